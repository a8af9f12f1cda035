"""Applying a schema change to an SQL target once: the record of applied DDL, the execution of the steps
that :mod:`sinks.sql.dialect.ddl` translated, and the sink's caches of the tables it touched.

The record: table ``tidewater_ddl`` next to the position table (schema ``tidewater`` on PostgreSQL, the URI's
database elsewhere), one row per applied DDL:

=============  ===================================================================================
changefeed     changefeed id of the span's position (``""`` when exactly-once is off)
commit_ts      commit Ts of the upstream transaction that ran the DDL (primary key with ``seq``)
seq            the DDL's position in that transaction (``DdlEvent.seq``: the same in every span of a changefeed)
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
  transaction. A replay that finds the record without ``rows_done`` reopens the position again. That write fails
  (``SinkUnavailable``, rolled back) when no record of the transaction had ``rows_done`` 0 any more: another
  writer (a zombie, or its successor) wrote those rows since, and the position's compare-and-set cannot tell, as it
  stays at the same commit Ts.
- A record at the DDL's position that names another table is never taken for this DDL: the call fails
  (``SinkError``, naming both) instead of skipping it as applied.
- The target tables the changefeed has had (:mod:`sinks.sql.target.table_record`) follow the DDL in its transaction
  (MySQL: with its record): a DROP TABLE deletes the table's row, a RENAME TABLE moves it to the new name, a CREATE
  TABLE writes it. Any other DDL of a table the changefeed has had that is missing downstream is refused
  (``TargetTableDropped``: dropped behind the changefeed's back), never recorded as applied to a table "not
  downstream yet". A skipped DDL (``skip``) changes neither.
- After every call (applied, already applied or failed) the sink forgets what it cached about the tables
  the DDL touches (reflected columns and keys, bindings with their statements, the foreign-key graph), so
  the next rows bind to the table's new shape; the rows after a DDL carry the new ``TableSchema``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from decimal import Context, Decimal, InvalidOperation
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from cdc.config import DdlConfig
from cdc.errors import DdlRejected, SinkError, SinkUnavailable, TidewaterError, UpstreamUnavailable
from cdc.events import DdlEvent, DdlKind, RowChange, TableName
from cdc.model import DataWarning
from sinks.base import RowSource
from sinks.sql.dialect.ddl import (
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
from sinks.sql.dialect.errors import is_db_error
from sinks.sql.dialect.values import decimal_text
from sinks.sql.target.catalog import Catalog
from sinks.sql.target.connection import Target
from sinks.sql.target.own_table import PG_SCHEMA, OwnTable
from sinks.sql.target.position import Position

log = logging.getLogger(__name__)

RECORD_TABLE = "tidewater_ddl"
WARN_DEFAULT = "CDC:WarnDdlDefault"
REREAD_BATCH = 500  # keys per upstream read of a volatile default's values
LOCK_TIMEOUT = 60  # seconds a DDL waits for a lock downstream before it fails with SinkUnavailable (retried)
_WIDE = Context(prec=2000)  # numeric has at most 1000 digits before and 16383 after the point upstream


class RecordSQL(OwnTable):
    """The record table of one dialect (:class:`OwnTable`) and its statements."""

    def __init__(self, dialect: str, preparer: Any) -> None:
        text, big, stamp = {"postgresql": ("text", "bigint", "timestamptz"),
                            "mysql": ("longtext", "bigint", "datetime(6)"),
                            "sqlite": ("TEXT", "INTEGER", "TEXT")}[dialect]
        super().__init__(dialect, preparer, RECORD_TABLE,
                         f"changefeed varchar(255) NOT NULL, commit_ts {big} NOT NULL, seq integer NOT NULL, "
                         f"table_name {text} NOT NULL, kinds {text} NOT NULL, query {text} NOT NULL, "
                         f"rows_done integer NOT NULL, applied_at {stamp} NOT NULL, "
                         "PRIMARY KEY (changefeed, commit_ts, seq)")
        name, p = self.name, self.p
        self.select = (f"SELECT rows_done, table_name FROM {name} WHERE changefeed = {p} AND commit_ts = {p} "
                       f"AND seq = {p}")
        self.insert = (f"INSERT INTO {name} (changefeed, commit_ts, seq, table_name, kinds, query, rows_done, "
                       f"applied_at) VALUES ({p}, {p}, {p}, {p}, {p}, {p}, 0, {self.now})")
        self.floors = f"SELECT table_name, max(commit_ts) FROM {name} WHERE changefeed = {p} GROUP BY table_name"
        self.mark_done = f"UPDATE {name} SET rows_done = 1 WHERE changefeed = {p} AND commit_ts = {p} AND rows_done = 0"


class DdlRunner:
    """Applies one sink's schema changes (module docstring) on ``target``, telling ``catalog`` which tables to
    forget; the warnings of an applied DDL go to ``on_warning``. Keeps the ``[ddl]`` settings (``config``), the
    changefeed (:meth:`load_floors`), the record statements once the record table exists, and, with at-least-once
    delivery, the *floors*: per upstream table the commit Ts of its last applied DDL."""

    def __init__(self, target: Target, catalog: Catalog, on_warning: Callable[[DataWarning], None]) -> None:
        self._target = target
        self._catalog = catalog
        self._on_warning = on_warning
        self.config = DdlConfig()
        self.changefeed = ""
        self.floors: dict[str, int] = {}
        self._record: RecordSQL | None = None
        self._warnings: list[DataWarning] = []  # of the DDL being applied

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

    def apply(self, ev: DdlEvent, fence: Callable[[], None] | None, *, skip: bool = False, position: Position | None,
              row_source: RowSource | None) -> bool:
        """Apply ``ev`` to the target at most once (module docstring); True when applied by this call.
        ``skip``: record it as applied (query prefixed ``skipped:``) without changing the target. ``position``: the
        span's exactly-once position (reopened for the rest of the DDL's transaction), None without one;
        ``row_source`` re-reads a volatile default's values (None: the rows keep NULL, with a warning)."""
        target = self._target
        target.check_open()
        pos = position
        cf = pos.changefeed if pos is not None else self.changefeed
        query = ("skipped: " if skip else "") + (ev.query or ", ".join(ev.kinds))
        touched = {target.target_parts(t) for t in (ev.table, ev.new_table) if t is not None}
        applied = False
        try:
            rec = self._record_sql()
            step_sql = ""
            if target.dialect == "mysql":
                state = self._read_state(rec, cf, ev)
                plan = None if state is not None else DdlPlan() if skip else self._translate(ev)
                if plan is not None:
                    touched |= plan.touched
                    with target.engine.connect() as ddl:
                        ddl.execution_options(isolation_level="AUTOCOMMIT")
                        # a metadata lock held downstream fails the DDL (retryable) instead of blocking the span
                        ddl.exec_driver_sql(f"SET SESSION lock_wait_timeout = {LOCK_TIMEOUT}", ())
                        if not skip:
                            self._check_dropped(ddl, ev)
                        for step in plan.steps:
                            step_sql = step.sql or step.kind
                            if fence is not None:
                                fence()
                            self._run(ddl, step, ev, query, row_source)
                    step_sql = ""
                    with target.engine.begin() as conn:
                        conn.exec_driver_sql(rec.insert, _record_row(cf, ev, query))
                        if not skip:
                            self._follow_tables(conn, ev)
                        if fence is not None:
                            fence()
            else:
                plan = DdlPlan() if skip else self._translate(ev)  # pure; the record decides whether it runs
                with target.engine.connect() as conn:
                    fk_off = any(step.kind == REBUILD for step in plan.steps)
                    dbapi: Any = conn.connection.dbapi_connection
                    if fk_off:  # SQLite's rebuild recipe: foreign keys off outside the transaction (no-op inside)
                        dbapi.execute("PRAGMA foreign_keys=OFF")
                    try:
                        with conn.begin():
                            if target.dialect == "sqlite":
                                conn.exec_driver_sql(rec.create_table, ())
                            else:  # a lock held downstream fails the DDL (retryable) instead of blocking the span
                                conn.exec_driver_sql(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}s'", ())
                            state = _state(conn.exec_driver_sql(rec.select, (cf, ev.commit_ts, ev.seq)).first(),
                                           ev, target.where)
                            if state is None:
                                touched |= plan.touched
                                if not skip:
                                    self._check_dropped(conn, ev)
                                for step in plan.steps:
                                    step_sql = step.sql or step.kind
                                    self._run(conn, step, ev, query, row_source)
                                step_sql = ""
                                conn.exec_driver_sql(rec.insert, _record_row(cf, ev, query))
                                if not skip:
                                    self._follow_tables(conn, ev)
                                if fence is not None:
                                    fence()
                    finally:
                        if fk_off:
                            dbapi.execute("PRAGMA foreign_keys=ON")
            applied = state is None
        except Exception as exc:
            self._catalog.forget_tables(touched)
            self._catalog.record.forget_cache()  # (its changes in the DDL's transaction may be rolled back)
            if isinstance(exc, TidewaterError) or not is_db_error(exc):
                raise
            if target.classify(exc)[0]:
                raise target.wrap(exc, str(ev.table)) from exc
            reason = " ".join(str(target.classify(exc)[2]).split())
            if step_sql:
                reason += f" (while running: {step_sql})"
            raise DdlRejected(query, str(ev.table), f"{target.where} refused it: {reason}",
                              commit_ts=ev.commit_ts, cause=exc) from exc
        self._catalog.forget_tables(touched)
        if applied:
            log.info("applied DDL %r on %s (commit ts %d, seq %d) to %s", query, ev.table, ev.commit_ts, ev.seq,
                     target.where)
            for w in list(self._warnings):
                self._on_warning(w)
        else:
            log.info("DDL %r on %s (commit ts %d, seq %d) is already in %s; not applied again", query, ev.table,
                     ev.commit_ts, ev.seq, target.where)
        self._warnings = []
        if pos is not None and (applied or state == 0):
            pos.reopen(ev.commit_ts, lambda conn: _mark_rows_done(conn, rec, cf, ev, target.where))
        return applied

    def state(self, changefeed: str, ev: DdlEvent) -> int | None:
        """The record's ``rows_done`` for ``ev`` of ``changefeed`` (None: not applied yet)."""
        return self._read_state(self._record_sql(), changefeed, ev)

    def load_floors(self, changefeed: str) -> int:
        """At-least-once delivery of ``changefeed``: read its floors from the record (see
        :meth:`drop_replayed`); returns 0 (no position)."""
        target = self._target
        self.changefeed = changefeed
        schema = PG_SCHEMA if target.dialect == "postgresql" else None
        with target.transaction(RECORD_TABLE) as conn:
            if not sa.inspect(conn).has_table(RECORD_TABLE, schema=schema):
                return 0  # no DDL applied yet (the table is created by the first one)
            rec = RecordSQL(target.dialect, target.engine.dialect.identifier_preparer)
            rows = conn.exec_driver_sql(rec.floors, (self.changefeed,)).fetchall()
        self.floors = {str(t): int(ts) for t, ts in rows}
        return 0

    def _record_sql(self) -> RecordSQL:
        """The record statements; the table is created once per sink (MySQL/PostgreSQL: autocommit)."""
        target = self._target
        rec = self._record
        if rec is None:
            with target.engine.connect() as conn:
                conn.exec_driver_sql("SELECT 1")
            target.statements()  # the server's flavour (MySQL collation) is known once connected
            rec = RecordSQL(target.dialect, target.engine.dialect.identifier_preparer)
            rec.create(target)  # (MySQL, PostgreSQL: autocommit; SQLite: in the DDL's transaction)
            self._record = rec
        return rec

    def _read_state(self, rec: RecordSQL, cf: str, ev: DdlEvent) -> int | None:
        target = self._target
        with target.engine.begin() as conn:
            if target.dialect == "sqlite":  # (created inside a transaction there: OwnTable)
                conn.exec_driver_sql(rec.create_table, ())
            return _state(conn.exec_driver_sql(rec.select, (cf, ev.commit_ts, ev.seq)).first(), ev, target.where)

    def _check_dropped(self, conn: Connection, ev: DdlEvent) -> None:
        """``TargetTableDropped`` when ``ev`` changes a table the changefeed has had that is missing downstream (module
        docstring); a CREATE or DROP TABLE is never refused here."""
        record, target = self._catalog.record, self._target
        if not record.bound or DdlKind.CREATE_TABLE in ev.kinds or DdlKind.DROP_TABLE in ev.kinds:
            return
        label = target.target_name(ev.table)
        if record.had(conn, label):
            tschema, tname = target.target_parts(ev.table)
            if not sa.inspect(conn).has_table(tname, schema=tschema):
                raise record.refuse(label, ev.table, f"; the schema change {ev.query or ', '.join(ev.kinds)!r} "
                                                     f"(commit ts {ev.commit_ts}) is not applied")

    def _follow_tables(self, conn: Connection, ev: DdlEvent) -> None:
        """The record of the tables the changefeed has had follows ``ev``'s CREATE, DROP and RENAME TABLE."""
        record, target = self._catalog.record, self._target
        if not record.bound:
            return
        label = target.target_name(ev.table)
        for ch in ev.changes:
            if ch.kind == DdlKind.DROP_TABLE:
                record.dropped(conn, label)
            elif ch.kind == DdlKind.CREATE_TABLE:
                record.created(conn, label)
            elif ch.kind == DdlKind.RENAME_TABLE:
                new = ev.new_table or (TableName.parse(ch.new_name) if ch.new_name else None)
                if new is not None:
                    record.renamed(conn, label, target.target_name(new))
                    label = target.target_name(new)

    def _translate(self, ev: DdlEvent) -> DdlPlan:
        target = self._target
        self._warnings = []
        return Translator(target.dialect, target.engine.dialect.identifier_preparer, target.target_parts,
                          mysql_collation=target.mysql_collation,
                          replicate_indexes=self.config.replicate_indexes).translate(ev)

    def _run(self, conn: Connection, step: Step, ev: DdlEvent, query: str, row_source: RowSource | None) -> None:
        target = self._target
        for g in step.guards:
            if not self._holds(conn, g):
                log.info("DDL %r on %s: skipped %s (%s %s %s)", query, ev.table, step.sql or step.kind, g.what,
                         g.name or "", "missing" if g.exists else "present")
                return
        if step.kind == FILL:
            if step.note:  # no value for the existing rows: a divergence when there are rows
                if conn.exec_driver_sql(step.sql, ()).first() is not None:
                    self._warn(ev, step.note)
                return
            conn.exec_driver_sql(step.sql, step.params)
        elif step.kind == EMPTY:
            if conn.exec_driver_sql(step.sql, ()).first() is not None:
                raise DdlRejected(query, str(ev.table), f"target table {self._name(step.table)} already exists with rows "
                                  "(an earlier incarnation of the table, or data loaded there): drop or rename it "
                                  "downstream, or skip this DDL to write into it as it is", commit_ts=ev.commit_ts)
        elif step.kind == DROP_PK:
            t = self._name(step.table)
            if target.dialect == "mysql":
                conn.exec_driver_sql(f"ALTER TABLE {t} DROP PRIMARY KEY", ())
            else:
                pk = sa.inspect(conn).get_pk_constraint(step.table[1], schema=step.table[0]).get("name")
                if pk:
                    conn.exec_driver_sql(f"ALTER TABLE {t} DROP CONSTRAINT {target.statements().q(pk)}", ())
        elif step.kind == REBUILD:
            self._rebuild(conn, step, ev, query)
        elif step.kind == REREAD:
            self._reread(conn, step, ev, row_source)
        elif step.kind == RESCALE:
            exp = Decimal(1).scaleb(-int(step.params[0]))
            rows = conn.exec_driver_sql(step.sql, ()).fetchall()
            fixed = [(decimal_text(Decimal(str(v)).quantize(exp, context=_WIDE)) if _finite(v) else v, rowid) for rowid, v in rows]
            if fixed:
                conn.exec_driver_sql(step.params[1], fixed)
        else:
            conn.exec_driver_sql(step.sql, ())

    def _reread(self, conn: Connection, step: Step, ev: DdlEvent, row_source: RowSource | None) -> None:
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
        source = row_source
        if source is None:
            self._warn(ev, f"column {rr.column}: {step.note}, and this sink has no upstream to read them from")
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
                self._warn(ev, f"column {rr.column}: {step.note}, and reading them back from the upstream failed "
                                f"({exc.message})")
                return
            params = [((row[rr.column] if convert is None or row[rr.column] is None else convert(row[rr.column])), *key)
                      for key, row in zip(batch, rows, strict=True) if row is not None]
            if params:
                conn.exec_driver_sql(rr.update, params)
                done += len(params)
        log.info("DDL on %s: column %s of %d existing row(s) read back from the upstream (%d gone there since)",
                 ev.table, rr.column, done, len(keys) - done)

    def _warn(self, ev: DdlEvent, note: str) -> None:
        self._warnings.append(DataWarning(
            WARN_DEFAULT, str(ev.table), f"{ev.query or ', '.join(ev.kinds)}: the rows already downstream keep NULL "
            f"in the new column(s): {note}"))

    def _name(self, parts: Parts) -> str:
        target = self._target
        q = target.statements().q
        return f"{q(parts[0])}.{q(parts[1])}" if parts[0] else q(parts[1])

    def _rebuild(self, conn: Connection, step: Step, ev: DdlEvent, query: str) -> None:
        """SQLite's 12-step recipe (lang_altertable.html#otheralter) inside the caller's transaction; foreign keys
        are off (the caller turned them off before BEGIN) and checked for the table before the commit."""
        target = self._target
        rb = step.rebuild
        assert rb is not None
        q = target.statements().q
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
            self._warn(ev, step.note)

    def _holds(self, conn: Connection, g: Guard) -> bool:
        target = self._target
        insp = sa.inspect(conn)
        schema, table = g.table
        if not insp.has_table(table, schema=schema):
            return not g.exists if g.what == "table" else False
        if g.what == "table":
            return g.exists
        fold = (lambda s: s) if target.dialect == "postgresql" else str.casefold  # noqa: E731
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


