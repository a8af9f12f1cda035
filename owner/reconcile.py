"""The owner's decisions as a pure function: etcd snapshot + clock -> patches.

No I/O and no sleeping here, so the scheduler and the changefeed state machine are unit-tested over
hand-built snapshots with an injected clock. ``owner.owner`` executes the patches as fenced etcd
transactions.

Rules:
- Spans of a running changefeed (``normal``/``warning``) are assigned to live, non-draining captures,
  least loaded first; a span whose capture's lease expired is reassigned with a higher epoch.
- Spans on a draining capture, and one span at a time when loads differ by more than one, are moved
  in two phases (``stopping`` -> holder confirms -> new assignment), see ``_Scheduler``.
- Changefeeds in any other state lose their assignments, also in two phases (their processors stop).
- Global checkpoint = min over spans of the span checkpoint; global resolved = min of span resolved;
  neither ever moves backwards.
- State machine: a span error that is retryable -> ``warning`` (the processor retries with backoff);
  an unretryable one -> ``failed``; ``warning`` for longer than ``stuck_duration`` -> ``failed``;
  no more span errors -> ``normal``; checkpoint >= target Ts -> ``finished``.
- Data warnings (``ChangefeedStatus.warnings``, see :func:`changefeed_warnings`): every span's warnings
  merged with the owner's own (upstream watch). An unacknowledged ``divergence`` warning keeps a running
  changefeed in ``warning`` (its ``error`` names it, with ``data_warning`` set) until an operator
  acknowledges it with ``resume`` (warnings last raised before ``resumed_at`` are history); it never
  escalates to ``failed``. ``notice`` warnings are shown and leave the state alone.
- ``removed``: assignments go first, then (after ``remove_grace`` for processors to stop) the owner
  drops the upstream slots and publications and deletes every key of the changefeed.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from cdc.meta.store import ClusterSnapshot
from cdc.model import (
    ChangefeedInfo,
    ChangefeedStatus,
    DataWarning,
    FeedState,
    RunningError,
    SpanAssignment,
    SpanStatus,
    TableCopy,
    WarningSeverity,
    ended_by_joining,
    merge_warnings,
    still_copying,
)


@dataclass(frozen=True)
class Assign:
    cf: str
    span: int
    assignment: SpanAssignment
    previous: SpanAssignment | None


@dataclass(frozen=True)
class Unassign:
    cf: str
    span: int
    previous: SpanAssignment


@dataclass(frozen=True)
class PutStatus:
    cf: str
    status: ChangefeedStatus


@dataclass(frozen=True)
class UpdateInfo:
    cf: str
    info: ChangefeedInfo
    expected_mod: int
    reason: str


@dataclass(frozen=True)
class DropChangefeed:
    cf: str
    info: ChangefeedInfo


Action = Assign | Unassign | PutStatus | UpdateInfo | DropChangefeed


def reconcile(snap: ClusterSnapshot, now: float, *, stuck_duration: float = 1800.0,
              remove_grace: float = 3.0, retained: dict[str, dict[str, int]] | None = None,
              upstream_warnings: dict[str, list[DataWarning]] | None = None,
              published: dict[str, frozenset[str]] | None = None) -> list[Action]:
    """The patches that bring the cluster toward its wanted state (module docstring). ``retained``: WAL
    bytes per changefeed and span from the upstream watch; ``upstream_warnings``: the data warnings of
    each changefeed's latest upstream report (``owner.upstream_watch.report_warnings``); ``published``: the
    tables of each changefeed's publications per its latest upstream report (``UpstreamReport.published``)."""
    actions: list[Action] = []
    sched = _Scheduler(snap)
    for cf_id in sorted(snap.changefeeds):
        entry = snap.changefeeds[cf_id]
        info = entry.value
        assigns = snap.assignments.get(cf_id, {})
        statuses = snap.span_statuses.get(cf_id, {})

        if not info.state.runs:
            if info.state is not FeedState.REMOVED:
                old = snap.statuses.get(cf_id) or ChangefeedStatus()
                status = changefeed_warnings(info, statuses, old, (upstream_warnings or {}).get(cf_id, ()), now,
                                             (published or {}).get(cf_id))
                if status != old:
                    actions.append(PutStatus(cf_id, status))
            for span, a in sorted(assigns.items()):
                if a.capture_id not in snap.captures or (a.stopping and _stopped(a, statuses.get(span))):
                    actions.append(Unassign(cf_id, span, a))
                elif not a.stopping:
                    actions.append(Assign(cf_id, span, replace(a, stopping=True), a))
            if info.state is FeedState.REMOVED and not assigns and now - info.state_since >= remove_grace:
                actions.append(DropChangefeed(cf_id, info))
            continue

        for span in info.spans:
            a = assigns.get(span.index)
            if a is None or a.capture_id not in snap.captures:
                # never assigned, or its holder's lease expired (a dead capture cannot write any more)
                target = sched.pick()
                if target is not None:
                    actions.append(Assign(cf_id, span.index, SpanAssignment(target, (a.epoch if a else 0) + 1), a))
            elif a.stopping:
                if _stopped(a, statuses.get(span.index)):
                    target = sched.pick(exclude=a.capture_id)
                    if target is not None:
                        sched.moved(a.capture_id)
                        actions.append(Assign(cf_id, span.index, SpanAssignment(target, a.epoch + 1), a))
            elif snap.captures[a.capture_id].draining:
                actions.append(Assign(cf_id, span.index, replace(a, stopping=True), a))

        old = snap.statuses.get(cf_id) or ChangefeedStatus()
        status = global_watermarks(info, statuses, old, now)
        if retained and cf_id in retained and retained[cf_id] != status.retained_wal:
            status = replace(status, retained_wal=retained[cf_id], updated=now)
        status = changefeed_warnings(info, statuses, status, (upstream_warnings or {}).get(cf_id, ()), now,
                                     (published or {}).get(cf_id))
        if status != old:
            actions.append(PutStatus(cf_id, status))

        new_info = next_state(info, statuses, status, now, stuck_duration)
        taken = served_table_copies(info, statuses)
        if taken:
            new_info = replace(new_info, table_copies=tuple(c for c in info.table_copies if c not in taken))
        if new_info is not info:
            actions.append(UpdateInfo(cf_id, new_info, entry.mod_revision,
                                      f"{info.state.value} -> {new_info.state.value}" if new_info.state is not info.state
                                      else "table copies taken up" if taken else "state details"))
    move = sched.rebalance(actions)
    if move is not None:
        actions.append(move)
    return actions


