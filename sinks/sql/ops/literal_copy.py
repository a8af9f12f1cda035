"""The initial copy's fast path into MySQL/MariaDB (:meth:`sinks.copy_roles.TextCopy.write_copy_text`): a chunk's
rows as the upstream's COPY text, turned into literal rows in C (:mod:`sinks.sql.dialect.copy_literals`) and sent as
the multi-row ``INSERT .. ON DUPLICATE KEY UPDATE`` statements the parsed path sends, in one target transaction.

Why the result is exactly the parsed path's. The parsed path (``read_chunk`` -> ``write``) upserts a chunk's rows by
key in key order, as multi-row statements of literal rows (``sinks.sql.ops.output``, ``Plan.parts`` of the upsert of
all columns); this path sends the same statement head and tail around the same literal text of the same rows in the
same order (the C renderer makes byte for byte the literal of each value that the parsed path makes, or declines),
within one transaction, fenced the same way. A chunk's keys are unique, so how rows are cut into statements changes
nothing. Taken only where that holds, else None (the caller reads the chunk parsed and calls ``write``):

- the target is MySQL/MariaDB, the sink has no exactly-once position and no DDL floors (the job opens neither), the C
  renderer is built, the connection's character set is UTF-8 and backslash escapes are on (``NO_BACKSLASH_ESCAPES``
  changes how strings are quoted);
- the table is keyed and has no other unique key in the target (the parsed path then cuts rows into runs: keep it),
  and it is not a key-less table's whole chunk (``replace``);
- every column's upstream type is rendered in C (:func:`sinks.sql.dialect.copy_literals.column_kinds`);
- every line of the chunk is in a form C renders exactly; at the first that is not, the transaction is rolled back
  (nothing of the chunk stays) and None sends the whole chunk through the parsed path, which stores it or raises the
  precise error (a NaN, a value with more fractional digits than the target's scale: ``DataRejected``).

Errors are those of ``write``: the target's, classified by :meth:`Target.transaction` and naming the table; an error
of the upstream's side (reading ``text.blocks``) is raised as itself. Statements run on the sink's statement pipeline
(the target executes one while the next block is read and rendered); the caller's thread otherwise.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from cdc.events import TableSchema
from cdc.snapshot import CopyText
from sinks.sql.dialect.copy_literals import LiteralRows, column_kinds
from sinks.sql.target.binding import K_UPSERT, Binding
from sinks.sql.target.catalog import Catalog
from sinks.sql.target.connection import Target

log = logging.getLogger(__name__)

STATEMENT_BYTES = 1_000_000
"""At most this many bytes of rows per statement (as ``sinks.sql.ops.output.MYSQL_STATEMENT_BYTES``: far below
MariaDB's default ``max_allowed_packet``)."""


class LiteralCopy:
    """The C literal path of one MySQL sink (module docstring): per binding its verdict (None: rendered in C; else
    why not). ``batch_rows``: rows per statement at most (the sink's ``batch-rows``)."""

    def __init__(self, target: Target, catalog: Catalog, batch_rows: int) -> None:
        self._target = target
        self._catalog = catalog
        self._batch = max(1, batch_rows)
        self._verdicts: dict[tuple[str, TableSchema], str | None] = {}

    def write(self, schema: TableSchema, open_text: Callable[[], CopyText | None], fence: Callable[[], None] | None, *,
              replace: bool, tracks_position: bool) -> int | None:
        """:meth:`sinks.copy_roles.TextCopy.write_copy_text` into MySQL/MariaDB (see the module docstring)."""
        target = self._target
        target.check_open()
        if target.dialect != "mysql" or tracks_position or replace:
            return None
        kinds = column_kinds(schema)
        if kinds is None:
            return None
        from pymysql.constants import SERVER_STATUS

        b: Binding | None = None
        text: CopyText | None = None
        pipe = target.pipeline
        try:
            with target.transaction(lambda: b.label if b is not None else str(schema.name), fence=fence) as conn:
                dbapi: Any = conn.connection.dbapi_connection
                if dbapi.encoding not in ("utf8", "utf-8") or \
                        dbapi.server_status & SERVER_STATUS.SERVER_STATUS_NO_BACKSLASH_ESCAPES:
                    conn.rollback()
                    return None
                b = self._catalog.bind(schema, conn)
                vkey = (b.label, b.schema)
                if vkey not in self._verdicts:
                    self._verdicts[vkey] = why = literal_refusal(b)
                    if why is not None:
                        log.info("%s: the initial copy of %s parses its rows (no C literal rows): %s", target.where,
                                 b.label, why)
                if self._verdicts[vkey] is not None:
                    conn.rollback()
                    return None
                text = open_text()
                if text is None or not text.pg_utf8:
                    conn.rollback()
                    return None
                parts = b.plan(K_UPSERT, b.names, None).parts
                assert parts is not None
                head, tail = parts[0].encode(dbapi.encoding), parts[1].encode(dbapi.encoding)
                rows = LiteralRows(kinds, [b.scales[n] for n in b.names], STATEMENT_BYTES, self._batch)
                cur = dbapi.cursor()
                try:
                    for block in text.blocks:
                        bodies = rows.feed(block)
                        if bodies is None:  # a value C does not render: the whole chunk goes parsed
                            pipe.drain()
                            conn.rollback()
                            log.info("%s: a chunk of %s holds a value the C literal rows do not render: written "
                                     "parsed", target.where, b.label)
                            return None
                        for body in bodies:
                            if not pipe.submit(b.label, cur.execute, head + body + tail):
                                pipe.drain()  # an earlier statement failed: raised here
                    pipe.drain()
                finally:
                    error = pipe.quiesce()  # (nothing runs on the connection past this point)
                    cur.close()
                if error is not None:
                    raise error[0]
                if not rows.finish():
                    raise ValueError(f"the COPY text of a chunk of {schema.name} ended inside a row")
            return rows.rows  # committed (after the fence)
        finally:
            if text is not None:  # unread or partly read (declined, an error): abandon the upstream's COPY
                text.abandon()


def literal_refusal(b: Binding) -> str | None:
    """Why this binding's rows are not rendered in C (None: they are); see the module docstring."""
    if not b.keyed:
        return "the table has no key (its rows are inserted, not upserted)"
    if b.other_uniques:
        return "the target has another unique key (rows go in runs)"
    return None