def _state(row: Any, ev: DdlEvent, where: str) -> int | None:
    """The record's ``rows_done`` for ``ev`` (None: not applied yet). A record at the same position of *another*
    table is never taken for this DDL (that skipped it silently when two spans numbered the DDLs of one transaction
    each on their own): it fails loudly instead."""
    if row is None:
        return None
    if str(row[1]) != str(ev.table):
        raise SinkError(f"the DDL record of {where} holds a schema change of table {row[1]} at commit Ts {ev.commit_ts}, "
                        f"seq {ev.seq}, the position of this one ({ev.query or ', '.join(ev.kinds)!r} on {ev.table}): "
                        "two DDLs were given one position, and taking this one for applied would lose it. Not applied; "
                        "apply it downstream by hand, then skip it (`--skip-ddl-ts`), and report this as a bug")
    return int(row[0])


def _record_row(cf: str, ev: DdlEvent, query: str) -> tuple[Any, ...]:
    return (cf, ev.commit_ts, ev.seq, str(ev.table), ",".join(ev.kinds), query[:60000])


def _finite(v: Any) -> bool:
    try:
        return Decimal(str(v)).is_finite()
    except InvalidOperation:
        return False


def _mark_rows_done(conn: Connection, rec: RecordSQL, changefeed: str, ev: DdlEvent, where: str) -> None:
    """In the transaction writing the rows that follow ``ev`` in its upstream transaction: set ``rows_done``
    (module docstring); ``SinkUnavailable`` when another writer set it first."""
    if conn.exec_driver_sql(rec.mark_done, (changefeed, ev.commit_ts)).rowcount < 1:
        raise SinkUnavailable(
            f"changefeed={changefeed}: the rows after DDL {ev.query!r} on {ev.table} (commit ts {ev.commit_ts}) are "
            f"in {where} already (another writer applied them); rolled back, the span restarts from the target")
