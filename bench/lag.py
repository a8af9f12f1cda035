"""Replication lag under a fixed offered rate.

A :class:`PacedWriter` thread inserts workload (a)'s rows in 100-row transactions at a fixed rate (the
transaction ``k`` is due at ``start + k * 100 / rate``; a writer that falls behind does not sleep, and the
achieved rate is reported). Meanwhile the lag is sampled every 100 ms:

* Tidewater: ``checkpoint_lag`` of ``GET /api/v2/changefeeds/{id}`` (seconds; now minus the upstream time
  of the changefeed checkpoint). Its resolution is bounded by the server's ``checkpoint-interval`` and
  ``owner-tick``, which is part of what a user sees.
* native logical replication: the same definition computed by the benchmark: now minus the commit time
  of the last upstream transaction the subscriber has applied (its replication origin's ``remote_lsn``
  against the LSN the writer read inside each transaction).

Percentiles use the nearest-rank method over the samples taken while the writer ran.
"""

from __future__ import annotations

import bisect
import math
import threading
import time
from dataclasses import dataclass
from typing import Any

from bench.consumers import NativeSubscription, TidewaterFeed
from bench.procstat import cpu_seconds
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
    p50: float | None = None
    p99: float | None = None
    max: float | None = None
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


def _summarise(res: LagResult, lags: list[float], writer: PacedWriter) -> LagResult:
    res.samples = len(lags)
    res.p50, res.p99 = percentile(lags, 50), percentile(lags, 99)
    res.max = max(lags) if lags else None
    res.seconds = writer.elapsed
    res.achieved = writer.rows / writer.elapsed if writer.elapsed else 0.0
    return res


def lag_tidewater(feed: TidewaterFeed, capture_pid: int, table: str, first_id: int, rate: int, seconds: float,
                  timeout: float) -> tuple[LagResult, int]:
    """Resume ``feed``, wait until it is caught up, write at ``rate`` for ``seconds`` while sampling its
    checkpoint lag, wait until it has caught up with the writes, pause it. Returns the result and the next
    free id."""
    res = LagResult("tidewater", feed.sink, rate)
    writer = PacedWriter(feed.upstream, feed.db, table, first_id, rate, seconds)
    lags: list[float] = []
    try:
        feed.resume()
        conn = feed.upstream.connect(feed.db)
        try:
            feed.wait(current_lsn(conn), timeout)
        finally:
            conn.close()
        cpu0 = cpu_seconds(capture_pid)
        writer.start()
        while writer.is_alive():
            t = time.monotonic()
            info: dict[str, Any] = feed.cdc.get(f"/api/v2/changefeeds/{feed.cf_id}", timeout=5)
            if info.get("checkpoint_lag") is not None:
                lags.append(float(info["checkpoint_lag"]))
            time.sleep(max(0.0, SAMPLE_INTERVAL - (time.monotonic() - t)))
        writer.join()
        cpu1 = cpu_seconds(capture_pid)
        if writer.error is not None:
            raise writer.error
        if cpu0 is not None and cpu1 is not None and writer.elapsed:
            res.cpu_pct = 100 * (cpu1 - cpu0) / writer.elapsed
        feed.wait(writer.end_lsn, timeout)
        _summarise(res, lags, writer)
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
            applied = sub.applied_lsn()
            now = time.time()
            commits = list(writer.commits)  # appended by the writer thread; a copy is consistent enough
            i = bisect.bisect_right([c[0] for c in commits], applied) - 1
            if commits:
                lags.append(now - (commits[i][1] if i >= 0 else caught_up_at))
            time.sleep(max(0.0, SAMPLE_INTERVAL - (time.monotonic() - t)))
        writer.join()
        if writer.error is not None:
            raise writer.error
        sub.wait(writer.end_lsn, timeout)
        _summarise(res, lags, writer)
    except Exception as exc:  # noqa: BLE001
        res.error = f"{type(exc).__name__}: {exc}"
    finally:
        writer.join(timeout)
        try:
            sub.disable()
        except Exception as exc:  # noqa: BLE001
            res.error = res.error or f"disable failed: {exc}"
    return res, writer.next_id
