"""The target tables a changefeed has had: a table of Tidewater's own in the SQL target (:class:`OwnTable`: schema
``tidewater`` on PostgreSQL, the URI's database elsewhere), ``tidewater_tables``, one row per (changefeed, target
table) that the changefeed created or wrote rows into:

=============  ===================================================================================
changefeed     changefeed id of the sink's position (primary key, with ``table_name``)
table_name     the target table as the sink names it (``schema.table`` on PostgreSQL, ``table`` elsewhere)
span           the span that recorded it
origin_ts      that span's start Ts (its slot's creation point): tells this changefeed from an earlier one of the
               same id that ``remove`` could not clean
recorded_at    when the row was written (the target's clock, UTC)
=============  ===================================================================================

Why: the sink creates a missing target table at the first rows of its upstream table (right for a table new to the
changefeed). A table the changefeed already had that is missing downstream was dropped behind its back; creating it
again would write only the changes from then on, every row it held gone, the changefeed ``normal``. With this record
the sink refuses instead (:class:`TargetTableDropped`, fatal: the changefeed fails naming the table and the fix).

Guarantees:
- Only a sink bound to a changefeed (:meth:`TableRecord.open`, from ``open_position``, or from ``bind_tables_had``: the
  copy job's sinks, which write the initial copy and table copies without a stream position) records or refuses
  anything; an unbound one (a tool's, a test's, a copy job planned without the span's origin) behaves as before. So a
  table only the copy filled is recorded before its first chunk commits (MySQL, PostgreSQL: at binding; SQLite: in
  the chunk's transaction; a table whose key the copy defers: when the job creates or finds it, before any chunk),
  and a stream that finds it missing later refuses it as any other.
- Written **idempotently at binding time**: the first time a sink binds a target table (the catalog read it or
  created it), :meth:`TableRecord.note` upserts its row, before the write's first row of the table. On MySQL and
  PostgreSQL on an autocommit connection of its own, committed at once, as the table's own ``CREATE`` is (MySQL and
  PostgreSQL create tables on an autocommit connection): a binding need not happen in a transaction that commits (the
  parallel apply's planning binds in one it rolls back), and a row recorded for a write that then fails costs nothing
  but a refusal should someone drop that table, which holds nothing of the changefeed yet, behind its back: loud,
  never silent. On SQLite (one writer per file: a second connection would wait for the write's lock) in the write's
  own transaction, committed with its rows or rolled back with them (a failed write makes the record read again). The
  alternative, writing the row with the first rows of the table, would put a statement into the hot path's
  transaction and still miss bindings outside one. No per-row cost: one ``SELECT`` of the changefeed's rows when the
  sink is bound (again only after a failed write made the catalog forget what it knew), one upsert when a table is
  bound that the record does not show yet.
- :meth:`TableRecord.had` is what the catalog asks before it creates a missing table: True for a table recorded
  with this span's origin. A row of another origin (another span of the changefeed, which held the table before
  ``changefeed update`` moved it; or an earlier changefeed of the same id) is not taken for this span's: its table
  is created as a new one, and the row becomes this span's at the binding.
- The legitimate ways a table leaves downstream move the record in the DDL's transaction (PostgreSQL, SQLite) or with
  the DDL's record (MySQL, after its steps, :mod:`sinks.sql.ops.ddl_run`): an upstream DROP TABLE deletes the row, a
  RENAME TABLE moves it to the new name, a CREATE TABLE writes it. :func:`forget` deletes a changefeed's rows
  (``changefeed remove``), :func:`forget_tables` those of tables copied again (a resync: ``cdc cli changefeed
  snapshot --table``), whose copy then creates them anew.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from cdc.errors import TargetTableDropped, TidewaterError
from cdc.events import TableName
from sinks.sql.target.connection import Target
from sinks.sql.target.own_table import OwnTable

log = logging.getLogger(__name__)

RECORD_TABLE = "tidewater_tables"
KAFKA_CONSUMER = "kafka:"  # the position name of a Kafka consumer's target (``cdc cli kafka-consumer``)


class TablesSQL(OwnTable):
    """The record table of one dialect (:class:`OwnTable`) and its statements."""

    def __init__(self, dialect: str, preparer: Any) -> None:
        big, stamp = {"postgresql": ("bigint", "timestamptz"), "mysql": ("bigint", "datetime(6)"),
                      "sqlite": ("INTEGER", "TEXT")}[dialect]
        super().__init__(dialect, preparer, RECORD_TABLE,
                         f"changefeed varchar(255) NOT NULL, table_name varchar(255) NOT NULL, span integer NOT NULL, "
                         f"origin_ts {big} NOT NULL, recorded_at {stamp} NOT NULL, PRIMARY KEY (changefeed, table_name)")
        name, p, now = self.name, self.p, self.now
        self.select = f"SELECT table_name, origin_ts FROM {name} WHERE changefeed = {p}"
        head = (f"INSERT INTO {name} (changefeed, table_name, span, origin_ts, recorded_at) "
                f"VALUES ({p}, {p}, {p}, {p}, {now})")
        if dialect == "mysql":
            self.upsert = (f"{head} ON DUPLICATE KEY UPDATE span = VALUES(span), origin_ts = VALUES(origin_ts), "
                           f"recorded_at = {now}")
        else:
            self.upsert = (f"{head} ON CONFLICT (changefeed, table_name) DO UPDATE SET span = excluded.span, "
                           f"origin_ts = excluded.origin_ts, recorded_at = {now}")
        self.delete = f"DELETE FROM {name} WHERE changefeed = {p} AND table_name = {p}"
        self.move = (f"UPDATE {name} SET table_name = {p}, span = {p}, origin_ts = {p}, recorded_at = {now} "
                     f"WHERE changefeed = {p} AND table_name = {p}")
        self.forget = f"DELETE FROM {name} WHERE changefeed = {p}"


class TableRecord:
    """One sink's view of the record (module docstring): the changefeed, span and origin it is bound to, and the
    target tables recorded with that origin (read once, kept up to date by this sink's own writes)."""

    def __init__(self, target: Target) -> None:
        self._target = target
        self.changefeed = ""  # "": not bound (records and refuses nothing)
        self._span = 0
        self._origin = 0
        self._sql: TablesSQL | None = None
        self._had: set[str] | None = None  # None: to be read (at the next question)
        self._upstream: dict[str, TableName] = {}  # target table -> its upstream table, as bound by this sink

    @property
    def bound(self) -> bool:
        return bool(self.changefeed)

    def sql(self) -> TablesSQL:
        if self._sql is None:
            self._sql = TablesSQL(self._target.dialect, self._target.engine.dialect.identifier_preparer)
        return self._sql

    def open(self, changefeed: str, span: int, origin: int) -> None:
        """Bind to ``changefeed``'s span ``span`` started at ``origin``: create the table if missing (MySQL,
        PostgreSQL: autocommit; SQLite: in its own transaction) and read the changefeed's rows."""
        target, sql = self._target, self.sql()
        sql.create(target)
        with target.transaction(sql.label) as conn:
            if target.dialect == "sqlite":
                conn.exec_driver_sql(sql.create_table, ())
            self.changefeed, self._span, self._origin = changefeed, span, origin
            self._read(conn)

    def forget_cache(self) -> None:
        """What this sink knew may have been rolled back (a write failed): read the rows again at the next question."""
        self._had = None

    def _read(self, conn: Connection) -> set[str]:
        rows = conn.exec_driver_sql(self.sql().select, (self.changefeed,)).fetchall()
        self._had = {str(t) for t, origin in rows if int(origin) == self._origin}
        return self._had

    def shows(self, label: str) -> bool:
        """Whether the record as last read shows ``label`` as this span's (no I/O)."""
        return self._had is not None and label in self._had

    def had(self, conn: Connection, label: str) -> bool:
        """Whether this changefeed (this span's origin) has had target table ``label`` (module docstring). Asked only
        before a missing table is created: a label the rows as last read do not show is looked up again (one
        ``SELECT``), since another sink of the changefeed may have recorded it since (the copy job's, filling a table
        while this span streams: a table copy)."""
        if not self.changefeed:
            return False
        if self._had is not None and label in self._had:
            return True
        return label in self._read(conn)

    def note(self, conn: Connection, label: str, upstream: TableName) -> None:
        """``label`` (of upstream table ``upstream``) is bound by a write on ``conn``: recorded unless the record shows
        it (module docstring: SQLite in ``conn``'s transaction, MySQL and PostgreSQL on an autocommit connection)."""
        if not self.changefeed:
            return
        self._upstream[label] = upstream
        if self._had is not None and label in self._had:
            return
        if self._target.dialect == "sqlite":
            self._note(conn, label)
            return
        with self._target.engine.connect() as own:
            own.execution_options(isolation_level="AUTOCOMMIT")
            self._note(own, label)

    def _note(self, conn: Connection, label: str) -> None:
        had = self._had if self._had is not None else self._read(conn)
        if label not in had:
            conn.exec_driver_sql(self.sql().upsert, (self.changefeed, label, self._span, self._origin))
            had.add(label)
            log.info("changefeed=%s: target table %s recorded as the changefeed's", self.changefeed, label)

    def refuse(self, label: str, upstream: TableName | str, why: str = "") -> TargetTableDropped:
        """The error for target table ``label`` of upstream ``upstream``, recorded as had and missing downstream."""
        cf = self.changefeed
        if cf.startswith(KAFKA_CONSUMER):  # (sinks.kafka.applier's position: no changefeed to resync)
            who, fix = f"the Kafka consumer {cf}", "rebuild the target from the topics' start into an empty database"
        else:
            who = f"changefeed {cf}"
            fix = (f"copy it again with `cdc cli changefeed snapshot -c {cf} --table {upstream}`, then "
                   f"`cdc cli changefeed resume -c {cf}`; or remove the changefeed and create it again")
        return TargetTableDropped(
            f"target table {label} (upstream {upstream}) is missing in {self._target.where}, yet {who} created it or "
            f"wrote rows into it and applied no upstream DROP or RENAME TABLE of it: it was dropped behind the "
            f"changefeed's back{why}. Not created again, which would lose every row it held. Fix: {fix}", table=label)

    def explain(self, exc: BaseException, table: str | None) -> TargetTableDropped | None:
        """A write failed with ``exc`` while it wrote ``table`` (target or upstream name, as the writer names the
        table it writes): the error to raise instead when the target said that table does not exist and it is one
        this changefeed has had (dropped while this sink held it bound); None otherwise. Reads the record again and
        the catalog on a connection of its own (a failed write's path only)."""
        if not self.changefeed or not table or not _missing_table(self._target.dialect, exc):
            return None
        found = [(label, up) for label, up in self._upstream.items() if table in (label, str(up))]
        if not found:
            return None
        label, upstream = found[0]
        tschema, tname = self._target.target_parts(upstream)
        self._had = None
        with self._target.engine.connect() as conn:
            if not self.had(conn, label) or sa.inspect(conn).has_table(tname, schema=tschema):
                return None
        return self.refuse(label, upstream)

    # ---- the DDL path (sinks.sql.ops.ddl_run), inside the DDL's transaction or with its record ---------------
    def dropped(self, conn: Connection, label: str) -> None:
        """An upstream DROP TABLE of ``label`` was applied."""
        if self.changefeed:
            conn.exec_driver_sql(self.sql().delete, (self.changefeed, label))
            if self._had is not None:
                self._had.discard(label)

    def created(self, conn: Connection, label: str) -> None:
        """An upstream CREATE TABLE of ``label`` was applied (the table is downstream now)."""
        if self.changefeed:
            conn.exec_driver_sql(self.sql().upsert, (self.changefeed, label, self._span, self._origin))
            if self._had is not None:
                self._had.add(label)

    def renamed(self, conn: Connection, old: str, new: str) -> None:
        """An upstream RENAME TABLE ``old`` -> ``new`` was applied: a row of ``old`` follows to ``new``."""
        if not self.changefeed or old == new:
            return
        sql = self.sql()
        conn.exec_driver_sql(sql.delete, (self.changefeed, new))
        moved = conn.exec_driver_sql(sql.move, (new, self._span, self._origin, self.changefeed, old)).rowcount
        if self._had is not None:
            self._had.discard(old)
            if moved:  # (the row is this span's now)
                self._had.add(new)
            else:
                self._had.discard(new)


def _missing_table(dialect: str, exc: BaseException) -> bool:
    """Whether ``exc`` (a driver error, or our error wrapping one) says a table does not exist."""
    cause = exc.__cause__ if isinstance(exc, TidewaterError) else exc
    orig = getattr(cause, "orig", cause)
    if dialect == "postgresql":
        return getattr(orig, "pgcode", None) == "42P01"  # undefined_table
    if dialect == "mysql":
        args = getattr(orig, "args", ())
        return bool(args) and args[0] == 1146  # ER_NO_SUCH_TABLE
    return isinstance(orig, sqlite3.OperationalError) and "no such table" in str(orig)


def forget(target: Target, sql: TablesSQL, changefeed: str) -> int:
    """Delete ``changefeed``'s rows (``changefeed remove``); returns how many went (0 when there is no table)."""
    with target.transaction(sql.label) as conn:
        if not sql.exists(conn):
            return 0
        return int(conn.exec_driver_sql(sql.forget, (changefeed,)).rowcount)


def forget_tables(target: Target, sql: TablesSQL, changefeed: str, labels: Sequence[str]) -> int:
    """Delete the rows of target tables ``labels`` of ``changefeed`` (they are copied again: a resync); returns how
    many went."""
    with target.transaction(sql.label) as conn:
        if not sql.exists(conn):
            return 0
        return sum(int(conn.exec_driver_sql(sql.delete, (changefeed, label)).rowcount) for label in labels)
