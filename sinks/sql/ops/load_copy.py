"""The initial copy's bulk path into MySQL/MariaDB (:meth:`sinks.copy_roles.TextCopy.write_copy_text`): a chunk's rows
as the upstream's COPY text, rendered in C into ``LOAD DATA`` input (:class:`sinks.sql.dialect.copy_literals.LoadRows`)
and loaded with ``LOAD DATA LOCAL INFILE`` from memory, in one target transaction; whatever the load does not store
exactly as the statements would is rolled back and written by the statements (:mod:`sinks.sql.ops.literal_copy`).

Why. The literal ``INSERT .. ON DUPLICATE KEY UPDATE`` rows cost the server 3.9-4.4 us of CPU per row whatever
renders them, ``LOAD DATA`` ~2.5 (docs/benchmarks.md, "Issue 22 item 8"); on a small host the server is the bound.

Why the result is exactly the statement path's. A chunk's rows are fresh keys unless the chunk was copied before (a
crash between commit and record) or the target is merged into. For a fresh key, the statement inserts the row with
each value converted from its literal; the load inserts it with each value converted from the literal's text without
the quotes (``LoadRows``: the same C acceptance, the same digits, dates and unescaped strings). For the literals that
are quoted strings (text, dates, times, timestamps, UUIDs) that is the same string-to-column conversion; for the
numbers (integers, booleans as 0/1, decimals, floats) it is the conversion of the same digits as a string, which
gives the same value for the column types allowed here (:data:`LOAD_TYPES`: integers and decimals from integer
digits, decimals from decimal digits, doubles and floats from a float's shortest repr, parsed by the same
correctly-rounded routine). Any other target column type, a BIT, a JSON, a binary string, sends the table's chunks to
the statements. Where the two could still differ the load is not kept:

- ``LOAD DATA LOCAL`` turns a refused value (out of range, too long, an invalid date, a NULL into NOT NULL, a
  character the column's charset lacks) into a warning and stores something else, where the strict statements fail;
  it skips a row whose key exists (``IGNORE``), where the statements update it. So a load whose rows loaded differ
  from the rows sent, or that reports any warning or note, or that the server refuses with a data error, is rolled
  back with the whole transaction (nothing of the chunk stays), and the chunk is written by the statement path,
  which upserts exactly and raises the precise error (``DataRejected``) for a refused value. After
  :data:`CONFLICTS_TO_STOP` chunks of a table met existing keys (a ``merge`` target), the sink stops trying the load
  for that table.
- Taken only where the statement path would be taken too (``literal_refusal``: keyed, no other unique key; not a
  key-less whole chunk; no exactly-once position; a UTF-8 connection with backslash escapes; C built), and only when
  the server allows local files (``@@local_infile``, read once per sink: a server with ``local_infile = 0`` gets the
  statements, said once in the log per process and target; a refusal met later is treated the same way).
  ``TIDEWATER_COPY_LOAD=off`` turns the path off (the statements then copy every chunk: the before/after switch).
- A chunk with a value C does not render returns :attr:`Fallback.PARSED` at once (the literal path declines the
  same lines): the caller writes it parsed, which stores it or raises the precise error.

Exactly-once and resume rules are those of the statement path: one transaction per chunk with the run fence right
before its commit; a chunk written but not recorded meets its own keys when copied again and is upserted.

Safety of local files: the sink's connections offer ``LOAD DATA LOCAL`` but never read a file of this machine: they
send only the rows in memory, only while a load of the sink's own file name runs, and answer any other request of a
server with no data and an error (:func:`sinks.sql.target.connection.pymysql_connection_class`).

Errors: the target's (retryable ones, a deadlock or a lost connection, as the statements would raise them; classified
and naming the table by :meth:`Target.transaction`); an error of the upstream's side (reading ``text.blocks``) as
itself. Loads run on the sink's statement pipeline (the server loads one body while the next is read and rendered).
"""

from __future__ import annotations

import enum
import logging
import os
from collections.abc import Callable
from typing import Any

