"""Workload ``verify``: ``changefeed verify`` (issue 24 item 7) next to the read ceiling measured in the same run.

The upstream database ``bench_verify`` is preloaded with ``rows`` rows of about 100 bytes (workload (a)'s
``sbtest`` table: bigint key, int, 60 + 20 characters, timestamp) in one table and vacuumed. Then, per SQL sink
(PostgreSQL, MariaDB; the others are not measured):

* the changefeed is created with the initial copy (untimed) and waited for until it streams;
* **the read ceiling**: a plain scan of both sides, one after the other, that reads every row and hashes it:
  ``SELECT count(*), max(md5(row))`` upstream (``t::text``) and in the target (``CONCAT_WS`` of the columns on
  MariaDB), on the same servers, with nothing else running; rows/s = rows / (upstream seconds + target seconds);
* **verify**: while a writer inserts ``write_rate`` rows/s upstream in 100-row transactions (the changefeed keeps
  replicating them), ``POST /api/v2/changefeeds/{id}/verify`` and poll the run until it is done, as the CLI does
  (the job: Spark, the hold, checksums, drill-down; docs/verify.md). Figures: the wall seconds from the request
  to the report (the job's process and Spark's start included) and the job's own ``seconds``; rows/s = rows
  compared (upstream rows of the report: the preloaded rows, those of the writer so far) / wall seconds; the hold's ``hold_seconds`` from the report; the
  changefeed's ``checkpoint_lag`` sampled from the API every 100 ms before the request (baseline: its max over
  the 3 s before) and while the job runs (its max): the replication lag the hold caused. The report must say
  equal (exit 0), else the run is an error.

Not thread-safe; one :class:`VerifyBench` per run.
"""

from __future__ import annotations

import contextlib
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bench.consumers import Rated
from bench.env import BenchEnv
from bench.snapshot import changefeed_config
from bench.workloads import ROWS_PER_TXN, insert_sql, sbtest_ddl
from playground.cluster import ApiError

Say = Callable[[str], None]

KEY = "verify"  # upstream database bench_verify, target databases tw_verify
UPSTREAM_DB = "bench_verify"
TABLE = "sbtest1"
SINKS = ("postgresql", "mariadb")
LOAD_ROWS_PER_STATEMENT = 500_000
BASELINE_SECONDS = 3.0
LAG_SAMPLE = 0.1


@dataclass
class ScanRun(Rated):
    """The read ceiling of one sink: both sides scanned and hashed, one after the other."""

    rows: int
    seconds: float = 0.0
    error: str = ""
    upstream_s: float = 0.0
    target_s: float = 0.0


@dataclass
class VerifyRunResult(Rated):
    """One ``changefeed verify`` of the preloaded table under the writer (``rows``: rows compared, ``seconds``:
    request -> report)."""

    rows: int
    seconds: float = 0.0
    error: str = ""
    sink: str = ""
    job_seconds: float = 0.0  # the job's own (report ``seconds``)
    hold_seconds: float | None = None
    lag_before_max: float | None = None  # checkpoint lag, max over the BASELINE_SECONDS before the request
    lag_during_max: float | None = None  # max while the job ran
    lag_samples: int = 0
    write_rate: float = 0.0  # rows/s the writer achieved during the job
    chunks: int = 0
    verdict: str = ""
    ceiling: ScanRun | None = None


