"""Orchestration of one benchmark run: scenarios, consumers, references, lag, the big transaction.

For every scenario (its own upstream database): the schema is created upstream and on the native
subscriber, one publication ``FOR ALL TABLES`` serves ``pg_recvlogical`` and the subscription, and one
changefeed per sink is created and paused. Each phase is written with nothing reading; a setup phase is
then consumed by every consumer untimed, a timed phase by each consumer in turn, timed (see
:mod:`bench.consumers`), followed by the write ceilings of each target. After each phase but the last, every paused
consumer runs again until its slot restarts decoding past the phase (``catch_up_untimed``), so that no timed
catch-up decodes an earlier phase's WAL again (pg_recvlogical's slot is created for each timed phase). Everything a scenario created
(changefeeds, slots, subscription, databases, target databases) is removed when it ends, also on error.

Not thread-safe; one :class:`Runner` per run.
"""

from __future__ import annotations

import contextlib
import os
import platform
import shutil
import subprocess
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench import bigtxn
from bench.ceiling import export_rows, measure_ceiling
from bench.consistency import Variant, variants, with_consistency
from bench.consumers import (
    Around,
    Measurement,
    NativeSubscription,
    Profiler,
    SyncpointPosition,
    TargetPosition,
    TidewaterFeed,
    catch_up_untimed,
    create_recv_slot,
    drop_slot,
    measure_native,
    measure_recvlogical,
    measure_tidewater,
)
from bench.env import BenchEnv
from bench.lag import LagResult, lag_native, lag_tidewater
from bench.report import PhaseReport, Report
from bench.snapshot import SnapshotBench
from bench.verify import VerifyBench
from bench.workloads import (
    CeilingSource,
    InsertsUpdates,
    ManyTables,
    Pgbench,
    Phase,
    Scenario,
    insert_sql,
    sbtest_ddl,
)
from cdc.ts import lsn_to_str
from playground.cluster import current_lsn
from playground.servers import PostgresServer

Say = Callable[[str], None]


@dataclass
class Options:
    workloads: list[str]
    sinks: list[str]
    rows: int
    tables: int
    pgbench_seconds: float
    pgbench_scale: int
    pgbench_clients: int
    lag_rates: list[int]
    lag_seconds: float
    big_mb: float
    timeout: float
    e_rows: int
    work_dir: Path
    server_config: str = ""
    changefeed_config: str = ""
    native: bool = True
    profile_dir: Path | None = None
    snapshot_rows: int = 10_000_000
    snapshot_tables: int = 4
    verify_write_rate: int = 1000  # rows/s the upstream writer offers during the verify workload
    chunk_rows: int | None = None
    spark_master: str | None = None
    compare_rows: int = 200_000
    consistency: list[str] = field(default_factory=lambda: ["default"])  # modes measured side by side (bench.consistency)
    barrier_interval: float = 1.0  # [consistency] interval of the snapshot-mode changefeeds

    @property
    def variants(self) -> list[Variant]:
        """One changefeed per sink and mode of the throughput and lag runs (bench.consistency)."""
        return variants(self.sinks, self.consistency)

    @property
    def labels(self) -> list[str]:
        """The variants' names in the result tables."""
        return [v.label for v in self.variants]


def code_version() -> str:
    """The product code under test: ``$TIDEWATER_CODE_VERSION`` if set (a run from an exported tree),
    else ``git rev-parse --short HEAD`` of this checkout, ``+dirty`` when it has uncommitted changes."""
    if os.environ.get("TIDEWATER_CODE_VERSION"):
        return os.environ["TIDEWATER_CODE_VERSION"]
    root = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (head or "unknown") + ("+dirty" if dirty else "")


