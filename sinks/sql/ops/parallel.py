"""Parallel apply: one ``write`` call's upstream transactions on several downstream connections at once
(``[sink] worker-count`` > 1; MySQL/MariaDB and PostgreSQL. SQLite has one writer per file: worker-count is
ignored there and every write takes the one-connection path).

What a write does with N workers (:meth:`ParallelApply.stream`):

* It is *streamed*: the caller (the span's sink thread) reads the write transaction by transaction (mounting each
  change as it reads it), and a transaction, once read whole, is keyed and handed at once to a worker, which applies
  it while the caller reads the next ones. So the target's backends work while the capture reads, mounts and keys
  (measured before: with the write read whole first, the target's backends sat idle while the sink thread read it,
  and the sink thread while they applied: docs/benchmarks.md, "the wait of (b) and (c)").
* A transaction goes to the worker that holds one of its keys in the current *round*, else to the worker with the
  fewest changes in the round. One whose keys two workers hold ends the round first: every worker commits what it
  has, the keys are forgotten, and a new round begins with it. After ``MAX_CUTS`` such cuts in one write the rest of
  it goes to one worker (transactions that keep bridging the workers, e.g. updates of random keys that repeat, would
  pay a commit round every few transactions). A schema the catalog has not bound yet also ends the round first (the
  caller binds it while no worker reads the catalog).
* Past ``2 * max(batch-rows, txn-rows)`` changes (the span's batcher hands whole transactions up to ``txn-rows`` per
  write, so only a write holding one transaction larger than that bound goes past it) the round ends and the rest
  of the write takes today's path: one downstream transaction, streamed, the writer's rules unchanged (a huge
  transaction is cut only as ``sinks.sql.ops.writer`` documents); so does a write while a transaction continues
  after its DDL (``Position.reopened``). So an upstream transaction is never split across workers or downstream
  transactions beyond what the writer already does.
* After ``SERIAL_AFTER`` writes in a row whose transactions (at least two each) all went to one worker, the next 1,
  then 2, 4... up to ``SERIAL_SKIP_MAX`` writes take the one-connection path without being keyed (hot rows, such as
  pgbench's branches, chain every transaction to one worker: keying them only cost capture CPU); the first keyed write
  after that which uses several workers resets the backoff. Those writes record their transactions in the applied
  table too (point 4 below), so exactness does not depend on it.
* Each transaction's keys (:func:`keys_of`): per row image touched (old and new), one key per target unique key
  (primary key included) ``(table, columns, values)``; a table-wide key instead for tables whose rows cannot be
  told apart safely: without a key, with a unique key besides the key while the upstream logs only the key of old
  rows (replica identity not FULL), with a target unique key on columns the upstream does not have, with a
  foreign key to or from another target table (the tables of one foreign-key component share one key: such tables
  go to one worker, so a target that checks foreign keys immediately never sees a child before its parent), a key
  value that holds an unsent (TOAST) column, and a table from its TRUNCATE on in the round (the TRUNCATE itself
  conflicts with every worker that changed the table's rows in the round: a barrier for that table; a DDL never
  shares a write with rows: the span applies it between writes). On MySQL/MariaDB text key values are compared
  case- and accent-folded (a case-insensitive collation makes 'a' and 'A' one key downstream).
* Each worker applies its transactions of a round in commit order with a :class:`~sinks.sql.ops.writer.Writer`
  (windows and net effect as on one connection) in one downstream transaction on its own connection, in its own
  thread (which runs the statements too): the transaction holds the span's position first (:meth:`Position.hold`),
  records the transactions in the applied table after their rows (:meth:`Position.mark`), and commits after the
  span's fence when the caller ends the round; once every round committed, one more transaction moves the span's
  position to the write's last commit Ts (exactly-once, below).
* Worker k's thread and connection are kept for the sink's life (:class:`~sinks.sql.target.held.HeldConnection`):
  no pool checkout, pre-ping or session reset per write; so is the caller's connection that moves the position, and
  a write whose schemas are all bound plans without any round trip. A held connection that broke between writes
  fails on its transaction's first statement; that transaction is run once more on a new connection (the server
  rolled the broken session back; a commit that did reach it is refused the second time by point 2 below). A
  worker's bookkeeping is one statement on PostgreSQL (the position check and its applied rows,
  :meth:`Position.hold_and_mark`), two on MySQL/MariaDB; the position move and the applied rows' delete are one
  statement on PostgreSQL.

Guarantees: per key, upstream order (conflicting transactions go to one worker in one round, in order, or the later
one to a later round, and the next write starts after this one committed everything); a transaction is applied whole
in one downstream transaction. Across keys a reader downstream may see a later transaction before an unrelated
earlier one, during a write (worker-count 1 never shows that). Exactly-once (``sinks.sql.target.position``, "Several
apply workers"): each worker's transaction holds the span's position row in share mode, checks it, and records its
transactions in the applied table (a streamed round's after their rows, before its commit; a staged list's before
them); a crash between the workers' commits leaves some transactions recorded above the position, which the restart
skips; a zombie writer racing its successor fails on the position check or on the applied table's key, so no
transaction is applied twice and none is skipped.

Why this is exact, with a zombie (a frozen capture Z that wakes up after its successor S took the span; both use the
same target):

1. A writer starts a transaction T only once every earlier transaction conflicting with T is committed downstream:
   earlier in its own worker's round (same downstream transaction), in an earlier round, or in an earlier write (the span
   calls ``write`` only after the previous one returned, i.e. every worker committed), or at or below the position
   / in the applied table when the writer opened (committed by definition).
2. T's applied row and T's rows commit together or not at all, and the row's primary key lets only one of Z and S
   commit T: the second inserter waits on the first's uncommitted row (PostgreSQL and InnoDB unique checks; rows
   written before the applied row may meet the other writer's row locks first, or a deadlock the server ends), then
   fails on the duplicate (``SinkUnavailable``, its whole downstream transaction rolled back, the span restarts and
   reads the target again), or goes on if the first rolled back. A writer whose worker failed never applies a later
   transaction of that list, so by 1 it never applies T2 after a T1 it could not commit.
3. Applied rows are deleted only by the transaction that moves the position past them (compare-and-set, as with one
   worker). Every worker transaction share-locks the position row and checks that it still holds what its writer
   last read: so it runs either before the move (which waits for its commit) or after it (and fails). A writer that
   read the position before a compaction can therefore never insert, unnoticed, an applied row for a transaction
   the compaction already covered.
4. Writes of a parallel sink that take the one-connection path record their transactions too (those known before
   the rows, first; a streamed write's others after its rows, before its compare-and-set), so 2 covers them.

From 1 and 2: every transaction is committed downstream exactly once and, per key, in upstream order, whichever of Z
and S applies it. Across keys Z and S may interleave as two workers of one writer would.

A staging sink (``[consistency] mode = "snapshot"``, ``sinks.sql.ops.barrier.Stager``) uses the same workers with
:meth:`ParallelApply.split` (one round of lists by size: staged pieces never conflict) and a worker body that stages
the list's transactions instead of applying them (:data:`ListBody`); points 2 to 4 hold as they are, and its
one-connection path is refused by the staged pieces' own key instead of applied rows.

Compared with TiCDC (``pkg/causality``: a transaction waits only for its own conflicting predecessors, across workers,
as they finish, streaming over writes), a round and a write here are barriers: a transaction that conflicts with two
workers waits for every worker's commit, and the next write starts after the slowest worker of this one committed.

Threads: the caller's thread reads, keys and hands out the write and binds its schemas (the catalog's tables are
read or created by that thread only, between rounds: workers find every binding cached); worker threads apply and
commit (a worker's connection is its own, and its statements run in its thread: worker k
always runs on thread k; the fence and the row source are called by one worker at a time); the caller moves the
position on its own held connection.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import logging
import operator
import queue
import threading
import time
from collections.abc import Callable, Hashable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from sqlalchemy.engine import Connection

from cdc.config import SinkConfig
from cdc.errors import SinkUnavailable
from cdc.events import UNCHANGED, OpType, RowChange
from cdc.model import DataWarning
from sinks.base import RowSource
from sinks.sql.dialect.errors import is_deadlock
from sinks.sql.dialect.normalize import hashable_key
from sinks.sql.dialect.unique_moves import fold_text
from sinks.sql.ops.writer import Writer
from sinks.sql.target.binding import Binding
from sinks.sql.target.catalog import Catalog
from sinks.sql.target.connection import Target
from sinks.sql.target.held import HeldConnection
from sinks.sql.target.pipeline import Pipeline
from sinks.sql.target.position import Position

log = logging.getLogger(__name__)

# writes in a row that all went to one list before writes are streamed unplanned (module docstring), and the most
# writes streamed so before one is planned again
SERIAL_AFTER = 3
SERIAL_SKIP_MAX = 64
# a worker's transaction chosen as a deadlock victim is run again this many times (20, 40, 80 ms apart...) before the
# write fails (SinkUnavailable: the span restarts)
DEADLOCK_RETRIES = 4

# cuts of one streamed write (a transaction whose keys two workers hold: every worker commits first) after which the
# rest of the write goes to one worker (transactions that keep bridging workers, e.g. updates of random keys that
# repeat, would otherwise pay a commit round per few transactions)
MAX_CUTS = 4

ListBody = Callable[[Connection, int, list["Txn"]], int]
"""What a worker of :meth:`ParallelApply.apply` does with its list inside its downstream transaction, after
:meth:`Position.hold` and :meth:`Position.mark`: ``body(conn, k, txns)`` returns the changes it wrote (a staging sink
stages them, ``sinks.sql.ops.barrier``)."""


_gc_lock = threading.Lock()
_gc_paused = 0  # writes (of any span of this process) holding the cyclic collector off
_gc_owned = False  # the collector was enabled when the first of them began (so the last one enables it again)


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Hold Python's cyclic garbage collector off while a write's changes are held in memory. Buffered changes
    survive their allocation, so the collector runs every few hundred allocations and its older generations scan
    the whole capture heap: measured 1.8 -> 6.2 us/row of sink CPU with 4 workers and a 300k-object heap (1,773
    collections per 180k rows, none on the streamed one-connection path). Memory is bounded by the write; cycles
    made meanwhile are collected once the last paused write ends. Process-wide (the collector is), counted so that
    concurrent spans enable it again only after the last one."""
    global _gc_paused, _gc_owned
    with _gc_lock:
        _gc_paused += 1
        if _gc_paused == 1:
            _gc_owned = gc.isenabled()
            gc.disable()
    try:
        yield
    finally:
        with _gc_lock:
            _gc_paused -= 1
            if _gc_paused == 0 and _gc_owned:
                gc.enable()


