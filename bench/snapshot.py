"""Workload ``snapshot``: the initial copy of existing rows (issue 10), next to references measured in the same run.

The upstream database ``bench_snap`` is preloaded with ``rows`` rows of about 100 bytes (workload (a)'s
``sbtest`` table: bigint key, int, 60 + 20 characters, timestamp) spread over ``tables`` tables, then vacuumed
(so every reader finds hint bits and the visibility map set). Then, one after the other:

* **references** (PostgreSQL -> PostgreSQL, into databases of the ``postgresql://`` target server):
  ``pg_dump --data-only | psql`` into the same tables created beforehand (untimed), i.e. into tables that have
  their primary key while the rows arrive, as the copy's tables do; and ``pg_dump | psql`` (schema and data,
  the key built after the load), the usual way to copy a database;
* **Tidewater, per sink** (PostgreSQL first, right after its references): ``changefeed create`` with ``[snapshot] mode = "initial"`` (and ``spark-min-rows = 0``:
  the copy always runs in the Spark job, the path being measured) into an empty target; the time runs from the
  create request until the changefeed's ``phase`` is ``streaming`` (every span stored its copy as done; the
  API's view of :func:`cdc.model.still_copying`); the rows are then verified (count and column sums per table;
  row by row when there are at most ``compare_rows``); the changefeed is removed;
* **the write ceiling of that target**: the same rows (exported with ``COPY (SELECT ...) TO STDOUT`` beforehand)
  bulk loaded into empty copies of the tables the copy created (:mod:`bench.ceiling`: COPY FROM STDIN, LOAD DATA
  LOCAL INFILE, one ``executemany`` transaction).

For every run: wall seconds; the CPU of the client's process tree (the capture with the Spark job, its JVM and
Python workers; ``pg_dump`` and ``psql``; the loading benchmark process) and of the database servers (upstream
and target postmasters with their backends, the MariaDB server); the highest RSS sum of the client's process
tree, sampled every 200 ms. Not thread-safe; one :class:`SnapshotBench` per run.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bench.ceiling import export_rows, measure_ceiling
from bench.consumers import Rated
from bench.env import BenchEnv
from bench.procstat import TreeCpu, TreeSampler
from bench.workloads import SBTEST_COLUMNS, CeilingSource, insert_sql, sbtest_ddl
from playground.cluster import ApiError
from playground.compare import compare_tables, norm

Say = Callable[[str], None]

KEY = "snap"  # the scenario key: upstream database bench_snap, target databases tw_snap
UPSTREAM_DB = "bench_snap"
LOAD_ROWS_PER_STATEMENT = 500_000


@dataclass
class CopyRun(Rated):
    """One copy of the preloaded rows (Tidewater into one sink, a reference, or a write ceiling)."""

    kind: str  # tidewater | dump_data | dump | ceiling
    sink: str  # target kind
    what: str
    rows: int
    seconds: float = 0.0
    client_cpu_s: float | None = None
    server_cpu_s: float | None = None
    rss_peak: int | None = None  # highest sampled RSS sum of the client's process tree (bytes)
    procs: int | None = None  # most processes seen in that tree at once
    first_chunk_s: float | None = None  # Tidewater: create -> the first chunk recorded
    verified: str = ""
    note: str = ""
    error: str = ""


@dataclass
class SnapshotReport:
    rows: int
    tables: int
    load_seconds: float = 0.0
    config: str = ""
    runs: list[CopyRun] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def find(self, kind: str, sink: str = "") -> CopyRun | None:
        return next((r for r in self.runs if r.kind == kind and (not sink or r.sink == sink)), None)


def table_names(tables: int) -> list[str]:
    return [f"sbtest{i}" for i in range(1, tables + 1)]


def changefeed_config(base: str, chunk_rows: int | None, spark_master: str | None) -> str:
    """The changefeed TOML of the copy: ``base`` (the command's ``--changefeed-config``) plus a ``[snapshot]``
    table when it has none: mode initial, always the Spark job (spark-min-rows 0), the chunk size and master
    if given."""
    if "[snapshot]" in base:
        return base
    lines = ["[snapshot]", 'mode = "initial"', "spark-min-rows = 0"]
    if chunk_rows:
        lines.append(f"chunk-rows = {chunk_rows}")
    if spark_master:
        lines.append(f'spark-master = "{spark_master}"')
    return (base.rstrip() + "\n\n" if base.strip() else "") + "\n".join(lines) + "\n"


class SnapshotBench:
    def __init__(self, env: BenchEnv, say: Say, *, rows: int, tables: int, sinks: list[str], timeout: float,
                 work_dir: Any, cf_config: str = "", chunk_rows: int | None = None,
                 spark_master: str | None = None, compare_rows: int = 200_000) -> None:
        self.env, self.say = env, say
        self.rows, self.tables, self.sinks, self.timeout = rows, max(1, tables), sinks, timeout
        self.work_dir = work_dir
        self.config = changefeed_config(cf_config, chunk_rows, spark_master)
        self.compare_rows = compare_rows
        self.load_seconds = 0.0
        self.names = table_names(self.tables)

    # ---- helpers ------------------------------------------------------------------------------------
    @property
    def up(self) -> Any:
        assert self.env.upstream is not None
        return self.env.upstream

    def _server_pids(self, sink: str) -> list[int]:
        pids = [self.up.pid]
        if sink == "postgresql" and self.env.subscriber is not None:
            pids.append(self.env.subscriber.pid)
        if sink == "mariadb" and self.env.mariadb is not None:
            pids.append(self.env.mariadb.pid)
        return [p for p in pids if p is not None]

    def _server_cpu(self, sink: str) -> TreeCpu:
        """The CPU of the database servers ``sink``'s copy uses (upstream, and the target's server), from now."""
        return TreeCpu(self._server_pids(sink)).start()

    def _per_table_rows(self) -> list[int]:
        base, extra = divmod(self.rows, self.tables)
        return [base + (1 if i < extra else 0) for i in range(self.tables)]

    # ---- the upstream rows --------------------------------------------------------------------------
    def preload(self) -> None:
        self.up.drop_database(UPSTREAM_DB)
        self.up.create_database(UPSTREAM_DB)
        t0 = time.monotonic()
        conn = self.up.connect(UPSTREAM_DB)
        try:
            with conn.cursor() as cur:
                for name, n in zip(self.names, self._per_table_rows(), strict=True):
                    cur.execute(sbtest_ddl(name))
                    for lo in range(1, n + 1, LOAD_ROWS_PER_STATEMENT):
                        cur.execute(insert_sql(name), (lo, min(lo + LOAD_ROWS_PER_STATEMENT - 1, n)))
                for name in self.names:
                    cur.execute(f"VACUUM (ANALYZE) {name}")
        finally:
            conn.close()
        self.load_seconds = time.monotonic() - t0
        size = self.up.execute("SELECT pg_size_pretty(pg_database_size(current_database()))", db=UPSTREAM_DB)
        self.say(f"[snapshot] {self.rows} rows in {self.tables} tables loaded upstream in {self.load_seconds:.1f}s "
                 f"(database {size[0][0] if size else '?'})")

    def checksums(self, conn: Any, kind: str) -> dict[str, tuple[Any, ...]]:
        """Per table: count, sum(id), sum(k), total length of c and pad, min and max ts (normalised)."""
        length = "CHAR_LENGTH" if kind == "mariadb" else "LENGTH"
        out = {}
        for name in self.names:
            table = f"public.{name}" if kind == "postgresql" else name
            sql = (f"SELECT count(*), sum(id), sum(k), sum({length}(c)), sum({length}(pad)), min(ts), max(ts) "
                   f"FROM {table}")
            if kind == "sqlite":
                row = conn.execute(sql).fetchone()
            else:
                with conn.cursor() as cur:
                    cur.execute(sql)
                    row = cur.fetchone()
            out[name] = tuple(int(v) if v is not None and i < 5 else norm(v) for i, v in enumerate(row))
        return out

    def source_checksums(self) -> dict[str, tuple[Any, ...]]:
        conn = self.up.connect(UPSTREAM_DB)
        try:
            return self.checksums(conn, "postgresql")
        finally:
            conn.close()

    def verify(self, kind: str, connect: Callable[[], Any], uri: str | None, expected: dict[str, tuple[Any, ...]]
               ) -> str:
        """'count+sums' / 'row by row' when the target equals the source, else 'NO: ...'."""
        conn = connect()
        try:
            got = self.checksums(conn, kind)
        finally:
            conn.close()
        bad = [f"{t}: {got.get(t)} != {v}" for t, v in expected.items() if got.get(t) != v]
        if bad:
            return "NO: " + "; ".join(bad)[:500]
        if uri is None or self.rows > self.compare_rows:
            return "count+sums"
        src = self.up.connect(UPSTREAM_DB)
        try:
            diffs = compare_tables(src, [f"public.{n}" for n in self.names], uri)
        finally:
            src.close()
        unequal = [d for d in diffs if not d.equal or d.source_rows != d.target_rows]
        if unequal:
            return "NO: " + "; ".join(f"{d.table}: missing {d.missing[:3]} extra {d.extra[:3]} different "
                                      f"{d.different[:3]}" for d in unequal)[:500]
        return "row by row"

    # ---- references ---------------------------------------------------------------------------------
    def _pg_tool(self, name: str) -> str:
        return str(self.up.bin_dir / name)

    def _shell(self, cmd: str, run: CopyRun, sink: str = "postgresql") -> None:
        """Run ``cmd`` (bash, pipefail) timed, with its process tree's CPU (rusage of the reaped children) and
        sampled RSS, and the servers' CPU."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        servers = self._server_cpu(sink)
        t0 = time.monotonic()
        proc = subprocess.Popen(["bash", "-o", "pipefail", "-c", cmd], stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, env=env)
        sampler = TreeSampler(proc.pid).start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            peak = sampler.stop()
        run.seconds = time.monotonic() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
        if proc.stderr:
            proc.stderr.close()
        run.server_cpu_s = servers.stop()
        if proc.returncode != 0:
            raise RuntimeError(f"exit {proc.returncode}: {err[-1000:]}")
        run.client_cpu_s = usage.ru_utime + usage.ru_stime
        run.rss_peak, run.procs = peak.tree_rss_peak, peak.tree_procs

    def references(self, expected: dict[str, tuple[Any, ...]], report: SnapshotReport) -> None:
        sub = self.env.subscriber
        if sub is None:
            report.notes.append("no PostgreSQL target server: pg_dump | psql not measured")
            return
        up = self.up
        opts = f"-h 127.0.0.1 -p {up.port} -U postgres"
        sub_opts = f"-h 127.0.0.1 -p {sub.port} -U postgres -X -q -v ON_ERROR_STOP=1"
        tables = " ".join(f"-t public.{n}" for n in self.names)
        dump, psql = self._pg_tool("pg_dump"), self._pg_tool("psql")
        for kind, db, what in (("dump_data", "ref_dump_data", "pg_dump --data-only | psql (tables created before)"),
                               ("dump", "ref_dump", "pg_dump | psql (schema and data)")):
            run = CopyRun(kind, "postgresql", what, self.rows)
            sub.drop_database(db)
            sub.create_database(db)
            try:
                if kind == "dump_data":
                    subprocess.run(["bash", "-o", "pipefail", "-c",
                                    f"{dump} {opts} --schema-only {tables} {UPSTREAM_DB} | {psql} {sub_opts} -d {db}"],
                                   check=True, capture_output=True, timeout=600)
                    cmd = f"{dump} {opts} --data-only {tables} {UPSTREAM_DB} | {psql} {sub_opts} -d {db}"
                else:
                    cmd = f"{dump} {opts} {tables} {UPSTREAM_DB} | {psql} {sub_opts} -d {db}"
                self.say(f"[snapshot] {what}")
                self._shell(cmd, run)
                run.verified = self.verify("postgresql", lambda db=db: sub.connect(db), None, expected)
                self._said(run)
            except Exception as exc:  # noqa: BLE001 - reported in the table
                run.error = f"{type(exc).__name__}: {exc}"[:500]
                self.say(f"[snapshot]   ERROR {run.error}")
            finally:
                sub.drop_database(db)
            report.runs.append(run)

    # ---- Tidewater ----------------------------------------------------------------------------------
    def tidewater(self, sink: str, expected: dict[str, tuple[Any, ...]]) -> CopyRun:
        env = self.env
        assert env.cdc is not None
        cdc = env.cdc
        run = CopyRun("tidewater", sink, f"Tidewater -> {sink}", self.rows)
        cf = f"bench-snap-{sink}"
        env.prepare_target(sink, KEY)
        pid = env.capture_pid
        client, servers = TreeCpu([pid]).start(), self._server_cpu(sink)
        sampler = TreeSampler(pid).start()
        created = False
        try:
            t0 = time.monotonic()
            cdc.request("POST", "/api/v2/changefeeds", {
                "changefeed_id": cf, "upstream_uri": self.up.uri(UPSTREAM_DB), "sink_uri": env.sink_uri(sink, KEY),
                "config": self.config, "snapshot": "initial"}, timeout=self.timeout)
            created = True
            next_report = t0 + 30
            while True:
                info = cdc.changefeed(cf)
                copied = (info.get("snapshot") or {}).get("rows_copied") or 0
                now = time.monotonic()
                if copied and run.first_chunk_s is None:
                    run.first_chunk_s = now - t0
                if info["phase"] == "streaming":
                    run.seconds = now - t0
                    break
                if info["state"] == "failed" or (info["state"] == "warning" and info.get("error")):
                    raise RuntimeError(f"changefeed {info['state']}: {info.get('error')}")
                if now - t0 > self.timeout:
                    raise TimeoutError(f"still copying after {self.timeout:.0f}s ({copied} rows copied)")
                if now > next_report:
                    next_report += 30
                    self.say(f"[snapshot]   {cf}: {copied} of {self.rows} rows copied")
                time.sleep(0.25)
        except Exception as exc:  # noqa: BLE001 - reported in the table, the run goes on
            run.error = f"{type(exc).__name__}: {exc}"[:500]
        finally:
            run.client_cpu_s, run.server_cpu_s = client.stop(), servers.stop()
            peak = sampler.stop()
            run.rss_peak, run.procs = peak.tree_rss_peak, peak.tree_procs
        if created:
            self._remove(cf)
        if not run.error and sink != "blackhole":
            try:
                run.verified = self.verify(sink, lambda: env.target_connection(sink, KEY), env.sink_uri(sink, KEY),
                                           expected)
            except Exception as exc:  # noqa: BLE001
                run.verified = f"NO: {type(exc).__name__}: {exc}"[:500]
        elif not run.error:
            run.verified = "-"
        return run

    def _remove(self, cf: str) -> None:
        assert self.env.cdc is not None
        with contextlib.suppress(ApiError, OSError):
            self.env.cdc.request("DELETE", f"/api/v2/changefeeds/{cf}")
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    self.env.cdc.changefeed(cf)
                except ApiError:
                    return
                time.sleep(0.2)

    def ceiling(self, sink: str) -> CopyRun:
        run = CopyRun("ceiling", sink, f"write ceiling {sink}", self.rows)
        out_dir = self.work_dir / "ceiling" / KEY
        out_dir.mkdir(parents=True, exist_ok=True)
        try:
            exported = []
            for name in self.names:
                src = CeilingSource(name, SBTEST_COLUMNS)
                path = out_dir / f"{name}.tsv"
                exported.append((src, path, export_rows(self.up, UPSTREAM_DB, src, path)))
            servers = self._server_cpu(sink)
            m = measure_ceiling(self.env, sink, KEY, exported)
            run.server_cpu_s = servers.stop()
            run.seconds, run.client_cpu_s, run.note, run.error = m.seconds, m.cpu_s, m.note, m.error
            run.what = f"write ceiling {sink} ({m.note or '-'})"
        except Exception as exc:  # noqa: BLE001
            run.error = f"{type(exc).__name__}: {exc}"[:500]
        finally:
            shutil.rmtree(out_dir, ignore_errors=True)
        return run

    def _said(self, run: CopyRun) -> None:
        if run.error:
            self.say(f"[snapshot]   {run.what}: ERROR {run.error}")
        else:
            self.say(f"[snapshot]   {run.what}: {run.seconds:.2f}s, {run.rows_per_s:.0f} rows/s, verified "
                     f"{run.verified or '-'}")

    # ---- everything ---------------------------------------------------------------------------------
    def run(self) -> SnapshotReport:
        report = SnapshotReport(self.rows, self.tables, config=self.config)
        try:
            self.preload()
            report.load_seconds = self.load_seconds
            expected = self.source_checksums()
            self.references(expected, report)
            # PostgreSQL right after its references: the host's speed drifts within minutes, and this is the pair
            # that the goal compares
            for sink in sorted(self.sinks, key=lambda k: k != "postgresql"):
                self.say(f"[snapshot] Tidewater -> {sink}: changefeed create ... phase streaming")
                try:
                    run = self.tidewater(sink, expected)
                    report.runs.append(run)
                    self._said(run)
                    if sink != "blackhole" and not run.error:
                        ceiling = self.ceiling(sink)
                        report.runs.append(ceiling)
                        self._said(ceiling)
                finally:
                    self.env.drop_target(sink, KEY)
        except Exception as exc:  # noqa: BLE001 - reported; the other workloads still run
            report.errors.append(f"snapshot: {type(exc).__name__}: {exc}")
            self.say(f"[snapshot] FAILED: {traceback.format_exc()}")
        finally:
            with contextlib.suppress(Exception):
                self.up.drop_database(UPSTREAM_DB)
        return report


