"""Protecting the upstream: the owner's periodic look at each changefeed's slots and publications.

A logical slot makes PostgreSQL keep every WAL segment from the slot's restart point on, for as long
as the slot exists, whether or not anybody reads it. This module is how the owner keeps that cost
visible and bounded, and how it notices what happened to a changefeed's upstream behind its back:

- :class:`UpstreamWatcher` inspects a changefeed's upstream at most every ``interval`` seconds (one
  connection per inspection): for each span the slot (exists, active, lost, retained WAL bytes,
  confirmed flush LSN) and whether its publication exists. For a running changefeed it also picks up
  tables created after the changefeed that match its filter: each eligible one is added to the
  publication of the span it hashes to (:func:`cdc.spans.span_of`), ineligible ones (no key, a
  DEFERRABLE key, ...) are reported, never added (publishing them would make UPDATE/DELETE fail
  upstream), and so is one whose target name in the sink is already taken by another table (it would
  mix two tables' rows). It also compares the leaf partitions of each published partitioned table with
  the previous look (:mod:`owner.partition_watch`): a detached, dropped, attached-with-rows or truncated
  partition leaves the downstream different and the stream carries nothing for it.
  The pick-up itself is :mod:`owner.table_pickup`.
- :func:`decide` turns the latest report into at most one :data:`Decision` (pure, no I/O): fail a
  running changefeed whose slot vanished or was invalidated, or release the slots of a changefeed
  stopped or failed for longer than ``gc-ttl``.
- Everything an inspection finds that can make the target differ from the source is a
  :class:`cdc.model.DataWarning` in ``UpstreamReport.warnings`` (rows of a picked-up table that will
  never be streamed, a matched table that cannot be replicated, ...). The owner keeps them in the
  changefeed's ``ChangefeedStatus.upstream_warnings`` (one per code and table, refreshed by every
  report that carries it) and a ``divergence`` one moves the changefeed to ``warning``.
- :func:`release_slots` drops a changefeed's slots and publications; :func:`can_resume` refuses to
  resume a changefeed whose slots were released.

New tables are added under ``LOCK TABLE ... IN SHARE MODE`` (waiting at most ``lock_timeout``, then
retried at the next inspection): writers to that table are held back for the instant of the add, so
every change committed after the add is streamed and the rows present at the add are exactly the ones
the stream will never carry. If there are any (the table was written before the owner saw it) the
table is reported in ``UpstreamReport.unreplicated`` and as a ``CDC:WarnUnreplicatedRows`` warning with
the number of rows (counted up to ``COUNT_CAP``), loudly, instead of silently diverging.

Thread-safety: ``inspect`` may run concurrently for different changefeeds (each call opens its own
connection); ``due``, ``latest``, ``reports``, ``forget`` and ``clear`` are safe from any thread (the
metrics scrape reads ``reports()`` while the owner inspects). Retryable upstream problems never raise
out of ``inspect``: they become ``UpstreamReport.error``.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from cdc.errors import GCTTLExceeded, SlotLost, TidewaterError
from cdc.events import TableName
from cdc.model import (
    ChangefeedInfo,
    DataWarning,
    FeedState,
    RunningError,
    SpanInfo,
    WarningSeverity,
    ended_by_joining,
)
from owner import partition_watch
from owner.table_pickup import (
    CopyRequester,
    pick_up_new_tables,
    sink_target_names,
    unusable_new_partitions,
)
from sinks.base import SinkOpener
from upstream.base import SlotState, Upstream

log = logging.getLogger(__name__)

STATEMENT_TIMEOUT_MS = 15000  # bound on any one catalog query of an inspection


# ---- reports ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SlotReport:
    """One span's upstream resources as seen at ``UpstreamReport.checked_at``.

    ``retained_bytes`` is the WAL the slot keeps (current WAL position minus its restart LSN); None when
    the slot does not exist or was invalidated. ``lost`` is true for a slot PostgreSQL invalidated
    (``wal_status = lost`` or an ``invalidation_reason``): it exists but can never stream again.
    """

    span: int
    slot: str
    exists: bool
    active: bool
    retained_bytes: int | None
    confirmed_flush_lsn: int | None
    wal_status: str | None
    lost: bool
    publication: str = ""
    publication_exists: bool = True
    invalidation_reason: str | None = None


@dataclass(frozen=True)
class UpstreamReport:
    """One inspection of one changefeed's upstream.

    ``error`` is non-empty when the inspection could not complete (upstream unreachable, ...); then
    ``slots`` is empty and the report says nothing about the upstream. ``new_tables`` are the
    ``schema.table`` names this inspection added to a publication; ``unreplicated`` those of them that
    already held rows when they were added (those rows are not replicated, only later changes);
    ``ineligible`` one message per matched table that cannot be added, naming the table and the fix
    (including a table whose target name collides with another's).

    ``warnings``: every finding of this inspection that can make the target differ from the source, as
    :class:`DataWarning` (one per code and table; ``first_time`` = when it was found). Any check of the
    inspection appends here; the owner stores them in the changefeed's status (see the module docstring),
    so a condition found again by every inspection is one warning, not one per inspection.
    Among them: ``CDC:WarnTargetNameConflict`` per table not added because of a target-name collision,
    and the partition warnings of :mod:`owner.partition_watch` (found once, when the change is first seen).

    ``published``: every table in the changefeed's publications after this inspection (``schema.table``; None
    when a publication is missing or the inspection failed): a table in it has joined, which ends its
    :data:`cdc.model.NOT_JOINED_WARNINGS`.
    """

    changefeed: str
    checked_at: float
    slots: tuple[SlotReport, ...]
    new_tables: tuple[str, ...] = ()
    ineligible: tuple[str, ...] = ()
    error: str = ""
    unreplicated: tuple[str, ...] = ()
    warnings: list[DataWarning] = field(default_factory=list)
    published: frozenset[str] | None = None

    def retained_bytes(self) -> dict[int, int | None]:
        """Retained WAL bytes per span index (None: unknown, slot missing or invalidated)."""
        return {s.span: s.retained_bytes for s in self.slots}


# ---- decisions ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Decision:
    reason: str
    code: ClassVar[str] = ""
    retryable: ClassVar[bool] = False

    def running_error(self, now: float) -> RunningError:
        """The changefeed error recording this decision (``code``, ``reason``, not span-specific)."""
        return RunningError(self.code, self.reason, now, retryable=self.retryable)


@dataclass(frozen=True)
class FailSlotLost(_Decision):
    """A running changefeed's slot (or publication) vanished or was invalidated: set it ``failed``."""

    code: ClassVar[str] = SlotLost.code


