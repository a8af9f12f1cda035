"""Prometheus metrics (``tidewater_*``), computed at scrape time from the capture's state.

Metrics as observers: the data path keeps plain counters on its objects; this module alone turns them
into Prometheus families. Changefeed-level lag metrics are exported by the owner only (one series per
changefeed in the cluster); span-level metrics by the capture running the span. Series of a changefeed
(or of a data warning) that no longer exists disappear with it: every family is rebuilt per scrape.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from owner.upstream_watch import UpstreamReport


class CaptureCollector(Collector):
    def __init__(self, capture_id: str, is_owner: Callable[[], bool], snapshot: Callable[[], Any],
                 runners: Callable[[], list[tuple[str, int, Any]]], sorter_bytes: Callable[[], int],
                 slot_reports: Callable[[], list[UpstreamReport]] = lambda: []) -> None:
        """``slot_reports`` returns the owner's latest upstream reports (``UpstreamWatcher.reports``);
        it is read only while this capture is the owner."""
        self.capture_id = capture_id
        self._is_owner = is_owner
        self._snapshot = snapshot
        self._runners = runners
        self._sorter_bytes = sorter_bytes
        self._slot_reports = slot_reports

    def collect(self) -> Iterator[Any]:
        now = time.time()
        owner = GaugeMetricFamily("tidewater_owner", "1 if this capture is the owner", labels=["capture"])
        owner.add_metric([self.capture_id], 1.0 if self._is_owner() else 0.0)
        yield owner
        sorter = GaugeMetricFamily("tidewater_sorter_disk_bytes", "LevelDB sorter size on disk", labels=["capture"])
        sorter.add_metric([self.capture_id], float(self._sorter_bytes()))
        yield sorter
        rows = CounterMetricFamily("tidewater_sink_rows", "Row changes written to the sink by spans on this capture",
                                   labels=["changefeed", "span"])
        span_ck = GaugeMetricFamily("tidewater_span_checkpoint_lag_seconds", "Span checkpoint lag",
                                    labels=["changefeed", "span"])
        for cf, span, runner in self._runners():
            rows.add_metric([cf, str(span)], float(runner.rows))
            span_ck.add_metric([cf, str(span)], max(0.0, now - runner.checkpoint.time))
        yield rows
        yield span_ck
        if not self._is_owner():
            return
        snap = self._snapshot()
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
        for cf_id, entry in snap.changefeeds.items():
            st = snap.statuses.get(cf_id)
            if st is not None and st.checkpoint_time:
                ck.add_metric([cf_id], max(0.0, now - st.checkpoint_time))
                rs.add_metric([cf_id], max(0.0, now - st.resolved_time))
            state.add_metric([cf_id, entry.value.state.value], 1.0)
            for w in st.warnings if st is not None else ():
                warnings.add_metric([cf_id, w.code, w.table, w.severity.value], float(w.count))
        yield ck
        yield rs
        yield state
        yield warnings
        yield from slot_metrics(self._slot_reports())


def slot_metrics(reports: list[UpstreamReport]) -> Iterator[Any]:
    """Per-slot families from the owner's upstream reports; a slot whose size is unknown (upstream
    unreachable, slot missing or invalidated) has no ``retained`` sample rather than a wrong one."""
    retained = GaugeMetricFamily("tidewater_slot_retained_wal_bytes",
                                 "WAL the upstream retains for the span's replication slot (current WAL "
                                 "position minus the slot's restart LSN)", labels=["changefeed", "span", "slot"])
    usable = GaugeMetricFamily("tidewater_slot_usable",
                               "1 if the span's slot and publication exist and the slot is not invalidated",
                               labels=["changefeed", "span", "slot"])
    for report in reports:
        for s in report.slots:
            labels = [report.changefeed, str(s.span), s.slot]
            if s.retained_bytes is not None:
                retained.add_metric(labels, float(s.retained_bytes))
            usable.add_metric(labels, 1.0 if s.exists and not s.lost and s.publication_exists else 0.0)
    yield retained
    yield usable


def make_registry(collector: CaptureCollector) -> Callable[[], bytes]:
    registry = CollectorRegistry()
    registry.register(collector)
    return lambda: generate_latest(registry)
