"""The initial copy's bulk path into PostgreSQL (:meth:`sinks.copy_roles.TextCopy.write_copy_text`): a chunk's rows
as the upstream's COPY text, streamed unparsed into ``COPY table (columns) FROM STDIN`` in one target transaction.

Why the result is exactly what streaming stores. For rows that carry their upstream text (every INSERT the
mounter makes, and every copied row), the sink's ordinary PostgreSQL path already sends that text through COPY:
:class:`sinks.sql.ops.output.Output` writes ``RowChange.row_text`` re-escaped in COPY's text format whenever the
group's plan has a COPY form (``Plan.copy``: all columns, no converter that must see every value, see
:func:`sinks.sql.dialect.values.checks_every_value`). The upstream's ``COPY ... TO STDOUT`` text is the same text (the
reader's session has the walsender's output settings, tested text for text against a real stream) with COPY's
escapes, which ``COPY FROM`` undoes exactly as it undoes the sink's own escapes: every input function receives
the same string, so every stored value is the same. The bulk path is taken only where that argument holds
word for word, and otherwise returns None (the caller parses the rows and calls ``write``):

- the target is PostgreSQL, the sink has no exactly-once position and no DDL floors (the job opens neither);
- every column's upstream base type is in :data:`PASSTHROUGH_TYPES` (arrays of them too): built-in types whose
  output text the sink's parameter path is tested to store identically (``tests/integration/test_values_exact.py``);
  anything else (money, network, geometric, range, extension types...) takes the parsed path;
- the ``INSERT`` plan of all columns has a COPY form (as above: a narrower numeric scale of an existing target
  is checked value by value, so never passed through);
- the target table's column types are exactly those the sink creates for the upstream columns
  (``format_type`` compared with :func:`sinks.sql.dialect.typemap.plan_table`): a pre-existing table of other
  types takes the parsed path, whose converters were written for it;
- the text is :data:`cdc.snapshot.PG_COPY_TEXT` in UTF8 and the target connection's client encoding is UTF8.

Idempotency. The rows go straight into the table (no staging, no merge: that is the gain). A chunk written but
not recorded as done (a crash in between) is written again by the next run, and a ``merge`` target holds rows
already: then the COPY meets an existing key (unique violation), the transaction is rolled back, nothing of it
stays, and None makes the caller write the chunk through ``write`` (upserts by key, as before). After
:data:`CONFLICTS_TO_STOP` such chunks of a table the sink stops trying the direct COPY for it. A key-less table's whole chunk (``replace``) is ``TRUNCATE``
then the rows, in the same transaction, as ``write`` does it. ``fence`` runs right before the commit.

Errors are those of ``write``: ``SinkUnavailable`` (retryable) or ``SinkError`` naming the table; an error of the
upstream's side of the chunk (reading ``text.blocks``) is raised as itself (:meth:`Blocks.copy_from`). Threading:
the caller's thread, on a connection of the sink's pool (the sink's statement pipeline is not used).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

from cdc.events import TableSchema
from cdc.snapshot import CopyText
from sinks.sql.dialect.typemap import plan_table
from sinks.sql.target.binding import K_INSERT, Binding
from sinks.sql.target.catalog import Catalog
from sinks.sql.target.connection import Target

log = logging.getLogger(__name__)

PASSTHROUGH_TYPES = frozenset({
    "int2", "int4", "int8", "bool", "text", "varchar", "bpchar", "char", "name", "numeric", "float4", "float8",
    "date", "time", "timetz", "timestamp", "timestamptz", "interval", "uuid", "bytea", "json", "jsonb",
})
"""Upstream base types whose values may pass through as text (see the module docstring)."""

UNIQUE_VIOLATION = "23505"
READ_SIZE = 1 << 20


CONFLICTS_TO_STOP = 2
"""Chunks of one table whose direct COPY met existing rows after which a sink stops trying it for that table: a
resumed run meets about one (the chunk each task had committed but not recorded), a ``merge`` target every one
(each attempt reads the chunk twice)."""


def type_refusal(schema: TableSchema) -> str | None:
    """Why ``schema``'s rows cannot pass through as text whatever the target (None: they can)."""
    if not schema.columns:
        return "no columns"
    odd = [f"{c.name} ({c.type_name or c.base_type})" for c in schema.columns if c.base_type not in PASSTHROUGH_TYPES]
    return f"column type(s) not passed through as text: {', '.join(odd)}" if odd else None


def target_types(cur: Any, table: str) -> dict[str, str]:
    cur.execute("SELECT attname, format_type(atttypid, atttypmod) FROM pg_catalog.pg_attribute "
                "WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped", (table,))
    return {str(n): str(t) for n, t in cur.fetchall()}