def checkpoint_actions(snap: ClusterSnapshot, now: float) -> list[PutStatus]:
    """Only the checkpoint part of :func:`reconcile`: the new global watermarks of every running
    changefeed whose span statuses moved them (same rule: minimum over spans, never backwards).
    For the owner's prompt aggregation between two full cycles."""
    actions: list[PutStatus] = []
    for cf_id in sorted(snap.changefeeds):
        info = snap.changefeeds[cf_id].value
        if not info.state.runs:
            continue
        old = snap.statuses.get(cf_id) or ChangefeedStatus()
        statuses = snap.span_statuses.get(cf_id, {})
        status = changefeed_warnings(info, statuses, global_watermarks(info, statuses, old, now), (), now)
        if status != old:
            actions.append(PutStatus(cf_id, status))
    return actions


class FlushPacer:
    """When the owner aggregates checkpoints between its full cycles: as soon as a span status changed
    (``notify``), but never sooner than ``min_interval`` after the previous aggregation that wrote a status
    (``done``), so a cluster with many spans reporting at different moments costs at most ``1 / min_interval``
    status writes per changefeed per second. An aggregation that wrote nothing (``done(wrote=False)``: no changefeed's
    watermarks moved, e.g. a span reported that it runs) does not hold back the next one, so the status that
    does move a checkpoint right after it is aggregated at once (a resumed span's first checkpoint); such
    aggregations are bounded by the span status writes, which the processors pace. Pure: the caller passes its
    monotonic clock."""

    def __init__(self, min_interval: float) -> None:
        self.min_interval = min_interval
        self.pending = False
        self._last = float("-inf")

    def notify(self) -> None:
        """A span status changed since the last aggregation."""
        self.pending = True

    def done(self, now: float, wrote: bool = True) -> None:
        """An aggregation ran at ``now`` (the full cycle counts too: it covers every change before it); ``wrote``
        False: it wrote nothing, the changes so far are covered but the spacing is not restarted (an aggregation
        that failed counts as one that wrote: etcd errors are not retried faster than the spacing)."""
        self.pending = False
        if wrote:
            self._last = now

    def due(self, now: float) -> bool:
        return self.pending and now >= self._last + self.min_interval

    def delay(self, now: float) -> float | None:
        """Seconds until the pending aggregation is due; None when nothing is pending."""
        if not self.pending:
            return None
        return max(0.0, self._last + self.min_interval - now)


