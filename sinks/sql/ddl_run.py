"""Applying a schema change to an SQL target once: the record of applied DDL, the execution of the steps
that :mod:`sinks.sql.ddl_apply` translated, and the sink's caches of the tables it touched.

The record: table ``tidewater_ddl`` next to the position table (schema ``tidewater`` on PostgreSQL, the URI's
database elsewhere), one row per applied DDL:

=============  ===================================================================================
changefeed     changefeed id of the span's position (``""`` when exactly-once is off)
commit_ts      commit Ts of the upstream transaction that ran the DDL (primary key with ``seq``)
seq            the DDL's position among the DDL events of that transaction
table_name     upstream table, kinds, query: for humans
rows_done      1 once a write committed rows of the DDL's transaction that come after it (see below)
applied_at     when it was applied (the target's clock, UTC)
=============  ===================================================================================

Guarantees:
- PostgreSQL and SQLite: the DDL's steps, the record and the fence check run in one transaction (their DDL
  is transactional): the DDL is applied and recorded together or not at all. A replay finds the record
  and returns False.
- MariaDB/MySQL: DDL commits implicitly, so each step runs on an autocommit connection after checking its
  guards against the catalog (a step already done is skipped), and the record is written after the last
  step. Crash window: between the first step and the record; the replay re-checks every step and skips
  what is done, then records. TRUNCATE is the only non-idempotent step and it is safe: rows after the DDL
  are written only after the record exists.
- A transaction split around its DDL (rows before it written by one ``write``, which moves the span's
  position to that transaction's commit Ts): after the DDL the position is *reopened* for that commit Ts so
  that the next ``write`` applies the transaction's remaining rows; that write sets ``rows_done`` in its own
  transaction. A replay that finds the record without ``rows_done`` reopens the position again.
- After every call (applied, already applied or failed) the sink forgets what it cached about the tables
  the DDL touches (reflected columns and keys, bindings with their statements, the foreign-key graph), so
  the next rows bind to the table's new shape; the rows after a DDL carry the new ``TableSchema``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from decimal import Context, Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from cdc.config import DdlConfig
from cdc.errors import DdlRejected, SinkError, TidewaterError, UpstreamUnavailable
from cdc.events import DdlEvent, RowChange
from cdc.model import DataWarning
from sinks.sql.ddl_apply import (
    DROP_PK,
    EMPTY,
    FILL,
    REBUILD,
    REREAD,
    RESCALE,
    DdlPlan,
    Guard,
    Parts,
    Step,
    Translator,
)
from sinks.sql.errors import is_db_error
from sinks.sql.fkgraph import FkGraph
from sinks.sql.position import PG_SCHEMA
from sinks.sql.values import decimal_text

if TYPE_CHECKING:
    from sinks.sql.sink import SQLSink

log = logging.getLogger(__name__)

RECORD_TABLE = "tidewater_ddl"
WARN_DEFAULT = "CDC:WarnDdlDefault"
REREAD_BATCH = 500  # keys per upstream read of a volatile default's values
LOCK_TIMEOUT = 60  # seconds a DDL waits for a lock downstream before it fails with SinkUnavailable (retried)
_WIDE = Context(prec=2000)  # numeric has at most 1000 digits before and 16383 after the point upstream


@dataclass
class DdlState:
    """What one sink keeps for schema changes: the ``[ddl]`` settings, the changefeed (``open_position``),
    the record statements (once the record table exists), the warnings of the DDL being applied, and, with
    at-least-once delivery, the *floors*: per upstream table the commit Ts of its last applied DDL."""

    config: DdlConfig = field(default_factory=DdlConfig)
    changefeed: str = ""
    record: RecordSQL | None = None
    warnings: list[DataWarning] = field(default_factory=list)
    floors: dict[str, int] = field(default_factory=dict)

    def drop_replayed(self, changes: Iterable[RowChange]) -> Iterator[RowChange]:
        """At-least-once after a restart: the leading changes of a table older than its last applied DDL are
        replays (the barrier wrote them before the DDL) and carry a schema the target no longer has; they are
        dropped. Input is in commit order, so the check ends at the first change past every floor, and the
        floors are cleared once a write got past them (per change cost: none from then on)."""
        floors, top = self.floors, max(self.floors.values())
        it = iter(changes)
        dropped = 0
        for ch in it:
            if ch.commit_ts >= top:
                self.floors = {}
                yield ch
                break
            if ch.commit_ts < floors.get(str(ch.schema.name), 0):
                dropped += 1
                continue
            yield ch
        if dropped:
            log.info("changefeed=%s: dropped %d replayed change(s) from before applied schema changes",
                     self.changefeed, dropped)
        yield from it


class RecordSQL:
    """The statements of one dialect for the DDL record table."""

    def __init__(self, dialect: str, preparer: Any) -> None:
        q = preparer.quote
        self.schema = PG_SCHEMA if dialect == "postgresql" else None
        self.label = f"{self.schema}.{RECORD_TABLE}" if self.schema else RECORD_TABLE
        name = f"{q(self.schema)}.{q(RECORD_TABLE)}" if self.schema else q(RECORD_TABLE)
        p = "?" if dialect == "sqlite" else "%s"
        text, big, now = {"postgresql": ("text", "bigint", "now()"),
                          "mysql": ("longtext", "bigint", "UTC_TIMESTAMP(6)"),
                          "sqlite": ("TEXT", "INTEGER", "strftime('%Y-%m-%d %H:%M:%f', 'now')")}[dialect]
        stamp = {"postgresql": "timestamptz", "mysql": "datetime(6)", "sqlite": "TEXT"}[dialect]
        self.create_schema = f"CREATE SCHEMA IF NOT EXISTS {q(PG_SCHEMA)}" if self.schema else None
        self.create_table = (
            f"CREATE TABLE IF NOT EXISTS {name} (changefeed varchar(255) NOT NULL, commit_ts {big} NOT NULL, "
            f"seq integer NOT NULL, table_name {text} NOT NULL, kinds {text} NOT NULL, query {text} NOT NULL, "
            f"rows_done integer NOT NULL, applied_at {stamp} NOT NULL, PRIMARY KEY (changefeed, commit_ts, seq))")
        if dialect == "mysql":
            self.create_table += " DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin"
        self.select = f"SELECT rows_done FROM {name} WHERE changefeed = {p} AND commit_ts = {p} AND seq = {p}"
        self.insert = (f"INSERT INTO {name} (changefeed, commit_ts, seq, table_name, kinds, query, rows_done, "
                       f"applied_at) VALUES ({p}, {p}, {p}, {p}, {p}, {p}, 0, {now})")
        self.floors = f"SELECT table_name, max(commit_ts) FROM {name} WHERE changefeed = {p} GROUP BY table_name"
        self.mark_done = f"UPDATE {name} SET rows_done = 1 WHERE changefeed = {p} AND commit_ts = {p} AND rows_done = 0"


def apply_ddl(sink: SQLSink, ev: DdlEvent, fence: Callable[[], None] | None, *, skip: bool = False) -> bool:
    """Apply ``ev`` to ``sink``'s target at most once (module docstring); True when applied by this call.
    ``skip``: record it as applied (query prefixed ``skipped:``) without changing the target."""
    sink._check_open()
    pos = sink._position
    cf = pos.changefeed if pos is not None else sink._ddl_state.changefeed
    query = ("skipped: " if skip else "") + (ev.query or ", ".join(ev.kinds))
    touched = {sink._target_parts(t) for t in (ev.table, ev.new_table) if t is not None}
    applied = False
    try:
        rec = _record_sql(sink)
        step_sql = ""
        if sink.dialect == "mysql":
            state = _read_state(sink, rec, cf, ev)
            plan = None if state is not None else DdlPlan() if skip else _translate(sink, ev)
            if plan is not None:
                touched |= plan.touched
                with sink._engine.connect() as ddl:
                    ddl.execution_options(isolation_level="AUTOCOMMIT")
                    # a metadata lock held downstream fails the DDL (retryable) instead of blocking the span
                    ddl.exec_driver_sql(f"SET SESSION lock_wait_timeout = {LOCK_TIMEOUT}", ())
                    for step in plan.steps:
                        step_sql = step.sql or step.kind
                        if fence is not None:
                            fence()
                        _run(sink, ddl, step, ev, query)
                step_sql = ""
                with sink._engine.begin() as conn:
                    conn.exec_driver_sql(rec.insert, _record_row(cf, ev, query))
                    if fence is not None:
                        fence()
        else:
            plan = DdlPlan() if skip else _translate(sink, ev)  # pure; the record decides whether it runs
            with sink._engine.connect() as conn:
                fk_off = any(step.kind == REBUILD for step in plan.steps)
                dbapi: Any = conn.connection.dbapi_connection
                if fk_off:  # SQLite's rebuild recipe: foreign keys off outside the transaction (no-op inside)
                    dbapi.execute("PRAGMA foreign_keys=OFF")
                try:
                    with conn.begin():
                        if sink.dialect == "sqlite":
                            conn.exec_driver_sql(rec.create_table, ())
                        else:  # a lock held downstream fails the DDL (retryable) instead of blocking the span
                            conn.exec_driver_sql(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}s'", ())
                        row = conn.exec_driver_sql(rec.select, (cf, ev.commit_ts, ev.seq)).first()
                        state = None if row is None else int(row[0])
                        if state is None:
                            touched |= plan.touched
                            for step in plan.steps:
                                step_sql = step.sql or step.kind
                                _run(sink, conn, step, ev, query)
                            step_sql = ""
                            conn.exec_driver_sql(rec.insert, _record_row(cf, ev, query))
                            if fence is not None:
                                fence()
                finally:
                    if fk_off:
                        dbapi.execute("PRAGMA foreign_keys=ON")
        applied = state is None
    except Exception as exc:
        _forget_tables(sink, touched)
        if isinstance(exc, TidewaterError) or not is_db_error(exc):
            raise
        if sink._classify(exc)[0]:
            raise sink._wrap(exc, str(ev.table)) from exc
        reason = " ".join(str(sink._classify(exc)[2]).split())
        if step_sql:
            reason += f" (while running: {step_sql})"
        raise DdlRejected(query, str(ev.table), f"{sink._where()} refused it: {reason}",
                          commit_ts=ev.commit_ts, cause=exc) from exc
    _forget_tables(sink, touched)
    if applied:
        log.info("applied DDL %r on %s (commit ts %d, seq %d) to %s", query, ev.table, ev.commit_ts, ev.seq,
                 sink._where())
        for w in _pending_warnings(sink):
            sink._add_warning(w)
    else:
        log.info("DDL %r on %s (commit ts %d, seq %d) is already in %s; not applied again", query, ev.table,
                 ev.commit_ts, ev.seq, sink._where())
    sink._ddl_state.warnings = []
    if pos is not None and (applied or state == 0):
        pos.reopen(ev.commit_ts, lambda conn: conn.exec_driver_sql(rec.mark_done, (cf, ev.commit_ts)))
    return applied


def load_ddl_floors(sink: SQLSink, changefeed: str) -> int:
    """At-least-once delivery of ``changefeed``: read its floors from the record (see
    :meth:`DdlState.drop_replayed`); returns 0 (no position)."""
    state = sink._ddl_state
    state.changefeed = changefeed
    schema = PG_SCHEMA if sink.dialect == "postgresql" else None
    try:
        with sink._engine.begin() as conn:
            if not sa.inspect(conn).has_table(RECORD_TABLE, schema=schema):
                return 0  # no DDL applied yet (the table is created by the first one)
            rec = RecordSQL(sink.dialect, sink._engine.dialect.identifier_preparer)
            rows = conn.exec_driver_sql(rec.floors, (state.changefeed,)).fetchall()
    except Exception as exc:
        if isinstance(exc, TidewaterError) or not is_db_error(exc):
            raise
        raise sink._wrap(exc, RECORD_TABLE) from exc
    state.floors = {str(t): int(ts) for t, ts in rows}
    return 0


# ---- helpers -----------------------------------------------------------------------------------------
def _record_sql(sink: SQLSink) -> RecordSQL:
    """The record statements; the table is created once per sink (MySQL/PostgreSQL: autocommit)."""
    rec = sink._ddl_state.record
    if rec is None:
        with sink._engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
        sink._statements()  # the server's flavour (MySQL collation) is known once connected
        rec = RecordSQL(sink.dialect, sink._engine.dialect.identifier_preparer)
        if sink.dialect != "sqlite":
            with sink._engine.connect() as ddl:
                ddl.execution_options(isolation_level="AUTOCOMMIT")
                if rec.create_schema:
                    sink._ddl(ddl, rec.create_schema)
                sink._ddl(ddl, rec.create_table)
        sink._ddl_state.record = rec
    return rec


def _read_state(sink: SQLSink, rec: RecordSQL, cf: str, ev: DdlEvent) -> int | None:
    with sink._engine.begin() as conn:
        row = conn.exec_driver_sql(rec.select, (cf, ev.commit_ts, ev.seq)).first()
    return None if row is None else int(row[0])


def _record_row(cf: str, ev: DdlEvent, query: str) -> tuple[Any, ...]:
    return (cf, ev.commit_ts, ev.seq, str(ev.table), ",".join(ev.kinds), query[:60000])


def _translate(sink: SQLSink, ev: DdlEvent) -> DdlPlan:
    sink._ddl_state.warnings = []
    return Translator(sink.dialect, sink._engine.dialect.identifier_preparer, sink._target_parts,
                      mysql_collation=sink._mysql_collation,
                      replicate_indexes=sink._ddl_state.config.replicate_indexes).translate(ev)


def _pending_warnings(sink: SQLSink) -> list[DataWarning]:
    return list(sink._ddl_state.warnings)


def _run(sink: SQLSink, conn: Connection, step: Step, ev: DdlEvent, query: str) -> None:
    for g in step.guards:
        if not _holds(sink, conn, g):
            log.info("DDL %r on %s: skipped %s (%s %s %s)", query, ev.table, step.sql or step.kind, g.what,
                     g.name or "", "missing" if g.exists else "present")
            return
    if step.kind == FILL:
        if step.note:  # no value for the existing rows: a divergence when there are rows
            if conn.exec_driver_sql(step.sql, ()).first() is not None:
                _warn(sink, ev, step.note)
            return
        conn.exec_driver_sql(step.sql, step.params)
    elif step.kind == EMPTY:
        if conn.exec_driver_sql(step.sql, ()).first() is not None:
            raise DdlRejected(query, str(ev.table), f"target table {_name(sink, step.table)} already exists with rows "
                              "(an earlier incarnation of the table, or data loaded there): drop or rename it "
                              "downstream, or skip this DDL to write into it as it is", commit_ts=ev.commit_ts)
    elif step.kind == DROP_PK:
        t = _name(sink, step.table)
        if sink.dialect == "mysql":
            conn.exec_driver_sql(f"ALTER TABLE {t} DROP PRIMARY KEY", ())
        else:
            pk = sa.inspect(conn).get_pk_constraint(step.table[1], schema=step.table[0]).get("name")
            if pk:
                conn.exec_driver_sql(f"ALTER TABLE {t} DROP CONSTRAINT {sink._statements().q(pk)}", ())
    elif step.kind == REBUILD:
        _rebuild(sink, conn, step, ev, query)
    elif step.kind == REREAD:
        _reread(sink, conn, step, ev)
    elif step.kind == RESCALE:
        exp = Decimal(1).scaleb(-int(step.params[0]))
        rows = conn.exec_driver_sql(step.sql, ()).fetchall()
        fixed = [(decimal_text(Decimal(str(v)).quantize(exp, context=_WIDE)) if _finite(v) else v, rowid) for rowid, v in rows]
        if fixed:
            conn.exec_driver_sql(step.params[1], fixed)
    else:
        conn.exec_driver_sql(step.sql, ())


def _reread(sink: SQLSink, conn: Connection, step: Step, ev: DdlEvent) -> None:
    """A volatile default's values: the keys of the rows downstream, their current upstream values of the new
    column through the sink's row source (``REREAD_BATCH`` keys per read), one UPDATE per batch. A row the upstream
    no longer has is left (its DELETE is later in the stream); a later change of a row carries its full row and wins.
    No row source, or an upstream that cannot say (the column or table gone since): the rows keep NULL, with the
    warning. An unreachable upstream raises ``UpstreamUnavailable`` (retried: the DDL is applied again)."""
    rr = step.reread
    assert rr is not None
    keys = [tuple(r) for r in conn.exec_driver_sql(rr.select, ()).fetchall()]
    if not keys:
        return
    source = sink.row_source
    if source is None:
        _warn(sink, ev, f"column {rr.column}: {step.note}, and this sink has no upstream to read them from")
        return
    convert = rr.convert
    done = 0
    for start in range(0, len(keys), REREAD_BATCH):
        batch = keys[start:start + REREAD_BATCH]
        try:
            rows = source(rr.schema, batch)
        except UpstreamUnavailable:
            raise
        except TidewaterError as exc:
            _warn(sink, ev, f"column {rr.column}: {step.note}, and reading them back from the upstream failed "
                            f"({exc.message})")
            return
        params = [((row[rr.column] if convert is None or row[rr.column] is None else convert(row[rr.column])), *key)
                  for key, row in zip(batch, rows, strict=True) if row is not None]
        if params:
            conn.exec_driver_sql(rr.update, params)
            done += len(params)
    log.info("DDL on %s: column %s of %d existing row(s) read back from the upstream (%d gone there since)",
             ev.table, rr.column, done, len(keys) - done)


def _finite(v: Any) -> bool:
    try:
        return Decimal(str(v)).is_finite()
    except InvalidOperation:
        return False


def _warn(sink: SQLSink, ev: DdlEvent, note: str) -> None:
    sink._ddl_state.warnings.append(DataWarning(
        WARN_DEFAULT, str(ev.table), f"{ev.query or ', '.join(ev.kinds)}: the rows already downstream keep NULL "
        f"in the new column(s): {note}"))


def _name(sink: SQLSink, parts: Parts) -> str:
    q = sink._statements().q
    return f"{q(parts[0])}.{q(parts[1])}" if parts[0] else q(parts[1])


def _rebuild(sink: SQLSink, conn: Connection, step: Step, ev: DdlEvent, query: str) -> None:
    """SQLite's 12-step recipe (lang_altertable.html#otheralter) inside the caller's transaction; foreign keys
    are off (the caller turned them off before BEGIN) and checked for the table before the commit."""
    rb = step.rebuild
    assert rb is not None
    q = sink._statements().q
    name = step.table[1]
    indexes = [r[0] for r in conn.exec_driver_sql(
        "SELECT sql FROM sqlite_master WHERE type = 'index' AND tbl_name = ? AND sql IS NOT NULL", (name,))]
    conn.exec_driver_sql(f"DROP TABLE IF EXISTS {q(rb.temp)}", ())
    conn.exec_driver_sql(rb.create, ())
    copied = conn.exec_driver_sql(rb.copy, rb.params).rowcount
    conn.exec_driver_sql(f"DROP TABLE {q(name)}", ())
    conn.exec_driver_sql(f"ALTER TABLE {q(rb.temp)} RENAME TO {q(name)}", ())
    for sql in indexes:  # an index on a dropped column cannot come back
        conn.exec_driver_sql("SAVEPOINT tidewater_index", ())
        try:
            conn.exec_driver_sql(sql, ())
        except sa.exc.DBAPIError as exc:
            conn.exec_driver_sql("ROLLBACK TO tidewater_index", ())
            log.info("DDL %r on %s: index not recreated after the rebuild (%s): %s", query, ev.table, exc.orig, sql)
        conn.exec_driver_sql("RELEASE tidewater_index", ())
    bad = conn.exec_driver_sql(f"PRAGMA foreign_key_check({q(name)})", ()).fetchall()
    if bad:
        raise DdlRejected(query, str(ev.table), f"after the rebuild, {len(bad)} row(s) of {name} violate its foreign "
                          "keys", commit_ts=ev.commit_ts)
    if step.note and copied:
        _warn(sink, ev, step.note)


def _holds(sink: SQLSink, conn: Connection, g: Guard) -> bool:
    insp = sa.inspect(conn)
    schema, table = g.table
    if not insp.has_table(table, schema=schema):
        return not g.exists if g.what == "table" else False
    if g.what == "table":
        return g.exists
    fold = (lambda s: s) if sink.dialect == "postgresql" else str.casefold  # noqa: E731
    if g.what == "column":
        found = any(fold(c["name"]) == fold(g.name or "") for c in insp.get_columns(table, schema=schema))
    elif g.what == "index":
        found = any(fold(ix["name"] or "") == fold(g.name or "") for ix in insp.get_indexes(table, schema=schema))
    elif g.what == "pk":
        cols = insp.get_pk_constraint(table, schema=schema).get("constrained_columns") or []
        found = bool(cols) and (g.name is None or sorted(map(fold, cols)) == sorted(map(fold, g.name.split(","))))
    else:
        raise SinkError(f"internal: unknown DDL guard {g.what!r}")
    return found == g.exists


def _forget_tables(sink: SQLSink, touched: set[Parts]) -> None:
    """Drop what the sink cached about ``touched`` target tables: the next rows re-read their shape."""
    labels = set()
    for parts in touched:
        sink._tables.pop(parts, None)
        sink._existing.get(parts[0], {}).pop(parts[1], None)
        labels.add(f"{parts[0]}.{parts[1]}" if parts[0] else parts[1])
    for key, (_schema, b) in list(sink._bindings.items()):
        if b.label in labels:
            del sink._bindings[key]
    for schema, b in list(sink._bindings_by_value.items()):
        if b.label in labels:
            del sink._bindings_by_value[schema]
    sink._fk = FkGraph()
    sink._fk_seen = set()