class Txn:
    """One upstream transaction of a write: its changes, in order."""

    __slots__ = ("commit_ts", "commit_time", "changes")

    def __init__(self, commit_ts: int, commit_time: float) -> None:
        self.commit_ts = commit_ts
        self.commit_time = commit_time
        self.changes: list[RowChange] = []


class KeyPlan:
    """How one binding's rows are keyed: ``table`` (a table-wide key, or None) or, per unique key, its tag
    ``(label, columns)``, its columns (dict rows) and a getter of its values from a positional row."""

    __slots__ = ("label", "table", "uniques")

    def __init__(self, b: Binding, catalog: Catalog) -> None:
        self.label = b.label
        fk = catalog.fk
        self.table: Hashable | None = None
        if fk.has_parents(b.label) or fk.is_parent(b.label):
            self.table = ("fk", fk_component(catalog, b.label))
        elif (not b.keyed or b.unique_unmapped
              or (len(b.unique_keys) > 1 and b.schema.replica_identity != "f")):
            self.table = ("table", b.label)
        self.uniques = tuple(((b.label, u), u, operator.itemgetter(*(b.names.index(c) for c in u)), len(u) == 1)
                             for u in b.unique_keys)


def fk_component(catalog: Catalog, label: str) -> str:
    """The smallest label of the tables linked to ``label`` by target foreign keys (either direction)."""
    fk = catalog.fk
    seen = {label}
    todo = [label]
    while todo:
        t = todo.pop()
        for u in itertools.chain(fk.parents.get(t, ()), fk.children.get(t, ())):
            if u not in seen:
                seen.add(u)
                todo.append(u)
    return min(seen)


