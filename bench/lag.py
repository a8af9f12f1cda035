"""Replication lag under a fixed offered rate.

A :class:`PacedWriter` thread inserts workload (a)'s rows in 100-row transactions at a fixed rate (the
transaction ``k`` is due at ``start + k * 100 / rate``; a writer that falls behind does not sleep, and the
achieved rate is reported). Meanwhile:

* *apply latency*, per transaction: the time a consumer was first seen holding the transaction minus the time
  its upstream COMMIT returned, the consumer's applied position polled every 5 ms on a connection of its own
  (:class:`ApplyLatencies`). Native logical replication: its replication origin's ``remote_lsn``; Tidewater
  into a SQL target: the exactly-once position the sink commits with the rows (``tidewater_checkpoint``, the
  lowest ``commit_ts`` of the changefeed's spans); both against the LSN the writer read inside each
  transaction, so the two figures are directly comparable. Per transaction, not "now minus the last applied
  commit" sampled every 100 ms: that sample is phase-locked to the writer's 100 ms cadence at 1,000 rows/s
  and read anywhere from the true latency to 100 ms more, whichever consumer it sampled.
* Tidewater, every sink: *checkpoint lag*, ``checkpoint_lag`` of ``GET /api/v2/changefeeds/{id}`` sampled every
  100 ms (now minus the upstream time of the changefeed checkpoint). What the API, the dashboard and the alerts
  show; its resolution is bounded by the server's ``checkpoint-interval`` and ``owner-tick`` (etcd round
  trips), so it trails the apply latency by up to about one owner tick.

Percentiles use the nearest-rank method over the samples taken while the writer ran.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bench.consumers import NativeSubscription, TidewaterFeed
from bench.procstat import tree_cpu_seconds
from bench.workloads import ROWS_PER_TXN, insert_sql
from cdc.ts import str_to_lsn
from playground.cluster import current_lsn
from playground.servers import PostgresServer

SAMPLE_INTERVAL = 0.1  # checkpoint-lag samples (the API)
POLL_INTERVAL = 0.005  # applied-position polls (apply latency)


@dataclass
class LagResult:
    consumer: str  # "tidewater" or "native"
    sink: str
    offered: int  # rows/s asked for
    achieved: float = 0.0  # rows/s written
    seconds: float = 0.0
    samples: int = 0
    p50: float | None = None  # checkpoint lag (Tidewater) / apply lag (native)
    p99: float | None = None
    max: float | None = None
    apply_p50: float | None = None  # apply lag (native's definition; Tidewater into SQL targets only)
    apply_p99: float | None = None
    cpu_pct: float | None = None  # capture CPU while the writer ran, % of one core
    error: str = ""


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (``q`` in 0..100) of ``values``; None when empty."""
    if not values:
        return None
    s = sorted(values)
    return s[max(0, math.ceil(q / 100 * len(s)) - 1)]