# ---- report ---------------------------------------------------------------------------------------------
MAIN_COLUMNS = ("sink", "rows", "tables", "Tidewater rows/s", "seconds", "first chunk s", "tree peak RSS MB",
                "capture tree CPU s/M rows", "servers CPU s/M rows", "verified", "dump data-only rows/s",
                "TW/dump data-only", "dump+restore rows/s", "TW/dump+restore", "write ceiling rows/s", "TW/write")


def _num(x: float | None, digits: int = 0) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _ratio(a: float | None, b: float | None) -> str:
    if a is None or not b:
        return "-"
    r = a / b
    return f"{r:.2f}" if r >= 0.1 or r == 0 else f"{r:.3g}"


def _mb(b: int | None) -> str:
    return "-" if not b else f"{b / (1 << 20):.0f}"


def _table(columns: tuple[str, ...], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def format_snapshot(rep: SnapshotReport) -> str:
    data = rep.find("dump_data")
    full = rep.find("dump")
    data_rate = data.rows_per_s if data else None
    full_rate = full.rows_per_s if full else None
    rows = []
    for r in rep.runs:
        if r.kind != "tidewater":
            continue
        ceil = rep.find("ceiling", r.sink)
        write = ceil.rows_per_s if ceil else None
        rate = r.rows_per_s
        rows.append([r.sink, str(r.rows), str(rep.tables), _num(rate), _num(r.seconds if r.ok else None, 1),
                     _num(r.first_chunk_s, 1), _mb(r.rss_peak) if r.ok else "-",
                     _num(r.per_mrows(r.client_cpu_s), 1), _num(r.per_mrows(r.server_cpu_s), 1),
                     r.error[:80] if r.error else (r.verified or "-"), _num(data_rate), _ratio(rate, data_rate),
                     _num(full_rate), _ratio(rate, full_rate), _num(write), _ratio(rate, write)])
    detail_cols = ("what", "sink", "rows", "seconds", "rows/s", "client CPU s/M rows", "servers CPU s/M rows",
                   "client tree peak RSS MB", "processes", "verified", "note")
    details = []
    for r in rep.runs:
        details.append([r.what.replace("|", "into"), r.sink, str(r.rows), _num(r.seconds if r.ok else None, 2),
                        _num(r.rows_per_s), _num(r.per_mrows(r.client_cpu_s), 1), _num(r.per_mrows(r.server_cpu_s), 1),
                        _mb(r.rss_peak), str(r.procs or "-"), r.verified or "-", r.error or r.note])
    out = ["## Initial snapshot (copy of existing rows: changefeed create -> phase streaming)", "",
           _table(MAIN_COLUMNS, rows), "", "### Details", "", _table(detail_cols, details), "",
           f"- {rep.rows} rows (~100 bytes) in {rep.tables} tables loaded upstream in {rep.load_seconds:.1f}s; "
           "dump data-only = `pg_dump --data-only | psql` into the same tables created beforehand (primary key "
           "present while loading, as for the copy); dump+restore = `pg_dump | psql` (schema and data, key built "
           "after the load); both PostgreSQL -> PostgreSQL on the target server. Client = the capture's process "
           "tree (Spark job, JVM, Python workers), pg_dump and psql, or the loading process; servers = upstream "
           "and target database servers.",
           "- changefeed config: " + " ".join(line.strip() for line in rep.config.splitlines() if line.strip())]
    out += [f"- {n}" for n in rep.notes]
    out += [f"- ERROR {e}" for e in rep.errors]
    return "\n".join(out) + "\n"