def _stopped(a: SpanAssignment, st: SpanStatus | None) -> bool:
    """The holder confirmed that it stopped the span for this very assignment."""
    return st is not None and st.capture_id == a.capture_id and st.epoch == a.epoch and not st.running


def stops_confirmed(snap: ClusterSnapshot, newer: ClusterSnapshot) -> bool:
    """Whether ``newer`` (``snap`` with the span statuses written since, ``StatusFeed.overlay``) holds a holder's
    confirmation that it stopped a span for a ``stopping`` assignment of ``snap`` that ``snap`` itself does not
    hold yet: the second phase of that move, pause or drain (reassign or unassign, decided by ``reconcile``) can
    run now rather than at the next ``owner-tick``. A confirmation ``snap`` already holds is not new: a second
    phase that could not run then (no capture to take the span) does not wake the owner again."""
    for cf_id, spans in snap.assignments.items():
        old = snap.span_statuses.get(cf_id, {})
        new = newer.span_statuses.get(cf_id, {})
        for span, a in spans.items():
            if a.stopping and _stopped(a, new.get(span)) and not _stopped(a, old.get(span)):
                return True
    return False


class _Scheduler:
    """Span placement: least-loaded live, non-draining capture; at most one rebalancing move at a time.

    A move is two-phase (TiCDC's): the assignment is first marked ``stopping``; the holder stops the
    span and reports ``running=False`` for that epoch; only then is the span assigned elsewhere with a
    higher epoch. So a span never runs on two captures at once, except after a lease expiry, when the
    old holder can no longer write anything (its writes are fenced and its sink refuses to commit).
    """

    def __init__(self, snap: ClusterSnapshot) -> None:
        self.snap = snap
        self.targets = sorted(cid for cid, c in snap.captures.items() if not c.draining)
        self.load = {cid: 0 for cid in snap.captures}
        self.moving = False
        self.candidates: dict[str, list[tuple[str, int, SpanAssignment]]] = {cid: [] for cid in self.targets}
        for cf_id, spans in snap.assignments.items():
            entry = snap.changefeeds.get(cf_id)
            running = entry is not None and entry.value.state.runs
            for span, a in spans.items():
                if a.capture_id in self.load:
                    self.load[a.capture_id] += 1
                if a.stopping:
                    self.moving = True
                elif running and a.capture_id in self.candidates:
                    self.candidates[a.capture_id].append((cf_id, span, a))

    def pick(self, exclude: str = "") -> str | None:
        choices = [c for c in self.targets if c != exclude] or self.targets
        if not choices:
            return None
        target = min(choices, key=lambda c: (self.load[c], c))
        self.load[target] += 1
        return target

    def moved(self, source: str) -> None:
        self.load[source] -= 1

    def rebalance(self, actions: list[Action]) -> Action | None:
        """When loads differ by more than one span, start moving one span off the busiest capture."""
        if self.moving or len(self.targets) < 2 or any(isinstance(a, Assign) for a in actions):
            return None
        busiest = max(self.targets, key=lambda c: (self.load[c], c))
        idlest = min(self.targets, key=lambda c: (self.load[c], c))
        if self.load[busiest] - self.load[idlest] <= 1 or not self.candidates[busiest]:
            return None
        cf_id, span, a = sorted(self.candidates[busiest], key=lambda t: (t[0], t[1]))[0]
        return Assign(cf_id, span, replace(a, stopping=True), a)


