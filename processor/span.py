"""A span running on this capture: puller thread (the upstream's span source) -> sorter -> mounter -> sink thread.

Guarantees:
- ``checkpoint`` only moves forward and only after the sink returned from ``write`` for every
  transaction with commit Ts <= checkpoint.ts (so it is durable downstream).
- The upstream slot is acked (``persisted``) only with a checkpoint the processor has stored in etcd.
- Whole upstream transactions are handed to the sink; several small ones may share a downstream
  transaction (up to ``sink.txn_rows`` rows), a large one is streamed in one call.
- With ``position`` the sink is opened for exactly-once delivery (``TxnSink.open_position``): a replay from
  an etcd checkpoint older than what the target holds is skipped by the sink, never applied twice.
- Any error stops both threads; ``error`` holds it and ``failed`` is set. A failed runner is discarded
  and a new one restarts the span from its persisted checkpoint (the sorter is cleared on start, and by
  ``discard()`` when the processor discards a failed runner).
- Data warnings: after every successful ``write`` the sink's ``take_warnings()`` are merged (by code and
  table) into ``warnings``, a :class:`SpanWarnings` the processor keeps across restarts of the span and
  stores in ``SpanStatus.warnings``. With a ``row_source`` factory, the sink thread gives a sink that re-reads
  missing rows (``sinks.base.RowSourceUser``) a fresh row source and closes it (its ``close()``, if any) when
  the thread ends.
- Sink roles (``sinks.base``): rows go through ``TxnSink.write``; a ``BufferedSink`` is flushed as below; a
  schema change goes to ``DdlSink.apply_ddl`` (a sink without that role rejects every DDL: ``DdlRejected``).
- Span watermarks (``sinks.base.WatermarkSink``): the sink is told which span of how many it serves
  (``bind_span``, before ``open_position``) and, with ``watermark_interval`` > 0, gets
  ``publish_resolved(checkpoint)`` after the checkpoint moved, at most every ``watermark_interval`` seconds (so the
  checkpoint it is given is durable downstream).
- Watermarks during a table copy (``watermark_limit``): the copy's rows are written by the copy job with the commit
  Ts of their snapshot ``C`` while the span streams its other tables past ``C``. Until the copy is written (the
  hold released), no watermark of this span says more than ``watermark_limit``: the span's start checkpoint, or
  ``B - 1`` once the copy's first snapshot ``B`` is known (every snapshot of the copy is at or above ``B``, and
  above the start checkpoint: exported after it). The processor stores it in ``SpanStatus.hold_ts`` and the owner
  holds the changefeed's published checkpoint there too (docs/snapshot.md, "Table copies"), so no consumer cuts
  past a copied row it has not read yet.
- A verify hold (``changefeed verify``, docs/verify.md "The hold"; :meth:`SpanRunner.set_verify_hold`): while the
  processor passes one, the sink thread applies nothing past its point -- ``(id, 0)``: where the span is (a write
  in progress ends after its downstream transaction); ``(id, ts)``: everything up to commit Ts ``ts`` -- and once its
  checkpoint is exactly there sets ``verify_held`` to ``(id, point)``, which the processor stores in
  ``SpanStatus.held_id``/``held_ts``. Reading and sorting go on; the slot is confirmed only up to the checkpoint.
- Passes, not transactions: the source wakes the sink thread when it reports resolved (after each commit, or once for
  the commits of one read of its stream: ``upstream.postgres.source``), and a pass writes everything committed
  up to the resolved watermark; a pass that wrote is followed by the next one no sooner than ``PASS_GAP`` (2 ms) after
  it ended, so transactions that arrive faster than that share a pass (one wake-up, one batcher, one sink write:
  single-row transactions cost one pass each without it, ~50 us). A transaction waits at most ``PASS_GAP`` more;
  after a quiet moment the first one is read at once. Checkpoint and resolved semantics are unchanged (the checkpoint
  still moves only after the sink returned).
Thread-safety: ``checkpoint``, ``resolved``, ``rows``, ``error`` are read by the processor thread;
each is a single reference assignment.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from cdc.config import DdlConfig
from cdc.errors import DdlOrderUnknown, DdlRejected, LeaseLost, SnapshotTableChanged, TidewaterError
from cdc.events import DdlEvent, DdlKind, TableSchema
from cdc.model import DataWarning, WarningSeverity, merge_warnings
from cdc.stats import SpanStats
from cdc.ts import Watermark
from processor.barrier import barrier_position
from processor.batcher import TxnBatcher
from processor.floors import TableFloors
from processor.mounter import Mounter
from processor.table_hold import TableHold
from sinks.base import (
    BarrierSink,
    BufferedSink,
    RowSource,
    RowSourceUser,
    TextRows,
    TxnSink,
    WatermarkSink,
    apply_ddl,
    waits_for_barrier,
)
from sorter.base import SpanSorter
from upstream.base import ChangeDecoder, SpanSource

log = logging.getLogger(__name__)

# Stores (commit Ts, table oid, schema from then on | None when dropped) in the schema history; the int is the
# span's stored checkpoint (older versions than the last one at or below it are no longer needed).
SchemaRecorder = Callable[[list[tuple[int, int, TableSchema | None]], int], None]

# The sink thread starts a pass that reads the sorter at least this long after the end of the last one that wrote
# (module docstring: one wake-up, batcher and sink write per pass, not per transaction)
PASS_GAP = 0.002

# DDL kinds that change which table a downstream name belongs to: a changefeed barrier (_changefeed_barrier)
NAME_CHANGES = frozenset({DdlKind.CREATE_TABLE, DdlKind.DROP_TABLE, DdlKind.RENAME_TABLE})


class SpanWarnings:
    """The data warnings of one span on this capture, merged by (code, table) (``cdc.model.merge_warnings``).

    Outlives the span's runners: the processor creates it from the span's stored ``SpanStatus.warnings``
    and hands it to every runner it starts for the span, so warnings survive restarts (and, through etcd,
    moves to other captures). ``acknowledge(t)`` forgets every warning last raised at or before ``t`` (the
    changefeed's ``resumed_at``); a later occurrence starts a new count. Thread-safe: the sink thread
    ``add``s, the processor thread reads ``current()`` and acknowledges.
    """

    def __init__(self, initial: tuple[DataWarning, ...] = ()) -> None:
        self._lock = threading.Lock()
        self._warnings = tuple(initial)
        self._acked = 0.0

    def add(self, new: list[DataWarning]) -> None:
        if not new:
            return
        with self._lock:
            self._warnings = merge_warnings(self._warnings, [w for w in new if w.seen > self._acked])

    def acknowledge(self, until: float) -> None:
        with self._lock:
            if until > self._acked:
                self._acked = until
                self._warnings = tuple(w for w in self._warnings if w.seen > until)

    def current(self) -> tuple[DataWarning, ...]:
        return self._warnings


@dataclass(frozen=True)
class SinkPlan:
    """What the span's sink thread writes, and into what.

    ``open`` opens the span's sink (a ``sinks.base.TxnSink`` with whatever other roles it has; the sink thread checks
    it, then closes it when it ends). ``txn_rows``: rows per downstream transaction of small upstream ones.
    ``position``: (changefeed, span index, span start Ts), the sink's exactly-once position (``open_position``);
    ``spans``: the changefeed's span count (``WatermarkSink.bind_span``). ``row_source`` opens a fresh row source for
    a ``RowSourceUser`` sink. ``ddl``: the changefeed's ``[ddl]`` settings (what to skip). ``target_ts``: the
    changefeed's target Ts (0: none): nothing committed after it is written. ``barrier_origin``: the changefeed's start
    Ts when the sink stages for barriers (``[consistency] mode = "snapshot"``, ``sinks.base.BarrierSink``; None: it
    does not): a schema change that alters a table's shape then waits for the barrier just before its transaction
    (``SpanRunner._barrier_wait``).
    """

    open: Callable[[], TxnSink]
    txn_rows: int
    position: tuple[str, int, int] | None = None
    spans: int = 1
    row_source: Callable[[], RowSource] | None = None
    ddl: DdlConfig = field(default_factory=DdlConfig)
    target_ts: int = 0
    barrier_origin: int | None = None


@dataclass(frozen=True)
class CopyPlan:
    """The span's copies (``processor.snapshot.InitialCopy``). ``initial``: the initial copy, run before the span
    streams (its floors then drop the changes it already holds). Otherwise ``floors``/``ceilings`` are the stored ones
    of earlier copies (per relation oid, ``processor.floors``: changes in (floor, ceiling] are replayed over possibly
    newer rows), and ``table``, with its ``hold``, is a table copy that runs beside the stream, which holds back the
    copied tables' changes (``processor.table_hold``; the runner is its ``StreamGate``)."""

    initial: Callable[[threading.Event], Mapping[str, int]] | None = None
    floors: TableFloors | None = None
    ceilings: TableFloors | None = None
    table: Callable[[threading.Event, SpanRunner], Mapping[str, int]] | None = None
    hold: TableHold | None = None


