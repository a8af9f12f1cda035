"""Exactly-once delivery into SQL targets: each span's applied position, stored in the target itself.

The target holds one small table (default name ``tidewater_checkpoint``; on PostgreSQL in schema
``tidewater``, on MySQL/MariaDB and SQLite in the sink URI's database), one row per (changefeed, span):

=============  ===================================================================================
changefeed     changefeed id (primary key, with ``span``)
span           span index
commit_ts      commit Ts (upstream commit end LSN) of the last upstream transaction applied downstream
commit_time    that transaction's upstream commit time (UTC)
origin_ts      the span's start Ts (its slot's creation point): tells this changefeed from an earlier
               one that had the same id
updated_at     when the row was last written (the target's clock, UTC)
=============  ===================================================================================

Guarantees:
- :meth:`Position.open` creates the table when it is missing (``CREATE .. IF NOT EXISTS``; on MySQL and
  PostgreSQL on an autocommit connection, as the sink does for every table; on SQLite in its own
  transaction), creates the span's row (commit Ts 0) when it is missing, and returns the applied Ts. A row
  whose ``origin_ts`` is not the span's belongs to an earlier changefeed of the same id that ``remove``
  could not clean: it is reset to 0 (logged), never trusted.
- :meth:`Position.record` runs inside the caller's downstream transaction, after the rows and before the
  commit, so the position and the rows commit together or not at all. It is a compare-and-set: it moves
  the row from the Ts this sink last read or wrote to the new one and raises :class:`SinkUnavailable`
  (retryable: the span restarts, reads the position again and skips what is there) when the row holds
  something else, i.e. another writer (a frozen capture's successor) advanced the span meanwhile. So
  even a writer whose lease fence failed to stop it cannot apply a transaction twice.
- :func:`forget` deletes a changefeed's rows (``remove``), and those of the applied table; the tables stay.
- :class:`Tracked` wraps one write's changes: drops those at or below the applied Ts, notes the last one.

Several apply workers (``[sink] worker-count`` > 1, :mod:`sinks.sql.ops.parallel`): one write's transactions are
applied in several downstream transactions that commit independently, so the position alone cannot say which of
the transactions above it are downstream after a crash between those commits. Then (``Position(parallel=True)``):

- a second small table, the *applied table* (``<checkpoint-table>_applied``, next to the position table), holds one
  row (changefeed, span, commit_ts) per upstream transaction applied above the position; primary key all three.
  Each worker's downstream transaction first takes the span's position row in share mode and checks it still
  holds ``applied`` (:meth:`Position.hold`: a successor that moved the position makes an old writer fail here,
  and a position move waits for the workers that hold it), then inserts its transactions' rows
  (:meth:`Position.mark`), all in that one transaction: after their changes when the worker applies transactions as
  they are handed to it (a streamed write, ``ParallelApply.stream``), before them for a staged list (on PostgreSQL
  the check and the rows are then one statement, :meth:`Position.hold_and_mark`: rows inserted only while the
  share-locked row holds ``applied``):
  a duplicate key means another writer
  (a fenced-off zombie, or its successor) applied that transaction already, and raises :class:`SinkUnavailable`
  (rolled back, the span restarts and reads again). No transaction is applied twice, even by a writer whose
  lease fence failed: both writers insert the same (changefeed, span, commit_ts) and only one commits it (the
  second waits on the first's uncommitted row, then fails on the duplicate).
- the position moves (:meth:`Position.record`, compare-and-set as above) only after every worker of the write
  committed, i.e. to the end of a contiguous prefix of applied transactions, and in the same transaction deletes the
  applied rows at or below it (compaction; on PostgreSQL in the same statement, a data-modifying ``WITH``). A transaction at or below the position is never looked up in the
  applied table: a writer that read the position before that compaction fails :meth:`Position.hold` instead.
- :meth:`Position.open` also reads the applied rows above the position (``done``): a restart skips them
  (:func:`skip_done`), and applies everything else above the position.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from cdc.errors import SinkUnavailable
from cdc.events import RowChange
from sinks.sql.target.connection import Target
from sinks.sql.target.own_table import OwnTable

log = logging.getLogger(__name__)

DEFAULT_TABLE = "tidewater_checkpoint"


class PositionSQL(OwnTable):
    """The position table of one dialect (:class:`OwnTable`) and its statements (parameters in the driver's
    paramstyle)."""

    def __init__(self, dialect: str, preparer: sa.sql.compiler.IdentifierPreparer, table: str) -> None:
        q = preparer.quote
        if dialect == "postgresql":
            types = ("varchar(255)", "integer", "bigint", "timestamptz", "bigint", "timestamptz")
        elif dialect == "mysql":
            types = ("varchar(255)", "int", "bigint", "datetime(6)", "bigint", "datetime(6)")
        else:
            types = ("TEXT", "INTEGER", "INTEGER", "TEXT", "INTEGER", "TEXT")
        cf, sp, ts, ct, origin, upd = (q(c) for c in ("changefeed", "span", "commit_ts", "commit_time",
                                                         "origin_ts", "updated_at"))
        super().__init__(dialect, preparer, table,
                         f"{cf} {types[0]} NOT NULL, {sp} {types[1]} NOT NULL, {ts} {types[2]} NOT NULL, "
                         f"{ct} {types[3]} NULL, {origin} {types[4]} NOT NULL, {upd} {types[5]} NOT NULL, "
                         f"PRIMARY KEY ({cf}, {sp})")
        name, p, now = self.name, self.p, self.now
        at = {"postgresql": f"to_timestamp({p})", "mysql": f"FROM_UNIXTIME({p})",
              "sqlite": f"strftime('%Y-%m-%d %H:%M:%f', {p}, 'unixepoch')"}[dialect]
        ignore = {"postgresql": ("INSERT INTO", f" ON CONFLICT ({cf}, {sp}) DO NOTHING"),
                  "mysql": ("INSERT INTO", f" ON DUPLICATE KEY UPDATE {sp} = {sp}"),
                  "sqlite": ("INSERT OR IGNORE INTO", "")}[dialect]
        self.insert = (f"{ignore[0]} {name} ({cf}, {sp}, {ts}, {ct}, {origin}, {upd}) "
                       f"VALUES ({p}, {p}, 0, NULL, {p}, {now}){ignore[1]}")
        self.select = f"SELECT {ts}, {origin} FROM {name} WHERE {cf} = {p} AND {sp} = {p}"
        self.reset = (f"UPDATE {name} SET {ts} = 0, {ct} = NULL, {origin} = {p}, {upd} = {now} "
                      f"WHERE {cf} = {p} AND {sp} = {p}")
        self.record = (f"UPDATE {name} SET {ts} = {p}, {ct} = {at}, {upd} = {now} "
                       f"WHERE {cf} = {p} AND {sp} = {p} AND {ts} = {p}")
        self.forget = f"DELETE FROM {name} WHERE {cf} = {p}"
        # share-lock the span's row and read its Ts (a worker's transaction, parallel apply)
        lock = "FOR SHARE" if dialect == "postgresql" else "LOCK IN SHARE MODE" if dialect == "mysql" else ""
        self.hold = f"SELECT {ts} FROM {name} WHERE {cf} = {p} AND {sp} = {p} {lock}".rstrip()
        # lock the span's row exclusively and read its Ts: waits for every worker transaction holding it (the
        # staging sink's open, sinks.sql.ops.barrier)
        self.seize = f"SELECT {ts} FROM {name} WHERE {cf} = {p} AND {sp} = {p}" + (" FOR UPDATE" if lock else "")
        # the applied table (parallel apply): one row per upstream transaction applied above the position
        self.applied = OwnTable(dialect, preparer, table[:55] + "_applied",
                                f"{cf} {types[0]} NOT NULL, {sp} {types[1]} NOT NULL, {ts} {types[2]} NOT NULL, "
                                f"PRIMARY KEY ({cf}, {sp}, {ts})")
        aname = self.applied.name
        self.applied_table, self.applied_label, self.applied_name = self.applied.table, self.applied.label, aname
        self.create_applied = self.applied.create_table
        self.mark_head = f"INSERT INTO {aname} ({cf}, {sp}, {ts}) VALUES "
        self.mark_row = f"({p}, {p}, {p})"
        self.select_done = f"SELECT {ts} FROM {aname} WHERE {cf} = {p} AND {sp} = {p} AND {ts} > {p}"
        self.compact = f"DELETE FROM {aname} WHERE {cf} = {p} AND {sp} = {p} AND {ts} <= {p}"
        self.clear_span = f"DELETE FROM {aname} WHERE {cf} = {p} AND {sp} = {p}"
        self.forget_applied = f"DELETE FROM {aname} WHERE {cf} = {p}"
        # PostgreSQL, one round trip each (parallel apply's bookkeeping on the target's serial chain):
        # hold + mark: the applied rows of an array of commit Ts, inserted only while the share-locked position row
        # still holds the Ts this writer read (no row inserted: it does not, or the row is gone)
        # record + compact: the compare-and-set, and the applied rows at or below the new Ts deleted by the same
        # statement (its row count is the UPDATE's)
        self.hold_mark: str | None = None
        self.record_compact: str | None = None
        if dialect == "postgresql":
            self.hold_mark = (f"INSERT INTO {aname} ({cf}, {sp}, {ts}) SELECT h.{cf}, h.{sp}, t.ts "
                              f"FROM (SELECT {cf}, {sp} FROM {name} WHERE {cf} = {p} AND {sp} = {p} AND {ts} = {p} "
                              f"FOR SHARE) h CROSS JOIN unnest({p}::bigint[]) AS t(ts)")
            self.record_compact = (f"WITH compacted AS ({self.compact}) {self.record}")


class Position:
    """One span's applied position in one SQL sink (see the module docstring for the guarantees)."""

    def __init__(self, target: Target, sql: PositionSQL, changefeed: str, span: int, origin: int, *,
                 parallel: bool = False) -> None:
        self._target = target
        self.parallel = parallel  # several apply workers: the applied table is kept (module docstring)
        self.done: set[int] = set()  # commit Ts above ``applied`` found in the applied table (parallel)
        self.sql = sql
        self.changefeed = changefeed
        self.span = span
        self.origin = origin
        self.applied = 0  # commit Ts of the last transaction downstream, as this sink last read or wrote it
        # a DDL's commit Ts whose transaction continues after the DDL (sinks.sql.ops.ddl_run): its remaining rows
        # are written although ``applied`` may already be that Ts, and ``_on_reopened`` marks them done
        self.reopened = 0
        self._on_reopened: Callable[[Connection], Any] | None = None

    def open(self) -> int:
        """Create the table and the span's row if missing; read and return the applied commit Ts."""
        target, sql = self._target, self.sql
        sql.create(target)  # (MySQL, PostgreSQL: autocommit)
        if self.parallel:
            sql.applied.create(target)
        with target.transaction(sql.label) as conn:
            if target.dialect == "sqlite":
                conn.exec_driver_sql(sql.create_table, ())
                if self.parallel:
                    conn.exec_driver_sql(sql.create_applied, ())
            key = (self.changefeed, self.span)
            conn.exec_driver_sql(sql.insert, (*key, self.origin))
            row = conn.exec_driver_sql(sql.select, key).one()
            applied, origin = int(row[0]), int(row[1])
            if self.origin and origin != self.origin:
                log.warning("changefeed=%s span=%d: %s held position %d of an earlier changefeed with this id "
                            "(origin %d, this one starts at %d); reset to 0", self.changefeed, self.span,
                            sql.label, applied, origin, self.origin)
                conn.exec_driver_sql(sql.reset, (self.origin, *key))
                if self.parallel:
                    conn.exec_driver_sql(sql.clear_span, key)
                applied = 0
            if self.parallel:
                self.done = {int(r[0]) for r in conn.exec_driver_sql(sql.select_done, (*key, applied))}
                if self.done:
                    log.info("changefeed=%s span=%d: %d transaction(s) above position %d are already downstream "
                             "(applied table %s): the replay skips them", self.changefeed, self.span, len(self.done),
                             applied, sql.applied_label)
        self.applied = applied
        return applied

    def hold(self, conn: Connection) -> None:
        """Inside a worker's open transaction: share-lock the span's position row and check that it still holds
        ``applied`` (else :class:`SinkUnavailable`: another writer moved it)."""
        row = conn.exec_driver_sql(self.sql.hold, (self.changefeed, self.span)).first()
        if row is None or int(row[0]) != self.applied:
            raise SinkUnavailable(
                f"changefeed={self.changefeed} span={self.span}: the applied position in {self.sql.label} is no "
                f"longer {self.applied} (another writer advanced this span, or the row was deleted); "
                "rolled back, the span restarts from the position the target holds")

    def seize(self, conn: Connection) -> None:
        """Inside the caller's open transaction: lock the span's position row exclusively (waiting for every worker
        transaction that holds it in share mode to commit or roll back, and keeping new ones out until the caller's
        commit), check that it still holds ``applied`` (else :class:`SinkUnavailable`) and read ``done`` again from
        the applied table, which then stays as read until the caller commits: no writer of the span can be in the
        middle of a transaction meanwhile."""
        row = conn.exec_driver_sql(self.sql.seize, (self.changefeed, self.span)).first()
        if row is None or int(row[0]) != self.applied:
            raise SinkUnavailable(
                f"changefeed={self.changefeed} span={self.span}: the applied position in {self.sql.label} is no "
                f"longer {self.applied} (another writer advanced this span, or the row was deleted); "
                "rolled back, the span restarts from the position the target holds")
        if self.parallel:
            self.done = {int(r[0]) for r in conn.exec_driver_sql(self.sql.select_done,
                                                                 (self.changefeed, self.span, self.applied))}

    def hold_and_mark(self, conn: Connection, commits: list[int]) -> None:
        """:meth:`hold` then :meth:`mark` (the same guarantees, the same errors); on PostgreSQL in one statement
        (``PositionSQL.hold_mark``): the applied rows are inserted only if the share-locked position row still holds
        ``applied``, else none is and :class:`SinkUnavailable` says the position moved."""
        sql = self.sql
        if sql.hold_mark is None or not commits:
            self.hold(conn)
            self.mark(conn, commits)
            return
        try:
            n = conn.exec_driver_sql(sql.hold_mark, (self.changefeed, self.span, self.applied, commits)).rowcount
        except sa.exc.IntegrityError as exc:
            raise SinkUnavailable(
                f"changefeed={self.changefeed} span={self.span}: a transaction of commits {commits[0]}..{commits[-1]} "
                f"is in {sql.applied_label} already (another writer applied it); rolled back, the span restarts "
                "and skips what is there") from exc
        if n != len(commits):
            raise SinkUnavailable(
                f"changefeed={self.changefeed} span={self.span}: the applied position in {sql.label} is no "
                f"longer {self.applied} (another writer advanced this span, or the row was deleted); "
                "rolled back, the span restarts from the position the target holds")

    def mark(self, conn: Connection, commits: list[int]) -> None:
        """Inside a worker's open transaction: one applied row per upstream transaction ``commits``;
        :class:`SinkUnavailable` when one is there already (applied by another writer)."""
        sql = self.sql
        key = (self.changefeed, self.span)
        for i in range(0, len(commits), 1000):
            chunk = commits[i:i + 1000]
            params: list[Any] = []
            for ts in chunk:
                params.extend((*key, ts))
            try:
                conn.exec_driver_sql(sql.mark_head + ", ".join([sql.mark_row] * len(chunk)), tuple(params))
            except sa.exc.IntegrityError as exc:
                raise SinkUnavailable(
                    f"changefeed={self.changefeed} span={self.span}: a transaction of commits {chunk[0]}..{chunk[-1]} "
                    f"is in {sql.applied_label} already (another writer applied it); rolled back, the span restarts "
                    "and skips what is there") from exc

    def skip_at(self) -> int:
        """Changes with a commit Ts at or below this are already downstream (``applied``, except for a
        transaction reopened after its DDL)."""
        return self.applied - 1 if self.reopened and self.reopened == self.applied else self.applied

    def reopen(self, commit_ts: int, on_written: Callable[[Connection], Any]) -> None:
        """The DDL at ``commit_ts`` was applied: the rows of its transaction that follow it are still to be
        written; ``on_written(conn)`` runs in the transaction of the write that records them."""
        self.reopened, self._on_reopened = commit_ts, on_written

    def record(self, conn: Connection, commit_ts: int, commit_time: float) -> None:
        """Move the row to ``commit_ts`` inside ``conn``'s open transaction (compare-and-set)."""
        compacted = self.parallel and self.sql.record_compact is not None
        res = self._sink_exec(conn, commit_ts, commit_time, compacted)
        if res != 1:
            raise SinkUnavailable(
                f"changefeed={self.changefeed} span={self.span}: the applied position in {self.sql.label} is no "
                f"longer {self.applied} (another writer advanced this span, or the row was deleted); "
                "rolled back, the span restarts from the position the target holds")
        if self.parallel and not compacted:
            conn.exec_driver_sql(self.sql.compact, (self.changefeed, self.span, commit_ts))
        if self._on_reopened is not None and commit_ts >= self.reopened:
            self._on_reopened(conn)

    def committed(self, commit_ts: int) -> None:
        """The transaction that recorded ``commit_ts`` committed."""
        self.applied = commit_ts
        if self.done:
            self.done = {ts for ts in self.done if ts > commit_ts}
        if commit_ts >= self.reopened:
            self.reopened, self._on_reopened = 0, None

    def _sink_exec(self, conn: Connection, commit_ts: int, commit_time: float, compacted: bool = False) -> int:
        params = (commit_ts, commit_time or time.time(), self.changefeed, self.span, self.applied)
        if compacted:
            assert self.sql.record_compact is not None
            return _rowcount(conn, self.sql.record_compact, (self.changefeed, self.span, commit_ts, *params))
        return _rowcount(conn, self.sql.record, params)