@dataclass(frozen=True)
class ReleaseAfterGcTtl(_Decision):
    """Drop the changefeed's slots and publications (:func:`release_slots`) and keep it ``failed``
    with this reason and ``released`` set (:func:`mark_released`). Also returned for a changefeed
    already marked released whose slots are still there (the drop failed earlier): then only drop."""

    code: ClassVar[str] = GCTTLExceeded.code


Decision = FailSlotLost | ReleaseAfterGcTtl


def is_released(info: ChangefeedInfo) -> bool:
    """True when the changefeed's slots were released after gc-ttl (``info.released``, or its error
    code is ``CDC:ErrGCTTLExceeded`` for records written before that field existed)."""
    if getattr(info, "released", False):
        return True
    return info.error is not None and info.error.code == GCTTLExceeded.code


def decide(info: ChangefeedInfo, report: UpstreamReport | None, now: float, gc_ttl: float) -> Decision | None:
    """What the owner must do about ``info``'s upstream, given its latest ``report``. Pure.

    Returns None when there is no report, the report is an error, or it was taken before the
    changefeed entered its current state (``checked_at < info.state_since``: e.g. a report of a removed
    changefeed whose id was reused). Otherwise, by priority:

    - running (``normal``/``warning``) and a slot does not exist, is invalidated, or a publication is
      gone -> :class:`FailSlotLost`;
    - ``stopped``/``failed`` and a slot still exists, and either the changefeed is already released or
      it has been in that state for at least ``gc_ttl`` seconds -> :class:`ReleaseAfterGcTtl`.

    What is not a decision but a data warning (rows of a new table not replicated, ineligible tables) is
    in ``report.warnings``; see :func:`report_warnings`.
    """
    if report is None or report.error or report.changefeed != info.id or report.checked_at < info.state_since:
        return None
    if info.state.runs:
        problems = []
        for s in report.slots:
            if not s.exists:
                problems.append(f"replication slot {s.slot!r} of span {s.span} disappeared from the upstream")
            elif s.lost:
                why = s.invalidation_reason or f"wal_status {s.wal_status}"
                problems.append(f"replication slot {s.slot!r} of span {s.span} was invalidated by the upstream "
                                f"({why}): WAL it still needed was removed")
            if not s.publication_exists:
                problems.append(f"publication {s.publication!r} of span {s.span} disappeared from the upstream")
        if problems:
            return FailSlotLost(
                f"changefeed {info.id!r}: " + "; ".join(problems) + ". It was dropped by someone or lost in an "
                "upstream failover (a promoted standby has no copy of the slot). Changes committed after the "
                "changefeed's checkpoint may be gone, so it cannot continue without silently skipping them: "
                "remove the changefeed and create it again (re-synchronising the downstream)")
        return None
    if info.state not in (FeedState.STOPPED, FeedState.FAILED):
        return None
    held = [s.slot for s in report.slots if s.exists]
    if not held:
        return None
    if is_released(info):
        return ReleaseAfterGcTtl(info.error.message if info.error else f"changefeed {info.id!r} was released")
    idle = now - info.state_since
    if idle < gc_ttl:
        return None
    cause = f" (it failed with: {info.error.message})" if info.state is FeedState.FAILED and info.error else ""
    return ReleaseAfterGcTtl(
        f"changefeed {info.id!r} was {info.state.value} for {idle:.0f}s, longer than gc-ttl ({gc_ttl:.0f}s){cause}. "
        f"Its upstream position was released: replication slot(s) {', '.join(held)} were dropped so the upstream "
        "stops retaining WAL for it. The changes after its checkpoint are no longer kept, so it can never be "
        "resumed: remove it and create it again (re-synchronising the downstream)")


