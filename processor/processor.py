"""The processor of one capture: runs the spans the owner assigned to this capture.

Each tick (``owner-tick``) reads one etcd snapshot, starts the span runners newly assigned here, stops
those no longer assigned (or reassigned with a new epoch) and restarts failed ones with exponential
backoff; while a failed span waits, its sink and upstream are probed about once a second
(``processor.recovery``) and it restarts at the next tick once the dependency that was away is back.
Between ticks a report pass (every ``checkpoint-min-interval / 4``) stores every running span's
resolved and checkpoint watermarks as a ``SpanStatus`` when ``report_due`` says so: a moving checkpoint
at most every ``checkpoint-min-interval`` (its first move after the runner started at once), an idle one
every ``checkpoint-interval``; all due spans of the capture go into one etcd transaction
(``MetaStore.put_span_statuses``).

Guarantees:
- Fencing: every ``SpanStatus`` write is an etcd transaction conditioned on this capture's key still
  being held by its current lease and on the span's assignment still being exactly the one this
  runner was started for. A capture that lost its lease or its assignment cannot report, and a span
  whose report fails is never acked upstream.
- The upstream slot is acked only up to a checkpoint that was stored in etcd by such a write.
- A failed span's progress is kept: the checkpoint its runner reached (durable downstream) is stored
  before the runner is discarded, so the restart resumes from there. Its sorter data (LevelDB entries,
  spill files) is removed at once, so a full disk is not kept full while it waits.
- Data warnings (``SpanStatus.warnings``): a span's warnings are kept per span across restarts of its
  runner (``processor.span.SpanWarnings``, seeded from the stored status when the span comes to this
  capture), dropped once acknowledged (raised at or before the changefeed's ``resumed_at``), and a change
  of them makes the span's status due at once.
- Threading: ``run`` owns the loop thread; ``close`` may be called from another thread after ``stop``
  is set.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace

from cdc.config import ChangefeedConfig, ServerConfig
from cdc.errors import DdlOrderUnknown, InvalidArgument, LeaseLost, MetaStoreError, SinkError, TidewaterError
from cdc.events import DdlEvent, TableName, TableSchema
from cdc.filter import TableFilter
from cdc.meta.keys import KeyKind
from cdc.meta.snapshot_progress import SnapshotProgressStore
from cdc.meta.status_feed import StatusFeed
from cdc.meta.store import ClusterSnapshot, MetaStore, SpanStatusWrite
from cdc.model import (
    ChangefeedInfo,
    DataWarning,
    RunningError,
    SchemaHistory,
    SpanAssignment,
    SpanInfo,
    SpanSnapshot,
    SpanStatus,
    pending_table_copies,
)
from cdc.snapshot import CopiedChunk
from cdc.spans import span_of
from cdc.stats import SpanStats
from cdc.ts import Watermark
from cdc.uri import scrub
from processor.barrier import UNORDERED, OtherSpan, barrier_position, barrier_verdict, copied_after, ddl_names
from processor.floors import TableFloors
from processor.merged_rows import MergedRows
from processor.recovery import DependencyProbe
from processor.snapshot import CopyLauncher, CopyStopped, InitialCopy, Truncate, join_wait
from processor.source_process import ChildSpanSource
from processor.span import CopyPlan, SchemaRecorder, SinkPlan, SpanHooks, SpanRunner, SpanWarnings
from processor.table_hold import TableHold
from sinks.base import BarrierSink, SinkOpener, TxnSink
from sinks.copy_roles import CopyAnnouncer, CopyTargets
from sorter.base import Sorter
from upstream.base import Upstream

log = logging.getLogger(__name__)



@dataclass(frozen=True)
class SpanView:
    """One span of this capture as the metrics collector sees it: ``runner`` is None while it backs off."""

    changefeed: str
    span: int
    stats: SpanStats
    runner: SpanRunner | None


@dataclass
class Slot:
    """One span this processor holds, as :attr:`Processor.slots` keeps it: its assignment, its runner (None while
    it backs off), restart and report state, and what outlives a restart of the runner (warnings, stats)."""

    cf: str
    span: int
    assignment: SpanAssignment
    runner: SpanRunner | None = None
    failures: int = 0
    restart_at: float = 0.0
    error: RunningError | None = None
    reported: SpanStatus | None = None  # last status this processor stored (or found in etcd)
    last_report: float = 0.0
    stop_confirmed: bool = False  # for a stopping assignment: running=False is stored
    probe: DependencyProbe | None = None  # while failed: watches for the failed dependency's return
    warnings: SpanWarnings = field(default_factory=SpanWarnings)  # kept across restarts of the runner
    snapshot: SpanSnapshot | None = None  # the span's initial copy state (stored with its status)
    stats: SpanStats = field(default_factory=SpanStats)  # metrics, kept across restarts of the runner


def history_at(histories: Iterable[SchemaHistory], ts: int, span: int, spans: int) -> tuple[list[TableSchema], list[int]]:
    """What span ``span`` of ``spans`` starting at ``ts`` is seeded with (``SpanSource.seed_schemas``): every table's
    schema as of ``ts``, and the oids of the tables the history gives to this span then. Their DDL concerns the span
    even once they left its publication (a DROP TABLE committed before ``ts``, decoded after it). A version stored
    before versions named their span gives the table to the span its name hashes to, where create and the table
    join place it."""
    schemas: list[TableSchema] = []
    carried: list[int] = []
    for h in histories:
        schema = h.as_of(ts)
        if schema is None:
            continue
        schemas.append(schema)
        at = h.span_as_of(ts)
        if at == span or (at < 0 and span_of(schema.name, spans) == span):
            carried.append(h.relid)
    return schemas, carried


class Processor:
    """The processor role of one capture (module docstring). ``sinks`` and ``open_upstream`` are the capture's
    factories (``capture.server`` wires them): the processor opens sinks and upstreams only through them."""

    def __init__(self, store: MetaStore, capture_id: str, sorter: Sorter, config: ServerConfig,
                 lease: Callable[[], int], lease_deadline: Callable[[], float] | None = None,
                 clock: Callable[[], float] = time.time, probe_interval: float = 1.0,
                 copy_launcher: CopyLauncher | None = None, *, sinks: SinkOpener,
                 open_upstream: Callable[..., Upstream]) -> None:
        self.store = store
        self._sinks = sinks
        self._open_upstream = open_upstream
        self._copy_launcher = copy_launcher  # runs the initial copy's job (the capture launches the Spark job)
        self._store_lock = threading.Lock()  # status writes come from the tick and from a span's copy thread
        self.capture_id = capture_id
        self.sorter = sorter
        self.config = config
        self._lease = lease
        self._lease_deadline = lease_deadline
        self._clock = clock
        self._probe_interval = probe_interval  # seconds between probes of a failed span's dependencies; 0: none
        self.slots: dict[tuple[str, int], Slot] = {}  # (changefeed, span) -> Slot; changed only by tick()
        self._last_batch = float("-inf")  # clock time of the last report batch
        self._etcd_ok = False  # report passes between ticks only while etcd answers (no retry storm)
        self.draining = False  # this capture is marked draining in etcd (as of the last tick; readiness)
        self._wake_reports: Callable[[], None] = lambda: None  # ends the loop's wait for the next report pass

    # ---- loop ------------------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        """Full tick (etcd snapshot, start/stop spans) every ``owner-tick``; in between, a report pass
        every ``checkpoint-min-interval / 4`` stores the statuses that are due (see ``report_due``)."""
        log.info("processor started capture=%s", self.capture_id)
        poll = self.config.checkpoint_min_interval / 4
        # assignment changes (a span given to or taken from this capture) and verify holds run the next tick early
        feed = StatusFeed(self.store, frozenset({KeyKind.SPAN_ASSIGNMENT, KeyKind.CHANGEFEED_HOLD}))
        # a span's first checkpoint move, or one to where its source caught up (SpanHooks.report_now), ends the wait:
        # its status is stored at once
        self._wake_reports = feed.interrupt
        next_tick = last_tick = 0.0
        try:
            while not stop.is_set():
                mono = time.monotonic()
                try:
                    if mono >= next_tick:
                        next_tick = mono + self.config.owner_tick
                        last_tick = mono
                        self._etcd_ok = False
                        snap = self.store.snapshot()
                        self.tick(snap)
                        self._etcd_ok = True
                        feed.follow(snap)
                    elif self._etcd_ok and not self.report(stop_fenced=False):
                        next_tick = mono  # a guard failed: re-read the assignments now, the tick decides
                except MetaStoreError as exc:
                    log.warning("processor capture=%s: etcd unavailable: %s", self.capture_id, exc)
                except Exception:  # noqa: BLE001 - keep the loop alive, the error is logged
                    log.exception("processor capture=%s tick failed", self.capture_id)
                if feed.wait(max(0.0, min(poll, next_tick - time.monotonic()))):
                    next_tick = min(next_tick, last_tick + 2 * poll)
        finally:
            feed.close()
        self.close()

    def close(self) -> None:
        """Stop every span, reporting final checkpoints where the fence still allows it."""
        for key in list(self.slots):
            slot = self.slots.pop(key)
            if slot.probe is not None:
                slot.probe.close()
            if slot.runner is not None:
                slot.runner.stop()
                self._report(slot)
        log.info("processor stopped capture=%s", self.capture_id)

    def span_views(self) -> list[SpanView]:
        """Every span this capture holds (running, or failed and waiting to restart), for metrics; safe to
        call from another thread (a copy of the slot table; each view is read-only)."""
        return [SpanView(k[0], k[1], s.stats, s.runner) for k, s in list(self.slots.items())]

    def running_spans(self) -> list[tuple[str, int]]:
        return sorted(k for k, s in self.slots.items() if s.runner is not None and not s.runner.stopped)

    def tick(self, snap: ClusterSnapshot) -> None:
        now = self._clock()
        me = snap.captures.get(self.capture_id)
        self.draining = bool(me is not None and me.draining)
        wanted: dict[tuple[str, int], tuple[ChangefeedInfo, SpanAssignment]] = {}
        for cf_id, spans in snap.assignments.items():
            entry = snap.changefeeds.get(cf_id)
            if entry is None:
                continue
            for span, assignment in spans.items():
                if assignment.capture_id == self.capture_id:
                    wanted[(cf_id, span)] = (entry.value, assignment)

        for key, slot in list(self.slots.items()):
            want = wanted.get(key)
            if want is None or (want[1].epoch, want[1].capture_id) != (slot.assignment.epoch, slot.assignment.capture_id):
                if slot.runner is not None:
                    log.info("span=%s/%d no longer assigned here; stopping capture=%s", key[0], key[1], self.capture_id)
                    slot.runner.stop()
                if slot.probe is not None:
                    slot.probe.close()
                del self.slots[key]

        for key, (info, assignment) in wanted.items():
            slot = self.slots.get(key)
            if slot is None:
                slot = self.slots[key] = Slot(key[0], key[1], assignment)
                slot.reported = snap.span_statuses.get(key[0], {}).get(key[1])
                slot.warnings = SpanWarnings(slot.reported.warnings if slot.reported is not None else ())
                slot.snapshot = slot.reported.snapshot if slot.reported is not None else None
            slot.warnings.acknowledge(max(info.resumed_at, info.create_time))
            if assignment.stopping or not info.state.runs:
                self._stop_for_move(slot, assignment)
                continue
            runner = slot.runner
            if runner is not None and runner.stopped and not runner.failed.is_set() and not runner.alive:
                # stopped because a status write was fenced off (the assignment changed under it), yet the
                # current snapshot assigns the span here again with the same capture and epoch (unassigned and
                # reassigned between two ticks, e.g. pause + resume): start it again under the new assignment.
                # Without this the stopped runner stayed in the slot and the span never ran again.
                log.info("span=%s/%d was stopped by a fenced status write and is assigned here again; restarting",
                         key[0], key[1])
                slot.runner = None
                runner = None
            slot.assignment = assignment  # the value the status writes are guarded on
            if runner is not None and runner.failed.is_set():
                exc = runner.error
                exited = runner.stop()
                self._failed(slot, info, exc, now, getattr(runner, "error_stage", ""))  # stores the checkpoint the runner reached
                slot.runner = None
                if exited:
                    runner.discard()
            if (slot.runner is not None and pending_table_copies(info, key[1], slot.snapshot)
                    and not slot.runner.copying and not slot.runner.table_copying):
                log.info("span=%s/%d restarts to take up a table copy", key[0], key[1])
                if slot.runner.stop():
                    slot.runner = None
            if slot.runner is None and (now >= slot.restart_at or (slot.probe is not None and slot.probe.ready.is_set())):
                if slot.probe is not None:
                    slot.probe.close()
                    slot.probe = None
                try:
                    slot.runner = self.start_runner(info, key[1], _newest(snap.span_statuses.get(key[0], {}).get(key[1]),
                                                                    slot.reported))
                    slot.stats.started(after_failure=slot.failures > 0)
                except TidewaterError as exc:
                    self._failed(slot, info, exc, now, "start")
            set_hold = getattr(slot.runner, "set_verify_hold", None)
            if set_hold is not None:  # a verify hold obeyed until its deadline (docs/verify.md, "The hold")
                hold = snap.holds.get(key[0])
                set_hold((hold.id, hold.ts) if hold is not None and hold.active(now) else None)
            if slot.runner is not None and slot.error is not None and slot.runner.checkpoint.ts > slot.runner.start_ts:
                # progress since the restart: the error is over (the report pass may already have stored that
                # progress, still with the error, so the stored checkpoint is no measure of it)
                slot.error = None
                slot.failures = 0
                slot.stats.consecutive_failures = 0
        self.report()

    def report(self, stop_fenced: bool = True) -> bool:
        """Store the status of every running span for which it is due (``report_due``), all of them in
        as few etcd transactions as possible (``MetaStore.put_span_statuses``), at most one batch per
        ``checkpoint-min-interval`` (a first report or a ``running``/``error`` change is not delayed). False if a write was
        refused by its guard (the span was moved or paused, or the lease is gone): with ``stop_fenced``
        that span is stopped at once, otherwise the caller re-reads the assignments first."""
        now = self._clock()
        due: list[tuple[Slot, SpanStatus]] = []
        moving: list[tuple[Slot, SpanStatus]] = []
        for slot in self.slots.values():
            if slot.runner is None or slot.runner.stopped:
                continue
            status = self._status(slot, now)
            if report_due(slot.reported, status, now - slot.last_report,
                          min_interval=self.config.checkpoint_min_interval,
                          idle_interval=self.config.checkpoint_interval, started_at=slot.runner.start_ts,
                          caught_up_at=slot.runner.caught_up_at):
                due.append((slot, status))
            elif slot.reported is not None and status.checkpoint_ts > slot.reported.checkpoint_ts:
                moving.append((slot, status))
        if not due:
            return True
        urgent = any(slot.reported is None or _urgent_fields(slot.reported) != _urgent_fields(st)
                     or (slot.runner is not None and (_first_move(slot.reported, st, slot.runner.start_ts)
                                                      or _caught_up(slot.reported, st, slot.runner.caught_up_at)))
                     for slot, st in due)
        if not urgent and now - self._last_batch < self.config.checkpoint_min_interval:
            return True  # one batch per checkpoint-min-interval per capture, however many spans are due
        self._last_batch = now
        # busy spans ride along with the ones due, so that they keep sharing one cadence
        due += moving
        return all(r is not False for r in self._store(due, now, stop_fenced))

    def _failed(self, slot: Slot, info: ChangefeedInfo, exc: BaseException | None, now: float,
                stage: str = "") -> None:
        """Record a failure of the span: error, next restart time, probes; store its status at once (with
        the checkpoint of ``slot.runner`` if it is still set). ``stage``: puller, sink or start (metrics)."""
        slot.failures += 1
        delay = self._backoff(slot.failures)
        slot.restart_at = now + delay
        slot.error = running_error(exc, self.capture_id, slot.span, now)
        slot.stats.failed(stage or "unknown", slot.error.code, slot.restart_at, slot.failures)
        log.warning("span=%s/%d failed (%s); restarting in %.0fs, or once the dependency that failed is back",
                    slot.cf, slot.span, slot.error.message, delay)
        self._report(slot)
        if slot.probe is None and slot.error.retryable:
            slot.probe = self._probe(info, slot.span)

    def _probe(self, info: ChangefeedInfo, span_index: int) -> DependencyProbe | None:
        """A started probe of the span's sink and upstream (see ``processor.recovery``)."""
        if self._probe_interval <= 0:
            return None
        _span_info(info, span_index)  # raises if the changefeed no longer has that span
        config = ChangefeedConfig.from_dict(info.config)

        def sink() -> None:
            s = self._sinks.open(info.sink_uri, config.sink)
            try:
                s.probe()
            finally:
                s.close()

        upstream = self._open_upstream(info.upstream_uri).probe  # its own short connection per probe
        return DependencyProbe(f"{info.id}/{span_index}", {"sink": sink, "upstream": upstream},
                               self._probe_interval).start()

    def _backoff(self, failures: int) -> float:
        return min(self.config.error_backoff_max, self.config.error_backoff_min * 2 ** (failures - 1))

    def _stop_for_move(self, slot: Slot, assignment: SpanAssignment) -> None:
        """First phase of a move or pause: stop the span, then confirm ``running=False`` (with its final
        checkpoint) under the stopping assignment, so that the owner may hand the span elsewhere."""
        if slot.runner is not None:
            if not slot.runner.stopped:
                log.info("span=%s/%d asked to stop (move or pause) on capture=%s", slot.cf, slot.span,
                         self.capture_id)
            if not slot.runner.stop():
                log.warning("span=%s/%d still finishing a sink write; not confirming the stop yet", slot.cf, slot.span)
                return
        if slot.assignment != assignment:
            slot.assignment = assignment
            slot.stop_confirmed = False
        if not slot.stop_confirmed:
            slot.stop_confirmed = self._report(slot)
        if slot.stop_confirmed:
            slot.runner = None

    # ---- helpers ---------------------------------------------------------------------------------
    def start_runner(self, info: ChangefeedInfo, span_index: int, status: SpanStatus | None) -> SpanRunner:
        """Build and start the runner of one span (called by tick(); a subclass may build another runner)."""
        # a capture whose lease may be gone must not start a span: it would take the slot over (below) from
        # the span's rightful new holder
        self._lease_fence()
        span = _span_info(info, span_index)
        config = ChangefeedConfig.from_dict(info.config)
        resume: str | None = None
        if status is not None and status.checkpoint_ts >= span.start_ts:
            start = Watermark(status.checkpoint_ts, status.checkpoint_time)
            resume = status.resume_token  # (stored with exactly that checkpoint: _status)
        else:
            start = Watermark(span.start_ts, info.start_time)
        label = f"{info.id}/{span_index}"
        upstream = self._open_upstream(info.upstream_uri)  # no I/O: the source and the row sources open their own
        # opening it takes the slot over from a holder that lost the span (upstream.base.SpanSource)
        source = upstream.span_source(span, start, TableFilter(config.filter.rules), label=label,
                                      holder=self.capture_id, resume=resume)
        source.seed_schemas(*history_at(self.store.get_schema_histories(info.id).values(), start.ts, span_index,
                                        len(info.spans)))
        if self.config.puller_process and source.runs_in_child:  # (a source that cannot runs in a thread)
            source = ChildSpanSource(source, label)
        sorter = self.sorter.span(label, memory_budget=config.memory_quota // max(1, len(info.spans)))
        slot = self.slots.get((info.id, span_index))
        copy: InitialCopy | None = None
        table_copy: InitialCopy | None = None
        state = status.snapshot if status is not None else None
        progress = SnapshotProgressStore(self.store.client, self.store.cluster_id)
        if info.initial_copy and (state is None or (state.phase != "done" and not state.tables)):
            copy = self._initial_copy(info, span, upstream, progress, state, config, label,
                                      warn=slot.warnings.add if slot is not None else None, resume=resume)
        else:
            state = self._take_up_table_copies(info, span_index, state, progress, upstream)
            if state is not None and state.phase != "done" and state.tables:
                def truncate(schemas: Sequence[TableSchema], at: Watermark) -> None:
                    sink = self._sinks.open(info.sink_uri, config.sink)
                    try:
                        if isinstance(sink, CopyTargets):  # (else no target holds rows to empty)
                            sink.truncate_targets([s.name for s in schemas], schemas=schemas, at=at)
                    finally:
                        sink.close()

                table_copy = self._initial_copy(info, span, upstream, progress, state, config, label, truncate,
                                                resume=resume)
        if slot is not None:
            slot.snapshot = state
        sink = SinkPlan(lambda: open_span_sink(self._sinks, info.sink_uri, config, info.start_ts), config.sink.txn_rows,
                        position=(info.id, span_index, span.start_ts), spans=len(info.spans),
                        row_source=lambda: upstream.row_source(label=label), ddl=config.ddl, target_ts=info.target_ts,
                        barrier_origin=info.start_ts if config.consistency.snapshot else None)
        stored = state is not None and copy is None  # (the floors of earlier copies; an initial copy makes its own)
        copies = CopyPlan(initial=copy,
                          floors=TableFloors(state.floors, state.oids) if stored and state is not None else None,
                          ceilings=TableFloors(state.ceilings, state.oids) if stored and state is not None else None,
                          table=table_copy,
                          hold=TableHold(state.tables, oids=state.oids)
                          if table_copy is not None and state is not None else None)
        hooks = SpanHooks(fence=self._lease_fence, schema_history=self._schema_recorder(info.id, span_index),
                          barrier=self._changefeed_barrier(info, span_index, progress) if len(info.spans) > 1 else None,
                          warnings=slot.warnings if slot is not None else None,
                          stats=slot.stats if slot is not None else None,
                          report_now=lambda: self._wake_reports())
        runner = SpanRunner(label, start, source, sorter, sink, copies, hooks)
        runner.start()
        log.info("span=%s started on capture=%s from checkpoint=%d", label, self.capture_id, start.ts)
        return runner

    def _initial_copy(self, info: ChangefeedInfo, span: SpanInfo, upstream: Upstream, progress: SnapshotProgressStore,
                      state: SpanSnapshot | None, config: ChangefeedConfig, label: str,
                      truncate: Truncate | None = None,
                      warn: Callable[[list[DataWarning]], None] | None = None,
                      resume: str | None = None) -> InitialCopy:
        if self._copy_launcher is None:
            raise InvalidArgument(f"span {label} must copy existing rows, and this capture cannot run the copy job")

        def restart_target(schema: TableSchema, ts: int, at: float) -> None:
            sink = self._sinks.open(info.sink_uri, config.sink)
            try:
                if isinstance(sink, CopyTargets):  # (else nothing of the earlier runs stays downstream)
                    sink.restart_copy_target(schema, info.id, span.index, ts, at)
            finally:
                sink.close()

        def announce(chunks: Sequence[CopiedChunk]) -> None:
            sink = self._sinks.open(info.sink_uri, config.sink)
            try:
                if isinstance(sink, CopyAnnouncer):  # (else its readers have nothing to be told)
                    sink.announce_copy(chunks)
            finally:
                sink.close()

        merge = truncate is None and config.snapshot.on_existing_rows == "merge"  # (a table copy empties its tables)
        merged = None
        if merge:  # the rows the merge keeps that the upstream does not have are counted after the copy
            merged = MergedRows(info.id, lambda: self._sinks.open(info.sink_uri, config.sink),
                                warn if warn is not None else (lambda _w: None), label)  # (logged there too)
        return InitialCopy(info, span, upstream, progress, self._copy_launcher,
                           self._persist_snapshot(info.id, span.index), state,
                           chunk_rows=config.snapshot.chunk_rows, spark_master=config.snapshot.spark_master,
                           label=label, spark_min_rows=config.snapshot.spark_min_rows, truncate=truncate,
                           defer_keys=truncate is None and not merge, restart_target=restart_target, merge=merge,
                           merged_rows=merged, announce=announce, resume=resume,
                           join_wait=join_wait(self.config.upstream_check_interval))

    @staticmethod
    def _take_up_table_copies(info: ChangefeedInfo, span: int, state: SpanSnapshot | None,
                              progress: SnapshotProgressStore, upstream: Upstream) -> SpanSnapshot | None:
        """A span that has no copy running takes up the table copies asked of it since its last one: their
        tables' earlier copy records go (before the new state is stored, so a run that dies in between takes
        them up again), and its snapshot state becomes a table copy of them (stored by the copy's first run),
        with each table's relation oid (the request's, else the table's of that name now), by which the hold and
        the copy find it when it is renamed (docs/snapshot.md, "A table renamed while it is copied")."""
        pending = pending_table_copies(info, span, state)
        if not pending or (state is not None and state.phase != "done"):
            return state
        tables = tuple(sorted({c.table for c in pending}))
        asked = {c.table: c.oid for c in sorted(pending, key=lambda c: c.request) if c.oid}
        taken: dict[str, int] = {}
        for t in tables:
            oid = asked.get(t, 0)
            if not oid:
                try:
                    oid = upstream.table_schema(TableName.parse(t)).relation_id
                except InvalidArgument:
                    oid = 0  # gone (or renamed) and asked for without an oid: the copy says what it finds
            taken[t] = oid
        for t in tables:
            progress.forget_table(info.id, span, TableName.parse(t))
        log.info("span=%s/%d takes up a table copy of %s (%s)", info.id, span, ", ".join(tables),
                 ", ".join(sorted({c.reason for c in pending})))
        floors = dict(state.floors) if state is not None else {}
        oids = {**(dict(state.oids) if state is not None else {}), **{t: o for t, o in taken.items() if o}}
        for t, o in taken.items():
            if not o:
                oids.pop(t, None)  # (an earlier copy's oid of that name is no longer the table's)
        return SpanSnapshot("copying", (), floors, tables, max(c.request for c in pending), oids=oids)

    def _persist_snapshot(self, cf: str, span: int) -> Callable[[SpanSnapshot], None]:
        """Stores a span's initial-copy state with its status now, under the span's guard; raises when the write
        is refused (the span was moved or paused, the lease is gone) or etcd fails: the copy must not go on
        without its state stored."""
        def persist(state: SpanSnapshot) -> None:
            slot = self.slots.get((cf, span))
            if slot is None:
                raise CopyStopped(f"span {cf}/{span} is no longer assigned to capture {self.capture_id}")
            slot.snapshot = state
            ok = self._store([(slot, self._status(slot, self._clock()))], self._clock(), stop_fenced=True)[0]
            if ok is None:
                raise MetaStoreError(f"span {cf}/{span}: its initial-copy state could not be stored in etcd")
            if not ok:
                raise CopyStopped(f"span {cf}/{span}: its status write was fenced off (moved, paused or lease lost)")
        return persist

    def _schema_recorder(self, cf: str, span: int) -> SchemaRecorder:
        """Stores span ``span``'s schema versions in the changefeed's schema history (docs/ddl.md), as that span's.
        A table belongs to one span, so read-modify-write per table races with no other processor."""
        def record(versions: list[tuple[int, int, TableSchema | None]], keep_after: int) -> None:
            by_table: dict[int, SchemaHistory] = {}
            for ts, relid, schema in versions:
                h = by_table.get(relid) or self.store.get_schema_history(cf, relid) or SchemaHistory(relid)
                by_table[relid] = h.with_version(ts, schema, keep_after, span)
            self.store.put_schema_histories(cf, list(by_table.values()))
        return record

    def _changefeed_barrier(self, info: ChangefeedInfo, span_index: int, progress: SnapshotProgressStore
                            ) -> Callable[[DdlEvent, threading.Event], list[str]]:
        """Waits (polling the stored span statuses every 0.5 s) until the wait rule of ``processor.barrier`` lets the
        DDL at ``(commit Ts, seq)`` pass: every other span of ``info`` wrote all of that commit Ts, or waits at a later
        DDL of its transaction (``SpanStatus.barrier_ts``/``barrier_seq``, published by ``SpanRunner``). Then returns
        the tables whose names the DDL changes that another span's copy planned under a snapshot *after* the commit Ts
        (:func:`copied_after`): such a copy already wrote what the name holds after this DDL, so applying it would
        destroy or mix rows. Raises ``DdlOrderUnknown`` when the DDL has no position across spans and another span
        waits at a DDL of the same transaction."""
        label = f"{info.id}/{span_index}"

        def wait(event: DdlEvent, stop: threading.Event) -> list[str]:
            ts, seq = barrier_position(event)
            announced = False
            while not stop.is_set():
                others = []
                for s in info.spans:
                    if s.index == span_index:
                        continue
                    st = self.store.get_span_status(info.id, s.index)
                    v = st.value if st is not None else None
                    others.append(OtherSpan(s.index, max(s.start_ts, v.covered_ts if v is not None else 0),
                                            v.barrier_ts if v is not None else 0, v.barrier_seq if v is not None else 0))
                verdict = barrier_verdict(span_index, ts, seq, others)
                if verdict.unordered:
                    names = ", ".join(str(n) for n in ddl_names(event))
                    spans = ", ".join(f"{info.id}/{i}" for i in verdict.unordered)
                    raise DdlOrderUnknown(
                        f"span {label}: schema change {event.query or ', '.join(event.kinds)!r} on {names} (commit Ts "
                        f"{ts}) changes which table holds a downstream name, and span(s) {spans} wait(s) at another "
                        "such DDL of the same upstream transaction; this one was seen in the stream alone (without "
                        "Tidewater's DDL trigger), so their order in the transaction is unknown and applying them in "
                        "the wrong order would put rows under the wrong name downstream. Fix: skip the DDLs of that "
                        f"transaction (`cdc cli changefeed update -c {info.id} --skip-ddl-ts {ts}`, then `resume`), "
                        "make the downstream tables match the upstream's names by hand or resync them (`cdc cli "
                        "changefeed snapshot --table ...`), and install the DDL trigger (a superuser for the "
                        "changefeed's upstream user) so DDLs carry their order")
                if verdict.proceed:
                    if announced:
                        log.info("span=%s passes the changefeed barrier at commit %d, DDL %s", label, ts,
                                 "of unknown position" if seq == UNORDERED else seq)
                    others_idx = [s.index for s in info.spans if s.index != span_index]
                    return copied_after(progress, info.id, others_idx, ddl_names(event), ts)
                if not announced:
                    log.info("span=%s waits at a changefeed barrier (DDL %s at commit %d) for span(s) %s", label,
                             "of unknown position" if seq == UNORDERED else seq, ts, verdict.behind)
                    announced = True
                stop.wait(0.5)
            return []
        return wait

    def _lease_fence(self) -> None:
        """Refuse a downstream commit once this capture's lease may have expired: after that the
        owner may already have given the span to another capture."""
        if self._lease_deadline is not None and time.monotonic() >= self._lease_deadline() - 1.0:
            raise LeaseLost(f"capture {self.capture_id}: etcd lease may have expired; not committing downstream")

    def _status(self, slot: Slot, now: float) -> SpanStatus:
        """The span's status as it would be stored now; its checkpoint never below the stored one."""
        runner = slot.runner
        prev = slot.reported
        if runner is not None:
            checkpoint = runner.checkpoint  # (read once: the sink thread moves it; the token must be this one's)
            token_of = getattr(runner, "resume_token", None)  # (a runner of the span's source: SpanRunner)
            status = SpanStatus(
                capture_id=self.capture_id, epoch=slot.assignment.epoch,
                checkpoint_ts=checkpoint.ts, checkpoint_time=checkpoint.time,
                resume_token=token_of(checkpoint.ts) if token_of is not None else None,
                resolved_ts=runner.resolved.ts, resolved_time=runner.resolved.time,
                running=runner.alive, error=slot.error, rows=runner.rows, updated=now,
                warnings=slot.warnings.current(), snapshot=slot.snapshot)
            barrier = getattr(runner, "barrier_at", None)  # (read once: the sink thread sets it)
            if barrier is not None:
                status = replace(status, barrier_ts=barrier[0], barrier_seq=barrier[1])
            held = getattr(runner, "verify_held", None)  # (read once: the sink thread sets it)
            if held is not None:
                status = replace(status, held_id=held[0], held_ts=held[1])
            limit = runner.watermark_limit
            if limit is not None:
                status = replace(status, hold_ts=limit.ts, hold_time=limit.time)
        elif prev is not None:  # (a barrier position it stored stays true of the past: processor.barrier)
            status = replace(prev, capture_id=self.capture_id, epoch=slot.assignment.epoch, running=False,
                             error=slot.error, updated=now, warnings=slot.warnings.current(), snapshot=slot.snapshot)
        else:
            status = SpanStatus(capture_id=self.capture_id, epoch=slot.assignment.epoch, error=slot.error,
                                updated=now, warnings=slot.warnings.current(), snapshot=slot.snapshot)
        if prev is not None and status.checkpoint_ts < prev.checkpoint_ts:  # never below the stored checkpoint
            status = replace(status, checkpoint_ts=prev.checkpoint_ts, checkpoint_time=prev.checkpoint_time,
                             resume_token=prev.resume_token)
        elif prev is not None and status.checkpoint_ts == prev.checkpoint_ts and status.resume_token is None:
            status = replace(status, resume_token=prev.resume_token)  # never without the token stored with it
        return status

    def _report(self, slot: Slot) -> bool:
        """Store the span's status now (state changes: failure, stop, final checkpoint)."""
        now = self._clock()
        return self._store([(slot, self._status(slot, now))], now)[0] is True

    def _store(self, due: list[tuple[Slot, SpanStatus]], now: float,
               stop_fenced: bool = True) -> list[bool | None]:
        """Store the statuses; per span True (stored), False (its guard failed) or None (etcd error)."""
        if not due:
            return []
        with self._store_lock:
            return self._store_locked(due, now, stop_fenced)

    def _store_locked(self, due: list[tuple[Slot, SpanStatus]], now: float,
                      stop_fenced: bool) -> list[bool | None]:
        try:
            guards = [self.store.processor_guard(slot.cf, slot.span, slot.assignment, self._lease())
                      for slot, _ in due]
            results = self.store.put_span_statuses(
                [SpanStatusWrite(slot.cf, slot.span, status, guard) for (slot, status), guard in zip(due, guards, strict=True)])
        except MetaStoreError as exc:
            log.warning("capture=%s: %d span status(es) not stored: %s", self.capture_id, len(due), exc)
            self._etcd_ok = False  # no more report passes until a tick succeeds
            return [None] * len(due)
        for (slot, status), ok in zip(due, results, strict=True):
            runner = slot.runner
            if not ok:
                if stop_fenced and runner is not None and not runner.stopped:
                    log.warning("span=%s/%d status write fenced off (lease or assignment changed); stopping it",
                                slot.cf, slot.span)
                    runner.stop()
                continue
            slot.reported = status
            slot.last_report = now
            if runner is not None:
                runner.persisted(status.checkpoint_ts)
        return list(results)


def report_due(prev: SpanStatus | None, status: SpanStatus, elapsed: float, *, min_interval: float,
               idle_interval: float, heartbeat: float = 10.0, started_at: int | None = None,
               caught_up_at: int = 0) -> bool:
    """Whether a span's ``status`` should be stored, ``elapsed`` seconds after ``prev`` was.

    - never stored, ``running``, ``error``, ``warnings``, ``hold_ts``, the barrier position or the verify hold obeyed
      (``held_id``/``held_ts``) changed: now (another span's barrier waits for the barrier position, a verifier for
      the hold);
    - the checkpoint Ts moved for the first time past ``started_at`` (the checkpoint the span's runner started from):
      now, so that the changefeed checkpoint moves as soon as a resumed, restarted or moved span has caught up with
      anything, not ``min_interval`` after the report that said it runs (once per start of a runner);
    - the checkpoint Ts reached ``caught_up_at`` (where the span's source caught up with its stream after a backlog:
      ``upstream.base.SpanSource.caught_up_ts``) and the stored one is below it: now, so that the end of a catch-up
      or of a burst is stored when it is written, not up to ``min_interval`` later (a steady stream, which never
      has a backlog, keeps the busy cadence);
    - checkpoint Ts moved (busy span): once ``min_interval`` has passed since the last write, so the
      stored checkpoint trails the span by at most about ``min_interval``;
    - only the checkpoint time or the resolved Ts moved (idle span, keepalives): every ``idle_interval``;
    - nothing moved: every ``heartbeat`` (its ``updated`` time shows that the processor is alive).
    """
    if prev is None or elapsed >= heartbeat:
        return True
    if _urgent_fields(prev) != _urgent_fields(status):
        return True  # (a table copy's hold released: the owner may publish the checkpoint at once)
    if status.checkpoint_ts > prev.checkpoint_ts:
        return elapsed >= min_interval or _first_move(prev, status, started_at) or _caught_up(prev, status,
                                                                                               caught_up_at)
    if (status.checkpoint_time, status.resolved_ts) != (prev.checkpoint_time, prev.resolved_ts):
        return elapsed >= idle_interval
    return False


def _urgent_fields(status: SpanStatus) -> tuple[object, ...]:
    """What of a span's status is stored at once when it changes (``report_due``)."""
    return (status.running, status.error, status.warnings, status.hold_ts, status.barrier_ts, status.barrier_seq,
            status.held_id, status.held_ts)


def _first_move(prev: SpanStatus | None, status: SpanStatus, started_at: int | None) -> bool:
    """``status`` is the first to store a checkpoint past ``started_at`` (the runner's start) after ``prev``."""
    return (started_at is not None and prev is not None and prev.checkpoint_ts <= started_at
            < status.checkpoint_ts)


def _caught_up(prev: SpanStatus | None, status: SpanStatus, caught_up_at: int) -> bool:
    """``status`` is the first to store a checkpoint at or past ``caught_up_at`` (``SpanRunner.caught_up_at``)."""
    return prev is not None and prev.checkpoint_ts < caught_up_at <= status.checkpoint_ts


def _newest(a: SpanStatus | None, b: SpanStatus | None) -> SpanStatus | None:
    """The status with the higher checkpoint (the one this processor stored may be newer than the snapshot)."""
    if a is None or (b is not None and b.checkpoint_ts > a.checkpoint_ts):
        return b
    return a


def _span_info(info: ChangefeedInfo, index: int) -> SpanInfo:
    for s in info.spans:
        if s.index == index:
            return s
    raise TidewaterError(f"changefeed {info.id} has no span {index}")


def running_error(exc: BaseException | None, capture_id: str, span: int, now: float) -> RunningError:
    """The span's error as stored in etcd and shown by the API: its message scrubbed of any secret."""
    if isinstance(exc, TidewaterError):
        return RunningError(exc.code, scrub(exc.message), now, capture_id, span, exc.retryable)
    return RunningError("CDC:ErrInternal", scrub(f"{type(exc).__name__}: {exc}"), now, capture_id, span, True)


def open_span_sink(sinks: SinkOpener, sink_uri: str, config: ChangefeedConfig, origin: int = 0) -> TxnSink:
    """A span's sink: with ``[consistency] mode = "snapshot"`` one that stages its writes for the owner's barriers
    (``sinks.base.BarrierSink.stage_barriers``, ``origin``: the changefeed's start Ts); a sink without that role fails
    the span (``SinkError``: applying directly would show readers states the upstream never had)."""
    sink = sinks.open(sink_uri, config.sink, config.ddl)
    if config.consistency.snapshot:
        if not isinstance(sink, BarrierSink):
            sink.close()
            raise SinkError(f"the sink {type(sink).__name__} cannot apply whole barriers: [consistency] mode = "
                            "\"snapshot\" needs an SQL target (docs/consistency.md)")
        sink.stage_barriers(origin)
    return sink