@dataclass(frozen=True)
class SpanHooks:
    """What the span calls back into, and what its processor keeps across restarts of the span.

    ``fence`` refuses a downstream commit (the capture's lease); ``schema_history`` stores schema versions;
    ``barrier(event, stop)`` waits until the name-changing DDL ``event`` may be applied: every other span of the
    changefeed wrote all before its commit Ts and applied every DDL before it in its transaction (the wait rule of
    ``processor.barrier``; None: one span), then returns what contradicts applying it: a description per table
    whose name it changes that another span's copy already wrote *as of a later Ts* (empty: none). It raises
    ``DdlOrderUnknown`` when ``event`` has no position in its transaction across spans and another span waits at a
    DDL of the same transaction.
    ``warnings`` and ``stats`` outlive the runner (None: the runner's own).
    ``report_now`` is called (on the sink thread) when the processor should store the span's status at once
    (``processor.processor.report_due``): the checkpoint first passed the start (once per runner), or reached the
    point where the source last caught up with its stream after a backlog (``SpanRunner.caught_up_at``); it must not
    block."""

    fence: Callable[[], None] | None = None
    schema_history: SchemaRecorder | None = None
    barrier: Callable[[DdlEvent, threading.Event], list[str]] | None = None
    warnings: SpanWarnings | None = None
    stats: SpanStats | None = None
    report_now: Callable[[], None] | None = None