def report_warnings(info: ChangefeedInfo, report: UpstreamReport | None) -> list[DataWarning]:
    """The data warnings of ``info``'s latest ``report`` (pure): none for a missing or failed report, a report
    of another changefeed, or one taken before the changefeed's last create/resume (acknowledged)."""
    if report is None or report.error or report.changefeed != info.id:
        return []
    since = max(info.resumed_at, info.create_time)
    return [w for w in report.warnings if w.seen > since]


def mark_released(info: ChangefeedInfo, decision: ReleaseAfterGcTtl, now: float) -> ChangefeedInfo:
    """``info`` as ``failed`` with the decision's error and ``released`` set (if the model has it)."""
    changes: dict[str, Any] = {"retries": 0, "backoff_until": 0.0}
    if any(f.name == "released" for f in dataclasses.fields(info)):
        changes["released"] = True
    return info.with_state(FeedState.FAILED, error=decision.running_error(now), now=now, **changes)


def can_resume(info: ChangefeedInfo) -> str | None:
    """None if ``info`` may be resumed as far as the upstream is concerned, else the refusal reason."""
    if not is_released(info):
        return None
    why = f" ({info.error.message})" if info.error else ""
    return (f"changefeed {info.id!r} cannot be resumed: its replication slots were released after gc-ttl{why}; "
            "the upstream no longer keeps the changes after its checkpoint. Remove it and create it again")


def release_slots(info: ChangefeedInfo, opener: Callable[[str], Upstream]) -> None:
    """Drop every slot and publication of ``info`` through ``opener`` (the capture's ``open_upstream``); idempotent
    (a session still streaming from a slot is ended, waiting at most 10 s per slot). Raises :class:`cdc.errors.TidewaterError` if the
    upstream cannot be reached or a drop fails: the caller retries later; what was dropped stays dropped."""
    with opener(info.upstream_uri) as up:
        for span in up.drop_spans(info.spans, timeout=10):
            log.warning("changefeed=%s span=%d: dropped replication slot %s and publication %s",
                        info.id, span.index, span.slot, span.publication)