def _rowcount(conn: Connection, sql: str, params: tuple[Any, ...]) -> int:
    """Run ``sql`` with ``params`` in ``conn``'s open transaction through a plain cursor of its driver connection (as
    the write's rows go: ``sinks.sql.ops.output``) and return its row count. Once per write: SQLAlchemy's execution
    context around the same statement cost ~100 us of Python, a third of a small write's CPU (single-row upstream
    transactions). A driver error is raised as the driver's (the transaction frame classifies it)."""
    cur = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
    try:
        cur.execute(sql, params)
        return int(cur.rowcount)
    finally:
        cur.close()


def forget(target: Target, sql: PositionSQL, changefeed: str) -> int:
    """Delete ``changefeed``'s rows; returns how many went (0 when the table does not exist)."""
    with target.transaction(sql.label) as conn:
        inspector = sa.inspect(conn)
        if inspector.has_table(sql.applied_table, schema=sql.schema):
            conn.exec_driver_sql(sql.forget_applied, (changefeed,))
        if not inspector.has_table(sql.table, schema=sql.schema):
            return 0
        return int(conn.exec_driver_sql(sql.forget, (changefeed,)).rowcount)


def skip_done(changes: Iterable[RowChange], done: set[int]) -> Iterator[RowChange]:
    """``changes`` without those of the transactions in ``done`` (applied already, parallel apply)."""
    for ch in changes:
        if ch.commit_ts not in done:
            yield ch


class Tracked:
    """The changes of one ``write`` after the span's applied position: drops the leading changes whose
    commit Ts is at or below ``applied`` (already downstream; input is ordered by commit Ts) and notes the
    last change's commit Ts and time once exhausted. Per change it costs one generator step; the
    comparison runs only until the first change past ``applied``."""

    __slots__ = ("_it", "applied", "skipped", "last_ts", "last_time", "done")

    def __init__(self, changes: Iterable[RowChange], applied: int) -> None:
        self.applied = applied
        self.skipped = 0
        self.last_ts = 0
        self.last_time = 0.0
        self.done = False
        self._it = self._gen(iter(changes))

    def __iter__(self) -> Iterator[RowChange]:
        return self._it

    def _gen(self, it: Iterator[RowChange]) -> Iterator[RowChange]:
        applied = self.applied
        for ch in it:
            if ch.commit_ts > applied:
                break
            self.skipped += 1
        else:
            self.done = True
            return
        yield ch
        for ch in it:  # noqa: B020 - ch ends as the call's last change
            yield ch
        self.done = True
        self.last_ts, self.last_time = ch.commit_ts, ch.commit_time
