"""Replication lag under a fixed offered rate.

A :class:`PacedWriter` thread inserts workload (a)'s rows in 100-row transactions at a fixed rate (the
transaction ``k`` is due at ``start + k * 100 / rate``; a writer that falls behind does not sleep, and the
achieved rate is reported). Meanwhile the lag is sampled every 100 ms:

* native logical replication: *apply lag*, now minus the commit time of the last upstream transaction the
  subscriber has applied (its replication origin's ``remote_lsn`` against the LSN the writer read inside
  each transaction).
* Tidewater into a SQL target: the same *apply lag*, from the exactly-once position the sink commits with
  the rows (``tidewater_checkpoint``, the lowest ``commit_ts`` of the changefeed's spans), read from the
  target on its own connection: directly comparable with native's.
* Tidewater, every sink: *checkpoint lag*, ``checkpoint_lag`` of ``GET /api/v2/changefeeds/{id}`` (now minus
  the upstream time of the changefeed checkpoint). What the API, the dashboard and the alerts show; its
  resolution is bounded by the server's ``checkpoint-interval`` and ``owner-tick`` (etcd round trips), so it
  trails the apply lag by up to about one owner tick.

Percentiles use the nearest-rank method over the samples taken while the writer ran.
"""

from __future__ import annotations

import bisect
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

SAMPLE_INTERVAL = 0.1


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


def apply_lag(writer: PacedWriter, applied_lsn: int, now: float, caught_up_at: float) -> float | None:
    """Now minus the commit time of the last of ``writer``'s transactions at or below ``applied_lsn`` (the time
    the writing started when none is); None before the first commit."""
    commits = list(writer.commits)  # appended by the writer thread; a copy is consistent enough
    if not commits:
        return None
    i = bisect.bisect_right([c[0] for c in commits], applied_lsn) - 1
    return now - (commits[i][1] if i >= 0 else caught_up_at)


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
    applies: list[float] = []
    try:
        feed.resume()
        conn = feed.upstream.connect(feed.db)
        try:
            feed.wait(current_lsn(conn), timeout)
        finally:
            conn.close()
        cpu0 = tree_cpu_seconds(capture_pid)  # (all the capture's processes)
        caught_up_at = time.time()
        writer.start()
        while writer.is_alive():
            t = time.monotonic()
            if applied is not None:
                lsn = applied()
                lag = apply_lag(writer, lsn, time.time(), caught_up_at) if lsn is not None else None
                if lag is not None:
                    applies.append(lag)
            info: dict[str, Any] = feed.cdc.get(f"/api/v2/changefeeds/{feed.cf_id}", timeout=5)
            if info.get("checkpoint_lag") is not None:
                lags.append(float(info["checkpoint_lag"]))
            time.sleep(max(0.0, SAMPLE_INTERVAL - (time.monotonic() - t)))
        writer.join()
        cpu1 = tree_cpu_seconds(capture_pid)
        if writer.error is not None:
            raise writer.error
        if cpu0 is not None and cpu1 is not None and writer.elapsed:
            res.cpu_pct = 100 * (cpu1 - cpu0) / writer.elapsed
        feed.wait(writer.end_lsn, timeout)
        _summarise(res, lags, writer)
        res.apply_p50, res.apply_p99 = percentile(applies, 50), percentile(applies, 99)
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
    lags: list[float] = []
    try:
        sub.enable()
        conn = sub.upstream.connect(sub.up_db)
        try:
            sub.wait(current_lsn(conn), timeout)
        finally:
            conn.close()
        caught_up_at = time.time()
        writer.start()
        while writer.is_alive():
            t = time.monotonic()
            lag = apply_lag(writer, sub.applied_lsn(), time.time(), caught_up_at)
            if lag is not None:
                lags.append(lag)
            time.sleep(max(0.0, SAMPLE_INTERVAL - (time.monotonic() - t)))
        writer.join()
        if writer.error is not None:
            raise writer.error
        sub.wait(writer.end_lsn, timeout)
        _summarise(res, lags, writer)
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
