"""Prometheus metrics (``tidewater_*``), computed at scrape time from the capture's state.

Metrics as observers: the data path keeps plain counters on its objects (``cdc.stats``, the sorter's
``in_rows``/``in_bytes``, ...), bumped per batch or per transaction, never per row; this module alone
turns them into Prometheus families. Every family is rebuilt per scrape, so the series of a changefeed or
span that is gone (removed, moved to another capture) disappear with it, and label sets never change.

Who exports what (``docs/metrics.md`` lists every family):
- every capture: its own process, etcd client, HTTP API, sorter, and the spans it runs;
- the owner only: changefeed-level lag and state, data warnings, slots (one series per changefeed in the
  cluster, whichever capture leads), and the capture count. A scrape never fails because etcd does not
  answer: the owner-only families are then empty and ``tidewater_etcd_snapshot_ok`` is 0.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    CollectorRegistry,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from cdc.errors import TidewaterError
from cdc.model import still_copying
from cdc.stats import EtcdStats, Histogram, RequestStats

if TYPE_CHECKING:
    from owner.upstream_watch import UpstreamReport

SPAN = ["changefeed", "span"]


@dataclass
class CaptureProcessState:
    """Figures of the capture process that outlive its etcd sessions (``capture.server`` keeps them)."""

    sessions: int = 0  # etcd sessions started (registrations); > 1: the capture lost its lease and re-registered
    owner_terms: int = 0  # elections won by this process
    draining: bool = False
    session_alive: Callable[[], bool] = lambda: False
    etcd: EtcdStats = field(default_factory=EtcdStats)
    api: RequestStats = field(default_factory=RequestStats)
    data_dir: str = ""
    sorter_disk_quota: int = 0
    version: str = ""
    addr: str = ""


class CaptureCollector(Collector):
    def __init__(self, capture_id: str, is_owner: Callable[[], bool], snapshot: Callable[[], Any],
                 spans: Callable[[], list[Any]], sorter_bytes: Callable[[], int],
                 slot_reports: Callable[[], list[UpstreamReport]] = lambda: [],
                 process: CaptureProcessState | None = None, owner_terms: Callable[[], int] = lambda: 0,
                 snapshot_progress: Callable[[str], Any] | None = None) -> None:
        """``spans`` returns this capture's spans (``processor.processor.SpanView``: ``changefeed``,
        ``span``, ``stats``, ``runner`` or None while it backs off). ``slot_reports`` returns the owner's
        latest upstream reports (``UpstreamWatcher.reports``); it is read only while this capture is the owner.
        ``owner_terms``: elections won by the current session's owner (added to ``process.owner_terms``).
        ``snapshot_progress(changefeed)``: its initial copy's ``cdc.snapshot.SnapshotProgress`` (read by the owner
        only, only for changefeeds still copying: one etcd range read each)."""
        self.capture_id = capture_id
        self._is_owner = is_owner
        self._snapshot = snapshot
        self._spans = spans
        self._sorter_bytes = sorter_bytes
        self._slot_reports = slot_reports
        self.process = process if process is not None else CaptureProcessState()
        self._owner_terms = owner_terms
        self._snapshot_progress = snapshot_progress

    def collect(self) -> Iterator[Any]:
        now = time.time()
        is_owner = self._is_owner()
        yield from self._capture_families(is_owner)
        yield from self._span_families(now)
        yield from etcd_families(self.process.etcd)
        yield from api_families(self.process.api)
        snap = None
        if is_owner:
            try:
                snap = self._snapshot()
            except TidewaterError:
                snap = None
        ok = GaugeMetricFamily("tidewater_etcd_snapshot_ok",
                               "1 if the owner read the cluster state from etcd for this scrape (0: owner-only "
                               "families are empty), absent on other captures")
        if is_owner:
            ok.add_metric([], 1.0 if snap is not None else 0.0)
        yield ok
        yield from changefeed_families(snap, now)
        yield from snapshot_families(snap, self._snapshot_progress)
        yield from slot_metrics(self._slot_reports() if is_owner else [])

    # ---- per capture -----------------------------------------------------------------------------
    def _capture_families(self, is_owner: bool) -> Iterator[Any]:
        p = self.process
        info = GaugeMetricFamily("tidewater_capture_info", "1; labels name this capture (its id changes when it "
                                 "registers again after losing its etcd session)", labels=["capture", "version", "addr"])
        info.add_metric([self.capture_id, p.version, p.addr], 1.0)
        yield info
        owner = GaugeMetricFamily("tidewater_owner", "1 if this capture is the owner", labels=["capture"])
        owner.add_metric([self.capture_id], 1.0 if is_owner else 0.0)
        yield owner
        terms = CounterMetricFamily("tidewater_owner_elections", "Elections this capture process won (owner changes)")
        terms.add_metric([], float(p.owner_terms + self._owner_terms()))
        yield terms
        sessions = CounterMetricFamily("tidewater_capture_sessions", "etcd sessions this process started (the "
                                       "first registration, then one per re-registration after a lost lease)")
        sessions.add_metric([], float(p.sessions))
        yield sessions
        alive = GaugeMetricFamily("tidewater_capture_session_alive", "1 while the capture holds a live etcd "
                                  "session (registered, lease refreshed)")
        alive.add_metric([], 1.0 if p.session_alive() else 0.0)
        yield alive
        draining = GaugeMetricFamily("tidewater_capture_draining", "1 while the capture is draining (SIGTERM)")
        draining.add_metric([], 1.0 if p.draining else 0.0)
        yield draining
        sorter = GaugeMetricFamily("tidewater_sorter_disk_bytes", "LevelDB sorter size on disk (with spill files)",
                                   labels=["capture"])
        sorter.add_metric([self.capture_id], float(self._sorter_bytes()))
        yield sorter
        quota = GaugeMetricFamily("tidewater_sorter_disk_quota_bytes", "sorter-disk-quota (0: unlimited)")
        quota.add_metric([], float(p.sorter_disk_quota))
        yield quota
        free = GaugeMetricFamily("tidewater_sorter_filesystem_free_bytes", "Free bytes of the file system "
                                 "holding --data-dir (for unprivileged use)")
        size = GaugeMetricFamily("tidewater_sorter_filesystem_size_bytes", "Size of the file system holding "
                                 "--data-dir")
        if p.data_dir:
            try:
                usage = shutil.disk_usage(p.data_dir)
                free.add_metric([], float(usage.free))
                size.add_metric([], float(usage.total))
            except OSError:
                pass
        yield free
        yield size

    # ---- per span --------------------------------------------------------------------------------
    def _span_families(self, now: float) -> Iterator[Any]:
        f = _SpanFamilies()
        for view in self._spans():
            f.add(view, now)
        yield from f.families()


class _SpanFamilies:
    def __init__(self) -> None:
        def c(name: str, doc: str, extra: Iterable[str] = ()) -> CounterMetricFamily:
            return CounterMetricFamily(name, doc, labels=[*SPAN, *extra])

        def g(name: str, doc: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, labels=SPAN)

        self.running = g("tidewater_span_running", "1 if the span runs on this capture, 0 while it waits to restart")
        self.ck_lag = g("tidewater_span_checkpoint_lag_seconds", "now - upstream time of the span's checkpoint")
        self.rs_lag = g("tidewater_span_resolved_lag_seconds", "now - upstream time of the span's resolved ts")
        self.recv_rows = c("tidewater_puller_received_rows", "Row changes the puller received (committed and "
                           "rolled back), counted per transaction")
        self.recv_bytes = c("tidewater_puller_received_bytes", "Payload bytes the puller received")
        self.in_rows = c("tidewater_sorter_input_rows", "Row changes of committed transactions entering the sorter")
        self.in_bytes = c("tidewater_sorter_input_bytes", "Payload bytes of committed transactions entering the sorter")
        self.out_rows = c("tidewater_sorter_output_rows", "Row changes the sink thread read from the sorter")
        self.out_bytes = c("tidewater_sorter_output_bytes", "Payload bytes the sink thread read from the sorter")
        self.sink_rows = c("tidewater_sink_rows", "Row changes written downstream (committed)")
        self.sink_bytes = c("tidewater_sink_bytes", "Payload bytes of the row changes written downstream")
        self.sink_txns = c("tidewater_sink_txns", "Upstream transactions written downstream")
        self.mem = g("tidewater_sorter_memory_bytes", "Change data the span's sorter holds in memory")
        self.spills = g("tidewater_sorter_spill_files", "Spill files the span's sorter holds now")
        self.pending = g("tidewater_sorter_pending_txns", "Open (uncommitted) upstream transactions buffered")
        self.write = HistogramMetricFamily("tidewater_sink_write_duration_seconds", "Duration of one sink write: "
                                           "one downstream transaction, mount to commit", labels=SPAN)
        self.batch = HistogramMetricFamily("tidewater_sink_batch_rows", "Rows per sink write", labels=SPAN)
        self.errors = c("tidewater_span_errors", "Span failures by stage (puller, sink, start) and error code",
                        ["stage", "code"])
        self.restarts = c("tidewater_span_restarts", "Restarts of the span after a failure")
        self.backoff = g("tidewater_span_backoff_seconds", "Seconds until the failed span's next restart (0: running)")
        self.failures = g("tidewater_span_consecutive_failures", "Failures since the span last made progress")

    def add(self, view: Any, now: float) -> None:
        labels = [view.changefeed, str(view.span)]
        st = view.stats
        runner = view.runner
        self.running.add_metric(labels, 1.0 if runner is not None and not runner.stopped else 0.0)
        if runner is not None:
            self.ck_lag.add_metric(labels, max(0.0, now - runner.checkpoint.time))
            self.rs_lag.add_metric(labels, max(0.0, now - runner.resolved.time))
            sorter = runner.sorter
            self.recv_rows.add_metric(labels, float(sorter.in_rows + sorter.aborted_rows))
            self.recv_bytes.add_metric(labels, float(sorter.in_bytes + sorter.aborted_bytes))
            self.in_rows.add_metric(labels, float(sorter.in_rows))
            self.in_bytes.add_metric(labels, float(sorter.in_bytes))
            self.mem.add_metric(labels, float(sorter.memory_bytes()))
            self.spills.add_metric(labels, float(sorter.spill_files()))
            self.pending.add_metric(labels, float(sorter.pending_txns()))
        self.out_rows.add_metric(labels, float(st.sorter_out_rows))
        self.out_bytes.add_metric(labels, float(st.sorter_out_bytes))
        self.sink_rows.add_metric(labels, float(st.sink_rows))
        self.sink_bytes.add_metric(labels, float(st.sink_bytes))
        self.sink_txns.add_metric(labels, float(st.sink_txns))
        _add_histogram(self.write, labels, st.sink_write_seconds)
        _add_histogram(self.batch, labels, st.sink_batch_rows)
        for (stage, code), n in list(st.errors.items()):
            self.errors.add_metric([*labels, stage, code], float(n))
        self.restarts.add_metric(labels, float(st.restarts))
        self.backoff.add_metric(labels, max(0.0, st.restart_at - now) if runner is None else 0.0)
        self.failures.add_metric(labels, float(st.consecutive_failures))

    def families(self) -> list[Any]:
        return [self.running, self.ck_lag, self.rs_lag, self.recv_rows, self.recv_bytes, self.in_rows,
                self.in_bytes, self.out_rows, self.out_bytes, self.sink_rows, self.sink_bytes, self.sink_txns,
                self.mem, self.spills, self.pending, self.write, self.batch, self.errors, self.restarts,
                self.backoff, self.failures]


def _add_histogram(family: HistogramMetricFamily, labels: list[str], h: Histogram) -> None:
    family.add_metric(labels, h.cumulative(), h.sum)


def etcd_families(stats: EtcdStats) -> Iterator[Any]:
    latency = HistogramMetricFamily("tidewater_etcd_request_duration_seconds", "etcd requests of this capture, "
                                    "failover and retries included, by operation", labels=["op"])
    errors = CounterMetricFamily("tidewater_etcd_request_errors", "etcd requests that failed, by operation and "
                                 "gRPC code", labels=["op", "code"])
    leases = CounterMetricFamily("tidewater_etcd_lease_refreshes", "Session lease refreshes by result (ok, error)",
                                 labels=["result"])
    for op, h in sorted(stats.latency.items()):
        _add_histogram(latency, [op], h)
    for (op, code), n in sorted(stats.errors.items()):
        errors.add_metric([op, code], float(n))
    for result, n in sorted(stats.lease_refreshes.items()):
        leases.add_metric([result], float(n))
    yield from (latency, errors, leases)


def api_families(stats: RequestStats) -> Iterator[Any]:
    requests = CounterMetricFamily("tidewater_api_requests", "HTTP API requests by method, route template and "
                                   "status code", labels=["method", "route", "code"])
    latency = HistogramMetricFamily("tidewater_api_request_duration_seconds", "HTTP API request duration",
                                    labels=["method", "route"])
    for (method, route, code), n in sorted(stats.requests.items()):
        requests.add_metric([method, route, code], float(n))
    for (method, route), h in sorted(stats.latency.items()):
        _add_histogram(latency, [method, route], h)
    yield from (requests, latency)


def changefeed_families(snap: Any, now: float) -> Iterator[Any]:
    """Owner-only families from one cluster snapshot (``snap`` None: empty families)."""
    ck = GaugeMetricFamily("tidewater_changefeed_checkpoint_lag_seconds",
                           "now - upstream time of the global checkpoint", labels=["changefeed"])
    rs = GaugeMetricFamily("tidewater_changefeed_resolved_lag_seconds",
                           "now - upstream time of the global resolved ts", labels=["changefeed"])
    state = GaugeMetricFamily("tidewater_changefeed_state", "1 for the changefeed's current state",
                              labels=["changefeed", "state"])
    warnings = GaugeMetricFamily(
        "tidewater_data_warnings", "Unacknowledged data warnings of the changefeed: rows (or events) concerned "
        "so far, per kind (code), upstream table and severity (divergence: rows may differ downstream)",
        labels=["changefeed", "code", "table", "severity"])
    spans = GaugeMetricFamily("tidewater_changefeed_spans", "Spans of the changefeed by assignment state "
                              "(assigned, unassigned)", labels=["changefeed", "state"])
    captures = GaugeMetricFamily("tidewater_captures", "Registered captures by state (live, draining)",
                                 labels=["state"])
    if snap is not None:
        for cf_id, entry in snap.changefeeds.items():
            st = snap.statuses.get(cf_id)
            if st is not None and st.checkpoint_time:
                ck.add_metric([cf_id], max(0.0, now - st.checkpoint_time))
                rs.add_metric([cf_id], max(0.0, now - st.resolved_time))
            state.add_metric([cf_id, entry.value.state.value], 1.0)
            for w in st.warnings if st is not None else ():
                warnings.add_metric([cf_id, w.code, w.table, w.severity.value], float(w.count))
            assigned = snap.assignments.get(cf_id, {})
            live = {c for c in snap.captures}
            n_assigned = sum(1 for a in assigned.values() if a.capture_id in live)
            spans.add_metric([cf_id, "assigned"], float(n_assigned))
            spans.add_metric([cf_id, "unassigned"], float(len(entry.value.spans) - n_assigned))
        draining = sum(1 for c in snap.captures.values() if c.draining)
        captures.add_metric(["live"], float(len(snap.captures) - draining))
        captures.add_metric(["draining"], float(draining))
    yield from (ck, rs, state, warnings, spans, captures)


def snapshot_families(snap: Any, progress: Callable[[str], Any] | None) -> Iterator[Any]:
    """Owner-only families of the initial copy (``snap`` None: empty families): whether each changefeed still
    copies and its copy's ETA, and per table of a copying changefeed its chunks done / total, rows copied (never
    going backwards) and redone / planned, rows/s and ETA (the numbers of ``changefeed query``; rates and ETAs only
    once known)."""
    phase = GaugeMetricFamily("tidewater_changefeed_snapshot_copying", "1 while the changefeed copies the rows "
                              "that existed when it was created (it has no checkpoint yet), 0 once it streams",
                              labels=["changefeed"])
    done = GaugeMetricFamily("tidewater_snapshot_chunks_done", "Chunks of the table copied by the initial copy",
                             labels=["changefeed", "table"])
    total = GaugeMetricFamily("tidewater_snapshot_chunks_planned", "Chunks the table's initial copy was planned in",
                              labels=["changefeed", "table"])
    rows = GaugeMetricFamily("tidewater_snapshot_rows_copied", "Rows of the table the initial copy wrote downstream "
                             "so far, over all its runs (never goes backwards; includes the rows redone)",
                             labels=["changefeed", "table"])
    redone = GaugeMetricFamily("tidewater_snapshot_rows_redone", "Rows of the table the copy wrote under a plan "
                               "dropped since (its copy started over: a restart under a new snapshot, a changed "
                               "definition, a resync); they are copied again", labels=["changefeed", "table"])
    planned = GaugeMetricFamily("tidewater_snapshot_rows_planned", "Rows the table held when its copy was planned (PostgreSQL's "
                                "estimate for a large table with a dense integer key)",
                                labels=["changefeed", "table"])
    speed = GaugeMetricFamily("tidewater_snapshot_rows_per_second", "Rows per second the table's copy runs at in "
                              "its current run (that run's rows over the wall time from its first chunk's start to "
                              "its last chunk's end)", labels=["changefeed", "table"])
    eta = GaugeMetricFamily("tidewater_snapshot_eta_seconds", "Seconds until the table's copy is done at that speed "
                            "(0 once done; absent until a chunk of its current plan gave a rate)",
                            labels=["changefeed", "table"])
    cf_eta = GaugeMetricFamily("tidewater_changefeed_snapshot_eta_seconds", "Seconds until the changefeed's copy is "
                               "done: the slowest span's rows left at its current rate (absent while a span with "
                               "chunks left has no rate yet)", labels=["changefeed"])
    copies = GaugeMetricFamily("tidewater_changefeed_table_copies", "Table copies of the changefeed (tables that "
                               "joined with rows, resyncs) asked for or running while it streams",
                               labels=["changefeed"])
    if snap is not None:
        for cf_id, entry in snap.changefeeds.items():
            statuses = snap.span_statuses.get(cf_id, {})
            busy = still_copying(entry.value, statuses)
            phase.add_metric([cf_id], 1.0 if busy else 0.0)
            running = sum(len(st.snapshot.tables) for st in statuses.values()
                          if st is not None and st.snapshot is not None and st.snapshot.phase != "done")
            copies.add_metric([cf_id], float(running + len(entry.value.table_copies)))
            if not (busy or running) or progress is None:
                continue
            try:
                p = progress(cf_id)
            except TidewaterError:
                continue
            for t in p.tables:
                done.add_metric([cf_id, t.table], float(t.chunks_done))
                total.add_metric([cf_id, t.table], float(t.chunks_total))
                rows.add_metric([cf_id, t.table], float(t.rows_copied))
                redone.add_metric([cf_id, t.table], float(t.rows_redone))
                planned.add_metric([cf_id, t.table], float(t.rows_planned))
                if t.rows_per_second is not None:
                    speed.add_metric([cf_id, t.table], float(t.rows_per_second))
                if t.eta_seconds is not None:
                    eta.add_metric([cf_id, t.table], float(t.eta_seconds))
            if p.eta_seconds is not None:
                cf_eta.add_metric([cf_id], float(p.eta_seconds))
    yield from (phase, done, total, rows, redone, planned, speed, eta, cf_eta, copies)


def slot_metrics(reports: list[UpstreamReport]) -> Iterator[Any]:
    """Per-slot families from the owner's upstream reports; a slot whose size is unknown (upstream
    unreachable, slot missing or invalidated) has no ``retained`` sample rather than a wrong one."""
    retained = GaugeMetricFamily("tidewater_slot_retained_wal_bytes",
                                 "WAL the upstream retains for the span's replication slot (current WAL "
                                 "position minus the slot's restart LSN)", labels=["changefeed", "span", "slot"])
    usable = GaugeMetricFamily("tidewater_slot_usable",
                               "1 if the span's slot and publication exist and the slot is not invalidated",
                               labels=["changefeed", "span", "slot"])
    active = GaugeMetricFamily("tidewater_slot_active", "1 if a walsender streams from the slot",
                               labels=["changefeed", "span", "slot"])
    wal_status = GaugeMetricFamily("tidewater_slot_wal_status", "1 for the slot's pg_replication_slots.wal_status "
                                   "(reserved, extended, unreserved: about to be invalidated, lost)",
                                   labels=["changefeed", "span", "slot", "status"])
    reachable = GaugeMetricFamily("tidewater_upstream_reachable", "1 if the owner's last look at the changefeed's "
                                  "upstream succeeded", labels=["changefeed"])
    checked = GaugeMetricFamily("tidewater_upstream_checked_timestamp_seconds", "Unix time of that look",
                                labels=["changefeed"])
    for report in reports:
        reachable.add_metric([report.changefeed], 0.0 if report.error else 1.0)
        checked.add_metric([report.changefeed], float(report.checked_at))
        for s in report.slots:
            labels = [report.changefeed, str(s.span), s.slot]
            if s.retained_bytes is not None:
                retained.add_metric(labels, float(s.retained_bytes))
            usable.add_metric(labels, 1.0 if s.exists and not s.lost and s.publication_exists else 0.0)
            active.add_metric(labels, 1.0 if s.active else 0.0)
            if s.wal_status:
                wal_status.add_metric([*labels, s.wal_status], 1.0)
    yield from (retained, usable, active, wal_status, reachable, checked)


def make_registry(collector: CaptureCollector, process: bool = False) -> Callable[[], bytes]:
    """The exposition of ``collector``; with ``process`` also the standard ``process_*`` (CPU, RSS, open
    files, start time), ``python_gc_*`` and ``python_info`` families (one per process: the server's)."""
    registry = CollectorRegistry()
    registry.register(collector)
    if process:
        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
        GCCollector(registry=registry)
    return lambda: generate_latest(registry)
