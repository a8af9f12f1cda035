"""``[consistency] mode = "snapshot"`` in an SQL target (docs/consistency.md): a span's staging write, and the
coordinator's apply of one barrier.

Guarantees (the contract of ``sinks.base.BarrierSink``):

- :meth:`Stager.write` stages one ``write``'s changes above the span's position and moves the position, in one
  downstream transaction (fenced): exactly once, as a direct write, but nothing of it in the real tables. With
  ``[sink] worker-count`` > 1 the write's transactions are staged by the parallel-apply workers
  (``sinks.sql.ops.parallel``), each list in its own downstream transaction with its transactions' applied rows, and
  the position moves once every worker committed: exactly once by parallel apply's argument (that module's
  docstring); a crash between the workers' commits leaves whole transactions staged above the position, which
  :meth:`Stager.open` keeps and the replay skips. A transaction is never split over workers, so its pieces stay
  numbered from 0 per (span, commit Ts).
- :meth:`BarrierApply.apply` makes every staged change at or below a barrier visible in one downstream transaction:
  it first moves the changefeed's barrier head (the position row of span :data:`BARRIER_SPAN` in the position table,
  compare-and-set: a racing coordinator waits on that row and then fails with ``SinkUnavailable``), then applies the
  staged changes through the sink's ordinary writer (windows of whole transactions, net effect per key, foreign-key
  order: set-based multi-row statements, COPY on PostgreSQL), records the barrier in ``tidewater_syncpoint`` and
  deletes the staged pieces, and commits. Any failure rolls all of it back: the target shows the previous barrier
  and the staged rows are still there for the next attempt (this or another coordinator).
- The head is opened (read, created when missing) on first use and again after any failure, so a coordinator never
  trusts a head value another one may have moved.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

from sqlalchemy.engine import Connection

from cdc.errors import SinkError
from cdc.events import RowChange
from sinks.base import BarrierApplied, Fence
from sinks.sql.ops.parallel import ParallelApply, Txn, collector_paused
from sinks.sql.ops.writer import Writer
from sinks.sql.target.connection import Target
from sinks.sql.target.position import Position, PositionSQL, Tracked
from sinks.sql.target.staging import StageSQL

log = logging.getLogger(__name__)

BARRIER_SPAN = -1
"""The span index of a changefeed's barrier head in the position table (spans are 0 and up)."""


def create_tables(target: Target, stage: StageSQL, conn: Connection | None = None) -> None:
    """The staging and syncpoint tables, if missing: autocommit (MySQL, PostgreSQL), or inside ``conn``'s open
    transaction (SQLite)."""
    if target.dialect == "sqlite":
        if conn is not None:
            for statement in stage.create_tables:
                conn.exec_driver_sql(statement, ())
        return
    stage.create(target)


