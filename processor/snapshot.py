"""The initial copy of a span's existing rows, run by its :class:`processor.span.SpanRunner` before it streams.

Protocol (docs/snapshot.md, "The copy and the stream"):

1. The span's slot was created by ``changefeed create`` at Ts ``S`` and is not read during the copy.
2. Each copy run takes a fresh exported snapshot of the upstream (:meth:`upstream.base.Upstream.export_snapshot`)
   at Ts ``C`` >= ``S`` and records ``(name, C)`` in the span's status (:class:`cdc.model.SpanSnapshot`)
   *before* the job may write a row, then has the :class:`CopyLauncher` (the Spark job, launched by the
   capture) copy every table chunk not yet recorded as done, under that snapshot.
3. When the job succeeds, the run fence is removed (a process of the job that outlived it commits nothing
   more), every table whose key the copy deferred must have it built (else ``SinkError``: never streamed without
   its key; such a table counts as pending, so the next run's job builds it), each table gets its *floor* and
   the span's snapshot is ``done``: the span streams from its checkpoint
   ``S``, and a change of a table at or below its floor is dropped, being in the copy already.

Floors: a keyed table's chunks may have been copied under several snapshots (a run died and another took a new
snapshot): its floor is the *first* run's Ts, so every change after any chunk's snapshot is applied again in
commit order, which converges because rows are upserted and deleted by key. A key-less table is copied whole
under one snapshot (its single chunk replaces the table's rows), and its floor is exactly that snapshot's Ts, so
not one of its rows is applied twice.

Guarantees: nothing is written downstream by the span itself during the copy; a stop request ends the job and
returns promptly (:class:`CopyStopped`); every failure is a ``TidewaterError`` naming what to fix.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from cdc.errors import InvalidArgument, SinkError, TidewaterError
from cdc.events import TableName, TableSchema
from cdc.meta.snapshot_progress import SnapshotProgressStore
from cdc.model import ChangefeedInfo, SpanInfo, SpanSnapshot
from cdc.snapshot import KEY_DEFERRED, ChunkDone, TablePlan
from cdc.ts import Watermark
from upstream.base import Upstream

log = logging.getLogger(__name__)


PLAN_READERS = 4
"""Upstream connections that plan a span's new tables in parallel (each imports the run's exported snapshot)."""


class CopyStopped(TidewaterError):
    """The span was asked to stop (pause, move, remove) during its copy: the job was ended."""

    code = "CDC:ErrSnapshotStopped"
    retryable = True


class TableCopyWaiting(TidewaterError):
    """A table copy names a table that exists upstream but is not in its span's publication yet."""

    code = "CDC:ErrTableCopyWaiting"
    retryable = True


@dataclass(frozen=True)
class CopyRequest:
    """One run of the copy job for one span: what to copy from where to where, under which snapshot."""

    changefeed: str
    span: int
    upstream_uri: str
    sink_uri: str
    tables: tuple[TableName, ...]
    snapshot: str  # the exported snapshot every reader imports
    commit_ts: int  # its Ts: stamped on every copied row
    commit_time: float
    chunk_rows: int
    spark_master: str
    local: bool = False  # small enough to copy without starting Spark (in the job's own process)
    sink_config: dict[str, Any] = field(default_factory=dict)  # the changefeed's [sink] (e.g. Kafka dispatchers)
    # the initial copy (not a table copy, not merge): a keyed table whose target does not exist yet may be created
    # without its key, built after the load (docs/snapshot.md, "The key after the load")
    defer_keys: bool = False


Truncate = Callable[[Sequence[TableSchema], Watermark], None]
"""A table copy's emptying of targets before it copies (``Sink.truncate_targets``): the tables' schemas and the run's
snapshot (its rows carry that commit Ts)."""


class CopyLauncher(Protocol):
    """Runs the copy job for a request and returns when it finished: raises a ``TidewaterError`` saying why it
    failed, or :class:`CopyStopped` after ending it when ``stop`` was set. The capture provides it (the Spark
    job is launched as a process of its own)."""

    def __call__(self, request: CopyRequest, stop: threading.Event) -> None: ...


class StreamGate(Protocol):
    """The streaming span a table copy runs beside (``processor.span.SpanRunner``, through its
    :class:`processor.table_hold.TableHold`)."""

    def pass_up_to(self, boundary: int, drop: Mapping[str, int]) -> None:
        """Let the copied tables' changes at or below ``boundary`` pass (those at or below ``drop[table]``: drop)."""

    def caught_up(self, boundary: int) -> bool:
        """Everything the span streams up to ``boundary`` is written downstream (or it waits before a copied
        table's change above it, everything before that written)."""