@dataclass
class VerifyReport:
    rows: int
    chunk_rows: int
    write_rate: int
    load_seconds: float = 0.0
    runs: list[VerifyRunResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


class _Writer(threading.Thread):
    """Inserts rows ``first_id..`` at ``rate`` rows/s in 100-row transactions until :meth:`stop`."""

    def __init__(self, env: BenchEnv, first_id: int, rate: int) -> None:
        super().__init__(name="verify-bench-writer", daemon=True)
        self.env, self.next_id, self.rate = env, first_id, rate
        self.rows = 0
        self.error: BaseException | None = None
        self._halt = threading.Event()

    def stop(self) -> None:
        self._halt.set()
        self.join(60)
        if self.error is not None:
            raise self.error

    def run(self) -> None:
        assert self.env.upstream is not None
        try:
            conn = self.env.upstream.connect(UPSTREAM_DB)
            try:
                conn.autocommit = True
                interval = ROWS_PER_TXN / self.rate
                t0 = time.monotonic()
                k = 0
                with conn.cursor() as cur:
                    while not self._halt.is_set():
                        delay = t0 + k * interval - time.monotonic()
                        if delay > 0 and self._halt.wait(delay):
                            break
                        cur.execute(insert_sql(TABLE), (self.next_id, self.next_id + ROWS_PER_TXN - 1))
                        self.next_id += ROWS_PER_TXN
                        self.rows += ROWS_PER_TXN
                        k += 1
            finally:
                conn.close()
        except BaseException as exc:  # noqa: BLE001 - re-raised by stop()
            self.error = exc


class VerifyBench:
    def __init__(self, env: BenchEnv, say: Say, *, rows: int, sinks: list[str], timeout: float,
                 cf_config: str = "", chunk_rows: int | None = None, spark_master: str | None = None,
                 write_rate: int = 1000) -> None:
        self.env, self.say = env, say
        self.rows, self.timeout = rows, timeout
        self.sinks = [s for s in SINKS if s in sinks]
        self.skipped = [s for s in sinks if s not in SINKS]
        self.chunk_rows = chunk_rows or max(10_000, rows // 64)
        self.config = changefeed_config(cf_config, None, spark_master)
        self.write_rate = write_rate

    @property
    def up(self) -> Any:
        assert self.env.upstream is not None
        return self.env.upstream

    @property
    def cdc(self) -> Any:
        assert self.env.cdc is not None
        return self.env.cdc

    def preload(self) -> float:
        self.up.drop_database(UPSTREAM_DB)
        self.up.create_database(UPSTREAM_DB)
        t0 = time.monotonic()
        conn = self.up.connect(UPSTREAM_DB)
        try:
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute(sbtest_ddl(TABLE))
                for lo in range(1, self.rows + 1, LOAD_ROWS_PER_STATEMENT):
                    cur.execute(insert_sql(TABLE), (lo, min(lo + LOAD_ROWS_PER_STATEMENT - 1, self.rows)))
                cur.execute(f"VACUUM (ANALYZE) {TABLE}")
        finally:
            conn.close()
        return time.monotonic() - t0

    # ---- the read ceiling -----------------------------------------------------------------------------
    def _scan(self, conn: Any, sql: str) -> tuple[float, int]:
        t0 = time.monotonic()
        with contextlib.closing(conn.cursor()) as cur:
            cur.execute(sql)
            count = int(cur.fetchone()[0])
        return time.monotonic() - t0, count

    def ceiling(self, sink: str) -> ScanRun:
        run = ScanRun(self.rows)
        try:
            up = self.up.connect(UPSTREAM_DB)
            try:
                run.upstream_s, up_rows = self._scan(up, f"SELECT count(*), max(md5(t::text)) FROM {TABLE} t")
            finally:
                up.close()
            target = self.env.target_connection(sink, KEY)
            try:
                sql = (f"SELECT count(*), max(md5(t::text)) FROM public.{TABLE} t" if sink == "postgresql" else
                       f"SELECT count(*), max(md5(CONCAT_WS('|', id, k, c, pad, ts))) FROM {TABLE}")
                run.target_s, down_rows = self._scan(target, sql)
            finally:
                target.close()
            run.rows = up_rows
            run.seconds = run.upstream_s + run.target_s
            if up_rows != down_rows:
                run.error = f"upstream {up_rows} rows, target {down_rows}"
        except Exception as exc:  # noqa: BLE001 - reported in the table
            run.error = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
        return run

    # ---- one sink ---------------------------------------------------------------------------------------
    def _lag(self, cf: str) -> float | None:
        info = self.cdc.get(f"/api/v2/changefeeds/{cf}", timeout=5)
        lag = info.get("checkpoint_lag")
        return float(lag) if lag is not None else None

    def _next_id(self) -> int:
        """The first id the writer may insert (a sink measured before left the writer's rows upstream)."""
        return int(self.up.execute(f"SELECT coalesce(max(id), 0) + 1 FROM {TABLE}", db=UPSTREAM_DB)[0][0])

    def _wait_streaming(self, cf: str) -> None:
        deadline = time.monotonic() + self.timeout
        while True:
            info = self.cdc.changefeed(cf)
            if info["phase"] == "streaming":
                return
            if info["state"] == "failed":
                raise RuntimeError(f"changefeed failed while copying: {info.get('error')}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"still copying after {self.timeout:.0f}s")
            time.sleep(0.5)

    def run_sink(self, sink: str) -> VerifyRunResult:
        res = VerifyRunResult(0, sink=sink)
        cf = f"bench-verify-{sink}"
        self.env.prepare_target(sink, KEY)
        created = False
        writer: _Writer | None = None
        try:
            self.say(f"[verify] {sink}: changefeed create with the initial copy of {self.rows} rows (untimed)")
            self.cdc.request("POST", "/api/v2/changefeeds", {
                "changefeed_id": cf, "upstream_uri": self.up.uri(UPSTREAM_DB),
                "sink_uri": self.env.sink_uri(sink, KEY), "config": self.config, "snapshot": "initial"},
                timeout=self.timeout)
            created = True
            self._wait_streaming(cf)
            self.say(f"[verify] {sink}: read ceiling (count(*) + md5 of every row, upstream then target)")
            res.ceiling = self.ceiling(sink)
            writer = _Writer(self.env, self._next_id(), self.write_rate)
            writer.start()
            before: list[float] = []
            t_end = time.monotonic() + BASELINE_SECONDS
            while time.monotonic() < t_end:
                lag = self._lag(cf)
                if lag is not None:
                    before.append(lag)
                time.sleep(LAG_SAMPLE)
            self.say(f"[verify] {sink}: changefeed verify under {self.write_rate} rows/s of inserts")
            written0 = writer.rows
            t0 = time.monotonic()
            run = self.cdc.request("POST", f"/api/v2/changefeeds/{cf}/verify", {"chunk_rows": self.chunk_rows})
            during: list[float] = []
            while run.get("state") == "running":
                if time.monotonic() - t0 > self.timeout:
                    raise TimeoutError(f"verify still running after {self.timeout:.0f}s")
                lag = self._lag(cf)
                if lag is not None:
                    during.append(lag)
                time.sleep(LAG_SAMPLE)
                run = self.cdc.get(f"/api/v2/changefeeds/{cf}/verify/{run['id']}")
            res.seconds = time.monotonic() - t0
            res.write_rate = (writer.rows - written0) / res.seconds if res.seconds else 0.0
            writer.stop()
            writer = None
            report = run.get("report") or {}
            tables = report.get("tables") or []
            res.rows = sum(int(t.get("source_rows") or 0) for t in tables)
            res.chunks = sum(int(t.get("chunks") or 0) for t in tables)
            res.job_seconds = float(report.get("seconds") or 0.0)
            res.hold_seconds = report.get("hold_seconds")
            res.lag_before_max = max(before) if before else None
            res.lag_during_max = max(during) if during else None
            res.lag_samples = len(during)
            if run.get("state") != "done" or report.get("error"):
                res.error = f"verify {run.get('state')}: {report.get('error') or run.get('error')}"[:300]
            elif any(t.get(k) for t in tables for k in ("missing", "extra", "different", "inexact", "note")):
                res.error = "verify found differences: " + "; ".join(
                    f"{t['table']}: missing {t.get('missing')} extra {t.get('extra')} different "
                    f"{t.get('different')} {t.get('note') or ''}" for t in tables)[:300]
            else:
                res.verdict = "equal"
        except Exception as exc:  # noqa: BLE001 - reported in the table, the other sink still runs
            res.error = res.error or " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
        finally:
            if writer is not None:
                with contextlib.suppress(BaseException):
                    writer.stop()
            if created:
                self._remove(cf)
            self.env.drop_target(sink, KEY)
        return res

    def _remove(self, cf: str) -> None:
        with contextlib.suppress(ApiError, OSError):
            self.cdc.request("DELETE", f"/api/v2/changefeeds/{cf}")
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    self.cdc.changefeed(cf)
                except ApiError:
                    return
                time.sleep(0.2)

    def run(self) -> VerifyReport:
        report = VerifyReport(self.rows, self.chunk_rows, self.write_rate)
        if self.skipped:
            report.notes.append(f"verify: not measured for {', '.join(self.skipped)} (the workload measures "
                                f"{' and '.join(SINKS)} targets)")
        try:
            report.load_seconds = self.preload()
            self.say(f"[verify] {self.rows} rows loaded upstream in {report.load_seconds:.1f}s")
            for sink in self.sinks:
                res = self.run_sink(sink)
                report.runs.append(res)
                self.say(f"[verify]   {sink}: " + (f"ERROR {res.error}" if res.error else
                                                    f"{res.seconds:.1f}s, {res.rows_per_s:.0f} rows/s, hold "
                                                    f"{res.hold_seconds}s, lag max {res.lag_during_max}s"))
        except Exception as exc:  # noqa: BLE001 - reported; the other workloads still run
            report.errors.append(f"verify: {type(exc).__name__}: {exc}")
            self.say(f"[verify] FAILED: {traceback.format_exc()}")
        finally:
            with contextlib.suppress(Exception):
                self.up.drop_database(UPSTREAM_DB)
        return report


# ---- report ---------------------------------------------------------------------------------------------
COLUMNS = ("sink", "rows compared", "chunks", "verify s (request -> report)", "job s", "verify rows/s",
           "read ceiling rows/s (upstream s + target s)", "verify/ceiling", "hold s", "checkpoint lag max before s",
           "checkpoint lag max during s", "writer rows/s", "verdict")


def _num(x: float | None, digits: int = 0) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def format_verify(rep: VerifyReport) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in rep.runs:
        c = r.ceiling
        ceiling = c.rows_per_s if c is not None else None
        rate = r.rows_per_s
        ratio = "-"
        if rate and ceiling:
            ratio = f"{rate / ceiling:.2f}" if rate / ceiling >= 0.1 else f"{rate / ceiling:.3g}"
        ceil_text = (f"{ceiling:.0f} ({c.upstream_s:.1f} + {c.target_s:.1f})" if c is not None and ceiling
                     else (c.error[:60] if c is not None and c.error else "-"))
        lines.append("| " + " | ".join([
            r.sink, str(r.rows), str(r.chunks), _num(r.seconds if r.ok else None, 1), _num(r.job_seconds, 1),
            _num(rate), ceil_text, ratio, _num(r.hold_seconds, 2), _num(r.lag_before_max, 2),
            _num(r.lag_during_max, 2), _num(r.write_rate),
            " ".join(r.error.split())[:100].replace("|", "/") if r.error else r.verdict]) + " |")
    out = ["## changefeed verify (POST .../verify -> report, under a writer; read ceiling: count(*) + md5 of every "
           "row, both sides)", "", "\n".join(lines), "",
           f"- {rep.rows} rows (~100 bytes, one table) loaded upstream in {rep.load_seconds:.1f}s; chunks of "
           f"{rep.chunk_rows} rows; the writer offered {rep.write_rate} rows/s of inserts in 100-row transactions "
           "during the verification. verify s includes the job's process and Spark starting; lag = the API's "
           "checkpoint_lag sampled every 100 ms."]
    out += [f"- {n}" for n in rep.notes]
    out += [f"- ERROR {e}" for e in rep.errors]
    return "\n".join(out) + "\n"


def complete(rep: VerifyReport) -> bool:
    return not rep.errors and all(r.ok and r.verdict == "equal" and r.ceiling is not None and r.ceiling.ok
                                  for r in rep.runs)