def served_table_copies(info: ChangefeedInfo, statuses: dict[int, SpanStatus]) -> list[TableCopy]:
    """The table copies of ``info`` that their span has taken up (its stored copy state covers them): they
    are dropped from the changefeed (the span's status shows the copy from then on)."""
    out = []
    for c in info.table_copies:
        st = statuses.get(c.span)
        if st is not None and st.snapshot is not None and st.snapshot.request >= c.request:
            out.append(c)
    return out


def global_watermarks(info: ChangefeedInfo, statuses: dict[int, SpanStatus], old: ChangefeedStatus,
                      now: float) -> ChangefeedStatus:
    """Minimum over all spans (of ``SpanStatus.covered_ts``: a span waiting at a DDL's barrier at ``B`` has written
    everything before ``B``); unchanged while a span has never reported; never backwards. While a span still
    copies its existing rows (``ChangefeedInfo.initial_copy``) the changefeed has no checkpoint yet: the commits
    before its start are not all downstream until every span's copy is done (docs/snapshot.md)."""
    spans = [statuses.get(s.index) for s in info.spans]
    if not spans or any(s is None or s.checkpoint_ts == 0 for s in spans):
        return old
    if still_copying(info, statuses):
        return old
    reported = [s for s in spans if s is not None]
    ck = min(reported, key=lambda s: (s.covered_ts, s.checkpoint_time))  # (a span waiting at a barrier: B - 1)
    rs = min(reported, key=lambda s: (s.resolved_ts, s.resolved_time))
    ck_ts, ck_time = max((ck.covered_ts, ck.checkpoint_time), (old.checkpoint_ts, old.checkpoint_time))
    rs_ts, rs_time = max((rs.resolved_ts, rs.resolved_time), (old.resolved_ts, old.resolved_time),
                         (ck_ts, ck_time))
    held = [s for s in reported if s.hold_ts]
    hold = min(held, key=lambda s: (s.hold_ts, s.hold_time)) if held else None
    hold_ts, hold_time = (hold.hold_ts, hold.hold_time) if hold is not None else (0, 0.0)
    if (ck_ts, ck_time, rs_ts, rs_time, hold_ts, hold_time) == (
            old.checkpoint_ts, old.checkpoint_time, old.resolved_ts, old.resolved_time, old.hold_ts, old.hold_time):
        return old
    return replace(old, checkpoint_ts=ck_ts, checkpoint_time=ck_time, resolved_ts=rs_ts, resolved_time=rs_time,
                   hold_ts=hold_ts, hold_time=hold_time, updated=now)


def published_checkpoint(status: ChangefeedStatus) -> tuple[int, float]:
    """The checkpoint the owner may publish to the sink now (``CheckpointSink.publish_checkpoint``): the changefeed's, held at
    ``hold_ts`` while a table copy runs (its copied rows, stamped with the copy's snapshot Ts, are not all written
    yet: a consumer cutting past them would drop them; docs/snapshot.md, "Table copies")."""
    if status.hold_ts and status.hold_ts < status.checkpoint_ts:
        return status.hold_ts, status.hold_time
    return status.checkpoint_ts, status.checkpoint_time


def refresh_warnings(current: tuple[DataWarning, ...], found: list[DataWarning] | tuple[DataWarning, ...]
                     ) -> tuple[DataWarning, ...]:
    """The owner's own warnings ``current`` updated by a report's ``found`` ones: one per (code, table); a
    warning found again keeps its ``first_time`` and takes the new message, count and keys (the latest
    inspection's view) and ``last_time``. Idempotent: the same report applied twice changes nothing, and a
    condition found by every inspection stays one warning."""
    by_ident = {w.ident: w for w in current}
    for w in found:
        prev = by_ident.get(w.ident)
        if prev is None:
            by_ident[w.ident] = w
        elif w.seen > prev.seen or (w.seen == prev.seen and w != prev):
            by_ident[w.ident] = replace(w, first_time=min(prev.first_time, w.first_time),
                                        last_time=max(prev.seen, w.seen))
    return tuple(sorted(by_ident.values(), key=lambda w: w.first_time))