class InitialCopy:
    """The copy phase of one span (see the module doc). ``persist(state)`` must store the span's snapshot state
    durably (the span's status, under the processor's guard) before returning; ``state`` is what is stored.

    A *table copy* (``state.tables`` not empty: docs/snapshot.md, "Table copies") copies only those tables, while
    the span streams (``gate``): each run exports its snapshot, lets the tables' changes up to the first run's
    snapshot ``B`` pass, waits until the span has written them, empties the targets of the keyed tables it plans
    now (``truncate``; a key-less table's single chunk replaces its rows anyway), then copies. The floors are the
    initial copy's, ``B`` being the first export."""

    def __init__(self, info: ChangefeedInfo, span: SpanInfo, upstream: Upstream, progress: SnapshotProgressStore,
                 launcher: CopyLauncher, persist: Callable[[SpanSnapshot], None], state: SpanSnapshot | None,
                 *, chunk_rows: int, spark_master: str, label: str, spark_min_rows: int = 0,
                 truncate: Truncate | None = None, defer_keys: bool = False) -> None:
        self.info = info
        self.span = span
        self.upstream = upstream
        self.progress = progress
        self.launcher = launcher
        self.persist = persist
        self.state = state if state is not None else SpanSnapshot()
        self.chunk_rows = chunk_rows
        self.spark_master = spark_master
        self.spark_min_rows = spark_min_rows
        self.label = label
        self.truncate = truncate
        self.defer_keys = defer_keys and truncate is None

    def __call__(self, stop: threading.Event, gate: StreamGate | None = None) -> dict[str, int]:
        """Copy what is left; return the floors (table -> Ts) once the span's snapshot is done. ``gate``: the
        span streams meanwhile (a table copy)."""
        if self.state.phase == "done":
            return dict(self.state.floors)
        tables = self.upstream.span_tables(self.span)
        if tables is None:
            raise InvalidArgument(f"span {self.label}: its publication {self.span.publication!r} no longer exists "
                                  "upstream; the changefeed cannot copy or stream: remove it and create it again")
        kept: dict[str, int] = {}
        if self.state.tables:  # a table copy: the tables asked for that the span still publishes
            wanted = set(self.state.tables)
            self._check_published(wanted - {str(t) for t in tables})
            tables = [t for t in tables if str(t) in wanted]
            kept = {k: v for k, v in self.state.floors.items() if k not in wanted}
        if tables:
            with self.upstream.export_snapshot(label=self.label) as exp:
                self.state = dataclasses.replace(self.state, phase="copying",
                                                 exports=(*self.state.exports, (exp.name, exp.ts)), floors=kept)
                self.persist(self.state)  # before any row is written under it
                if gate is not None:
                    self._catch_up(gate, tables, stop)
                pending, rows = self._plan(tables, exp.name, Watermark(exp.ts, exp.time))
                if pending:
                    request = CopyRequest(self.info.id, self.span.index, self.info.upstream_uri, self.info.sink_uri,
                                          tuple(pending), exp.name, exp.ts, exp.time, self.chunk_rows,
                                          self.spark_master, local=rows < self.spark_min_rows,
                                          sink_config=dict(self.info.config.get("sink") or {}),
                                          defer_keys=self.defer_keys and gate is None)
                    log.info("span=%s copying %d table(s) under snapshot %s (Ts %d)", self.label, len(pending),
                             exp.name, exp.ts)
                    try:
                        self.launcher(request, stop)
                    except BaseException:
                        # Spark's Python workers may outlive the job: fence them out, so no chunk commits after
                        # a stop (pause, move, remove) or a failure; the next run starts a new fence anyway
                        self.progress.end_run(self.info.id, self.span.index)
                        raise
            self.progress.end_run(self.info.id, self.span.index)  # a late process of the job commits nothing more
        self._check_keys_built(tables)
        floors = {**kept, **self.floors(tables)}
        self.state = dataclasses.replace(self.state, phase="done", floors=floors)
        self.persist(self.state)
        log.info("span=%s initial copy done: %d table(s); streaming from checkpoint", self.label, len(tables))
        return floors

    def _check_published(self, missing: set[str]) -> None:
        """A table of a table copy that the span does not publish: dropped since (nothing to copy), or not added
        yet (the owner asks for a joining table's copy just before it adds it): then the copy waits for it, as a
        retryable error the changefeed shows."""
        for name in sorted(missing):
            try:
                self.upstream.table_schema(TableName.parse(name))
            except InvalidArgument:
                continue  # gone upstream: nothing to copy
            raise TableCopyWaiting(
                f"span {self.label}: table {name} is to be copied but is not in publication {self.span.publication} "
                "yet; the copy starts once the owner has added it (if it stays out, see the changefeed's warnings "
                "for why it is not eligible)")

    def _catch_up(self, gate: StreamGate, tables: Sequence[TableName], stop: threading.Event) -> None:
        """A table copy's run, before it plans: the span writes the copied tables' changes up to the first
        export ``B`` (a key-less table whose copy is already committed: drops those up to its snapshot), then
        holds back the rest; once it has written everything up to ``B``, no change of theirs at or below ``B``
        is written any more by this run, and their copy may begin."""
        first = self.state.exports[0][1]
        drop: dict[str, int] = {}
        for t in tables:
            plan = self.progress.get_plan(self.info.id, self.span.index, t)
            copied_at = self._keyless_copied_at(t) if plan is not None and not plan.has_key else None
            if copied_at is not None:
                drop[str(t)] = copied_at
        gate.pass_up_to(first, drop)
        while not gate.caught_up(first):
            if stop.wait(0.1):
                raise CopyStopped(f"span {self.label} stopped while its table copy waited for the stream")

    def _plan(self, tables: Sequence[TableName], snapshot: str, at: Watermark) -> tuple[list[TableName], int]:
        """The tables with chunks left to copy (or a deferred key to build), and about how many rows those chunks
        hold (as planned). A table planned now (the first run to see it) is planned under ``snapshot`` and its plan
        stored (the job takes it as it is); one that is empty at ``snapshot`` is recorded as copied right away, so
        that a span of empty tables starts no job at all. Tables are planned in parallel, each reader importing
        ``snapshot`` (:data:`PLAN_READERS` connections): planning is an index scan per table on the upstream."""
        cf, span = self.info.id, self.span.index
        plans: dict[TableName, TablePlan | None] = {t: self.progress.get_plan(cf, span, t) for t in tables}
        new = [t for t in tables if plans[t] is None]
        if new:
            # a table copy truncates targets through the span's sink (one caller): one reader, in order
            readers = 1 if self.truncate is not None else min(PLAN_READERS, len(new))
            groups = [new[i::readers] for i in range(readers)]
            if readers == 1:
                plans.update(self._plan_new(groups[0], snapshot, at))
            else:
                with ThreadPoolExecutor(readers, thread_name_prefix="tidewater-plan") as pool:
                    for got in pool.map(lambda g: self._plan_new(g, snapshot, at), groups):
                        plans.update(got)
        pending: list[TableName] = []
        rows = 0
        for t in tables:
            stored = plans[t]
            if stored is None:  # empty at the snapshot: recorded as copied
                continue
            done = len(self.progress.done_chunks(cf, span, t))
            if done < len(stored.chunks) or stored.key_state == KEY_DEFERRED:  # (the job builds the key)
                pending.append(t)
                rows += stored.rows * (len(stored.chunks) - done) // len(stored.chunks)
        return pending, rows

    def _plan_new(self, tables: Sequence[TableName], snapshot: str, at: Watermark
                  ) -> dict[TableName, TablePlan | None]:
        """Plan ``tables`` (not planned yet) under ``snapshot`` on one reader and store their plans; a table empty
        at the snapshot gets its chunks recorded as done and None."""
        cf, span = self.info.id, self.span.index
        out: dict[TableName, TablePlan | None] = {}
        with self.upstream.snapshot_reader(snapshot, label=self.label) as reader:
            for t in tables:
                schema = reader.table_schema(t)
                if self.truncate is not None and schema.has_key:
                    # a table copy replaces the rows: extra rows downstream go too (before the plan is
                    # stored: a run that dies in between empties it again; a key-less table's single chunk
                    # replaces its rows itself). A log-shaped target (Kafka) gets a TRUNCATE at the snapshot's Ts,
                    # ordered before the copied rows, which carry that Ts
                    self.truncate([schema], at)
                plan = reader.plan(schema, self.chunk_rows)
                stored = self.progress.put_plan(cf, span, plan)
                reader.release()  # no lock held on this table while the next one is read (deadlocks)
                if stored is plan and plan.rows == 0:
                    now = time.time()
                    for chunk in plan.chunks:
                        self.progress.record_chunk(cf, span, t, chunk.index, ChunkDone(0, 0.0, now, snapshot))
                    out[t] = None
                    continue
                out[t] = stored
        return out

    def _check_keys_built(self, tables: Sequence[TableName]) -> None:
        """Streaming must never start on a table whose key the copy deferred and did not build (replays are
        idempotent only by key): the job builds it after the table's last chunk; a job that returned without doing
        so is a bug, and fails the changefeed naming the table."""
        for t in tables:
            plan = self.progress.get_plan(self.info.id, self.span.index, t)
            if plan is not None and plan.key_state == KEY_DEFERRED:
                raise SinkError(f"span {self.label}: the copy of table {t} deferred its primary key and the job ended "
                                "without building it; the table cannot stream without its key. Resume the changefeed "
                                "(the next run builds it) or resync the table")

    def _keyless_copied_at(self, table: TableName) -> int | None:
        """The Ts of the exported snapshot a key-less table's single chunk was committed under (None: not copied
        yet, or under a snapshot these runs did not record)."""
        done = self.progress.done_chunks(self.info.id, self.span.index, table).get(0)
        return dict(self.state.exports).get(done.snapshot or "") if done is not None else None

    def floors(self, tables: Sequence[TableName]) -> dict[str, int]:
        """Each table's floor from the stored plans and chunks (see the module doc)."""
        first = self.state.exports[0][1] if self.state.exports else 0
        out: dict[str, int] = {}
        for t in tables:
            plan = self.progress.get_plan(self.info.id, self.span.index, t)
            if plan is None or plan.has_key:
                out[str(t)] = first
                continue
            ts = self._keyless_copied_at(t)
            if ts is None:
                raise InvalidArgument(
                    f"span {self.label}: the copy of key-less table {t} is not recorded under a known snapshot; it "
                    f"cannot be told which of its changes the copy holds. Truncate it downstream and resync it "
                    f"(cdc cli changefeed snapshot --table {t})")
            out[str(t)] = ts
        return out