class SpanRunner:
    """One span's threads (module docstring), built from its source, its sorter, what its sink thread writes
    (:class:`SinkPlan`), its copies (:class:`CopyPlan`) and its hooks into the processor (:class:`SpanHooks`)."""

    def __init__(self, label: str, start: Watermark, source: SpanSource, sorter: SpanSorter, sink: SinkPlan,
                 copy: CopyPlan | None = None, hooks: SpanHooks | None = None) -> None:
        copy = copy or CopyPlan()
        hooks = hooks or SpanHooks()
        self.label = label
        self.stats = hooks.stats if hooks.stats is not None else SpanStats()  # the processor keeps it across restarts
        self.error_stage = ""  # "puller" or "sink": the thread whose failure stopped the span
        self.source = source
        self.sorter = sorter
        self._sink_factory = sink.open
        self._outer_fence = hooks.fence
        self.txn_rows = sink.txn_rows
        self.target_ts = sink.target_ts  # changefeed target Ts: nothing committed after it is written
        # (changefeed, span index, span start Ts): the sink's exactly-once position (TxnSink.open_position)
        self.position = sink.position
        self.spans = sink.spans  # the changefeed's span count (WatermarkSink.bind_span)
        self.ddl = sink.ddl
        self.barrier_origin = sink.barrier_origin  # (snapshot mode) the changefeed's start Ts: see _barrier_wait
        self._schema_history = hooks.schema_history
        self._barrier = hooks.barrier  # waits until every other span of the changefeed wrote all before a commit Ts
        # (commit Ts, seq) of the DDL the sink thread waits at a barrier to apply (the changefeed barrier of a
        # name-changing one, or snapshot mode's applied barrier; None: it does not wait); the processor stores it in
        # SpanStatus.barrier_ts/barrier_seq (processor.barrier), which then counts as a checkpoint of commit Ts - 1
        self.barrier_at: tuple[int, int] | None = None
        self.resolved = start
        self.checkpoint = start
        self.start_ts = start.ts  # the checkpoint this runner started from
        self._first_move = hooks.report_now  # called once the checkpoint passed start_ts (then None)
        self._report_now = hooks.report_now
        # the latest SpanSource.caught_up_ts the checkpoint reached (the end of a catch-up or a burst: the processor
        # stores the checkpoint that passes it at once); read by the processor thread (one int assignment)
        self.caught_up_at = 0
        self.start_time = start.time
        self.rows = 0
        self.warnings = hooks.warnings if hooks.warnings is not None else SpanWarnings()
        self._row_source = sink.row_source
        self.error: BaseException | None = None
        self.failed = threading.Event()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._persisted = start.ts
        self._cleaned = start.ts
        # what the sink was given (the checkpoint is what is durable: the same, except for a sink that buffers
        # until its flush: BufferedSink)
        self._written = start
        self._dirty = False
        self._last_flush = 0.0
        self._published = start.ts  # the last checkpoint given to WatermarkSink.publish_resolved
        # a verify hold (module docstring): (hold id, Ts; 0: where the span is) set by the processor thread, the
        # point a freeze stopped at (hold id, Ts) fixed by the sink thread, and (hold id, Ts) once the checkpoint is
        # exactly at the hold's point (read by the processor thread; single reference assignments)
        self.verify_hold: tuple[int, int] | None = None
        self._frozen: tuple[int, int] | None = None
        self.verify_held: tuple[int, int] | None = None
        self._last_publish = 0.0
        self._threads: list[threading.Thread] = []
        self._source_open = threading.Event()  # the puller thread opened the source
        self.started = time.time()
        # the initial copy (processor.snapshot.InitialCopy) runs first, then the span streams; the copy's
        # floors drop the changes it already holds (TxnBatcher)
        self.initial_copy = copy.initial
        self._copied = False
        self._lifecycle = threading.Lock()  # stop() and the copy's hand-over to streaming
        # (per relation oid, processor.floors: a table renamed inside its copy's window keeps its floor)
        self.floors = (copy.floors or TableFloors()).above(start.ts)
        # tables copied under several snapshots: changes in (floor, ceiling] are replayed over possibly newer rows
        # (TxnBatcher: marked cdc.events.REPLAYED, one transaction per batch)
        self.ceilings = (copy.ceilings or TableFloors()).above(start.ts)
        # a table copy (processor.snapshot.InitialCopy with tables) runs beside the stream, which holds back the
        # copied tables' changes (processor.table_hold); the runner is its StreamGate
        self.table_copy = copy.table
        self.hold = copy.hold  # (given with table_copy)

    # ---- lifecycle -------------------------------------------------------------------------------
    def start(self) -> None:
        self.sorter.clear()
        if self.initial_copy is not None:
            self._spawn("copy", self._run_copy)
        else:
            self._start_streaming()
            if self.table_copy is not None:
                self._spawn("copy", self._run_table_copy)

    def _start_streaming(self) -> None:
        for name, target in (("puller", self._run_puller), ("sink", self._run_sink)):
            self._spawn(name, target)

    def _spawn(self, name: str, target: Callable[[], None]) -> None:
        th = threading.Thread(target=self._guard, args=(target, name), name=f"{name}-{self.label}", daemon=True)
        self._threads.append(th)
        th.start()

    @property
    def copying(self) -> bool:
        """The span is in its initial copy (it streams only after it)."""
        return self.initial_copy is not None and not self._copied

    def _run_copy(self) -> None:
        assert self.initial_copy is not None
        floors = self.initial_copy(self._stop)
        with self._lifecycle:
            if self._stop.is_set():
                return
            oids = getattr(self.initial_copy, "oids", {})
            self.floors = TableFloors(floors, oids).above(self.checkpoint.ts)
            self.ceilings = TableFloors(getattr(self.initial_copy, "ceilings", {}), oids).above(self.checkpoint.ts)
            self._copied = True
            self._start_streaming()

    @property
    def table_copying(self) -> bool:
        """A table copy runs beside the stream (its tables' changes are held back until it is written)."""
        return self.hold is not None and not self.hold.released

    def _run_table_copy(self) -> None:
        assert self.table_copy is not None and self.hold is not None
        floors = self.table_copy(self._stop, self)
        oids = getattr(self.table_copy, "oids", {})
        # (read by the next batcher; the copied tables' floors also by oid: a rename inside the copy's window keeps
        # its floor once the hold is released)
        self.ceilings = self.ceilings.merged(TableFloors(getattr(self.table_copy, "ceilings", {}), oids))
        self.floors = self.floors.merged(TableFloors(floors, oids).above(self.checkpoint.ts))
        self.hold.release(floors, oids)
        log.info("span=%s table copy of %s done; their changes stream again", self.label,
                 ", ".join(sorted(self.hold.tables)))

    # StreamGate (processor.snapshot) of a table copy
    def pass_up_to(self, boundary: int, drop: Mapping[str, int], oids: Mapping[str, int] | None = None) -> None:
        assert self.hold is not None
        self.hold.pass_up_to(boundary, drop, oids)
        self._wake.set()

    @property
    def watermark_limit(self) -> Watermark | None:
        """The highest watermark the span's sink may publish while a table copy runs (module docstring); None: no
        limit."""
        hold = self.hold
        if hold is None or hold.released:
            return None
        start = Watermark(self.start_ts, self.start_time)
        boundary = hold.boundary
        if boundary is not None and boundary - 1 > start.ts:
            return Watermark(boundary - 1, start.time)
        return start

    def caught_up(self, boundary: int) -> bool:
        assert self.hold is not None
        return self.checkpoint.ts >= boundary or self.hold.blocked_at > boundary

    def stop(self, timeout: float = 10.0) -> bool:
        """Stop both threads; True once they have exited (then nothing more reaches the sink)."""
        with self._lifecycle:
            self._stop.set()
        self._wake.set()
        if self.hold is not None:
            self.hold.wake()  # a sink thread waiting on the hold sees the stop
        deadline = time.monotonic() + timeout
        for th in self._threads:
            th.join(max(0.0, deadline - time.monotonic()))
        self.source.close()
        return not self.alive

    def discard(self) -> None:
        """After ``stop()`` returned True (both threads exited): drop what the span's sorter holds (memory,
        LevelDB entries, spill files), so a failed span waiting to restart keeps no disk space. Best effort:
        a failure is logged, and the next ``start()`` clears again."""
        try:
            self.sorter.clear()
        except TidewaterError as exc:
            log.warning("span=%s: clearing the sorter of the failed span failed: %s", self.label, exc)

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    @property
    def alive(self) -> bool:
        """A thread of this span still runs (a stopped span may still be finishing a sink write)."""
        return any(th.is_alive() for th in self._threads)

    def _fence(self) -> None:
        """Called by the sink right before each downstream commit."""
        if self._stop.is_set():
            raise LeaseLost(f"span {self.label} is stopping: its last batch is not committed")
        if self._outer_fence is not None:
            self._outer_fence()

    def set_verify_hold(self, hold: tuple[int, int] | None) -> None:
        """Obey the verify hold ``(id, ts)`` (``ts`` 0: stop where the span is), or none (module docstring)."""
        if hold != self.verify_hold:
            self.verify_hold = hold
            self._wake.set()

    def _hold_point(self) -> int | None:
        """The commit Ts the sink thread may apply up to under the current verify hold (None: no hold)."""
        hold = self.verify_hold
        if hold is None:
            self._frozen = None
            self.verify_held = None
            return None
        hold_id, ts = hold
        if ts == 0:
            if self._frozen is None or self._frozen[0] != hold_id:
                self._frozen = (hold_id, self._written.ts)
            point = self._frozen[1]
        else:
            point = ts
        if self.checkpoint.ts == point or (self.checkpoint.ts > point and self._written.ts > point):
            # at the point, or already past it (a span restarted from a later checkpoint): the verifier compares
            # held_ts with its point and refuses a span that went past it
            self.verify_held = (hold_id, self.checkpoint.ts)
        else:
            self.verify_held = None
        return point

    def resume_token(self, ts: int) -> str | None:
        """The source's resume token of checkpoint ``ts`` (``SpanSource.resume_token``; stored beside it)."""
        return self.source.resume_token(ts)

    def persisted(self, ts: int) -> None:
        """The processor stored checkpoint ``ts`` in etcd: the upstream may now forget it."""
        if ts > self._persisted:
            self._persisted = ts
            self.source.ack(ts)
            self._wake.set()

    def _guard(self, target: Callable[[], None], stage: str = "") -> None:
        try:
            target()
        except BaseException as exc:  # noqa: BLE001 - any failure stops the span; the processor restarts it
            if not self._stop.is_set():
                self.error_stage = stage
                self.error = exc
                level = logging.WARNING if isinstance(exc, TidewaterError) else logging.ERROR
                log.log(level, "span=%s failed: %s", self.label, exc, exc_info=not isinstance(exc, TidewaterError))
                self.failed.set()
            self._stop.set()
            self._wake.set()

    def _schema_changes(self, decoder: ChangeDecoder) -> Callable[[bytes, int, float], list[DdlEvent]]:
        """``decoder.schema_changes``, except that a DDL the upstream could not describe (``DdlRejected`` at
        decode) is skipped under the same settings as one the sink rejects (else it fails the span)."""
        def decode(raw: bytes, commit_ts: int, commit_time: float) -> list[DdlEvent]:
            try:
                return decoder.schema_changes(raw, commit_ts, commit_time)
            except DdlRejected as exc:
                if self.ddl.mode == "ignore" or commit_ts in self.ddl.skip_ts or self.ddl.on_error == "skip":
                    now = time.time()
                    self.warnings.add([DataWarning("CDC:WarnDdlSkipped", exc.table, f"schema change skipped: "
                                                   f"{exc.message}", WarningSeverity.DIVERGENCE, first_time=now,
                                                   last_time=now)])
                    return []
                raise
        return decode

    def _apply_ddl(self, sink: TxnSink, event: DdlEvent) -> None:
        """Apply one schema change downstream, or skip it knowingly (``[ddl] mode = "ignore"``, its commit Ts in
        ``[ddl] skip-ts``, or ``on-error = "skip"`` after the sink rejected it): a skipped DDL is recorded by the
        sink (replays leave it) and raised as a warning naming it, never only logged."""
        what = f"{event.query or ', '.join(event.kinds)} on {event.table} (commit Ts {event.commit_ts})"
        conflicts = []
        skipped = self.ddl.mode == "ignore" or event.commit_ts in self.ddl.skip_ts
        if self._barrier is not None and NAME_CHANGES.intersection(event.kinds):
            try:
                conflicts = self._changefeed_barrier(event)
            except DdlOrderUnknown:
                if not skipped:  # (skipped: it changes nothing downstream, its order does not matter)
                    raise
        table = event.after if event.after is not None else event.before
        if table is not None and table.relation_id:  # the table's new shape, even when not applied downstream
            self._record_schemas([(event.commit_ts, table.relation_id, event.after)])
        if conflicts and not skipped:
            raise SnapshotTableChanged(
                f"span {self.label}: schema change {what} cannot be applied: {'; '.join(conflicts)}. Applying it "
                "would remove or change rows that copy wrote (a table was renamed onto that name while its copy "
                "ran, so the copy ran ahead of this changefeed barrier). Fix: skip this DDL (`cdc cli changefeed "
                f"update -c {self.label.rsplit('/', 1)[0]} --skip-ddl-ts {event.commit_ts}`, then `resume`), then copy "
                "the tables it names again (`cdc cli changefeed snapshot --table ...`) so their targets are rebuilt")
        if skipped:
            apply_ddl(sink, event, self._fence, skip=True)
            why = "[ddl] mode = \"ignore\"" if self.ddl.mode == "ignore" else "its commit Ts is in [ddl] skip-ts"
            self._ddl_warning("CDC:NoticeDdlSkipped", event, f"schema change {what} not applied downstream: {why}",
                              WarningSeverity.NOTICE)
            return
        if self.barrier_origin is not None and waits_for_barrier(event):
            self._barrier_wait(sink, event)
        try:
            applied = apply_ddl(sink, event, self._fence)
        except DdlRejected as exc:
            if self.ddl.on_error != "skip":
                raise
            apply_ddl(sink, event, self._fence, skip=True)
            self._ddl_warning("CDC:WarnDdlSkipped", event, f"schema change {what} was rejected downstream and skipped "
                              f"([ddl] on-error = \"skip\"): {exc.message}; the target's schema now differs from "
                              f"the upstream's", WarningSeverity.DIVERGENCE)
            return
        log.info("span=%s schema change %s %s", self.label, what, "applied" if applied else "already applied")

    def _settle(self, w: Watermark, rows: int) -> None:
        """The sink was given every change up to ``w`` (``rows`` of them in the last write): the checkpoint moves
        there now, or, for a sink that buffers (``BufferedSink``) and holds unflushed rows, at its next
        flush (:meth:`_flush`)."""
        self._written = w
        if rows:
            self._dirty = True
        if not self._dirty:
            self._advance(w)

    def _flush(self, sink: TxnSink, force: bool = False) -> None:
        """A buffering sink's flush, once ``flush_interval`` passed since the last one (or ``force``): then the
        checkpoint takes everything written so far (at once for a sink that does not buffer)."""
        if not self._dirty:
            return
        now = time.monotonic()
        if isinstance(sink, BufferedSink):
            if not force and now - self._last_flush < sink.flush_interval:
                return
            sink.flush(self._fence)
        self._last_flush = now
        self._dirty = False
        self._advance(self._written)

    def _advance(self, w: Watermark) -> None:
        """The checkpoint moves to ``w`` (everything up to it is durable downstream)."""
        self.checkpoint = w
        if self._first_move is not None and w.ts > self.start_ts:
            first_move, self._first_move = self._first_move, None
            first_move()
        caught_up = self.source.caught_up_ts()
        if caught_up > self.caught_up_at and w.ts >= caught_up:  # everything the source had when it caught up
            self.caught_up_at = caught_up
            if self._report_now is not None:
                self._report_now()

    def _publish(self, sink: TxnSink) -> None:
        """Span watermarks (``WatermarkSink``): the checkpoint, once it moved and the interval passed."""
        if not isinstance(sink, WatermarkSink):
            return
        interval = sink.watermark_interval
        if interval <= 0 or self.checkpoint.ts <= self._published:
            return
        now = time.monotonic()
        if now - self._last_publish < interval:
            return
        w = self.checkpoint
        limit = self.watermark_limit  # a table copy's rows are not all written yet
        if limit is not None and w.ts > limit.ts:
            if limit.ts <= self._published:
                return
            w = limit
        sink.publish_resolved(w, self._fence)
        self._published, self._last_publish = w.ts, now

    def _changefeed_barrier(self, event: DdlEvent) -> list[str]:
        """A DDL that changes which table holds a downstream name (CREATE, DROP, RENAME TABLE) waits until every
        other span of the changefeed has written everything committed before it and applied every DDL before it in
        its own transaction: the old holder of the name may live in another span (``DROP TABLE b; ALTER TABLE a
        RENAME TO b`` with ``a`` and ``b`` in two spans must not rename onto a ``b`` that the other span has not
        dropped yet, also when both statements are in one transaction). Everything of this span before the DDL's
        transaction is written, so its checkpoint moves to just below it first, and every DDL of this span before it
        is applied, so it then publishes where it waits (:attr:`barrier_at`, ``processor.barrier.barrier_position``),
        which counts as a checkpoint of ``B - 1`` (``cdc.model.SpanStatus.covered_ts``; the stored checkpoint itself
        stays a safe restart point below ``B``): spans waiting at their own such DDL see both, and the least waiting
        position always proceeds (no deadlock; the proof is in ``processor.barrier``)."""
        assert self._barrier is not None
        self.barrier_at = barrier_position(event)
        try:
            conflicts = self._barrier(event, self._stop)
        finally:
            self.barrier_at = None
        if self._stop.is_set():
            raise LeaseLost(f"span {self.label} stopped while waiting at the changefeed barrier of a DDL")
        return conflicts

    def _barrier_wait(self, sink: TxnSink, event: DdlEvent) -> None:
        """``[consistency] mode = "snapshot"``: a schema change that alters a table's shape is applied to the real
        table only once the target shows the barrier ``B - 1`` just before its transaction ``B``, so every staged row
        of the old shape is applied before it (``sinks.base.BarrierSink``). Everything of this span before ``B`` is
        staged, so it publishes where it waits (:attr:`barrier_at`), which counts as ``B - 1`` in the changefeed
        checkpoint (``cdc.model.SpanStatus.covered_ts``): the barrier can get there, and cannot pass it while this span
        waits, so the DDL lands between barriers ``B - 1`` and ``B``. The stored checkpoint is not moved to ``B - 1``:
        that is inside ``B``'s commit record, and a PostgreSQL slot read from there skips ``B`` (seen: a span restarted
        after such a checkpoint lost its DDL). Polls the target's barrier every 0.2 s; a stop raises ``LeaseLost`` (the
        span restarts from its checkpoint and waits again; a DDL applied before the stop is found in the record and not
        applied twice)."""
        if not isinstance(sink, BarrierSink):
            raise DdlRejected(event.query or ", ".join(event.kinds), str(event.table),
                              f"{type(sink).__name__} does not apply barriers", commit_ts=event.commit_ts)
        assert self.position is not None and self.barrier_origin is not None
        below = event.commit_ts - 1
        changefeed, origin = self.position[0], self.barrier_origin
        shown = sink.applied_barrier(changefeed, origin)
        if shown >= below:
            return
        log.info("span=%s schema change on %s at commit %d waits for barrier %d (the target shows %d)", self.label,
                 event.table, event.commit_ts, below, shown)
        began = time.monotonic()
        self.barrier_at = barrier_position(event)
        try:
            while shown < below:
                if self._stop.wait(0.2):
                    raise LeaseLost(f"span {self.label} stopped while its schema change at commit {event.commit_ts} "
                                    f"waited for barrier {below}")
                shown = sink.applied_barrier(changefeed, origin)
        finally:
            self.barrier_at = None
        log.info("span=%s barrier %d applied after %.1fs: applying the schema change on %s", self.label, shown,
                 time.monotonic() - began, event.table)

    def _ddl_warning(self, code: str, event: DdlEvent, message: str, severity: WarningSeverity) -> None:
        now = time.time()
        self.warnings.add([DataWarning(code, str(event.table), message, severity, first_time=now, last_time=now)])
        log.warning("span=%s %s", self.label, message)

    def _take_warnings(self, origin: SpanSource | TxnSink) -> None:
        new = origin.take_warnings()
        if new:
            self.warnings.add(new)
            log.warning("span=%s data warning(s): %s", self.label,
                        "; ".join(f"{w.code} {w.table} x{w.count}" for w in new))

    # ---- threads ---------------------------------------------------------------------------------
    def _on_resolved(self, w: Watermark) -> None:
        """Called by the source when it reports resolved (after a commit or a run of them): the sink thread wakes
        (``Event.set`` only when the event is not already set: while the sink thread is busy, the source's reports take
        no lock here)."""
        self.resolved = w
        if not self._wake.is_set():
            self._wake.set()

    def _record_schemas(self, versions: list[tuple[int, int, TableSchema | None]]) -> None:
        """Store schema versions in the schema history before the checkpoint passes them (sink thread)."""
        if versions and self._schema_history is not None:
            self._schema_history(versions, self._persisted)

    def _run_puller(self) -> None:
        self.source.open()
        self._source_open.set()
        self.source.run(self.sorter, self._stop, self._on_resolved)

    def _run_sink(self) -> None:
        sink = self._sink_factory()
        source: RowSource | None = None
        try:
            if self._row_source is not None and isinstance(sink, RowSourceUser):
                source = self._row_source()
                sink.set_row_source(source)
            sink.check()
            if self.position is not None:
                if isinstance(sink, WatermarkSink):
                    sink.bind_span(self.position[0], self.position[1], self.spans)
                applied = sink.open_position(*self.position)
                if applied > self.checkpoint.ts:
                    log.info("span=%s target already holds up to commit %d (checkpoint %d): the replay skips it",
                             self.label, applied, self.checkpoint.ts)
                    while not self._source_open.wait(0.2):  # (the puller thread opens it)
                        if self._stop.is_set():
                            return
                    self.source.check_target_ahead(applied)  # can it replay them under the same Ts?
            decoder = self.source.decoder()
            mount = Mounter(decoder, defer=isinstance(sink, TextRows)).mount  # (text rows: typed values when read)
            self._written = self.checkpoint
            self._last_flush = time.monotonic()
            wrote_at = -1.0  # (monotonic) the end of the last pass that wrote transactions
            while not self._stop.is_set():
                self._wake.wait(0.2)
                gap = wrote_at + PASS_GAP - time.monotonic()
                if gap > 0:  # transactions arriving faster than PASS_GAP share one pass (module docstring)
                    time.sleep(gap)
                self._wake.clear()
                self._flush(sink)
                self._publish(sink)
                self._take_warnings(self.source)
                if self._persisted > self._cleaned:
                    self.sorter.clean(self._persisted)
                    self._cleaned = self._persisted
                target = self.resolved
                self._record_schemas([(ts, s.relation_id, s) for ts, s in self.source.take_schema_versions()])
                if self.target_ts and target.ts > self.target_ts:
                    target = Watermark(self.target_ts, target.time)
                point = self._hold_point()
                if point is not None and target.ts > point:
                    target = Watermark(point, target.time) if point > self._written.ts else self._written
                if target.ts <= self._written.ts:
                    if target.ts == self._written.ts and target.time > self._written.time:
                        self._settle(target, 0)
                    continue
                if self.floors and self._written.ts >= self.floors.top:
                    self.floors = TableFloors()  # past every floor: nothing more to check
                if self.ceilings and self._written.ts >= self.ceilings.top:
                    self.ceilings = TableFloors()
                batcher = TxnBatcher(self.sorter.read_txns(self._written.ts, target.ts), mount, self.txn_rows,
                                     self.source.schema_change_commits(), self._schema_changes(decoder), self.floors,
                                     self.hold, self.ceilings)
                stats = self.stats
                frozen = False
                while batcher.has_more() and not self._stop.is_set():
                    hold = self.verify_hold
                    if hold is not None and hold[1] == 0:
                        frozen = True  # a verify hold's first phase: stop after the transactions written so far
                        break
                    if self.hold is not None and batcher.blocked():  # a table copy holds its next transaction back
                        self.hold.wait(self._stop)
                        continue
                    began = time.monotonic()  # one sink write = one downstream transaction (mount included)
                    written = sink.write(batcher.next_batch(), self._fence)
                    stats.sink_write_seconds.observe(time.monotonic() - began)
                    stats.sink_batch_rows.observe(written)
                    self.rows += written
                    stats.sorter_out_rows += batcher.read_rows
                    stats.sorter_out_bytes += batcher.read_bytes
                    stats.sink_rows += written
                    stats.sink_bytes += batcher.read_bytes
                    stats.sink_txns += batcher.read_txns
                    self._take_warnings(sink)
                    if not batcher.batch_complete:
                        raise RuntimeError(f"sink {type(sink).__name__} returned before consuming its batch")
                    if batcher.ddl:
                        self._flush(sink, force=True)  # a DDL is applied after the rows before it are durable
                    for event in batcher.ddl:  # a barrier: the rows before it are written, those after wait
                        self._apply_ddl(sink, event)
                    if batcher.last is not None:
                        self._settle(batcher.last, written)
                    self._flush(sink)
                    self._publish(sink)
                if not self._stop.is_set() and not frozen:
                    self._settle(target, 0)
                    self._publish(sink)
                self._hold_point()
                wrote_at = time.monotonic()
        finally:
            try:
                sink.close()
            finally:
                close = getattr(source, "close", None)
                if close is not None:
                    close()
