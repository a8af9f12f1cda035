"""The capture's collector: span families from SpanStats and the span's sorter, stale series dropped with the
span, histograms in Prometheus form, per-capture etcd/API/process families, and a scrape that survives etcd
being away."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from capture.metrics import CaptureCollector, CaptureProcessState, make_registry
from cdc.errors import MetaStoreError
from cdc.meta.store import ClusterSnapshot
from cdc.stats import EtcdStats, RequestStats, SpanStats
from cdc.ts import Watermark
from sorter.memory import MemorySpanSorter

pytestmark = pytest.mark.unit


@dataclass
class _Runner:
    sorter: MemorySpanSorter
    checkpoint: Watermark
    resolved: Watermark
    stopped: bool = False


@dataclass
class _View:
    changefeed: str
    span: int
    stats: SpanStats = field(default_factory=SpanStats)
    runner: Any = None


def _samples(text: bytes) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text.decode()):
        for s in fam.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


def _value(samples: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str) -> float:
    hits = [v for lab, v in samples.get(name, []) if all(lab.get(k) == w for k, w in labels.items())]
    assert len(hits) == 1, (name, labels, samples.get(name))
    return hits[0]


def _collector(views: list[_View], *, owner: bool = False, snapshot: Any = None,
               process: CaptureProcessState | None = None) -> CaptureCollector:
    snap = snapshot if snapshot is not None else (lambda: ClusterSnapshot(revision=1))
    return CaptureCollector("cap-1", lambda: owner, snap, lambda: list(views), lambda: 4096, process=process)


def test_span_families_count_stages_and_drop_series_of_a_span_that_left() -> None:
    sorter = MemorySpanSorter("a/0")
    sorter.add(7, 7, b"x" * 10)
    sorter.add(7, 7, b"y" * 20)
    sorter.commit(7, 100, 50.0)
    sorter.add(8, 8, b"z" * 5)
    sorter.abort(8, 8)
    sorter.add(9, 9, b"open")  # still open: neither in nor aborted
    stats = SpanStats()
    stats.sorter_out_rows, stats.sorter_out_bytes = 2, 30
    stats.sink_rows, stats.sink_bytes, stats.sink_txns = 2, 30, 1
    stats.sink_write_seconds.observe(0.003)
    stats.sink_write_seconds.observe(0.2)
    stats.sink_batch_rows.observe(2)
    now = __import__("time").time()
    a0 = _View("a", 0, stats, _Runner(sorter, Watermark(100, now - 5.0), Watermark(120, now - 1.0)))
    b1 = _View("b", 1)
    b1.stats.failed("sink", "CDC:ErrSinkUnavailable", restart_at=now + 30.0, consecutive=2)
    views = [a0, b1]
    s = _samples(make_registry(_collector(views))())

    assert _value(s, "tidewater_puller_received_rows_total", changefeed="a", span="0") == 3
    assert _value(s, "tidewater_puller_received_bytes_total", changefeed="a", span="0") == 35
    assert _value(s, "tidewater_sorter_input_rows_total", changefeed="a", span="0") == 2
    assert _value(s, "tidewater_sorter_input_bytes_total", changefeed="a", span="0") == 30
    assert _value(s, "tidewater_sorter_pending_txns", changefeed="a", span="0") == 1
    assert _value(s, "tidewater_sorter_output_rows_total", changefeed="a", span="0") == 2
    assert _value(s, "tidewater_sink_rows_total", changefeed="a", span="0") == 2
    assert _value(s, "tidewater_sink_bytes_total", changefeed="a", span="0") == 30
    assert _value(s, "tidewater_sink_txns_total", changefeed="a", span="0") == 1
    assert 4.5 <= _value(s, "tidewater_span_checkpoint_lag_seconds", changefeed="a", span="0") <= 6
    assert 0.5 <= _value(s, "tidewater_span_resolved_lag_seconds", changefeed="a", span="0") <= 2
    # histogram: cumulative buckets, +Inf = count, sum
    assert _value(s, "tidewater_sink_write_duration_seconds_bucket", changefeed="a", le="0.005") == 1
    assert _value(s, "tidewater_sink_write_duration_seconds_bucket", changefeed="a", le="0.25") == 2
    assert _value(s, "tidewater_sink_write_duration_seconds_bucket", changefeed="a", le="+Inf") == 2
    assert _value(s, "tidewater_sink_write_duration_seconds_count", changefeed="a") == 2
    assert abs(_value(s, "tidewater_sink_write_duration_seconds_sum", changefeed="a") - 0.203) < 1e-9
    assert _value(s, "tidewater_sink_batch_rows_bucket", changefeed="a", le="1.0") == 0
    assert _value(s, "tidewater_sink_batch_rows_bucket", changefeed="a", le="10.0") == 1
    # the failed span waiting for its restart: not running, backoff left, error by stage and code
    assert _value(s, "tidewater_span_running", changefeed="a", span="0") == 1
    assert _value(s, "tidewater_span_running", changefeed="b", span="1") == 0
    assert 25 <= _value(s, "tidewater_span_backoff_seconds", changefeed="b", span="1") <= 30
    assert _value(s, "tidewater_span_consecutive_failures", changefeed="b", span="1") == 2
    assert _value(s, "tidewater_span_errors_total", changefeed="b", stage="sink", code="CDC:ErrSinkUnavailable") == 1
    assert "tidewater_span_checkpoint_lag_seconds" not in {n for n, v in s.items() for lab, _ in v
                                                           if lab.get("changefeed") == "b"}
    # b restarts: restart counted, backoff over; a leaves this capture: every series of a disappears
    b1.stats.started(after_failure=True)
    views.remove(a0)
    s = _samples(make_registry(_collector(views))())
    assert _value(s, "tidewater_span_restarts_total", changefeed="b", span="1") == 1
    assert all(lab.get("changefeed") != "a" for v in s.values() for lab, _ in v)


def test_capture_families_etcd_api_and_process_collector() -> None:
    etcd = EtcdStats()
    etcd.observe("txn", 0.002)
    etcd.observe("txn", 4.0, "UNAVAILABLE")
    etcd.lease_refresh(True)
    etcd.lease_refresh(False)
    api = RequestStats()
    api.observe("GET", "/api/v2/changefeeds/{changefeed_id}", 404, 0.001)
    api.observe("GET", "/api/v2/changefeeds/{changefeed_id}", 404, 0.001)
    process = CaptureProcessState(sessions=2, owner_terms=3, session_alive=lambda: True, etcd=etcd, api=api,
                                  data_dir="/", sorter_disk_quota=1 << 30, version="0.1.0", addr="127.0.0.1:1")
    s = _samples(make_registry(_collector([], process=process), process=True)())
    assert _value(s, "tidewater_capture_info", capture="cap-1", version="0.1.0") == 1
    assert _value(s, "tidewater_owner", capture="cap-1") == 0
    assert _value(s, "tidewater_owner_elections_total") == 3
    assert _value(s, "tidewater_capture_sessions_total") == 2
    assert _value(s, "tidewater_capture_session_alive") == 1
    assert _value(s, "tidewater_sorter_disk_bytes", capture="cap-1") == 4096
    assert _value(s, "tidewater_sorter_disk_quota_bytes") == 1 << 30
    assert _value(s, "tidewater_sorter_filesystem_size_bytes") > 0
    assert _value(s, "tidewater_etcd_request_duration_seconds_count", op="txn") == 2
    assert _value(s, "tidewater_etcd_request_errors_total", op="txn", code="UNAVAILABLE") == 1
    assert _value(s, "tidewater_etcd_lease_refreshes_total", result="error") == 1
    assert _value(s, "tidewater_api_requests_total", route="/api/v2/changefeeds/{changefeed_id}", code="404") == 2
    assert _value(s, "process_resident_memory_bytes") > 0
    assert _value(s, "process_cpu_seconds_total") > 0
    # owner-only families: present but empty on a non-owner
    assert "tidewater_changefeed_checkpoint_lag_seconds" not in s and "tidewater_etcd_snapshot_ok" not in s


def test_owner_scrape_survives_etcd_outage() -> None:
    def down() -> ClusterSnapshot:
        raise MetaStoreError("etcd range failed: unavailable")

    s = _samples(make_registry(_collector([], owner=True, snapshot=down))())
    assert _value(s, "tidewater_etcd_snapshot_ok") == 0
    assert _value(s, "tidewater_owner", capture="cap-1") == 1


def test_scrape_while_sorter_is_written() -> None:
    """A scrape reads counters the puller thread bumps: it never raises, and counters never go back."""
    sorter = MemorySpanSorter("a/0")
    view = _View("a", 0, SpanStats(), _Runner(sorter, Watermark(0, 0.0), Watermark(0, 0.0)))
    stop = threading.Event()

    def write() -> None:
        ts = 1
        while not stop.is_set():
            sorter.add(ts, ts, b"p")
            sorter.commit(ts, ts, 1.0)
            ts += 1

    th = threading.Thread(target=write)
    th.start()
    try:
        scrape = make_registry(_collector([view]))
        last = -1.0
        for _ in range(50):
            n = _value(_samples(scrape()), "tidewater_sorter_input_rows_total", changefeed="a")
            assert n >= last
            last = n
    finally:
        stop.set()
        th.join()
    assert last > 0
