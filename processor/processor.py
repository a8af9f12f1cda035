"""The processor of one capture: runs the spans the owner assigned to this capture.

Each tick reads one etcd snapshot, starts the span runners newly assigned here, stops those no longer
assigned (or reassigned with a new epoch), restarts failed ones with exponential backoff, and reports
every running span's resolved and checkpoint watermarks as a ``SpanStatus``.

Guarantees:
- Fencing: every ``SpanStatus`` write is an etcd transaction conditioned on this capture's key still
  being held by its current lease and on the span's assignment still being exactly the one this
  runner was started for. A capture that lost its lease or its assignment cannot report, and a span
  whose report fails is never acked upstream.
- The upstream slot is acked only up to a checkpoint that was stored in etcd by such a write.
- Threading: ``run`` owns the loop thread; ``close`` may be called from another thread after ``stop``
  is set.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from cdc.config import ChangefeedConfig, ServerConfig
from cdc.errors import LeaseLost, MetaStoreError, TidewaterError
from cdc.filter import TableFilter
from cdc.meta.store import ClusterSnapshot, MetaStore
from cdc.model import ChangefeedInfo, RunningError, SpanAssignment, SpanInfo, SpanStatus
from cdc.ts import Watermark
from processor.puller import Puller
from processor.span import SpanRunner
from sinks.factory import open_sink
from sorter.base import Sorter
from upstream.postgres.conn import connect
from upstream.postgres.stream import ReplicationStream

log = logging.getLogger(__name__)



@dataclass
class _Slot:
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


class Processor:
    def __init__(self, store: MetaStore, capture_id: str, sorter: Sorter, config: ServerConfig,
                 lease: Callable[[], int], lease_deadline: Callable[[], float] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.capture_id = capture_id
        self.sorter = sorter
        self.config = config
        self._lease = lease
        self._lease_deadline = lease_deadline
        self._clock = clock
        self._slots: dict[tuple[str, int], _Slot] = {}

    # ---- loop ------------------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        log.info("processor started capture=%s", self.capture_id)
        while not stop.is_set():
            try:
                self.tick(self.store.snapshot())
            except MetaStoreError as exc:
                log.warning("processor capture=%s: etcd unavailable: %s", self.capture_id, exc)
            except Exception:  # noqa: BLE001 - keep the loop alive, the error is logged
                log.exception("processor capture=%s tick failed", self.capture_id)
            stop.wait(self.config.owner_tick)
        self.close()

    def close(self) -> None:
        """Stop every span, reporting final checkpoints where the fence still allows it."""
        for key in list(self._slots):
            slot = self._slots.pop(key)
            if slot.runner is not None:
                slot.runner.stop()
                self._report(slot, force=True)
        log.info("processor stopped capture=%s", self.capture_id)

    def running_spans(self) -> list[tuple[str, int]]:
        return sorted(k for k, s in self._slots.items() if s.runner is not None and not s.runner.stopped)

    def tick(self, snap: ClusterSnapshot) -> None:
        now = self._clock()
        wanted: dict[tuple[str, int], tuple[ChangefeedInfo, SpanAssignment]] = {}
        for cf_id, spans in snap.assignments.items():
            entry = snap.changefeeds.get(cf_id)
            if entry is None:
                continue
            for span, assignment in spans.items():
                if assignment.capture_id == self.capture_id:
                    wanted[(cf_id, span)] = (entry.value, assignment)

        for key, slot in list(self._slots.items()):
            want = wanted.get(key)
            if want is None or (want[1].epoch, want[1].capture_id) != (slot.assignment.epoch, slot.assignment.capture_id):
                if slot.runner is not None:
                    log.info("span=%s/%d no longer assigned here; stopping capture=%s", key[0], key[1], self.capture_id)
                    slot.runner.stop()
                del self._slots[key]

        for key, (info, assignment) in wanted.items():
            slot = self._slots.get(key)
            if slot is None:
                slot = self._slots[key] = _Slot(key[0], key[1], assignment)
                slot.reported = snap.span_statuses.get(key[0], {}).get(key[1])
            if assignment.stopping or not info.state.runs:
                self._stop_for_move(slot, assignment)
                continue
            runner = slot.runner
            if runner is not None and runner.failed.is_set():
                exc = runner.error
                runner.stop()
                slot.runner = None
                slot.failures += 1
                delay = self._backoff(slot.failures)
                slot.restart_at = now + delay
                slot.error = _running_error(exc, self.capture_id, key[1], now)
                log.warning("span=%s/%d failed (%s); restarting in %.0fs", key[0], key[1], slot.error.message, delay)
                self._report(slot, force=True)
            if slot.runner is None and now >= slot.restart_at:
                try:
                    slot.runner = self._start(info, key[1], snap.span_statuses.get(key[0], {}).get(key[1]))
                except TidewaterError as exc:
                    slot.failures += 1
                    slot.restart_at = now + self._backoff(slot.failures)
                    slot.error = _running_error(exc, self.capture_id, key[1], now)
                    self._report(slot, force=True)
            if slot.runner is not None:
                if slot.error is not None and slot.runner.checkpoint.ts > (slot.reported.checkpoint_ts if slot.reported else 0):
                    slot.error = None  # progress after a restart: the error is over
                    slot.failures = 0
                self._report(slot)

    def _backoff(self, failures: int) -> float:
        return min(self.config.error_backoff_max, self.config.error_backoff_min * 2 ** (failures - 1))

    def _stop_for_move(self, slot: _Slot, assignment: SpanAssignment) -> None:
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
            slot.stop_confirmed = self._report(slot, force=True)
        if slot.stop_confirmed:
            slot.runner = None

    # ---- helpers ---------------------------------------------------------------------------------
    def _start(self, info: ChangefeedInfo, span_index: int, status: SpanStatus | None) -> SpanRunner:
        span = _span_info(info, span_index)
        config = ChangefeedConfig.from_dict(info.config)
        if status is not None and status.checkpoint_ts >= span.start_ts:
            start = Watermark(status.checkpoint_ts, status.checkpoint_time)
        else:
            start = Watermark(span.start_ts, info.start_time)
        label = f"{info.id}/{span_index}"
        stream = ReplicationStream(info.upstream_uri, span.slot, span.publication, start.ts, label=label)
        sorter = self.sorter.span(label)
        puller = Puller(stream, sorter, TableFilter(config.filter.rules), start,
                        lambda: connect(info.upstream_uri), label)
        runner = SpanRunner(label, puller, sorter, lambda: open_sink(info.sink_uri, config.sink), start,
                            config.sink.txn_rows, fence=self._lease_fence, target_ts=info.target_ts)
        runner.start()
        log.info("span=%s started on capture=%s from checkpoint=%d", label, self.capture_id, start.ts)
        return runner

    def _lease_fence(self) -> None:
        """Refuse a downstream commit once this capture's lease may have expired: after that the
        owner may already have given the span to another capture."""
        if self._lease_deadline is not None and time.monotonic() >= self._lease_deadline() - 1.0:
            raise LeaseLost(f"capture {self.capture_id}: etcd lease may have expired; not committing downstream")

    def _report(self, slot: _Slot, force: bool = False) -> bool:
        runner = slot.runner
        now = self._clock()
        prev = slot.reported
        if runner is not None:
            status = SpanStatus(
                capture_id=self.capture_id, epoch=slot.assignment.epoch,
                checkpoint_ts=runner.checkpoint.ts, checkpoint_time=runner.checkpoint.time,
                resolved_ts=runner.resolved.ts, resolved_time=runner.resolved.time,
                running=runner.alive, error=slot.error, rows=runner.rows, updated=now)
        elif prev is not None:
            status = replace(prev, capture_id=self.capture_id, epoch=slot.assignment.epoch, running=False,
                             error=slot.error, updated=now)
        else:
            status = SpanStatus(capture_id=self.capture_id, epoch=slot.assignment.epoch, error=slot.error,
                                updated=now)
        if prev is not None and not force:
            unchanged = (prev.checkpoint_ts, prev.checkpoint_time, prev.resolved_ts, prev.error, prev.running) == (
                status.checkpoint_ts, status.checkpoint_time, status.resolved_ts, status.error, status.running)
            if (unchanged or now - slot.last_report < self.config.checkpoint_interval) and now - slot.last_report < 10:
                return True
        if prev is not None and status.checkpoint_ts < prev.checkpoint_ts:
            status = replace(status, checkpoint_ts=prev.checkpoint_ts, checkpoint_time=prev.checkpoint_time)
        try:
            guard = self.store.processor_guard(slot.cf, slot.span, slot.assignment, self._lease())
            ok = self.store.put_span_status(slot.cf, slot.span, status, guard)
        except MetaStoreError as exc:
            log.warning("span=%s/%d status not stored: %s", slot.cf, slot.span, exc)
            return False
        if not ok:
            if runner is not None and not runner.stopped:
                log.warning("span=%s/%d status write fenced off (lease or assignment changed); stopping it",
                            slot.cf, slot.span)
                runner.stop()
            return False
        slot.reported = status
        slot.last_report = now
        if runner is not None:
            runner.persisted(status.checkpoint_ts)
        return True


def _span_info(info: ChangefeedInfo, index: int) -> SpanInfo:
    for s in info.spans:
        if s.index == index:
            return s
    raise TidewaterError(f"changefeed {info.id} has no span {index}")


def _running_error(exc: BaseException | None, capture_id: str, span: int, now: float) -> RunningError:
    if isinstance(exc, TidewaterError):
        return RunningError(exc.code, exc.message, now, capture_id, span, exc.retryable)
    return RunningError("CDC:ErrInternal", f"{type(exc).__name__}: {exc}", now, capture_id, span, True)