def changefeed_warnings(info: ChangefeedInfo, statuses: dict[int, SpanStatus], status: ChangefeedStatus,
                        found: list[DataWarning] | tuple[DataWarning, ...], now: float,
                        published: frozenset[str] | None = None) -> ChangefeedStatus:
    """``status`` with its warnings brought up to date (pure; ``status`` itself when nothing changed):
    ``upstream_warnings`` = the stored ones refreshed with ``found`` (:func:`refresh_warnings`);
    ``warnings`` = those merged with every span's ``SpanStatus.warnings``. Warnings last raised at or before
    the changefeed's last create/resume are acknowledged and dropped from both, and so are the
    :data:`cdc.model.NOT_JOINED_WARNINGS` of tables in ``published`` (the tables of the changefeed's publications
    now): the table joined since (its rows are then the table copy's, or a ``CDC:WarnUnreplicatedRows``)."""
    since = max(info.resumed_at, info.create_time)
    own = refresh_warnings(tuple(w for w in status.upstream_warnings if w.seen > since),
                           [w for w in found if w.seen > since])
    if published:
        own = tuple(w for w in own if not ended_by_joining(w.code, w.table, published))
    spans = [w for _, s in sorted(statuses.items()) for w in s.warnings if w.seen > since]
    merged = merge_warnings(own, spans)
    if (own, merged) == (status.upstream_warnings, status.warnings):
        return status
    return replace(status, upstream_warnings=own, warnings=merged, updated=now)


def _warning_reason(warnings: tuple[DataWarning, ...]) -> RunningError | None:
    """The changefeed error that records its unacknowledged divergence warnings (None if there are none):
    the oldest one's code and message, the table and how many more there are."""
    divergent = [w for w in warnings if w.severity is WarningSeverity.DIVERGENCE]
    if not divergent:
        return None
    w = divergent[0]
    more = f" (and {len(divergent) - 1} more data warning(s))" if len(divergent) > 1 else ""
    return RunningError(w.code, f"data warning on {w.table}: {w.message}{more}", w.first_time, retryable=True,
                        data_warning=True)


def next_state(info: ChangefeedInfo, statuses: dict[int, SpanStatus], status: ChangefeedStatus, now: float,
               stuck_duration: float) -> ChangefeedInfo:
    errors: list[RunningError] = [s.error for _, s in sorted(statuses.items())
                                  if s.error is not None and s.error.time >= info.resumed_at]
    fatal = next((e for e in errors if not e.retryable), None)
    if fatal is not None:
        return info.with_state(FeedState.FAILED, error=fatal, now=now)
    if info.target_ts and status.checkpoint_ts >= info.target_ts:
        return info.with_state(FeedState.FINISHED, error=None, now=now)
    if errors:
        if info.state is FeedState.NORMAL or (info.error is not None and info.error.data_warning):
            # an error streak starts (also while in warning for data warnings: stuck time counts from here)
            return info.with_state(FeedState.WARNING, error=errors[0], now=now)
        if now - info.state_since >= stuck_duration:
            return info.with_state(FeedState.FAILED, error=replace(
                errors[0], message=f"stuck in warning for {now - info.state_since:.0f}s: {errors[0].message}",
                retryable=False), now=now)
        if info.error != errors[0] and info.error is not None and info.error.message != errors[0].message:
            return replace(info, error=errors[0])
        return info
    reason = _warning_reason(status.warnings)
    if reason is not None:
        if info.state is FeedState.NORMAL or info.error is None or not info.error.data_warning:
            return info.with_state(FeedState.WARNING, error=reason, now=now)
        return info if info.error == reason else replace(info, error=reason)
    if info.state is FeedState.WARNING:
        return info.with_state(FeedState.NORMAL, error=None, now=now)
    return info