def keys_of(txn: Txn, plans: dict[int, KeyPlan], fold: bool, truncated: set[str]) -> tuple[set[Hashable], set[str]]:
    """The keys of ``txn`` (module docstring): ``(tag, values)`` per unique key value, or table-wide keys; and the
    labels of the tables it touches. ``plans`` by id of the change's schema; ``truncated`` gains the tables it
    truncates (the caller adds their table key to every transaction touching them). On the hot path: per row one
    getter call and one set insertion per unique key."""
    keys: set[Hashable] = set()
    add = keys.add
    tables: set[str] = set()

    def add_unique(tag: Hashable, vals: tuple[Any, ...]) -> None:
        if fold:
            vals = tuple(map(fold_text, vals))
        try:
            add((tag, vals))
        except TypeError:  # arrays: lists
            add((tag, hashable_key(vals)))

    TRUNCATE = OpType.TRUNCATE
    last_sid = -1
    plan: KeyPlan | None = None
    for ch in txn.changes:
        sid = id(ch.schema)
        if sid != last_sid:
            plan = plans[sid]
            last_sid = sid
            tables.add(plan.label)
        assert plan is not None
        if ch.op == TRUNCATE:
            truncated.add(plan.label)
            add(("table", plan.label))
            continue
        if plan.table is not None:
            add(plan.table)
            continue
        row = ch.row
        if row is not None:
            for tag, _cols, get, single in plan.uniques:
                vals = (get(row),) if single else get(row)
                if None not in vals:
                    add_unique(tag, vals)
            if ch.old_values is None:
                continue
            images: tuple[dict[str, Any] | None, ...] = (ch.old_values,)
        else:
            images = (ch.values, ch.old_values)
        for img in images:
            if img is None:
                continue
            for tag, cols, _get, _single in plan.uniques:
                vals = tuple(img.get(c) for c in cols)
                if UNCHANGED in vals:
                    add(("table", plan.label))
                    break
                if None not in vals:
                    add_unique(tag, vals)
    return keys, tables


