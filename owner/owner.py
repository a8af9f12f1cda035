"""The owner: the capture that won the etcd election runs the control loop.

A cycle is one sentence (Patroni): read one snapshot of the cluster, ``reconcile`` it into patches,
commit each patch as an etcd transaction fenced by the election key, and log one line when something
changed. A deposed owner's writes fail their fence (``NotOwner``) and it steps down. Between two
cycles (``owner-tick``) the changefeed checkpoints are re-aggregated as soon as span statuses change
(``cdc.meta.status_feed`` watch), at most every ``owner-flush-interval``. A change of a changefeed's info
or of the captures, and a holder's confirmation that it stopped a span it was asked to stop (the second
phase of a move, ``reconcile.stops_confirmed``), run the next cycle early (``owner-flush-interval`` after
the last one), so that a resume, pause or span move does not wait for ``owner-tick``.

Guarantees: every owner write carries ``election.fence()``; the loop never blocks on the upstream for
longer than one slot drop; it never calls a processor (they talk through etcd only).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace

from cdc.config import ChangefeedConfig, ServerConfig
from cdc.errors import ChangefeedNotFound, MetaStoreError, NotOwner, TidewaterError
from cdc.events import TableName
from cdc.meta.election import Election
from cdc.meta.keys import KeyKind
from cdc.meta.status_feed import StatusFeed
from cdc.meta.store import ClusterSnapshot, MetaStore
from cdc.model import ChangefeedInfo, ChangefeedStatus, FeedState
from owner.barrier_apply import BarrierCoordinator
from owner.checkpoint_publish import CheckpointPublisher
from owner.reconcile import (
    Action,
    Assign,
    DropChangefeed,
    FlushPacer,
    PutStatus,
    Unassign,
    UpdateInfo,
    checkpoint_actions,
    published_checkpoint,
    reconcile,
    stops_confirmed,
)
from owner.upstream_watch import (
    FailSlotLost,
    ReleaseAfterGcTtl,
    UpstreamWatcher,
    is_released,
    mark_released,
    release_slots,
)
from sinks.base import PositionStore, SinkOpener
from upstream.base import Upstream

log = logging.getLogger(__name__)


def forget_positions(sinks: SinkOpener, info: ChangefeedInfo) -> None:
    """Best effort after ``remove``: delete the changefeed's rows from the sink's position table (exactly-once
    delivery, sinks.sql.target.position). Runs in its own thread so that an unreachable sink never delays the
    owner or the removal; a failure is logged with the statement to run by hand. The table itself stays."""
    try:
        config = ChangefeedConfig.from_dict(info.config).sink
        sink = sinks.open(info.sink_uri, config)
        try:
            n = sink.forget(info.id) if isinstance(sink, PositionStore) else 0  # (else it stores no positions)
        finally:
            sink.close()
        if n:
            log.info("changefeed=%s removed: %d position row(s) deleted from the sink's %s", info.id, n,
                     config.checkpoint_table)
    except Exception as exc:  # noqa: BLE001 - best effort, never blocks the removal
        log.warning("changefeed=%s removed but its positions in the sink could not be deleted (%s): run "
                    "DELETE FROM <checkpoint table> WHERE changefeed = '%s' on the target", info.id, exc, info.id)


# Changes that wake the owner between ticks: span statuses (checkpoint aggregation only); changefeed
# infos (API create/pause/resume/update/remove) and captures (join, leave, drain) run the full cycle early.
_OWNER_WAKE = frozenset({KeyKind.SPAN_STATUS, KeyKind.CHANGEFEED_INFO, KeyKind.CAPTURE})


class Owner:
    """The owner role of one capture (module docstring). ``sinks`` and ``open_upstream`` are the capture's
    factories (``capture.server`` wires them): the owner opens sinks and upstreams only through them."""

    def __init__(self, store: MetaStore, election: Election, capture_id: str, config: ServerConfig,
                 session_alive: Callable[[], bool], clock: Callable[[], float] = time.time, *,
                 sinks: SinkOpener, open_upstream: Callable[..., Upstream]) -> None:
        self.store = store
        self._sinks = sinks
        self._open_upstream = open_upstream
        self.election = election
        self._session_alive = session_alive
        self.capture_id = capture_id
        self.config = config
        self._clock = clock
        self.is_owner = False
        self.terms = 0  # times this capture won the election (metrics: owner changes)
        self.cycles = 0  # full cycles run as owner (a snapshot read and reconciled), all terms
        self.status_writes = 0  # changefeed statuses written (or tried), all terms: the checkpoint pacing counts them
        self.watcher = UpstreamWatcher(open_upstream, sinks, interval=config.upstream_check_interval,
                                       gc_ttl=config.gc_ttl, request_copy=self._request_copy)
        self._snapshot: ClusterSnapshot | None = None
        self._feed: StatusFeed | None = None
        self._resign = threading.Event()
        # sinks that show the checkpoint downstream (sinks.base.CheckpointSink): published off the loop; snapshot-mode
        # changefeeds ([consistency]): their staged changes made visible in whole barriers, off the loop
        self.publisher, self.barriers = self._downstream_writers()

    def _downstream_writers(self) -> tuple[CheckpointPublisher, BarrierCoordinator]:
        """A new checkpoint publisher and barrier coordinator: each shows a changefeed warning once writing to its
        downstream has failed for ``downstream-warn-after`` seconds (the server config's, as the term starts)."""
        warn_after = self.config.downstream_warn_after
        return (CheckpointPublisher(self._sinks, warn_after=warn_after),
                BarrierCoordinator(self._sinks, warn_after=warn_after))

    def _request_copy(self, info: ChangefeedInfo, table: TableName, span: int, oid: int) -> Callable[[], None]:
        """The upstream watch picks up ``table`` (relation ``oid``) with rows: store a table copy of it (fenced: only
        as owner); return what withdraws it."""
        (copy,) = self.store.request_table_copies(info.id, [(str(table), span)], "joined", self._clock(),
                                                  self.election.fence(), oids={str(table): oid})

        def cancel() -> None:
            self.store.cancel_table_copy(info.id, copy.request, self.election.fence())
        return cancel

    def resign(self) -> bool:
        """Ask the leading owner to step down: its loop returns (at once: its wait for status changes is ended, not
        left to run out at the next ``owner-tick``), it deletes its election key and campaigns again (behind every
        other candidate). True if this capture was leading."""
        if not self.is_owner:
            return False
        self._resign.set()
        self.wake()
        return True

    def wake(self) -> None:
        """Its ``stop`` was set: end the leading loop's wait for status changes now rather than at the next
        ``owner-tick`` (a stopping capture resigns at once)."""
        feed = self._feed
        if feed is not None:
            feed.interrupt()

    def run(self, stop: threading.Event) -> None:
        """Campaign, lead until deposed or stopped, campaign again."""
        while not stop.is_set():
            try:
                won = self.election.campaign(self.capture_id.encode(), stop)
            except MetaStoreError as exc:
                log.warning("capture=%s campaign failed: %s", self.capture_id, exc)
                stop.wait(1.0)
                continue
            if not won:
                continue
            self._resign.clear()  # a request from an earlier term does not apply to this one
            self.terms += 1
            self.is_owner = True
            log.info("capture=%s is the owner", self.capture_id)
            try:
                self._lead(stop)
            finally:
                self.is_owner = False
                try:
                    self.election.resign()
                except MetaStoreError:
                    pass
                log.info("capture=%s is no longer the owner", self.capture_id)

    def _lead(self, stop: threading.Event) -> None:
        term = threading.Event()  # this term of office
        watch = threading.Thread(target=self.watcher.run, args=(self._infos, term), name="upstream-watch",
                                 daemon=True)
        watch.start()
        # one of each per term: a new owner publishes what it computes; its coordinator reads the target's barrier
        # head afresh
        self.publisher, self.barriers = self._downstream_writers()
        publish = threading.Thread(target=self.publisher.run, args=(term,), name="checkpoint-publish", daemon=True)
        publish.start()
        barriers = threading.Thread(target=self.barriers.run, args=(term,), name="barrier-apply", daemon=True)
        barriers.start()
        try:
            self._lead_loop(stop)
        finally:
            term.set()
            self.publisher.stop_waiting()
            self.barriers.stop_waiting()
            self.watcher.clear()

    def _infos(self) -> list[ChangefeedInfo]:
        snap = self._snapshot
        return [e.value for e in snap.changefeeds.values()] if snap is not None else []

    def _lead_loop(self, stop: threading.Event) -> None:
        """Full cycle every ``owner-tick``; between cycles, checkpoint aggregation as soon as span
        statuses change (``StatusFeed`` watch), at most every ``owner-flush-interval``."""
        last_line = ""
        feed = self._feed = StatusFeed(self.store, _OWNER_WAKE)
        pacer = FlushPacer(self.config.owner_flush_interval)
        next_cycle = last_cycle = 0.0
        snap: ClusterSnapshot | None = None
        try:
            while not stop.is_set():
                if self._resign.is_set():
                    log.info("capture=%s resigning ownership on request", self.capture_id)
                    return
                if not self._session_alive():
                    log.warning("capture=%s owner session lost; stepping down", self.capture_id)
                    return
                try:
                    mono = time.monotonic()
                    if mono >= next_cycle or snap is None:
                        next_cycle = mono + self.config.owner_tick
                        last_cycle = mono
                        writes = self.status_writes
                        snap = self._snapshot = self.store.snapshot()
                        try:
                            last_line = self._cycle(snap, last_line)
                        finally:  # it covers every status change so far; only a status it wrote starts the spacing
                            pacer.done(mono, wrote=self.status_writes > writes)
                        self.cycles += 1
                        feed.follow(snap)
                    elif pacer.due(mono):
                        writes = self.status_writes
                        try:
                            self._flush_checkpoints(feed, snap)
                        finally:  # (a write that failed counts: etcd errors are not retried faster than the spacing)
                            pacer.done(mono, wrote=self.status_writes > writes)
                except NotOwner:
                    log.warning("capture=%s lost ownership (fenced write refused); stepping down", self.capture_id)
                    return
                except MetaStoreError as exc:
                    log.warning("owner capture=%s: etcd unavailable: %s", self.capture_id, exc)
                except ChangefeedNotFound as exc:  # removed between the snapshot and the write
                    log.info("owner capture=%s: %s; re-reading", self.capture_id, exc)
                    next_cycle = min(next_cycle, time.monotonic() + self.config.owner_flush_interval)
                mono = time.monotonic()
                timeout = max(0.0, next_cycle - mono)
                delay = pacer.delay(mono)
                if delay is not None:
                    stop.wait(min(timeout, delay))
                else:
                    kinds = feed.wait(timeout)
                    if kinds - {KeyKind.SPAN_STATUS}:
                        # a changefeed was created/paused/resumed/..., or a capture came or went: cycle
                        # early (the span statuses are covered by the cycle too)
                        next_cycle = min(next_cycle, last_cycle + self.config.owner_flush_interval)
                    elif kinds:
                        pacer.notify()
                        if snap is not None and stops_confirmed(snap, feed.overlay(snap)):
                            # a holder stopped a span it was asked to stop: reassign (or unassign) it now, not
                            # at the next tick (a span move, pause + resume, drain waits for this)
                            next_cycle = min(next_cycle, last_cycle + self.config.owner_flush_interval)
        finally:
            self._feed = None
            feed.close()

    def _cycle(self, snap: ClusterSnapshot, last_line: str) -> str:
        now = self._clock()
        self.watcher.retain(snap.changefeeds)
        reports = [r for r in self.watcher.reports() if not r.error]
        retained = {r.changefeed: {str(k): v for k, v in r.retained_bytes().items() if v is not None} for r in reports}
        published = {r.changefeed: r.published for r in reports if r.published is not None}
        found = {cf_id: self.watcher.found_warnings(e.value) + self.publisher.warnings(cf_id)
                 + self.barriers.warnings(cf_id) for cf_id, e in snap.changefeeds.items()}
        for cf_id, e in snap.changefeeds.items():  # (also what an earlier owner may not have published)
            self._offer_checkpoint(e.value, snap.statuses.get(cf_id))
        actions = reconcile(snap, now, stuck_duration=self.config.error_stuck_duration, retained=retained,
                            upstream_warnings={k: v for k, v in found.items() if v}, published=published)
        actions += self._upstream_actions(snap, now)
        done = []
        for a in actions:
            did = self.apply(a, snap)
            if did and isinstance(a, UpdateInfo) and _log_state_change(snap, a):
                did = ""  # said on its own line
            done.append(did)
        line = "; ".join(d for d in done if d)
        if line and line != last_line:
            log.info("owner capture=%s: %s", self.capture_id, line)
        return line

    def _flush_checkpoints(self, feed: StatusFeed, snap: ClusterSnapshot) -> None:
        """Aggregate changefeed checkpoints from the last snapshot plus the span statuses written since
        (fenced writes, never backwards: ``checkpoint_actions`` keeps the newest stored status as floor)."""
        if feed.broken:
            return
        for action in checkpoint_actions(feed.overlay(snap), self._clock()):
            try:
                self.apply(action, snap)
            except ChangefeedNotFound:
                pass  # removed since the snapshot; the next full cycle sees it

    def _offer_checkpoint(self, info: ChangefeedInfo, status: ChangefeedStatus | None) -> None:
        """Hand a stored changefeed checkpoint to the publisher (owner.checkpoint_publish) and, whatever the state
        (staged changes below it are final), to the barrier coordinator (owner.barrier_apply); cheap, never blocks."""
        if status is None or not status.checkpoint_ts:
            return
        point = published_checkpoint(status)
        self.barriers.offer(info, *point)
        if info.state.runs:
            self.publisher.offer(info, *point)

    def _upstream_actions(self, snap: ClusterSnapshot, now: float) -> list[Action]:
        """Turn the upstream watcher's decisions into state changes: a lost slot fails the changefeed
        loudly; a changefeed stopped or failed for longer than gc-ttl releases its slots. (Its data
        warnings go through ``reconcile``: see ``_cycle``.)"""
        actions: list[Action] = []
        for cf_id, entry in sorted(snap.changefeeds.items()):
            info = entry.value
            d = self.watcher.decide(info, now)
            if isinstance(d, FailSlotLost):
                if info.state.runs:
                    actions.append(UpdateInfo(cf_id, info.with_state(FeedState.FAILED, error=d.running_error(now),
                                                                     now=now), entry.mod_revision, "slot lost"))
            elif isinstance(d, ReleaseAfterGcTtl):
                if not is_released(info):
                    actions.append(UpdateInfo(cf_id, mark_released(info, d, now), entry.mod_revision,
                                              "gc-ttl exceeded: releasing the upstream slots"))
                else:
                    try:
                        release_slots(info, self._open_upstream)
                        self.watcher.forget(cf_id)
                        log.error("changefeed=%s: slots %s released after gc-ttl; the changefeed must be recreated",
                                  cf_id, [s.slot for s in info.spans])
                    except TidewaterError as exc:
                        log.warning("changefeed=%s: releasing slots failed, will retry: %s", cf_id, exc)
        return actions

    def apply(self, action: Action, snap: ClusterSnapshot | None) -> str:
        """Carry out one reconcile action under the owner's fence; ``snap`` is the snapshot it was decided from
        (a stored checkpoint is offered for publishing with that snapshot's changefeed info). Returns what it
        did, for the cycle's one log line ("" if nothing worth saying)."""
        fence = self.election.fence()
        s = self.store
        if isinstance(action, Assign):
            s.put_assignment(action.cf, action.span, action.assignment, fence)
            return f"span {action.cf}/{action.span} -> capture {action.assignment.capture_id} (epoch {action.assignment.epoch})"
        if isinstance(action, Unassign):
            s.delete_assignment(action.cf, action.span, fence)
            return f"span {action.cf}/{action.span} unassigned"
        if isinstance(action, PutStatus):
            self.status_writes += 1
            barrier, barrier_time = self.barriers.applied_point(action.cf)
            if barrier > action.status.barrier_ts:  # (snapshot mode: what readers see, carried by this write)
                action = PutStatus(action.cf, replace(action.status, barrier_ts=barrier, barrier_time=barrier_time))
            revision = s.put_status(action.cf, action.status, fence)
            if self._feed is not None:
                self._feed.note_status(action.cf, action.status, revision)
            entry = snap.changefeeds.get(action.cf) if snap is not None else None
            if entry is not None:
                self._offer_checkpoint(entry.value, action.status)
            return ""
        if isinstance(action, UpdateInfo):
            if s.update_changefeed(action.info, action.expected_mod, fence):
                err = f" ({action.info.error.message})" if action.info.error else ""
                return f"changefeed {action.cf}: {action.reason}{err}"
            return ""
        if isinstance(action, DropChangefeed):
            self._drop_upstream(action)
            s.delete_changefeed(action.cf, fence)
            self.publisher.forget(action.cf)
            self.barriers.forget(action.cf)
            threading.Thread(target=forget_positions, args=(self._sinks, action.info), name=f"forget-{action.cf}",
                             daemon=True).start()
            return f"changefeed {action.cf} removed"
        raise TypeError(action)

    def _drop_upstream(self, action: DropChangefeed) -> None:
        """Drop the changefeed's slots and publications. If the upstream is unreachable the removal
        waits (retried next tick) for up to 5 minutes, then the keys go and the leftover slot names are
        logged as an error, so that an unreachable upstream cannot pin a removed changefeed forever."""
        info = action.info
        try:
            with self._open_upstream(info.upstream_uri) as up:
                up.drop_spans(info.spans, timeout=10)
        except TidewaterError as exc:
            if self._clock() - info.state_since < 300:
                raise MetaStoreError(f"removing changefeed {info.id}: upstream cleanup failed, will retry: {exc}") from exc
            log.error("changefeed=%s removed but its upstream slots %s could not be dropped (%s): drop them by hand "
                      "on the upstream or they will retain its log",
                      info.id, [s.slot for s in info.spans], exc)


def _log_state_change(snap: ClusterSnapshot, action: UpdateInfo) -> bool:
    """One INFO line per changefeed state change the owner made, in a stable shape for log searches:
    ``changefeed=ID state OLD -> NEW[: reason][ (CODE: error)]``. True if the state changed (and was logged)."""
    entry = snap.changefeeds.get(action.cf)
    old = entry.value.state if entry is not None else None
    new = action.info.state
    if old is new:
        return False
    err = action.info.error
    reason = "" if "->" in action.reason else f": {action.reason}"
    why = f" ({err.code}: {err.message})" if err else ""
    log.info("changefeed=%s state %s -> %s%s%s", action.cf, old.value if old else "-", new.value, reason, why)
    return True
