"""MySQL/MariaDB: fresh rows by ``LOAD DATA LOCAL INFILE`` straight into the table, under a savepoint.

What. A group of upserts whose rows are all upstream INSERTs ("fresh": the target most likely lacks their keys) and
that came with their upstream text (``RowChange.row_text``: PostgreSQL's output text, or the text a MySQL/MariaDB
upstream's changes are stored as; an insert mounted for this sink has its typed values deferred, so a loaded row is
never parsed: ``sinks.base.TextRows``) is rendered in C into ``LOAD DATA`` input
(:class:`sinks.sql.dialect.copy_literals.LoadRows`, from the rows' COPY text) and loaded into the table in the
write's transaction, after a ``SAVEPOINT``; the statement path would have sent the same rows as multi-row ``INSERT ..
ON DUPLICATE KEY UPDATE`` statements. It is the streaming twin of the initial copy's load (:mod:`.load_copy`) and of
PostgreSQL's direct COPY of fresh rows (``Output._copy_fresh``).

Why. Measured on MariaDB 10.11 (``scripts/bench_my_shapes.py``, docs/benchmarks.md "MariaDB target's statements"):
the server spends ~3.9 us of CPU per new row on 1,000-row loads against ~5.5-6.5 on 1,000-row literal upserts; a plain
multi-row ``INSERT``, a ``REPLACE``, larger statements or an ``UPDATE .. JOIN`` of a table value constructor cost
what the upsert costs, within the noise.

Why the result is exactly the statement path's. For a fresh key the statement inserts the row with each value
converted from its literal; the load inserts it with each value converted from the literal's text without the quotes:
the same C acceptance and the same conversions as the initial copy's load, for the same target column types
(:data:`.load_copy.LOAD_TYPES`; the module docstring there gives the argument). Where the two could differ the load
is not kept: a load that skipped a row (its key exists, or the group holds a key twice: ``LOAD DATA LOCAL`` ignores
duplicates), that stored fewer or more rows than sent, that reports any warning or note (``LOCAL`` turns a refused
value into a warning and stores something else), or that the server refuses with a data error, is rolled back to
its savepoint (InnoDB: nothing of it stays, the transaction goes on) and the same rows go through the statements,
which upsert exactly or raise the precise error (``DataRejected``). After ``FRESH_CONFLICTS_TO_STOP`` such rollbacks
of one table for existing keys (``Binding.copy_conflicts``, shared with PostgreSQL's direct COPY) the table always
takes the statements.

Taken only where the statements are the multi-row upsert of every column of a keyed table with no other unique key
(:func:`.load_copy.literal_refusal`), every upstream column kind renders in C, every target column type reads the
load text as the literal, the connection is UTF-8 with backslash escapes, and the server allows local files
(``@@local_infile``, read once per sink; a refusal met later switches the path off for the sink). Otherwise, or with
``TIDEWATER_FRESH_LOAD=off`` (the before/after switch), the statements are sent as before. Triggers: an ``INSERT``
trigger of the target fires for the loaded rows as for the statements' inserts; after a rollback to the savepoint
its effects on transactional tables are rolled back with the rows.

Safety of local files: as for the initial copy, the sink's connection sends only these rows in memory, only while
the load of its own file name runs (:func:`sinks.sql.target.connection.pymysql_connection_class`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any, Protocol

from cdc.events import TableSchema
from sinks.sql.dialect.copy_literals import LoadRows, column_kinds
from sinks.sql.dialect.errors import classify, is_db_error
from sinks.sql.dialect.rowtext import RowText
from sinks.sql.dialect.statements import Statements
from sinks.sql.ops.load_copy import (
    LOAD_BYTES,
    LOAD_ROWS,
    REFUSED_CODES,
    literal_refusal,
    load_type_refusal,
    server_allows_local,
)
from sinks.sql.target.binding import Binding, Plan

log = logging.getLogger(__name__)

MIN_ROWS = 1000
"""Fresh groups of at least this many rows are loaded (a catch-up's groups: ``batch-rows``, 1,000 by default; a
smaller ``batch-rows`` turns the loads off); smaller ones go as statements. A load costs two round trips more than a
statement (the ``SAVEPOINT``, the server's request for the file), which showed in the apply lag at 10,000 rows/s on a
loaded host with groups from 32 or 500 rows (p50 26-52 ms against 12-15 without loads), not from 1,000 (8 ms, as
without; docs/benchmarks.md)."""
SAVEPOINT = "tidewater_fresh"


class Output(Protocol):
    """What a load needs of the write's statement output (:class:`sinks.sql.ops.output.Output`)."""

    cur: Any
    text: RowText
    stmts: Statements

    def sync(self) -> None: ...

    def submit(self, fn: Callable[..., Any], *args: Any) -> None: ...

    def literal_statements(self, plan: Plan, rows: list[tuple[Any, ...]], texts: list[Any] | None) -> list[str]: ...


class FreshLoads:
    """The fresh-row load path of one MySQL sink (module docstring): the server's ``local_infile``, per binding its
    verdict and load statement. ``where`` names the target in log lines. Used by one write at a time per
    connection: :meth:`apply` in the writing thread, the loads in the connection's statement pipeline."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.enabled = os.environ.get("TIDEWATER_FRESH_LOAD", "").lower() != "off"
        self._allowed: bool | None = None
        self._verdicts: dict[tuple[str, TableSchema], tuple[bytes, str] | None] = {}  # (kinds, load statement)

    def apply(self, out: Output, b: Binding, plan: Plan, rows: list[tuple[Any, ...]], texts: list[Any]) -> bool:
        """Send a fresh group (``rows`` with their upstream ``texts``, every column of ``b`` in order) as one load on
        ``out``'s pipeline, falling back there to the statements (module docstring); False: not taken, the caller
        sends the statements."""
        if not self.enabled or self._allowed is False or len(rows) < MIN_ROWS or len(texts) != len(rows):
            return False
        dbapi: Any = out.cur.connection
        from pymysql.constants import SERVER_STATUS

        if dbapi.encoding not in ("utf8", "utf-8") or not hasattr(dbapi, "load_local") or \
                dbapi.server_status & SERVER_STATUS.SERVER_STATUS_NO_BACKSLASH_ESCAPES:
            return False
        vkey = (b.label, b.schema)
        if vkey not in self._verdicts:
            out.sync()  # reads the catalog on the connection: idle first
            self._verdicts[vkey] = self._verdict(out, b)
        verdict = self._verdicts[vkey]
        if verdict is None or self._allowed is False:
            return False
        kinds, sql = verdict
        lines = LoadRows(kinds, [b.scales[n] for n in b.names], LOAD_BYTES, LOAD_ROWS)
        bodies = lines.feed(out.text.copy_text(texts))
        if bodies is None or not lines.finish() or lines.rows != len(rows):
            return False  # a value C does not render exactly: the statements send it (or refuse it precisely)
        body = bodies[0][0] if len(bodies) == 1 else b"".join(body for body, _ in bodies)
        out.submit(self._load, out, b, plan, sql, body, rows, texts)
        return True

    def _verdict(self, out: Output, b: Binding) -> tuple[bytes, str] | None:
        """(C kinds, load statement) for ``b``'s fresh rows, or None (said once in the log) when they are not loaded."""
        cur = out.cur
        if self._allowed is None:
            self._allowed = server_allows_local(cur)
            if not self._allowed:
                log.info("%s: local_infile = 0: fresh rows are written as statements", self.where)
        kinds = column_kinds(b.schema)
        why = ("an upstream column type is not rendered in C" if kinds is None else None) or literal_refusal(b) \
            or load_type_refusal(b, cur)
        if why is not None or kinds is None:
            log.info("%s: fresh rows of %s are written as statements (no LOAD DATA): %s", self.where, b.label, why)
            return None
        return kinds, out.stmts.load_local(b.table, [b.colmap[n] for n in b.names]) % ()

    def _load(self, out: Output, b: Binding, plan: Plan, sql: str, body: bytes, rows: list[tuple[Any, ...]],
              texts: list[Any]) -> None:
        """Pipeline side: ``SAVEPOINT``, the load; when it is not clean, back to the savepoint and the statements."""
        cur = out.cur
        cur.execute(f"SAVEPOINT {SAVEPOINT}")  # a name set again replaces the old savepoint
        conflict = False
        try:
            loaded = cur.connection.load_local(cur, sql, body)
            clean = loaded == len(rows) and not cur.warning_count
            conflict = loaded < len(rows)
        except Exception as exc:
            if not is_db_error(exc) or classify("mysql", exc)[0]:
                raise  # not the server's data error (a deadlock, a lost connection: retryable, as the statements')
            code = exc.args[0] if exc.args and isinstance(exc.args[0], int) else 0
            if code in REFUSED_CODES:
                self._allowed = False
                log.info("%s refuses LOAD DATA LOCAL INFILE (%s): fresh rows are written as statements", self.where,
                         exc)
            clean = False
        if clean:
            return
        cur.execute(f"ROLLBACK TO SAVEPOINT {SAVEPOINT}")
        if conflict:
            b.copy_conflicts += 1
        for statement in out.literal_statements(plan, rows, texts):
            cur.execute(statement)