class Blocks:
    """``read()`` for ``copy_expert``: the next block of the text (any size), b'' at the end. ``error``: what reading
    the blocks raised (the upstream's side of the chunk). Run the COPY with :meth:`copy_from`, which raises that error
    as itself."""

    def __init__(self, blocks: Iterator[bytes]) -> None:
        self._it = blocks
        self.error: BaseException | None = None

    def read(self, size: int = -1) -> bytes:
        try:
            return next(self._it, b"")
        except BaseException as exc:
            self.error = exc
            raise

    def copy_from(self, cur: Any, sql: str) -> None:
        """``cur.copy_expert(sql)`` (a ``COPY ... FROM STDIN``) fed these blocks. psycopg2 turns an exception of
        ``read()`` into a driver error of the target's COPY ("COPY from stdin failed: error in .read() call: ..."),
        which names the upstream's error only in its text: wrapped as the target's, the retryable
        ``SnapshotTableAltered`` of a column renamed since the snapshot, or the ``UpstreamUnavailable`` of an upstream
        session lost mid-chunk, became the target's fatal ``SinkError``. So when reading failed, the exception that
        reading raised is raised instead, as it is (its class, code, retryability and cause; the driver's error is its
        context). The caller rolls the transaction back as after any error: the target's COPY was aborted by then."""
        try:
            cur.copy_expert(sql, self, READ_SIZE)
        except Exception:
            error = self.error
            if error is None:  # the target's error
                raise
            raise error  # noqa: B904 - the reader's own exception with its own cause; the driver's is its context


class CopyPassthrough:
    """The passthrough of one sink (module docstring): per binding its verdict (None: pass through; else why not),
    and per table how many chunks met existing rows."""

    def __init__(self, target: Target, catalog: Catalog) -> None:
        self._target = target
        self._catalog = catalog
        self._verdicts: dict[tuple[str, TableSchema], str | None] = {}
        self._conflicts: dict[str, int] = {}

    def write(self, schema: TableSchema, open_text: Callable[[], CopyText | None], fence: Callable[[], None] | None, *,
              replace: bool, tracks_position: bool) -> int | None:
        """:meth:`sinks.copy_roles.TextCopy.write_copy_text` (see the module docstring); ``tracks_position``: the
        sink has an exactly-once position or DDL floors (then None)."""
        target = self._target
        target.check_open()
        if target.dialect != "postgresql" or tracks_position:
            return None
        b: Binding | None = None
        text: CopyText | None = None
        try:
            with target.transaction(lambda: b.label if b is not None else str(schema.name), fence=fence) as conn:
                dbapi = conn.connection.dbapi_connection
                assert dbapi is not None
                if dbapi.encoding != "UTF8":
                    conn.rollback()
                    return None
                b = self._catalog.bind(schema, conn)
                if self._conflicts.get(b.label, 0) >= CONFLICTS_TO_STOP:
                    conn.rollback()
                    return None
                with dbapi.cursor() as cur:
                    vkey = (b.label, b.schema)
                    if vkey not in self._verdicts:
                        self._verdicts[vkey] = why = self._verdict(b, cur)
                        if why is not None:
                            log.info("%s: the initial copy of %s parses its rows (no COPY passthrough): %s",
                                     target.where, b.label, why)
                    if self._verdicts[vkey] is not None:
                        conn.rollback()
                        return None
                    text = open_text()
                    if text is None or not text.pg_utf8:
                        conn.rollback()
                        return None
                    stmts = target.statements()
                    if replace:
                        cur.execute(stmts.truncate(b.table), ())
                    copy_sql = stmts.copy_in(stmts.table(b.table), [b.colmap[n] for n in b.names]) % ()
                    blocks = Blocks(text.blocks)
                    try:
                        blocks.copy_from(cur, copy_sql)
                    except Exception as exc:
                        if exc is blocks.error or getattr(exc, "pgcode", None) != UNIQUE_VIOLATION:
                            raise  # (the upstream's side failed, or the target did otherwise)
                        conn.rollback()
                        n = self._conflicts[b.label] = self._conflicts.get(b.label, 0) + 1
                        if n == CONFLICTS_TO_STOP:
                            log.info("%s: %s already holds rows of %d chunks of the initial copy (copied before, "
                                     "or merged): its chunks are upserted by key from now on", target.where,
                                     b.label, n)
                        return None
                    rows = int(cur.rowcount)
            return rows  # committed (after the fence)
        finally:
            if text is not None:  # unread or partly read (refused, a conflict, an error): abandon the upstream's COPY
                text.abandon()

    def _verdict(self, b: Binding, cur: Any) -> str | None:
        """Why this binding's rows cannot pass through (None: they can); see the module docstring."""
        why = type_refusal(b.schema)
        if why:
            return why
        plan = b.plan(K_INSERT, b.names, None)
        if plan.copy is None:
            return "its columns' values are checked one by one (a target numeric scale narrower than upstream's)"
        planned = plan_table(b.schema, "postgresql", target_schema=b.table.schema, target_name=b.table.name)
        actual = target_types(cur, self._target.statements().table(b.table) % ())  # (% doubled for parameter styles)
        for col in planned.columns:
            have = actual.get(b.colmap[col.name])
            if have != col.ddl_type:
                return (f"target column {b.colmap[col.name]!r} is {have}, not {col.ddl_type} as the sink creates it "
                        "for the upstream column")
        return None