class PacedWriter(threading.Thread):
    """Inserts rows ``first_id..`` into ``table`` at ``rate`` rows/s for ``seconds``; records, per
    transaction, the WAL insert position before its COMMIT and the wall time after it."""

    def __init__(self, server: PostgresServer, db: str, table: str, first_id: int, rate: int, seconds: float) -> None:
        super().__init__(name=f"paced-writer-{rate}", daemon=True)
        self.server, self.db, self.table = server, db, table
        self.first_id, self.rate, self.seconds = first_id, rate, seconds
        self.commits: list[tuple[int, float]] = []  # (lsn before COMMIT, time.time() after COMMIT)
        self.rows = 0
        self.elapsed = 0.0
        self.started_at = 0.0
        self.end_lsn = 0
        self.error: BaseException | None = None

    @property
    def next_id(self) -> int:
        return self.first_id + self.rows

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # noqa: BLE001 - re-raised by the caller
            self.error = exc

    def _run(self) -> None:
        conn = self.server.connect(self.db)
        try:
            conn.autocommit = False
            sql = insert_sql(self.table) + "; SELECT pg_current_wal_insert_lsn()::text"
            per_txn = self.seconds * self.rate
            txns = max(1, int(per_txn // ROWS_PER_TXN))
            interval = ROWS_PER_TXN / self.rate
            self.started_at = time.time()
            t0 = time.monotonic()
            with conn.cursor() as cur:
                for k in range(txns):
                    delay = t0 + k * interval - time.monotonic()
                    if delay > 0:
                        time.sleep(delay)
                    lo = self.next_id
                    cur.execute(sql, (lo, lo + ROWS_PER_TXN - 1))
                    lsn = str_to_lsn(cur.fetchone()[0])
                    conn.commit()
                    self.commits.append((lsn, time.time()))
                    self.rows += ROWS_PER_TXN
            self.elapsed = time.monotonic() - t0
            conn.autocommit = True
            self.end_lsn = current_lsn(conn)
        finally:
            conn.close()


class ApplyLatencies:
    """Per-transaction apply latency of one consumer against a :class:`PacedWriter`: each transaction's latency
    is the time of the first :meth:`observe` whose applied position covers its LSN minus the time its COMMIT
    returned upstream (never negative; resolution: the caller's poll interval)."""

    def __init__(self, writer: PacedWriter) -> None:
        self.writer = writer
        self.values: list[float] = []
        self._next = 0  # the first of the writer's transactions not seen applied yet

    def observe(self, applied_lsn: int | None, now: float) -> None:
        """The consumer holds everything up to ``applied_lsn`` (None: not known yet) at ``now``."""
        if applied_lsn is None:
            return
        commits = self.writer.commits  # appended by the writer thread after each COMMIT
        n = len(commits)
        while self._next < n and commits[self._next][0] <= applied_lsn:
            self.values.append(max(0.0, now - commits[self._next][1]))
            self._next += 1

    @property
    def complete(self) -> bool:
        """Every transaction the writer committed has been seen applied."""
        return self._next >= len(self.writer.commits)


def _poll(writer: PacedWriter, latencies: ApplyLatencies, applied: Callable[[], int | None] | None,
          sample: Callable[[], None], on_end: Callable[[], None], timeout: float) -> None:
    """While ``writer`` runs: poll ``applied`` every :data:`POLL_INTERVAL` into ``latencies`` and call ``sample``
    every :data:`SAMPLE_INTERVAL`; ``on_end`` once the writer has stopped; then go on polling until every written
    transaction was seen applied (or ``timeout``)."""
    next_sample = 0.0
    deadline: float | None = None
    while True:
        t = time.monotonic()
        alive = writer.is_alive()
        if not alive and deadline is None:
            on_end()
            deadline = t + timeout
        if applied is not None:
            latencies.observe(applied(), time.time())
        if alive and t >= next_sample:
            sample()
            next_sample = t + SAMPLE_INTERVAL
        if not alive and (applied is None or latencies.complete or t > deadline):
            return
        step = POLL_INTERVAL if applied is not None else SAMPLE_INTERVAL
        time.sleep(max(0.0, step - (time.monotonic() - t)))


def _summarise(res: LagResult, lags: list[float], writer: PacedWriter) -> LagResult:
    res.samples = len(lags)
    res.p50, res.p99 = percentile(lags, 50), percentile(lags, 99)
    res.max = max(lags) if lags else None
    res.seconds = writer.elapsed
    res.achieved = writer.rows / writer.elapsed if writer.elapsed else 0.0
    return res


def lag_tidewater(feed: TidewaterFeed, capture_pid: int, table: str, first_id: int, rate: int, seconds: float,
                  timeout: float, applied: Callable[[], int | None] | None = None) -> tuple[LagResult, int]:
    """Resume ``feed``, wait until it is caught up, write at ``rate`` for ``seconds`` while sampling its
    checkpoint lag (and, given ``applied``, which returns the commit Ts the target holds, its apply lag), wait
    until it has caught up with the writes, pause it. Returns the result and the next free id."""
    res = LagResult("tidewater", feed.sink, rate)
    writer = PacedWriter(feed.upstream, feed.db, table, first_id, rate, seconds)
    lags: list[float] = []
    latencies = ApplyLatencies(writer)
    cpu: list[float | None] = []

    def sample() -> None:
        info: dict[str, Any] = feed.cdc.get(f"/api/v2/changefeeds/{feed.cf_id}", timeout=5)
        if info.get("checkpoint_lag") is not None:
            lags.append(float(info["checkpoint_lag"]))

    try:
        feed.resume()
        conn = feed.upstream.connect(feed.db)
        try:
            feed.wait(current_lsn(conn), timeout)
        finally:
            conn.close()
        cpu.append(tree_cpu_seconds(capture_pid))  # (all the capture's processes)
        writer.start()
        _poll(writer, latencies, applied, sample, lambda: cpu.append(tree_cpu_seconds(capture_pid)), timeout)
        writer.join()
        if writer.error is not None:
            raise writer.error
        cpu0, cpu1 = cpu[0], cpu[-1]
        if cpu0 is not None and cpu1 is not None and writer.elapsed:
            res.cpu_pct = 100 * (cpu1 - cpu0) / writer.elapsed
        feed.wait(writer.end_lsn, timeout)
        _summarise(res, lags, writer)
        res.apply_p50, res.apply_p99 = percentile(latencies.values, 50), percentile(latencies.values, 99)
    except Exception as exc:  # noqa: BLE001 - reported in the table
        res.error = f"{type(exc).__name__}: {exc}"
    finally:
        writer.join(timeout)
        try:
            feed.pause()
        except Exception as exc:  # noqa: BLE001
            res.error = res.error or f"pause failed: {exc}"
    return res, writer.next_id


def lag_native(sub: NativeSubscription, table: str, first_id: int, rate: int, seconds: float,
               timeout: float) -> tuple[LagResult, int]:
    """The same offered load with the native subscription enabled; lag computed from what it applied."""
    res = LagResult("native", "postgresql", rate)
    writer = PacedWriter(sub.upstream, sub.up_db, table, first_id, rate, seconds)
    latencies = ApplyLatencies(writer)
    try:
        sub.enable()
        conn = sub.upstream.connect(sub.up_db)
        try:
            sub.wait(current_lsn(conn), timeout)
        finally:
            conn.close()
        writer.start()
        _poll(writer, latencies, sub.applied_lsn, lambda: None, lambda: None, timeout)
        writer.join()
        if writer.error is not None:
            raise writer.error
        sub.wait(writer.end_lsn, timeout)
        _summarise(res, latencies.values, writer)
        res.apply_p50, res.apply_p99 = res.p50, res.p99
    except Exception as exc:  # noqa: BLE001
        res.error = f"{type(exc).__name__}: {exc}"
    finally:
        writer.join(timeout)
        try:
            sub.disable()
        except Exception as exc:  # noqa: BLE001
            res.error = res.error or f"disable failed: {exc}"
    return res, writer.next_id