from cdc.events import TableSchema
from cdc.snapshot import CopyText
from sinks.sql.dialect.copy_literals import KINDS, LoadRows, column_kinds
from sinks.sql.dialect.errors import classify, is_db_error
from sinks.sql.ops.literal_copy import literal_refusal
from sinks.sql.target.binding import Binding
from sinks.sql.target.catalog import Catalog
from sinks.sql.target.connection import Target

log = logging.getLogger(__name__)

LOAD_BYTES = 8 << 20
LOAD_ROWS = 25_000
"""A ``LOAD DATA`` statement takes rows until it holds this many rows or :data:`LOAD_BYTES` bytes (at most twice
that; sent in 1 MiB packets): a chunk of ``chunk-rows`` (100,000) is several loads, the next read and rendered while
the server loads one."""
CONFLICTS_TO_STOP = 2
"""Chunks of one table whose load met existing keys after which a sink writes that table's chunks by the statements
(a resumed run meets about one per task; a ``merge`` target every one, each costing a load and a re-read)."""

LOAD_TYPES: dict[str, frozenset[str]] = {
    "INT": frozenset({"tinyint", "smallint", "mediumint", "int", "bigint", "decimal"}),
    "BOOL": frozenset({"tinyint", "smallint", "mediumint", "int", "bigint"}),
    "TEXT": frozenset({"char", "varchar", "tinytext", "text", "mediumtext", "longtext"}),
    "NUMERIC": frozenset({"decimal"}),
    "FLOAT": frozenset({"double", "float"}),
    "DATE": frozenset({"date"}),
    "TIME": frozenset({"time"}),
    "TIMESTAMP": frozenset({"datetime", "timestamp"}),
    "TIMESTAMPTZ": frozenset({"datetime", "timestamp"}),
    "UUID": frozenset({"char", "varchar"}),
}
"""Per C kind (:data:`sinks.sql.dialect.copy_literals.KINDS`), the target column types (``DATA_TYPE``) that read its
load text as the statements read its literal (module docstring)."""

REFUSED_CODES = frozenset({1148, 3948, 4166})
"""The server (or its ``local_infile = 0``) refuses ``LOAD DATA LOCAL``: MySQL's ER_NOT_ALLOWED_COMMAND and
ER_CLIENT_LOCAL_FILES_DISABLED, MariaDB's ER_LOAD_INFILE_CAPABILITY_DISABLED."""

REFUSALS_SAID: set[str] = set()
"""Targets (``Target.where``) whose refusal of local files this process has logged (once each)."""


class Fallback(enum.Enum):
    """What the caller does with a chunk the load did not store."""

    STATEMENTS = "statements"  # write it by the literal statements (sinks.sql.ops.literal_copy), which decide
    PARSED = "parsed"  # a value C does not render (or no COPY text): the parsed path


class _Outcome:
    """What the loads of one chunk met (written by the pipeline's worker, read after it is idle)."""

    __slots__ = ("missed", "conflict", "refused")

    def __init__(self) -> None:
        self.missed: str | None = None  # why the chunk's load is not kept (None: every load was clean)
        self.conflict = False  # a row was skipped: its key exists
        self.refused = False  # the server refuses LOAD DATA LOCAL