def inspection_opener(open_upstream: Callable[..., Upstream]) -> Callable[[str], Upstream]:
    """The watcher's default opener: ``open_upstream`` (the capture's) with every query of an inspection bounded by
    ``STATEMENT_TIMEOUT_MS``."""
    return lambda uri: open_upstream(uri, statement_timeout=STATEMENT_TIMEOUT_MS / 1000)


# ---- the watcher --------------------------------------------------------------------------------------
class UpstreamWatcher:
    """Rate-limited inspections of changefeeds' upstreams, keeping the latest report of each.

    ``open_upstream`` and ``sinks`` are the capture's factories (the owner never imports them). ``opener(uri)``
    returns the :class:`upstream.base.Upstream` an inspection uses (closed after it; default: ``open_upstream`` with
    every query bounded by ``STATEMENT_TIMEOUT_MS``); ``clock`` gives ``checked_at``. ``gc_ttl`` is only carried for
    :meth:`decide`. ``target_names(sink_uri)`` returns the sink's ``target_name`` function (default: that of an
    unconnected sink from ``sinks``; asked only when a new table is about to be added).
    """

    def __init__(self, open_upstream: Callable[..., Upstream], sinks: SinkOpener, interval: float = 10.0,
                 gc_ttl: float = 86400.0, clock: Callable[[], float] = time.time,
                 opener: Callable[[str], Upstream] | None = None,
                 target_names: Callable[[str], Callable[[TableName], str]] | None = None,
                 request_copy: CopyRequester | None = None,
                 look: Callable[[ChangefeedInfo, float], UpstreamReport] | None = None) -> None:
        self.interval = interval
        self.gc_ttl = gc_ttl
        self._clock = clock
        self._open = opener or inspection_opener(open_upstream)
        self._target_names = target_names or (lambda sink_uri: sink_target_names(sinks, sink_uri))
        self._request_copy = request_copy  # a table picked up with rows gets a table copy (owner.table_pickup)
        # one look at a changefeed's upstream: (info, started) -> report; a test may script the reports
        self._look = look or self._inspect
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}
        self._reports: dict[str, UpstreamReport] = {}
        self._found: dict[str, dict[tuple[str, str], DataWarning]] = {}  # warnings of every report, newest per ident
        # per changefeed: the leaf partitions of its published partitioned tables at the last look
        self._partitions: dict[str, partition_watch.Leaves] = {}

    # -- bookkeeping (thread-safe)
    def due(self, cf_id: str, now: float) -> bool:
        """True if ``cf_id`` was never inspected or its last inspection started ``interval`` s ago."""
        with self._lock:
            last = self._last.get(cf_id)
        return last is None or now - last >= self.interval

    def latest(self, cf_id: str) -> UpstreamReport | None:
        with self._lock:
            return self._reports.get(cf_id)

    def reports(self) -> list[UpstreamReport]:
        """The latest report of every changefeed inspected and not forgotten (for metrics)."""
        with self._lock:
            return [self._reports[k] for k in sorted(self._reports)]

    def forget(self, cf_id: str) -> None:
        """Drop what is known about ``cf_id`` (call when it is removed)."""
        with self._lock:
            self._last.pop(cf_id, None)
            self._reports.pop(cf_id, None)
            self._found.pop(cf_id, None)
            self._partitions.pop(cf_id, None)

    def retain(self, cf_ids: Iterable[str]) -> None:
        """Forget every changefeed not in ``cf_ids``."""
        keep = set(cf_ids)
        with self._lock:
            for k in [k for k in self._last if k not in keep]:
                self._last.pop(k, None)
                self._reports.pop(k, None)
                self._found.pop(k, None)
                self._partitions.pop(k, None)

    def clear(self) -> None:
        """Forget everything (call when this capture stops being the owner)."""
        with self._lock:
            self._last.clear()
            self._reports.clear()
            self._found.clear()
            self._partitions.clear()
    def found_warnings(self, info: ChangefeedInfo) -> list[DataWarning]:
        """The data warnings of every report of ``info`` since this watcher started (the newest of each code
        and table), without those acknowledged (:func:`report_warnings`' rule). Not only the latest report's:
        a warning found once (rows of a table just added) is not lost when a later inspection comes first."""
        with self._lock:
            found = list(self._found.get(info.id, {}).values())
        since = max(info.resumed_at, info.create_time)
        return sorted((w for w in found if w.seen > since), key=lambda w: w.first_time)

    def decide(self, info: ChangefeedInfo, now: float) -> Decision | None:
        """:func:`decide` over this watcher's latest report of ``info`` and its ``gc_ttl``."""
        return decide(info, self.latest(info.id), now, self.gc_ttl)

    def poll(self, infos: Iterable[ChangefeedInfo]) -> list[UpstreamReport]:
        """Inspect every changefeed of ``infos`` that is due (``removed`` ones are skipped)."""
        out = []
        for info in infos:
            if info.state is not FeedState.REMOVED and self.due(info.id, self._clock()):
                out.append(self.inspect(info))
        return out

    def run(self, source: Callable[[], Iterable[ChangefeedInfo]], stop: threading.Event,
            tick: float = 1.0) -> None:
        """Poll ``source()`` every ``tick`` seconds until ``stop`` is set (a thread target, so that a slow
        or unreachable upstream never delays the owner's tick). Never raises."""
        while not stop.is_set():
            try:
                self.poll(source())
            except Exception:  # noqa: BLE001 - keep watching; a bug here must not end the owner's watch
                log.exception("upstream watch failed")
            stop.wait(tick)

    # -- one inspection
    def inspect(self, info: ChangefeedInfo) -> UpstreamReport:
        """Inspect ``info``'s upstream now, store and return the report (see the module docstring).

        Adds new matching tables to publications only when ``info.state.runs``. Never raises for
        upstream problems: the report carries ``error`` instead.
        """
        started = self._clock()
        with self._lock:
            self._last[info.id] = started
        try:
            report = self._look(info, started)
        except TidewaterError as exc:
            report = UpstreamReport(info.id, started, (), error=str(exc))
        except Exception as exc:  # noqa: BLE001 - a watcher bug must not take the owner down
            log.exception("changefeed=%s: upstream inspection failed", info.id)
            report = UpstreamReport(info.id, started, (), error=f"inspection failed: {exc!r}")
        previous = self.latest(info.id)
        if report.error and (previous is None or previous.error != report.error):
            log.warning("changefeed=%s: upstream inspection failed: %s", info.id, report.error)
        elif previous is not None and previous.error and not report.error:
            log.info("changefeed=%s: upstream inspection works again", info.id)
        with self._lock:
            known = self._found.get(info.id, {})
            fresh = [w for w in report.warnings if w.ident not in known]
        for w in fresh:  # once per condition, not at every look
            log.warning("changefeed=%s: %s: %s", info.id, w.code, w.message)
        for name in report.new_tables:
            log.info("changefeed=%s: new table %s added to its span's publication%s", info.id, name,
                     " (it already held rows: those are NOT replicated)" if name in report.unreplicated else "")
        with self._lock:
            if info.id in self._last:  # not forgotten meanwhile
                self._reports[info.id] = report
                if report.warnings:
                    self._found.setdefault(info.id, {}).update((w.ident, w) for w in report.warnings)
                if report.published and info.id in self._found:  # ended by the table's joining
                    found = self._found[info.id]
                    for ident in [i for i in found if ended_by_joining(*i, report.published)]:
                        del found[ident]
        return report

    def _inspect(self, info: ChangefeedInfo, started: float) -> UpstreamReport:
        up = self._open(info.upstream_uri)
        try:
            published: dict[int, list[TableName] | None] = {}
            slots = []
            for span in info.spans:
                published[span.index] = up.span_tables(span)
                slots.append(_slot_report(up.slot_state(span.slot), span, published[span.index] is not None))
            new: list[str] = []
            unreplicated: list[str] = []
            ineligible: list[str] = []
            warnings: list[DataWarning] = []
            if info.state.runs and info.spans:
                leaves, warnings = self._partition_warnings(up, info, published, started)
                pickup = pick_up_new_tables(up, info, published, self._target_names, started, self._request_copy)
                new, unreplicated, ineligible = pickup.added, pickup.with_rows, pickup.ineligible
                warnings += pickup.warnings
                if not up.captures_ddl():
                    warnings.append(ddl_not_captured_notice(started))
                with self._lock:  # the new baseline only once its warnings are in a report (and not forgotten)
                    if info.id in self._last:
                        self._partitions[info.id] = leaves
            retention = up.retention_notice(self.gc_ttl)
            if retention is not None:  # (also while stopped: that is when it bites)
                warnings.append(DataWarning(CODE_RETENTION_SHORT, "*", retention, WarningSeverity.NOTICE,
                                            first_time=started, last_time=started))
            joined = None
            if all(tables is not None for tables in published.values()):
                joined = frozenset({str(t) for tables in published.values() for t in tables or ()} | set(new))
            return UpstreamReport(info.id, started, tuple(slots), tuple(new), tuple(ineligible),
                                  unreplicated=tuple(unreplicated), warnings=warnings, published=joined)
        finally:
            up.close()

    def _partition_warnings(self, up: Upstream, info: ChangefeedInfo, published: dict[int, list[TableName] | None],
                            now: float) -> tuple[partition_watch.Leaves, list[DataWarning]]:
        """The leaf partitions of ``info``'s published partitioned tables now, and the warnings from comparing
        them with the last look (:func:`owner.partition_watch.compare`; the first look is the baseline) and
        from checking new partitions' replica identity. The caller stores the leaves as the next baseline."""
        current = partition_watch.group(up.partition_leaves(
            [s for s in info.spans if published.get(s.index) is not None]))
        with self._lock:
            before = self._partitions.get(info.id)
        out = unusable_new_partitions(up, before or {}, current, now)
        if before is not None and not up.repairs_partitions():  # else the stream itself carried the repair
            out += partition_watch.compare(before, current, exists=up.relation_exists, has_rows=up.has_rows, now=now)
        return current, out