class Stager:
    """The staging write of one span's sink (module docstring); ``position`` is the span's exactly-once position.
    ``parallel``: the sink's apply workers (``[sink] worker-count`` > 1), which then stage a write's transactions on
    several connections (:meth:`write`)."""

    def __init__(self, target: Target, stage: StageSQL, parallel: ParallelApply | None = None) -> None:
        self._target = target
        self._stage = stage
        self._parallel = parallel

    def open(self, position: Position) -> None:
        """Create the tables if missing and delete the span's staged pieces above its position: with one worker
        those can only be an earlier changefeed's of the same id (its position was reset), since a piece commits
        with the position. With several (``position.parallel``) the pieces of the transactions in the applied table
        stay (staged whole by a worker that committed before a crash: the replay skips them, ``position.done``):
        the position row is locked first (:meth:`Position.seize`: no worker of a zombie writer is then in the
        middle of its transaction, and none starts until this one commits) and ``done`` read again under it, so
        the pieces kept are exactly those of ``done``."""
        target, stage = self._target, self._stage
        create_tables(target, stage)
        with target.transaction(stage.label) as conn:
            create_tables(target, stage, conn)
            keep = None
            if position.parallel:
                position.seize(conn)
                keep = position.sql.applied_name
            gone = stage.clear_above(conn, position.changefeed, position.span, position.applied, keep=keep)
        if gone:
            log.info("changefeed=%s span=%d: deleted %d staged piece(s) above position %d (kept those of %d "
                     "transaction(s) staged whole before a restart)", position.changefeed, position.span, gone,
                     position.applied, len(position.done))

    def tables_staged(self, position: Position, commit_ts: int) -> set[str]:
        """The upstream tables (``str(TableName)``) of the changes the span staged under ``commit_ts`` (read back
        from the target: also those staged before a restart). Decodes the pieces: asked only at a schema change."""
        stage = self._stage
        with self._target.transaction(stage.label) as conn:
            return {str(ch.schema.name) for ch in stage.staged_at(conn, position.changefeed, position.span, commit_ts)}

    def write(self, position: Position, changes: Iterable[RowChange], fence: Fence | None) -> int:
        """Stage ``changes`` above ``position`` (the caller dropped those of ``position.done``) and move it.

        With one worker, or for a write the parallel workers do not take (past their bound, one transaction, the
        rest of a transaction after its DDL): in one downstream transaction. Else (:meth:`_write_parallel`) each
        worker stages its share of the write's transactions in its own downstream transaction with their applied
        rows, and the position moves once every one committed. Either way a piece's key refuses a second writer of
        the same transaction (``SinkUnavailable``, ``StageSQL.stage_changes``)."""
        parallel = self._parallel
        if parallel is not None:
            with collector_paused():  # while the write's changes are held in memory
                txns, rest = parallel.read(changes, position.skip_at())
                if rest is None:
                    if len(txns) > 1 and not position.reopened:
                        return self._write_parallel(parallel, position, txns, fence)
                    changes = [ch for t in txns for ch in t.changes]
            if rest is not None:
                changes = rest
        return self._write_one(position, changes, fence)

    def _write_parallel(self, parallel: ParallelApply, position: Position, txns: list[Txn],
                        fence: Fence | None) -> int:
        """``txns`` in one round of lists split by size (staged pieces never conflict: each transaction's have keys
        of their own), staged by the workers as parallel apply applies (``sinks.sql.ops.parallel``: the position row
        held in share mode and checked, the transactions recorded in the applied table, then their pieces, one
        downstream transaction per worker, committed after the fence); then the position moves to the last one."""
        stage, changefeed, span = self._stage, position.changefeed, position.span

        def body(conn: Connection, _k: int, lst: list[Txn]) -> int:
            return stage.stage_changes(conn, changefeed, span, (ch for t in lst for ch in t.changes))

        rounds = parallel.split(txns)
        if len(rounds[0]) == 1:  # one list (a transaction holds most of the write): one connection, no applied rows
            return self._write_one(position, [ch for t in txns for ch in t.changes], fence)
        return parallel.apply(txns, rounds, position, fence, body)

    def _write_one(self, position: Position, changes: Iterable[RowChange], fence: Fence | None) -> int:
        tracked = Tracked(changes, position.skip_at())
        stage = self._stage
        with self._target.transaction(stage.label, fence=fence) as conn:
            resume = (0, 0)
            if position.skip_at() < position.applied:  # the rest of a transaction split at its DDL
                resume = (position.applied, stage.next_piece(conn, position.changefeed, position.span,
                                                             position.applied))
            count = stage.stage_changes(conn, position.changefeed, position.span, tracked, resume=resume)
            if not tracked.done:
                raise SinkError("internal: the staging write returned before consuming its changes")
            if tracked.last_ts:
                position.record(conn, tracked.last_ts, tracked.last_time)
        if tracked.last_ts:
            position.committed(tracked.last_ts)
        return count


class BarrierApply:
    """The coordinator's apply of barriers into one target (module docstring). ``writer(conn)`` builds the sink's
    writer inside ``conn``'s transaction; ``history`` keeps every syncpoint row."""

    def __init__(self, target: Target, positions: PositionSQL, stage: StageSQL,
                 writer: Callable[[Connection], Writer]) -> None:
        self._target = target
        self._positions = positions
        self._stage = stage
        self._writer = writer
        self._heads: dict[str, Position] = {}

    def _head(self, changefeed: str, origin: int) -> Position:
        head = self._heads.get(changefeed)
        if head is None or head.origin != origin:
            head = Position(self._target, self._positions, changefeed, BARRIER_SPAN, origin)
            self._target.guarded(head.open, self._positions.label)
            create_tables(self._target, self._stage)
            self._heads[changefeed] = head
        return head

    def applied(self, changefeed: str, origin: int) -> int:
        """The barrier the target shows (re-read)."""
        self._heads.pop(changefeed, None)
        return self._head(changefeed, origin).applied

    def apply(self, changefeed: str, origin: int, barrier: int, barrier_time: float, *, history: bool,
              fence: Fence | None = None) -> BarrierApplied:
        """Apply ``barrier`` (module docstring)."""
        head = self._head(changefeed, origin)
        if barrier <= head.applied:
            return BarrierApplied(head.applied)
        target, stage = self._target, self._stage
        writer: Writer | None = None
        started = time.monotonic()
        try:
            with target.transaction(lambda: writer.current if writer is not None else stage.label,
                                    fence=fence) as conn:
                create_tables(target, stage, conn)
                head.record(conn, barrier, barrier_time)  # first: the row lock orders racing coordinators
                writer = self._writer(conn)
                pipeline = target.pipeline
                changes = writer.run(stage.read(conn, changefeed, barrier, pipeline.drain))
                writer.current = stage.label
                pieces = stage.finish(conn, changefeed, barrier, barrier_time, history=history)
        except BaseException:
            self._heads.pop(changefeed, None)  # read it again: another coordinator may have moved it
            raise
        head.committed(barrier)
        log.info("changefeed=%s barrier %d applied: %d change(s) from %d staged piece(s) in %.3fs", changefeed,
                 barrier, changes, pieces, time.monotonic() - started)
        return BarrierApplied(barrier, changes, pieces)

    def forget(self, changefeed: str) -> None:
        """Drop what is cached of ``changefeed`` (its rows go with the position table's, ``forget``)."""
        self._heads.pop(changefeed, None)