class LoadCopy:
    """The load path of one MySQL sink (module docstring): per binding its verdict, per table the chunks that met
    existing keys, and whether the server allows local files."""

    def __init__(self, target: Target, catalog: Catalog) -> None:
        self._target = target
        self._catalog = catalog
        self._verdicts: dict[tuple[str, TableSchema], str | None] = {}
        self._conflicts: dict[str, int] = {}
        self._allowed: bool | None = None  # the server's local_infile, read once

    def write(self, schema: TableSchema, open_text: Callable[[], CopyText | None], fence: Callable[[], None] | None, *,
              replace: bool, tracks_position: bool) -> int | Fallback:
        """The chunk loaded and committed (its rows), or what to write it with instead (nothing of it stays)."""
        target = self._target
        target.check_open()
        if target.dialect != "mysql" or tracks_position or replace or self._allowed is False or \
                os.environ.get("TIDEWATER_COPY_LOAD", "").lower() == "off":
            return Fallback.STATEMENTS
        kinds = column_kinds(schema)
        if kinds is None:
            return Fallback.STATEMENTS
        from pymysql.constants import SERVER_STATUS

        b: Binding | None = None
        text: CopyText | None = None
        pipe = target.pipeline
        outcome = _Outcome()
        try:
            with target.transaction(lambda: b.label if b is not None else str(schema.name), fence=fence) as conn:
                dbapi: Any = conn.connection.dbapi_connection
                if dbapi.encoding not in ("utf8", "utf-8") or not hasattr(dbapi, "load_local") or \
                        dbapi.server_status & SERVER_STATUS.SERVER_STATUS_NO_BACKSLASH_ESCAPES:
                    conn.rollback()
                    return Fallback.STATEMENTS
                b = self._catalog.bind(schema, conn)
                if self._conflicts.get(b.label, 0) >= CONFLICTS_TO_STOP:
                    conn.rollback()
                    return Fallback.STATEMENTS
                cur = dbapi.cursor()
                try:
                    if not self._server_allows(cur) or self._verdict(b, cur) is not None:
                        conn.rollback()
                        return Fallback.STATEMENTS
                    text = open_text()
                    if text is None or not text.pg_utf8:
                        conn.rollback()
                        return Fallback.PARSED
                    stmts = target.statements()
                    sql = stmts.load_local(b.table, [b.colmap[n] for n in b.names]) % ()
                    rows = LoadRows(kinds, [b.scales[n] for n in b.names], LOAD_BYTES, LOAD_ROWS)
                    pending: list[bytes] = []  # bodies of the next load (a block's last one is short)
                    size = count = 0
                    try:
                        for block in text.blocks:
                            bodies = rows.feed(block)
                            if bodies is None:  # a value C does not render: the whole chunk goes parsed
                                pipe.drain()
                                conn.rollback()
                                log.info("%s: a chunk of %s holds a value C does not render: written parsed",
                                         target.where, b.label)
                                return Fallback.PARSED
                            for body, n in bodies:
                                pending.append(body)
                                size += len(body)
                                count += n
                                if count >= LOAD_ROWS or size >= LOAD_BYTES:
                                    data = pending[0] if len(pending) == 1 else b"".join(pending)
                                    if not pipe.submit(b.label, self._load, dbapi, cur, sql, data, count, outcome):
                                        pipe.drain()  # an earlier load failed: raised here
                                    pending, size, count = [], 0, 0
                            if outcome.missed is not None:
                                break  # (the statements read the chunk again)
                        if pending and outcome.missed is None:
                            pipe.submit(b.label, self._load, dbapi, cur, sql, b"".join(pending), count, outcome)
                        pipe.drain()
                    finally:
                        error = pipe.quiesce()  # (nothing runs on the connection past this point)
                    if error is not None:
                        raise error[0]
                finally:
                    cur.close()
                if outcome.missed is not None:
                    conn.rollback()
                    self._missed(b, outcome)
                    return Fallback.STATEMENTS
                if not rows.finish():
                    raise ValueError(f"the COPY text of a chunk of {schema.name} ended inside a row")
            return rows.rows  # committed (after the fence)
        finally:
            if text is not None:  # unread or partly read (declined, missed, an error): abandon the upstream's COPY
                text.abandon()

    @staticmethod
    def _load(dbapi: Any, cur: Any, sql: str, body: bytes, rows: int, outcome: _Outcome) -> None:
        """In the pipeline: one load of ``body`` (``rows`` lines); a load that is not clean is noted in ``outcome``
        (and the chunk's later loads do nothing). Raises the errors the statements would raise too (retryable)."""
        if outcome.missed is not None:
            return
        try:
            loaded = dbapi.load_local(cur, sql, body)
        except Exception as exc:
            if not is_db_error(exc):
                raise
            code = exc.args[0] if exc.args and isinstance(exc.args[0], int) else 0
            if code in REFUSED_CODES:
                outcome.refused = True
                outcome.missed = f"the server refuses LOAD DATA LOCAL INFILE ({exc})"
                return
            if classify("mysql", exc)[0]:  # a deadlock, a lost connection...: as the statements' own
                raise
            outcome.missed = f"the load failed ({exc})"  # the statements fail precisely, or store it
            return
        warnings = int(cur.warning_count or 0)
        if loaded == rows and not warnings:
            return
        outcome.conflict = loaded < rows
        first: Any = None
        if warnings:
            cur.execute("SHOW WARNINGS LIMIT 1")
            first = cur.fetchone()
        outcome.missed = (f"{rows - loaded} of {rows} rows skipped (their key exists), {warnings} warning(s)"
                          + (f", the first: {tuple(first)}" if first else ""))

    def _server_allows(self, cur: Any) -> bool:
        """Whether the server allows ``LOAD DATA LOCAL`` (read once per sink; a refusal said once per process)."""
        if self._allowed is None:
            self._allowed = server_allows_local(cur)
            if not self._allowed:
                self._say_refused("local_infile = 0")
        return self._allowed

    def _say_refused(self, why: str) -> None:
        where = self._target.where
        if where not in REFUSALS_SAID:
            REFUSALS_SAID.add(where)
            log.warning("%s refuses LOAD DATA LOCAL INFILE (%s): the initial copy writes its chunks as multi-row "
                        "INSERTs, which cost the server more CPU per row (set local_infile = ON on the server for "
                        "the faster load)", where, why)

    def _missed(self, b: Binding, outcome: _Outcome) -> None:
        """A chunk's load was rolled back (``outcome``): note it for the table and say why."""
        if outcome.refused:
            self._allowed = False
            self._say_refused(outcome.missed or "")
            return
        if outcome.conflict:
            n = self._conflicts[b.label] = self._conflicts.get(b.label, 0) + 1
            if n == CONFLICTS_TO_STOP:
                log.info("%s: %s already holds rows of %d chunks of the initial copy (copied before, or merged): "
                         "its chunks are written by statements from now on", self._target.where, b.label, n)
        log.info("%s: a chunk's load into %s was rolled back, the statements write it: %s", self._target.where,
                 b.label, outcome.missed)

    def _verdict(self, b: Binding, cur: Any) -> str | None:
        """Why this binding's rows are not loaded (None: they are); read once per binding, said once."""
        vkey = (b.label, b.schema)
        if vkey not in self._verdicts:
            self._verdicts[vkey] = why = literal_refusal(b) or load_type_refusal(b, cur)
            if why is not None:
                log.info("%s: the initial copy of %s is written by statements (no LOAD DATA): %s",
                         self._target.where, b.label, why)
        return self._verdicts[vkey]


def load_type_refusal(b: Binding, cur: Any) -> str | None:
    """Why a target column's type of ``b`` does not read the load text as the statements read the literal (None: all
    do; :data:`LOAD_TYPES`). Reads the target's catalog on ``cur`` (an idle connection)."""
    cur.execute("SELECT COLUMN_NAME, LOWER(DATA_TYPE) FROM information_schema.COLUMNS "
                "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s", (b.table.name,))
    have = {str(name): str(typ) for name, typ in cur.fetchall()}
    for c in b.schema.columns:
        target = b.colmap[c.name]
        typ = have.get(target)
        if typ not in LOAD_TYPES[KINDS[c.base_type]]:
            return f"target column {target!r} is {typ}, which the load does not fill (upstream {c.base_type})"
    return None


def server_allows_local(cur: Any) -> bool:
    """Whether the server allows ``LOAD DATA LOCAL`` (``@@GLOBAL.local_infile``), read on ``cur`` (an idle
    connection)."""
    cur.execute("SELECT @@GLOBAL.local_infile")
    row = cur.fetchone()
    return bool(row and int(row[0]))