def machine_info(env: BenchEnv) -> dict[str, str]:
    info = {"code": code_version(), "cores": str(os.cpu_count())}
    with contextlib.suppress(OSError, ValueError, IndexError, StopIteration):
        meminfo = Path("/proc/meminfo").read_text().splitlines()
        kb = next(int(line.split()[1]) for line in meminfo if line.startswith("MemTotal:"))
        info["memory"] = f"{kb / (1 << 20):.0f} GB"
    with contextlib.suppress(OSError, StopIteration):
        release = Path("/etc/os-release").read_text().splitlines()
        info["os"] = next(line.split("=", 1)[1].strip().strip('"') for line in release
                          if line.startswith("PRETTY_NAME="))
    info["python"] = platform.python_version()
    if env.upstream is not None:
        v = env.upstream.execute("SHOW server_version")
        info["postgresql"] = str(v[0][0]) if v else "?"
    if env.mariadb is not None:
        v = env.mariadb.execute("SELECT version()")
        info["mariadb"] = str(v[0][0]) if v else "?"
    return info


class Runner:
    def __init__(self, opts: Options, env: BenchEnv, say: Say, profiler: Profiler | None = None) -> None:
        self.opts = opts
        self.env = env
        self.say = say
        self.profiler = profiler
        self.notes: list[str] = []

    # ---- helpers ------------------------------------------------------------------------------------
    @property
    def up(self) -> PostgresServer:
        assert self.env.upstream is not None
        return self.env.upstream

    def _feed(self, key: str, db: str, sink: str, variant: Variant | None = None,
              stack: contextlib.ExitStack | None = None) -> TidewaterFeed:
        """A paused changefeed from ``db`` into ``sink`` (its own target of ``key``); a snapshot-mode ``variant`` gets
        a target of its own and waits, whenever the feed is waited for, until the target shows the barrier."""
        assert self.env.cdc is not None
        snapshot = variant is not None and variant.snapshot
        tkey = variant.target_key(key) if variant is not None else key
        self.env.prepare_target(sink, tkey)
        config = self.opts.changefeed_config
        if snapshot:
            config = with_consistency(config, self.opts.barrier_interval)
        cf_id = f"bench-{key}-{sink}{'-snapshot' if snapshot else ''}".replace("_", "-")
        feed = TidewaterFeed(self.env.cdc, self.up, db, cf_id, sink, self.env.sink_uri(sink, tkey), config)
        feed.create(self.opts.timeout)
        if snapshot:
            visible = SyncpointPosition(self.env.target_connection(sink, tkey), sink, cf_id)
            if stack is not None:
                stack.callback(visible.close)
            feed.visible = visible
            feed.wait(feed.info()["checkpoint_ts"], self.opts.timeout)  # the first barrier is applied
        feed.pause()
        return feed

    def _upstream_db(self, scn: Scenario, key: str, stack: contextlib.ExitStack) -> str:
        db = f"bench_{key}"
        self.up.drop_database(db)
        self.up.create_database(db)
        stack.callback(self.up.drop_database, db)
        scn.create_schema(self.up, db)
        return db

    def _native(self, scn: Scenario, key: str, db: str, publication: str, stack: contextlib.ExitStack
                ) -> NativeSubscription | None:
        if not self.opts.native or self.env.subscriber is None:
            return None
        sub_db = f"native_{key}"
        self.env.subscriber.drop_database(sub_db)
        self.env.subscriber.create_database(sub_db)
        stack.callback(self.env.subscriber.drop_database, sub_db)
        scn.create_schema(self.env.subscriber, sub_db)
        sub = NativeSubscription(self.up, db, self.env.subscriber, sub_db, f"bench_native_{key}", publication)
        sub.create()
        stack.callback(sub.drop)
        return sub

    # ---- throughput scenarios -----------------------------------------------------------------------
    def run_scenario(self, scn: Scenario, tidewater: bool = True) -> list[PhaseReport]:
        o, say = self.opts, self.say
        key = scn.key
        reports: list[PhaseReport] = []
        with contextlib.ExitStack() as stack:
            t_setup = time.monotonic()
            db = self._upstream_db(scn, key, stack)
            publication = f"bench_pub_{key}"
            self.up.execute(f"CREATE PUBLICATION {publication} FOR ALL TABLES", db=db)
            sub = self._native(scn, key, db, publication, stack)
            feeds: dict[str, TidewaterFeed] = {}  # by variant label
            for v in o.variants if tidewater else [Variant(s, "default", s) for s in o.sinks]:
                stack.callback(self.env.drop_target, v.sink, v.target_key(key))
                if tidewater:
                    feeds[v.label] = self._feed(key, db, v.sink, v, stack)
                    stack.callback(feeds[v.label].remove)
                else:
                    self.env.prepare_target(v.sink, key)
            recv_slot = f"bench_recv_{key}"
            stack.callback(drop_slot, self.up, db, recv_slot)
            say(f"[{key}] {scn.title}: schema, publication, subscription and {len(feeds)} changefeeds ready in "
                f"{time.monotonic() - t_setup:.1f}s")
            if feeds:
                idle = {sink: feed.idle_resume_seconds(o.timeout) for sink, feed in feeds.items()}
                self.notes.append(f"[{key}] Tidewater resume -> checkpoint with nothing to replicate (included in "
                                  "each catch-up): " + ", ".join(f"{k} {v:.2f}s" for k, v in idle.items()))
                say(self.notes[-1])
            phases = scn.phases()
            for i, phase in enumerate(phases):
                if phase.timed:
                    create_recv_slot(self.up, db, recv_slot)
                say(f"[{key}] {phase.label}: writing upstream{'' if phase.timed else ' (setup)'}")
                w = phase.write(self.up, db)
                say(f"[{key}]   {w.rows} rows written in {w.seconds:.1f}s {w.detail}")
                if not phase.timed:
                    self._catch_up_untimed(db, feeds, sub, w.target_lsn)
                    continue
                rep = PhaseReport(phase.name, phase.label, w.rows, w)
                rep.recv = measure_recvlogical(self.up, db, recv_slot, publication, w.target_lsn, w.rows, o.timeout)
                drop_slot(self.up, db, recv_slot)
                self._said(key, "pg_recvlogical", rep.recv)
                if sub is not None:
                    rep.native = measure_native(sub, w.target_lsn, w.rows, o.timeout,
                                                Around(target=self.env.target_server_pid("postgresql")))
                    self._said(key, "native", rep.native)
                for label, feed in feeds.items():
                    rep.tidewater[label] = measure_tidewater(feed, self.env.capture_pid, w.target_lsn, w.rows,
                                                             o.timeout, self.profiler,
                                                             f"{phase.name}-{label}".replace(" ", "-"), say,
                                                             around=self.env.around(feed.sink))
                    self._said(key, f"Tidewater -> {label}", rep.tidewater[label])
                self._ceilings(rep, key, db, phase.ceiling)
                reports.append(rep)
                if i + 1 < len(phases):  # the next timed phase must not decode this one's WAL again either
                    self._catch_up_untimed(db, feeds, sub, w.target_lsn)
        return reports

    def _said(self, key: str, what: str, m: Measurement) -> None:
        if m.error:
            self.say(f"[{key}]   {what}: ERROR {m.error}")
        else:
            self.say(f"[{key}]   {what}: {m.seconds:.2f}s, {m.rows_per_s:.0f} rows/s")

    def _catch_up_untimed(self, db: str, feeds: dict[str, TidewaterFeed], sub: NativeSubscription | None,
                          lsn: int) -> None:
        t0 = time.monotonic()
        behind = catch_up_untimed(self.up, db, list(feeds.values()), sub, lsn, self.opts.timeout)
        if behind:
            self.notes.append(f"slots {', '.join(behind)} still restart decoding inside an earlier phase's WAL: their "
                              "timed catch-up includes decoding it again")
        self.say(f"  every consumer read up to {lsn_to_str(lsn)} and restarts decoding past it, in "
                 f"{time.monotonic() - t0:.1f}s")

    def _ceilings(self, rep: PhaseReport, key: str, db: str, sources: list[CeilingSource]) -> None:
        kinds = [s for s in self.opts.sinks if s != "blackhole"]
        if not kinds or not sources:
            return
        out_dir = self.opts.work_dir / "ceiling" / key
        out_dir.mkdir(parents=True, exist_ok=True)
        try:
            exported = []
            for i, src in enumerate(sources):
                path = out_dir / f"{i:04d}-{src.table}.tsv"
                exported.append((src, path, export_rows(self.up, db, src, path)))
            for kind in kinds:
                # the copies are made in (and cloned from) a target this run filled: the first variant of the sink
                # (only the snapshot-mode one with --consistency snapshot)
                tkey = next((v.target_key(key) for v in self.opts.variants if v.sink == kind), key)
                rep.ceiling[kind] = measure_ceiling(self.env, kind, tkey, exported)
                self._said(key, f"write ceiling {kind} ({rep.ceiling[kind].note})", rep.ceiling[kind])
        finally:
            shutil.rmtree(out_dir, ignore_errors=True)

    # ---- lag ----------------------------------------------------------------------------------------
    def run_lag(self) -> list[LagResult]:
        """Each consumer gets its own upstream database (other slots skip its WAL cheaply) and runs every
        offered rate in turn. Changefeeds, databases and subscriptions are removed only after the last
        run, so that no removal work (slot drop, sorter cleanup) lands in another consumer's run."""
        o, say = self.opts, self.say
        results: list[LagResult] = []
        consumers: list[Variant | str] = ["native"] if o.native and self.env.subscriber is not None else []
        consumers += o.variants
        with contextlib.ExitStack() as stack:
            for consumer in consumers:
                # each consumer its own upstream database: a snapshot variant's key is its target's
                key = f"lag_{consumer}" if isinstance(consumer, str) else consumer.target_key(f"lag_{consumer.sink}")
                scn = _SbtestOnly()
                db = self._upstream_db(scn, key, stack)
                next_id = 1
                if consumer == "native":
                    publication = f"bench_pub_{key}"
                    self.up.execute(f"CREATE PUBLICATION {publication} FOR ALL TABLES", db=db)
                    sub = self._native(scn, key, db, publication, stack)
                    assert sub is not None
                    for rate in o.lag_rates:
                        say(f"[lag] native at {rate} rows/s for {o.lag_seconds:g}s")
                        res, next_id = lag_native(sub, "sbtest", next_id, rate, o.lag_seconds, o.timeout)
                        results.append(res)
                        say(f"[lag]   p50 {res.p50} p99 {res.p99} max {res.max} {res.error}")
                    continue
                assert isinstance(consumer, Variant)
                sink, tkey = consumer.sink, consumer.target_key(key)
                stack.callback(self.env.drop_target, sink, tkey)
                feed = self._feed(key, db, sink, consumer, stack)
                stack.callback(feed.remove)
                next_id = self._warm_up(feed, db)
                # apply lag: what a reader of the target sees (snapshot mode: the barrier, not the staged position)
                applied: Callable[[], int | None] | None = feed.visible
                if applied is None and sink in ("postgresql", "mariadb", "sqlite"):
                    position = TargetPosition(self.env.target_connection(sink, tkey), sink, feed.cf_id,
                                              len(feed.slots))
                    stack.callback(position.close)
                    applied = position
                for rate in o.lag_rates:
                    say(f"[lag] Tidewater -> {consumer.label} at {rate} rows/s for {o.lag_seconds:g}s")
                    res, next_id = lag_tidewater(feed, self.env.capture_pid, "sbtest", next_id, rate, o.lag_seconds,
                                                 o.timeout, applied)
                    res.sink = consumer.label
                    results.append(res)
                    say(f"[lag]   checkpoint p50 {res.p50} p99 {res.p99} max {res.max}; apply p50 {res.apply_p50} "
                        f"p99 {res.apply_p99} {res.error}")
        return results

    def _warm_up(self, feed: TidewaterFeed, db: str, rows: int = 1000) -> int:
        """Replicate ``rows`` rows untimed so that the lag runs do not include the sink's first-use costs
        (target table creation, statement compilation); return the next free id."""
        conn = self.up.connect(db)
        try:
            with conn.cursor() as cur:
                cur.execute(insert_sql("sbtest"), (1, rows))
            lsn = current_lsn(conn)
        finally:
            conn.close()
        feed.resume()
        feed.wait(lsn, self.opts.timeout)
        feed.pause()
        return rows + 1

    # ---- everything ---------------------------------------------------------------------------------
    def run(self, report: Report) -> Report:
        o = self.opts
        wl = set(o.workloads)
        scenarios: list[Scenario] = []
        if wl & {"a", "b"}:
            scenarios.append(InsertsUpdates(o.rows, wl & {"a", "b"}))
        if "c" in wl:
            scenarios.append(Pgbench(o.pgbench_scale, o.pgbench_seconds, o.pgbench_clients))
        if "e" in wl:
            scenarios.append(ManyTables(o.tables, o.e_rows or o.rows))
        for scn in scenarios:
            try:
                report.phases += self.run_scenario(scn)
            except Exception as exc:  # noqa: BLE001 - the other scenarios still run
                report.errors.append(f"scenario {scn.key}: {type(exc).__name__}: {exc}")
                self.say(f"[{scn.key}] FAILED: {traceback.format_exc()}")
        if o.lag_rates:
            try:
                report.lag = self.run_lag()
            except Exception as exc:  # noqa: BLE001
                report.errors.append(f"lag: {type(exc).__name__}: {exc}")
                self.say(f"[lag] FAILED: {traceback.format_exc()}")
        if "d" in wl:
            self.run_big(report)
        if "snapshot" in wl:
            report.snapshot = SnapshotBench(
                self.env, self.say, rows=o.snapshot_rows, tables=o.snapshot_tables, sinks=o.sinks, timeout=o.timeout,
                work_dir=o.work_dir, cf_config=o.changefeed_config, chunk_rows=o.chunk_rows,
                spark_master=o.spark_master, compare_rows=o.compare_rows).run()
        if "verify" in wl:
            report.verify = VerifyBench(
                self.env, self.say, rows=o.snapshot_rows, sinks=o.sinks, timeout=o.timeout,
                cf_config=o.changefeed_config, chunk_rows=o.chunk_rows, spark_master=o.spark_master,
                write_rate=o.verify_write_rate).run()
        report.notes[:0] = self.notes
        return report

    def run_big(self, report: Report) -> None:
        o = self.opts
        try:
            report.phases += self.run_scenario(bigtxn.BigTxnRef(o.big_mb), tidewater=False)
        except Exception as exc:  # noqa: BLE001
            report.errors.append(f"scenario d (references): {type(exc).__name__}: {exc}")
        for sink in o.sinks:
            if sink not in bigtxn.TIDEWATER_SINKS:
                report.notes.append(f"workload d: scripts/bench_big_txn.py has no {sink} target; not measured")
                continue
            self.say(f"[d] Tidewater -> {sink}: {o.big_mb:g} MB through scripts/bench_big_txn.py")
            work = o.work_dir / "big" / sink
            res = bigtxn.run_tidewater(o.big_mb, sink, work, o.timeout, self.say)
            shutil.rmtree(work, ignore_errors=True)
            report.big.append(res)


class _SbtestOnly(Scenario):
    key = "lag"
    title = "lag"

    def create_schema(self, server: PostgresServer, db: str) -> None:
        server.execute(sbtest_ddl("sbtest"), db=db)

    def phases(self) -> list[Phase]:
        return []
