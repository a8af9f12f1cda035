"""Plain counters the data and control paths keep for ``capture.metrics`` (metrics as observers).

Nothing here imports Prometheus: the code that does the work bumps integers and observes durations at
*batch* granularity (one call per sink write, per transaction, per etcd request, never per row), and the
capture's collector turns these objects into ``tidewater_*`` families at scrape time.

Thread-safety: every object has one writer thread at a time (the span's sink thread, the processor
thread, the etcd caller under ``EtcdStats``' lock); the collector reads without locking. Python's int
and list-item assignments are atomic, so a scrape may see a batch half-counted (rows before bytes), never
a corrupted value.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass, field

# Sink write (one downstream transaction) latency, seconds: from a ms-sized SQLite batch to a stuck target.
LATENCY_BUCKETS: tuple[float, ...] = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                                      10.0, 30.0)
# Rows per sink write (bounded by the changefeed's sink.txn-rows, except one huge transaction).
BATCH_ROW_BUCKETS: tuple[float, ...] = (1, 10, 100, 500, 1000, 5000, 20000, 100000)
# etcd requests: sub-ms locally, seconds when an endpoint fails over.
ETCD_BUCKETS: tuple[float, ...] = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 3.0, 10.0)


class Histogram:
    """Cumulative-bucket histogram in the Prometheus sense: ``counts[i]`` = observations <= ``buckets[i]``
    is computed at read time from per-bucket counts (``observe`` touches one slot)."""

    __slots__ = ("buckets", "_counts", "sum", "count")

    def __init__(self, buckets: Sequence[float]) -> None:
        if list(buckets) != sorted(set(buckets)) or not buckets:
            raise ValueError("buckets must be strictly increasing and non-empty")
        self.buckets = tuple(float(b) for b in buckets)
        self._counts = [0] * (len(self.buckets) + 1)  # last slot: above every bucket (+Inf only)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self._counts[bisect_left(self.buckets, value)] += 1
        self.sum += value
        self.count += 1

    def cumulative(self) -> list[tuple[str, int]]:
        """``[(le, count)]`` including ``+Inf`` (the Prometheus exposition's buckets)."""
        out: list[tuple[str, int]] = []
        acc = 0
        for b, c in zip(self.buckets, self._counts, strict=False):
            acc += c
            out.append((_le(b), acc))
        out.append(("+Inf", acc + self._counts[-1]))
        return out


def _le(b: float) -> str:
    return str(int(b)) + ".0" if b == int(b) else repr(b)


@dataclass
class SpanStats:
    """Cumulative figures of one span on this capture, kept across restarts of the span's runner (they
    reset only when the span leaves this capture; Prometheus' ``rate`` handles that)."""

    sorter_out_rows: int = 0  # rows the sink thread read from the sorter (whole transactions)
    sorter_out_bytes: int = 0
    sink_rows: int = 0  # rows written downstream (committed)
    sink_bytes: int = 0
    sink_txns: int = 0  # upstream transactions written downstream
    sink_write_seconds: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS))
    sink_batch_rows: Histogram = field(default_factory=lambda: Histogram(BATCH_ROW_BUCKETS))
    restarts: int = 0  # runner restarts after a failure
    consecutive_failures: int = 0
    restart_at: float = 0.0  # wall time of the next restart while backing off, else 0
    errors: dict[tuple[str, str], int] = field(default_factory=dict)  # (stage, error code) -> count

    def failed(self, stage: str, code: str, restart_at: float, consecutive: int) -> None:
        self.errors[(stage, code)] = self.errors.get((stage, code), 0) + 1
        self.restart_at = restart_at
        self.consecutive_failures = consecutive

    def started(self, after_failure: bool) -> None:
        if after_failure:
            self.restarts += 1
        self.restart_at = 0.0


class EtcdStats:
    """etcd requests of one client (one per capture): latency by operation, failures by operation and
    gRPC code, lease refreshes by result."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.latency: dict[str, Histogram] = {}
        self.errors: dict[tuple[str, str], int] = {}
        self.lease_refreshes: dict[str, int] = {"ok": 0, "error": 0}

    def observe(self, op: str, seconds: float, error_code: str | None = None) -> None:
        with self._lock:
            h = self.latency.get(op)
            if h is None:
                h = self.latency[op] = Histogram(ETCD_BUCKETS)
            h.observe(seconds)
            if error_code is not None:
                self.errors[(op, error_code)] = self.errors.get((op, error_code), 0) + 1

    def lease_refresh(self, ok: bool) -> None:
        with self._lock:
            self.lease_refreshes["ok" if ok else "error"] += 1


class RequestStats:
    """HTTP API requests by method, route template (never the raw path: ids would make unbounded label
    values) and status code."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: dict[tuple[str, str, str], int] = {}
        self.latency: dict[tuple[str, str], Histogram] = {}

    def observe(self, method: str, route: str, code: int, seconds: float) -> None:
        with self._lock:
            key = (method, route, str(code))
            self.requests[key] = self.requests.get(key, 0) + 1
            h = self.latency.get((method, route))
            if h is None:
                h = self.latency[(method, route)] = Histogram(LATENCY_BUCKETS)
            h.observe(seconds)