CODE_DDL_NOT_CAPTURED = "CDC:NoticeDdlNotCaptured"
CODE_RETENTION_SHORT = "CDC:NoticeRetentionShort"  # the upstream may drop a stopped changefeed's position before gc-ttl


def ddl_not_captured_notice(now: float) -> DataWarning:
    """The changefeed sees schema changes only through the row stream (no DDL trigger upstream): what it
    cannot see, and the fix (docs/ddl.md, "Privileges and the fallback")."""
    return DataWarning(
        CODE_DDL_NOT_CAPTURED, "*",
        "schema changes are seen only through the replication stream: Tidewater's DDL event triggers are not "
        "installed or are disabled upstream (creating them needs a superuser). Added, dropped and retyped columns "
        "and table renames are still applied (at the first row after them; the rows that existed get an added column's values read back by key); a "
        "column RENAME fails the changefeed; not seen at all: CREATE TABLE (tables are picked up later, their "
        "earlier rows reported), DROP TABLE, key changes that change no column, defaults, NOT NULL, indexes. "
        "Fix: recreate the changefeed as a superuser, or re-enable the triggers (ALTER EVENT TRIGGER "
        "tidewater_ddl_end ENABLE ALWAYS)", WarningSeverity.NOTICE, first_time=now, last_time=now)


def _slot_report(s: SlotState | None, span: SpanInfo, publication_exists: bool) -> SlotReport:
    if s is None:
        return SlotReport(span.index, span.slot, False, False, None, None, None, False, span.publication,
                          publication_exists)
    return SlotReport(span.index, span.slot, True, s.active, None if s.lost else s.retained_bytes,
                      s.confirmed_ts, s.wal_status, s.lost, span.publication, publication_exists,
                      s.invalidation_reason)