class ParallelApply:
    """Applies a write's transactions on ``workers`` connections (module docstring). ``serial(changes)`` is the
    one-connection write that a write falls back to."""

    def __init__(self, target: Target, catalog: Catalog, config: SinkConfig, workers: int,
                 warn: Callable[[DataWarning], None]) -> None:
        self.target = target
        self.catalog = catalog
        self.config = config
        self.workers = workers
        self.warn = warn
        self.limit = 2 * max(config.batch_rows, config.txn_rows)
        # each worker runs its statements in its own thread (no pipeline thread per worker: the workers overlap one
        # another; a second thread each measured more capture CPU per row for no more rows/s)
        self.pipelines = [Pipeline(threaded=False) for _ in range(workers)]
        # worker k: its own thread and its own connection, both kept for the sink's life (no pool checkout, pre-ping
        # or session reset per write; sinks.sql.target.held)
        self._threads = [ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"sql-apply-{k}") for k in range(workers)]
        self.conns = [HeldConnection(target, f"apply worker {k}") for k in range(workers)]
        self.mover = HeldConnection(target, "position mover")  # the caller's: moves the position after a write
        self._call_lock = threading.Lock()  # the row source and the fence: one worker at a time
        self._failed_at: list[str | None] = [None] * workers  # worker k's table when its transaction failed
        self.parallel_writes = 0  # writes applied on more than one connection (for tests and stats)
        self.deadlocks = 0  # worker transactions run again after the server chose them as a deadlock victim
        self.unplanned_writes = 0  # writes streamed on one connection without being planned (for tests and stats)
        self._one_list = 0  # writes in a row planned into one list
        self._backoff = 0  # writes to stream unplanned after the next such write
        self._skip = 0  # writes left to stream unplanned

    def plans_next(self) -> bool:
        """Whether the next write is to be keyed and spread over the workers; False: stream it on one connection (module
        docstring: after writes whose transactions all went to one worker)."""
        if self._skip:
            self._skip -= 1
            self.unplanned_writes += 1
            return False
        return True

    def planned(self, txns: int, lists: int) -> None:
        """A write of ``txns`` transactions went to at most ``lists`` workers per round."""
        if lists > 1:
            self._one_list = self._backoff = 0
        elif txns > 1:
            self._one_list += 1
            if self._one_list >= SERIAL_AFTER:
                self._backoff = min(SERIAL_SKIP_MAX, max(1, 2 * self._backoff))
                self._skip = self._backoff
                if self._backoff == SERIAL_SKIP_MAX or self._backoff == 1:
                    log.info("%s: %d writes in a row had all their transactions on one worker; the next %d are "
                             "streamed on one connection without keying them", self.target.where, self._one_list,
                             self._backoff)

    def read(self, changes: Iterable[RowChange], skip_at: int) -> tuple[list[Txn], Iterator[RowChange] | None]:
        """The write's transactions above ``skip_at``, or ([], the whole stream) past the bound."""
        reader = _TxnReader(changes, skip_at, self.limit)
        txns = list(reader)
        if reader.pending is not None:
            return [], itertools.chain([c for t in txns for c in t.changes], reader.rest())
        reader.log_skipped(self.target.where)
        return txns, None

    def stream(self, changes: Iterable[RowChange], pos: Position | None, fence: Callable[[], None] | None,
               row_source: RowSource | None, serial: Callable[[Iterable[RowChange]], int]) -> int:
        """Apply one write's transactions on the workers *while reading them* (module docstring, "Streamed"): each
        transaction, once read whole (mounted by the caller's iteration) and keyed, goes to the worker that holds
        one of its keys in the current round, else to the least loaded one; one whose keys two workers hold ends
        the round first (every worker commits). Each worker applies its transactions as they come in one downstream
        transaction per round. Past ``limit`` changes (one huge transaction) the round ends and the rest of the
        write goes to ``serial`` (the one-connection path, which also moves the position); else the position moves
        once every worker committed. Returns the changes written."""
        skip_at = pos.skip_at() if pos is not None else 0
        if row_source is not None:
            row_source = self._locked(row_source)
        worker_fence = self._locked(fence) if fence is not None else None
        rnd = _Round(self, pos, row_source, worker_fence)
        plans: dict[int, KeyPlan] = {}
        schemas: dict[int, Any] = {}
        fold = self.target.dialect == "mysql"
        reader = _TxnReader(changes, skip_at, self.limit)
        txns = 0
        last: Txn | None = None
        try:
            for txn in reader:
                rnd.dispatch(txn, plans, schemas, fold)
                txns += 1
                last = txn
            rnd.cut()
        except BaseException:
            rnd.abandon()
            raise
        if reader.pending is not None:  # one huge transaction: the one-connection path streams it (and the rest)
            return rnd.count + serial(reader.rest())
        reader.log_skipped(self.target.where)
        if last is None:
            return serial(())
        self.planned(txns, rnd.widest)
        if rnd.widest > 1:
            if not self.parallel_writes:  # once per sink: that this span's writes do go to several connections
                log.info("%s: first write applied on %d connections in %d round(s) (worker-count %d)%s",
                         self.target.where, rnd.widest, rnd.rounds, self.workers, _ids(pos))
            self.parallel_writes += 1
        if pos is not None:
            done = last
            self.mover.run(lambda conn: pos.record(conn, done.commit_ts, done.commit_time), pos.sql.label,
                           fence=fence)
            pos.committed(done.commit_ts)
        return rnd.count

    def key_plans(self, plans: dict[int, KeyPlan], schemas: dict[int, Any], txn: Txn,
                  before_binding: Callable[[], None]) -> None:
        """Make ``plans`` hold a key plan for every schema of ``txn``. A schema not bound yet is bound on a connection of
        its own (rolled back) after ``before_binding()`` (which ends the round: the workers are idle and committed,
        the catalog is the caller's alone), and every plan is made again (binding a table may reveal foreign keys of
        tables bound before)."""
        catalog = self.catalog
        unbound: dict[int, Any] = {}
        for ch in txn.changes:
            sid = id(ch.schema)
            if sid in plans or sid in unbound:
                continue
            b = catalog.cached(ch.schema)
            if b is None:
                unbound[sid] = ch.schema
            else:
                plans[sid] = KeyPlan(b, catalog)
                schemas[sid] = ch.schema
        if not unbound:
            return
        before_binding()

        def bind() -> None:
            with self.target.engine.connect() as conn:
                trans = conn.begin()  # (the catalog's raw cursors would leave a transaction open otherwise)
                try:
                    for sid, schema in unbound.items():
                        catalog.bind(schema, conn)
                        schemas[sid] = schema
                finally:
                    trans.rollback()

        try:
            self.target.guarded(bind, None)
        except BaseException:
            catalog.forget_all()
            raise
        for sid, schema in schemas.items():
            b = catalog.cached(schema)
            assert b is not None
            plans[sid] = KeyPlan(b, catalog)

    def split(self, txns: list[Txn]) -> list[list[list[int]]]:
        """One round of at most ``workers`` lists of consecutive transactions of about equal changes, in commit
        order (for writes whose transactions never conflict downstream: staging, where each transaction's pieces
        have keys of their own). Guarantees: every transaction in exactly one list, each list ascending."""
        total = sum(len(t.changes) for t in txns)
        share = -(-total // self.workers)
        lists: list[list[int]] = [[]]
        load = 0
        for i, t in enumerate(txns):
            if load >= share and len(lists) < self.workers:
                lists.append([])
                load = 0
            lists[-1].append(i)
            load += len(t.changes)
        return [lists]

    def apply(self, txns: list[Txn], rounds: list[list[list[int]]], pos: Position | None,
              fence: Callable[[], None] | None, body: ListBody) -> int:
        """Apply ``rounds`` (from :meth:`split`) one after the other, the lists of a round concurrently, each worker
        doing ``body`` with its list (:data:`ListBody`) in its own transaction, committed after the fence; then move
        the position once every one committed. The fence is called by one worker at a time. The first error of a
        round is raised once its every worker finished (no later round starts); workers that committed stay
        committed (recorded in the applied table: a restart skips them)."""
        worker_fence = self._locked(fence) if fence is not None else None
        count = 0
        for lists in rounds:
            futures = [self._threads[k].submit(self._work, k, [txns[i] for i in lst], pos, worker_fence, body)
                       for k, lst in enumerate(lists)]
            errors: list[tuple[BaseException, str | None]] = []
            for k, f in enumerate(futures):
                try:
                    count += f.result()
                except BaseException as exc:  # noqa: BLE001 - the first one is raised below
                    errors.append((exc, self._failed_at[k]))
            if errors:
                self.catalog.forget_all()
                raise self._explained(errors)
        if not self.parallel_writes:  # once per sink: that this span's writes do go to several connections
            log.info("%s: first write applied on %d connections in %d round(s) (worker-count %d)%s",
                     self.target.where, max(len(lists) for lists in rounds), len(rounds), self.workers,
                     f", changefeed={pos.changefeed} span={pos.span}" if pos is not None else "")
        self.parallel_writes += 1
        if pos is not None:
            last = txns[-1]
            self.mover.run(lambda conn: pos.record(conn, last.commit_ts, last.commit_time), pos.sql.label,
                           fence=fence)
            pos.committed(last.commit_ts)
        return count

    def _explained(self, errors: list[tuple[BaseException, str | None]]) -> BaseException:
        """The error to raise for a round whose workers failed with ``errors`` (in list order, each with the table its
        writer was writing): a worker's that says a table this changefeed has had is missing (dropped while bound)
        becomes ``TargetTableDropped`` naming it and the fix, as on one connection (:meth:`TableRecord.explain`); else
        the first. Read on the caller's thread, once every worker of the round finished."""
        record = self.catalog.record
        for exc, table in errors:
            dropped = record.explain(exc, table)
            if dropped is not None:
                dropped.__cause__ = exc
                return dropped
        return errors[0][0]

    def _locked(self, fn: Callable[..., Any]) -> Any:
        lock = self._call_lock

        def call(*args: Any) -> Any:
            with lock:
                return fn(*args)
        return call

    def _work(self, k: int, txns: list[Txn], pos: Position | None, fence: Callable[[], None] | None,
              body: ListBody) -> int:
        """Worker ``k``: ``body`` with its transactions in one downstream transaction that holds the position and
        records them first, committed after the fence. Committing at once (not after every worker applied) matters: a
        worker may wait for a lock another one holds (InnoDB's next-key locks of unique checks span keys), which a
        commit barrier would turn into a wait until the lock timeout."""

        def run(conn: Connection) -> int:
            if pos is not None:
                pos.hold_and_mark(conn, [t.commit_ts for t in txns])
            return body(conn, k, txns)

        return self._retried(k, pos, lambda: self._held(k, run, lambda: None, fence))

    def _stream_work(self, k: int, feed: _Feed, pos: Position | None, row_source: RowSource | None,
                     fence: Callable[[], None] | None) -> int:
        """Worker ``k``'s round of a streamed write (:meth:`stream`): the transactions the caller hands it through
        ``feed``, applied as they come in one downstream transaction, which holds the span's position first and
        records them in the applied table after their rows, then commits after the fence once the caller ends the
        round (a run again replays what it took first)."""
        return self._retried(k, pos, lambda: self._stream_once(k, feed, pos, row_source, fence))

    def _retried(self, k: int, pos: Position | None, once: Callable[[], int]) -> int:
        """``once()``, worker ``k``'s transaction, run again from its start when the server chose it as a deadlock
        victim (up to ``DEADLOCK_RETRIES`` times)."""
        attempt = 0
        while True:
            try:
                return once()
            except SinkUnavailable as exc:
                # Workers apply transactions without a common key, yet InnoDB's next-key locks of unique checks (and
                # PostgreSQL's row locks of FK checks) can still cross: the server picks a victim and rolls its whole
                # transaction back, so it is run again from its start (its applied marks went with it)
                if attempt == DEADLOCK_RETRIES or not is_deadlock(exc):
                    raise
                self.deadlocks += 1
                log.info("%s: worker %d's transaction was a deadlock victim; running it again (attempt %d of %d)%s",
                         self.target.where, k, attempt + 2, DEADLOCK_RETRIES + 1, _ids(pos))
                time.sleep(0.02 * (2 ** attempt))
                attempt += 1

    def _stream_once(self, k: int, feed: _Feed, pos: Position | None, row_source: RowSource | None,
                     fence: Callable[[], None] | None) -> int:
        target = self.target
        writer: Writer | None = None

        def run(conn: Connection) -> int:
            nonlocal writer
            writer = None
            if pos is not None:
                pos.hold(conn)  # refused before any row when another writer moved the position
            writer = Writer(conn, target.statements(), self.catalog, self.pipelines[k], self.config, row_source,
                            self.warn)
            n = writer.run(feed.changes())
            if pos is not None:
                writer.current = pos.sql.label
                pos.mark(conn, [t.commit_ts for t in feed.taken])
            return n

        return self._held(k, run, lambda: writer.current if writer else None, fence)

    def _held(self, k: int, run: Callable[[Connection], int], current: Callable[[], str | None],
              fence: Callable[[], None] | None) -> int:
        """``run(conn)`` in one transaction on worker ``k``'s held connection, committed after ``fence``; on a failure
        the table ``current()`` names is kept for the caller's error (``_explained``)."""
        self._failed_at[k] = None
        try:
            return self.conns[k].run(run, current, fence=fence)
        except BaseException:
            self._failed_at[k] = current()
            raise

    def close(self) -> None:
        for t in self._threads:
            t.shutdown(wait=True)
        for c in (*self.conns, self.mover):
            c.close()
        for p in self.pipelines:
            p.close()


class _TxnReader:
    """A write's changes above ``skip_at`` as whole transactions, each yielded once the next one begins (or the
    changes end). Past ``limit`` changes it stops: ``pending`` then holds the transaction being read and
    :meth:`rest` gives its changes and the rest of the write."""

    def __init__(self, changes: Iterable[RowChange], skip_at: int, limit: int) -> None:
        self.it = iter(changes)
        self.skip_at = skip_at
        self.limit = limit
        self.skipped = 0
        self.pending: Txn | None = None

    def __iter__(self) -> Iterator[Txn]:
        skip_at, limit = self.skip_at, self.limit
        cur: Txn | None = None
        n = 0
        for ch in self.it:
            ts = ch.commit_ts
            if ts <= skip_at:
                self.skipped += 1
                continue
            if cur is None or ts != cur.commit_ts:
                if cur is not None:
                    yield cur
                cur = Txn(ts, ch.commit_time)
            cur.changes.append(ch)
            n += 1
            if n > limit:
                self.pending = cur
                return
        if cur is not None:
            yield cur

    def rest(self) -> Iterator[RowChange]:
        """The pending transaction's changes, then the write's unread ones (after a stop past the limit)."""
        assert self.pending is not None
        return itertools.chain(self.pending.changes, self.it)

    def log_skipped(self, where: str) -> None:
        if self.skipped:
            log.info("%s: skipped %d change(s) already downstream (commit <= %d)", where, self.skipped, self.skip_at)


class _Feed:
    """Worker k's transactions of the current round of a streamed write, handed over by the caller in commit order
    (``None`` ends the round). ``taken``: those it took so far, which a run again (deadlock, broken held connection)
    replays before it takes more."""

    __slots__ = ("queue", "taken", "ended", "future")

    def __init__(self) -> None:
        self.queue: queue.SimpleQueue[Txn | None] = queue.SimpleQueue()
        self.taken: list[Txn] = []
        self.ended = False
        self.future: Future[int] | None = None

    def changes(self) -> Iterator[RowChange]:
        for t in list(self.taken):
            yield from t.changes
        while not self.ended:
            t = self.queue.get()
            if t is None:
                self.ended = True
                return
            self.taken.append(t)
            yield from t.changes


class _Round:
    """The caller's side of a streamed write (:meth:`ParallelApply.stream`): which worker holds which key in the
    current round, the workers' feeds, and the rounds' results."""

    def __init__(self, apply: ParallelApply, pos: Position | None, row_source: RowSource | None,
                 fence: Callable[[], None] | None) -> None:
        self.apply = apply
        self.pos, self.row_source, self.fence = pos, row_source, fence
        n = apply.workers
        self.feeds: list[_Feed | None] = [None] * n
        self.loads = [0] * n  # changes handed to each worker in this round
        self.owner: dict[Hashable, int] = {}  # key -> the worker that holds it in this round
        self.touched: dict[str, set[int]] = {}  # table -> workers that changed its rows in this round
        self.truncated: set[str] = set()  # tables truncated in this round (their table key from then on)
        self.cuts = 0  # rounds ended early for a transaction whose keys two workers held
        self.rounds = 0
        self.widest = 0  # most workers of one round
        self.count = 0  # changes the committed rounds wrote

    def dispatch(self, txn: Txn, plans: dict[int, KeyPlan], schemas: dict[int, Any], fold: bool) -> None:
        apply = self.apply
        apply.key_plans(plans, schemas, txn, self.cut)
        own: set[str] = set()  # the tables this transaction truncates
        keys, tables = keys_of(txn, plans, fold, own)
        for label in tables & (self.truncated | own):  # a truncated table is one key from its TRUNCATE on
            keys.add(("table", label))
        owners = {k for k in map(self.owner.get, keys) if k is not None}
        for label in own:  # and conflicts with every earlier change of its rows in the round
            owners |= self.touched.get(label, set())
        if len(owners) > 1:
            self.cut(early=True)
            owners = set()
        self.truncated |= own
        if self.cuts >= MAX_CUTS:
            k = 0  # the rest of this write on one worker: per key order by one list
        elif owners:
            k = owners.pop()
        else:
            k = min(range(apply.workers), key=self.loads.__getitem__)
        owner = self.owner
        for key in keys:
            owner[key] = k
        for label in tables:
            self.touched.setdefault(label, set()).add(k)
        self.loads[k] += len(txn.changes)
        feed = self.feeds[k]
        if feed is None:
            feed = self.feeds[k] = _Feed()
            feed.future = apply._threads[k].submit(apply._stream_work, k, feed, self.pos, self.row_source, self.fence)
        elif feed.future is not None and feed.future.done():  # it failed (a round's worker ends only at its cut)
            self.cut()
        feed.queue.put(txn)

    def cut(self, early: bool = False) -> None:
        """End the round: every worker of it commits (its error, if any, raised once all finished, as
        :meth:`ParallelApply.apply` raises a round's)."""
        feeds = [f for f in self.feeds if f is not None]
        if not feeds:
            return
        for f in feeds:
            f.queue.put(None)
        errors: list[tuple[BaseException, str | None]] = []
        for k, f in enumerate(self.feeds):
            if f is None:
                continue
            assert f.future is not None
            try:
                self.count += f.future.result()
            except BaseException as exc:  # noqa: BLE001 - the first one is raised below
                errors.append((exc, self.apply._failed_at[k]))
        self.rounds += 1
        self.widest = max(self.widest, len(feeds))
        self.cuts += early
        self.feeds = [None] * self.apply.workers
        self.loads = [0] * self.apply.workers
        self.owner, self.touched, self.truncated = {}, {}, set()
        if errors:
            self.apply.catalog.forget_all()
            raise self.apply._explained(errors)

    def abandon(self) -> None:
        """The caller failed: every worker's round ends (committing what it took: recorded, a restart skips it);
        their errors give way to the caller's."""
        with contextlib.suppress(BaseException):
            self.cut()


def _ids(pos: Position | None) -> str:
    return f" (changefeed={pos.changefeed} span={pos.span})" if pos is not None else ""

