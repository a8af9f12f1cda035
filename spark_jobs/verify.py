"""The verification job: compare tables upstream and downstream at one upstream snapshot, chunk by chunk, on Spark
(docs/verify.md). ``python -m spark_jobs.verify --plan FILE [--out FILE]``.

Steps of :func:`verify_tables`:

1. Open one :class:`upstream.base.SnapshotReader` at the job's snapshot (the exported snapshot at Ts ``ts``); for
   each table read its schema and plan its key-range chunks with the copy's planner (``SnapshotReader.plan``).
   A table whose key types the target cannot range-read (:func:`spark_jobs.verify_chunk.bounds_supported`) is one
   range. The reader is closed before Spark runs.
2. Checksums: one Spark task per chunk (``sc.parallelize(tasks, n).map(checksum_task)``): each reads its range
   on both sides and returns two (rows, 64-bit multiset sum) pairs (:class:`cdc.verify.ChunkSum`); no row reaches
   the driver.
3. Drill-down: only the chunks whose checksums differ, again one task each (``drill_task``), return their differing
   keys (:class:`cdc.verify.RowDiff`).
4. Per table: a key listed missing in one chunk and extra in another with the same row hash is the same row read
   in another range downstream (a target whose key order differs) and is no difference; the target's total rows
   (``count(*)`` in the same read snapshot) must equal the rows the chunks read, or the table is not called equal
   (a range order that left target rows unread). The verdict lists at most ``cap`` keys, counting the rest.

Without a SparkSession (``spark=None``) the same task functions run in this process, one chunk after another.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from cdc import serde
from cdc.config import DEFAULT_CHUNK_ROWS, DEFAULT_SPARK_MASTER, ChangefeedConfig
from cdc.errors import SinkUnavailable, TidewaterError
from cdc.events import TableName, TableSchema
from cdc.meta.etcd import EtcdClient
from cdc.meta.store import MetaStore
from cdc.model import VERIFY_DONE, VERIFY_RUNNING, ChangefeedInfo, VerifyRun
from cdc.snapshot import TablePlan, plan_from_bounds
from cdc.uri import parse_sink_uri
from cdc.verify import (
    DEFAULT_CAP,
    DIFFERENT,
    EXTRA,
    INEXACT,
    MISSING,
    ChunkSum,
    RowDiff,
    TableVerdict,
    VerifyReport,
)
from sinks.base import BarrierSink
from sinks.factory import open_sink
from sinks.sql.target.connection import Target
from spark_jobs.verify_chunk import (
    LAKE,
    ChunkDrill,
    VerifyTask,
    bounds_supported,
    checksum_task,
    drill_task,
    end_read,
    open_read,
    table_ref,
)
from spark_jobs.verify_hold import VerifyHoldSession
from spark_jobs.verify_lake import LAKE_SCHEMES, build_lake, lake_count, published, wait_published
from upstream import open_upstream

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class VerifyJob:
    """What to compare. ``snapshot``: the upstream's exported snapshot (None: each reader its own, only for data at
    rest) and ``ts`` its position; ``target_snapshot``: a PostgreSQL target's exported snapshot (None: each task
    reads the target's current state); ``consistency`` goes into the report as it is (see
    :class:`cdc.verify.VerifyReport`)."""

    upstream: str
    sink: str
    tables: tuple[str, ...]
    snapshot: str | None = None
    ts: int = 0
    target_snapshot: str | None = None
    changefeed: str = ""
    consistency: str = "none"
    chunk_rows: int = DEFAULT_CHUNK_ROWS
    cap: int = DEFAULT_CAP
    spark_master: str = DEFAULT_SPARK_MASTER
    spark_conf: dict[str, str] = field(default_factory=dict)
    # with a changefeed: where its keys are (the hold, its spans' statuses), the hold's deadline (seconds, renewed
    # while the job lives) and how long the spans may take to hold
    etcd: tuple[str, ...] = ()
    cluster: str = "default"
    hold_ttl: float = 30.0
    hold_timeout: float = 60.0
    # the VerifyRun this job reports to in etcd ("": none, the report goes to stdout or --out only)
    run_id: str = ""
    # fewer planned rows than this: the chunks are compared in this process, Spark is not started (a JVM and its
    # executors cost more than such a comparison; the changefeed's [snapshot] spark-min-rows)
    spark_min_rows: int = 0
    # a storage sink: each table's lake Parquet version at ``ts`` (spark_jobs.verify_lake; "" no version yet),
    # set by verify_changefeed once the lake is built; None: a SQL target
    lake: dict[str, str] | None = None


@dataclass(frozen=True)
class _Table:
    schema: TableSchema
    plan: TablePlan


def plan_tables(job: VerifyJob, dialect: str) -> list[_Table]:
    """Schemas and chunk plans of the job's tables at its snapshot (step 1)."""
    out = []
    with open_upstream(job.upstream) as up, up.snapshot_reader(job.snapshot, label="verify") as reader:
        for name in job.tables:
            schema = reader.table_schema(TableName.parse(name))
            plan = reader.plan(schema, job.chunk_rows)
            if not bounds_supported(schema, dialect):
                log.info("verify %s: the target cannot range-read key %s: one range", name, list(schema.key))
                plan = plan_from_bounds(schema.name, plan.rows, job.chunk_rows, tuple(schema.key), ())
            reader.release()
            out.append(_Table(schema, plan))
    return out


Progress = Callable[..., None]
"""``progress(phase, tasks done, tasks[, rows planned])``: called as tasks finish (``checksums``, then
``drill-down``; the rows once the tables are planned)."""

PROGRESS_POLL = 1.0
"""Seconds between two looks at Spark's status tracker while a phase runs on Spark."""


def _run(spark: Any, fn: Callable[[bytes], bytes], payloads: list[bytes], phase: str = "",
         progress: Progress | None = None) -> list[bytes]:
    """``fn`` of every payload, one Spark task each (in this process without Spark), with ``progress``."""
    if not payloads:
        return []
    total = len(payloads)
    if spark is None:
        out = []
        for p in payloads:
            out.append(fn(p))
            if progress is not None:
                progress(phase, len(out), total)
        return out
    sc = spark.sparkContext
    group = f"tidewater-verify-{phase}-{time.monotonic_ns()}"
    sc.setJobGroup(group, f"verify {phase}")
    done = threading.Event()

    def watch() -> None:  # tasks finished, from Spark's status tracker (the tasks themselves report nothing)
        tracker = sc.statusTracker()
        while not done.wait(PROGRESS_POLL):
            finished = 0
            for job_id in tracker.getJobIdsForGroup(group):
                info = tracker.getJobInfo(job_id)
                for stage_id in (info.stageIds if info is not None else ()):
                    stage = tracker.getStageInfo(stage_id)
                    finished += stage.numCompletedTasks if stage is not None else 0
            if progress is not None and finished < total:  # (complete: said once, below, when collect returned)
                progress(phase, finished, total)

    watcher = threading.Thread(target=watch, name=f"verify-progress-{phase}", daemon=True)
    if progress is not None:
        watcher.start()
    try:
        return list(sc.parallelize(payloads, total).map(fn).collect())
    finally:
        done.set()
        if progress is not None:
            watcher.join()  # a look in flight reports before the end, never after it
            progress(phase, total, total)


def missing_tables(target: Target, tables: list[_Table]) -> dict[str, tuple[_Table, str]]:
    """The tables that do not exist in the target: name -> (table, its target name)."""
    inspector = sa.inspect(target.engine)
    out = {}
    for t in tables:
        tschema, tname = target.target_parts(t.schema.name)
        if not inspector.has_table(tname, schema=tschema):
            out[str(t.schema.name)] = (t, target.target_name(t.schema.name))
    return out


def target_counts(job: VerifyJob, target: Target, tables: list[_Table]) -> dict[str, int]:
    """Each table's rows in the target, read the way the tasks read it (same snapshot where there is one)."""
    raw = open_read(target, job.target_snapshot)
    try:
        cur = raw.cursor()
        counts = {}
        for t in tables:
            cur.execute(f"SELECT count(*) FROM {table_ref(target, t.schema)}")
            counts[str(t.schema.name)] = int(cur.fetchone()[0])
        cur.close()
        return counts
    finally:
        end_read(raw)


def verdict(table: str, sums: list[ChunkSum], drills: list[ChunkDrill], target_total: int, cap: int) -> TableVerdict:
    """One table's verdict from its chunks' checksums and drill-downs (step 4)."""
    diffs = [d for drill in drills for d in drill.diffs]
    missing = {(d.key, d.row_hash): d for d in diffs if d.kind == MISSING}
    moved = {(d.key, d.row_hash) for d in diffs if d.kind == EXTRA} & set(missing)
    kept: list[RowDiff] = []
    for d in diffs:
        if d.kind in (MISSING, EXTRA) and (d.key, d.row_hash) in moved:
            continue
        kept.append(d)
    # a key missing from one range and extra in another with other values: one row, different values
    missing_keys = {d.key for d in kept if d.kind == MISSING}
    extra_keys = {d.key for d in kept if d.kind == EXTRA}
    both = missing_keys & extra_keys
    if both:
        kept = [d for d in kept if not (d.kind in (MISSING, EXTRA) and d.key in both)]
        kept.extend(RowDiff(DIFFERENT, k) for k in both)
    kept.sort(key=lambda d: (d.kind, [("" if v is None else v) for v in d.key]))
    read = sum(s.target_rows for s in sums)
    note = ""
    if read != target_total:
        note = (f"the target holds {target_total} rows but its key ranges read {read}: its key order differs from "
                "the upstream's, rows were not compared")
    counts = {k: sum(1 for d in kept if d.kind == k) for k in (MISSING, EXTRA, DIFFERENT, INEXACT)}
    return TableVerdict(table, sum(s.source_rows for s in sums), target_total, len(sums),
                        sum(1 for s in sums if not s.equal), counts[MISSING], counts[EXTRA], counts[DIFFERENT],
                        counts[INEXACT], tuple(kept[:cap]), max(0, len(kept) - cap), note)


def verify_tables(job: VerifyJob, *, spark: Any = None, progress: Progress | None = None) -> VerifyReport:
    """Compare the job's tables (see the module docstring). ``spark``: a SparkSession, None (no Spark), or a function
    that makes one, called only when the tables planned hold at least ``job.spark_min_rows`` rows. Errors: the
    ``TidewaterError`` of the side that failed (the upstream's snapshot gone, the target unreachable, a table missing
    upstream)."""
    started = time.monotonic()
    target = Target(job.sink) if job.lake is None else None
    try:
        tables = plan_tables(job, target.dialect if target is not None else LAKE)
        absent = missing_tables(target, tables) if target is not None else {}
        tables = [t for t in tables if str(t.schema.name) not in absent]
        if progress is not None:
            progress("checksums", 0, sum(len(t.plan.chunks) for t in tables), sum(t.plan.rows for t in tables))
        if callable(spark):  # a factory: started only for a comparison worth it
            spark = spark() if sum(t.plan.rows for t in tables) >= job.spark_min_rows else None
        tasks: list[tuple[str, int, bytes]] = []
        for t in tables:
            schema_json = serde.to_json(t.schema).decode()
            for chunk in t.plan.chunks:
                task = VerifyTask(job.upstream, job.sink, job.snapshot, job.target_snapshot, schema_json,
                                  serde.to_json(chunk).decode(),
                                  None if job.lake is None else job.lake.get(str(t.schema.name), ""))
                tasks.append((str(t.schema.name), chunk.index, serde.to_json(task)))
        sums = [serde.from_json(ChunkSum, raw)
                for raw in _run(spark, checksum_task, [p for _, _, p in tasks], "checksums", progress)]
        differing = [p for (_, _, p), s in zip(tasks, sums, strict=True) if not s.equal]
        log.info("verify %s: %d chunk(s) of %d table(s) compared, %d differ", job.changefeed or "-", len(sums),
                 len(tables), len(differing))
        drills = [serde.from_json(ChunkDrill, raw) for raw in _run(spark, drill_task, differing, "drill-down", progress)]
        totals = (target_counts(job, target, tables) if target is not None else
                  {str(t.schema.name): lake_count((job.lake or {}).get(str(t.schema.name), "")) for t in tables})
    finally:
        if target is not None:
            target.close()
    verdicts = [TableVerdict(name, t.plan.rows, 0, len(t.plan.chunks), len(t.plan.chunks), missing=t.plan.rows,
                             note=f"the target has no table {target_name}: every upstream row is missing"
                                  + (" (rows planned: an estimate)" if t.plan.rows else ""))
                for name, (t, target_name) in absent.items()]
    for t in tables:
        name = str(t.schema.name)
        verdicts.append(verdict(name, [s for s in sums if s.table == name], [d for d in drills if d.table == name],
                                totals[name], job.cap))
    verdicts.sort(key=lambda v: job.tables.index(v.table) if v.table in job.tables else len(job.tables))
    return VerifyReport(job.ts, job.consistency, tuple(verdicts), changefeed=job.changefeed,
                        seconds=round(time.monotonic() - started, 3))


def wait_for_barrier(job: VerifyJob, info: ChangefeedInfo, ts: int, poll: float = 0.2) -> None:
    """A ``[consistency] mode = "snapshot"`` changefeed's spans held at ``ts`` have *staged* up to it; the target shows
    it once the owner's coordinator has applied that barrier (docs/consistency.md): wait for it (``hold_timeout``),
    else raise ``SinkUnavailable`` (comparing earlier would report the staged changes as differences)."""
    try:
        snapshot_mode = ChangefeedConfig.from_dict(info.config).consistency.snapshot
    except TidewaterError:
        snapshot_mode = False
    if not snapshot_mode:
        return
    sink = open_sink(job.sink, ChangefeedConfig.from_dict(info.config).sink)
    try:
        if not isinstance(sink, BarrierSink):
            return
        deadline = time.monotonic() + job.hold_timeout
        while (applied := sink.applied_barrier(info.id, info.start_ts)) < ts:
            if time.monotonic() >= deadline:
                raise SinkUnavailable(f"changefeed {info.id}: the target shows barrier {applied}, not yet the held "
                                      f"point {ts}, after {job.hold_timeout:.0f}s (is the owner's coordinator "
                                      "applying barriers? see the changefeed's warnings); not compared")
            time.sleep(poll)
    finally:
        sink.close()


@contextlib.contextmanager
def target_snapshot(sink: str) -> Iterator[str | None]:
    """A PostgreSQL target's state now, exported (``pg_export_snapshot`` of a repeatable-read transaction kept open
    for the block) for the tasks to read under; None for a target without shareable snapshots (MySQL, SQLite)."""
    target = Target(sink)
    try:
        if target.dialect != "postgresql":
            yield None
            return
        raw = target.engine.raw_connection()
        try:
            raw.rollback()
            raw.dbapi_connection.set_session(isolation_level="REPEATABLE READ", readonly=True)
            cur = raw.cursor()
            cur.execute("SELECT pg_export_snapshot()")
            name = str(cur.fetchone()[0])
            cur.close()
            yield name
        finally:
            end_read(raw)
    finally:
        target.close()


class RunProgress:
    """The job's progress into its ``VerifyRun`` in etcd (phase, tasks done of tasks), at most every ``every`` seconds
    within a phase; a failed write is only logged (progress is advice, the report is what counts)."""

    def __init__(self, store: MetaStore, job: VerifyJob, every: float = 1.0) -> None:
        self.store = store
        self.job = job
        self.every = every
        self._last = (0.0, "")
        self._lock = threading.Lock()

    def __call__(self, phase: str, done: int, total: int, rows: int = 0) -> None:
        now = time.monotonic()
        with self._lock:
            if phase == self._last[1] and now - self._last[0] < self.every and done < total:
                return
            self._last = (now, phase)
            try:
                run = self.store.get_verify_run(self.job.changefeed, self.job.run_id)
                if run is None or run.state != VERIFY_RUNNING:
                    return
                self.store.put_verify_run(self.job.changefeed, dataclasses.replace(
                    run, phase=phase, chunks=total, chunks_done=done, rows=rows or run.rows))
            except TidewaterError as exc:
                log.warning("verify changefeed=%s run=%s: progress not stored: %s", self.job.changefeed,
                            self.job.run_id, exc)


def verify_changefeed(job: VerifyJob, *, spark: Any = None) -> VerifyReport:
    """Compare a changefeed's tables at one upstream position (docs/verify.md). A running changefeed is held
    (:class:`spark_jobs.verify_hold.VerifyHoldSession`) at the Ts ``Y`` of a snapshot exported while its spans stood
    still; a PostgreSQL target is then exported and the hold released before any chunk is read, other targets keep
    it until their chunks are read. A stopped or failed changefeed is compared without a hold: the report says
    ``checkpoint`` and, when the upstream moved past its checkpoint, that the differences may be those changes."""
    started = time.monotonic()
    with EtcdClient(list(job.etcd)) as client:
        store = MetaStore(client, job.cluster)
        entry = store.get_changefeed(job.changefeed)
        if entry is None:
            return VerifyReport(error=f"changefeed {job.changefeed} does not exist", changefeed=job.changefeed)
        info = entry.value
        spans = [s.index for s in info.spans]
        progress = RunProgress(store, job) if job.run_id else None
        if parse_sink_uri(job.sink).scheme in LAKE_SCHEMES:
            return verify_lake(job, store, info.state.runs, spans, spark=_lake_spark(spark), progress=progress,
                               started=started)
        with open_upstream(job.upstream) as up:
            if not info.state.runs:
                status = store.get_status(job.changefeed)
                checkpoint = status.value.checkpoint_ts if status is not None else 0
                with up.export_snapshot(label=f"verify-{job.changefeed}") as exp:
                    report = verify_tables(dataclasses.replace(job, snapshot=exp.name, ts=exp.ts,
                                                               consistency="checkpoint"), spark=spark,
                                           progress=progress)
                if exp.ts > checkpoint:
                    report = dataclasses.replace(report, note=(
                        f"changefeed {info.state.value} at checkpoint {checkpoint}: compared with the upstream at "
                        f"{exp.ts}; a difference may be a change the changefeed has not applied"))
                return dataclasses.replace(report, seconds=round(time.monotonic() - started, 3))
            spark = spark_before_hold(job, spark)
            with VerifyHoldSession(store, job.changefeed, spans, ttl=job.hold_ttl, timeout=job.hold_timeout) as hold:
                if progress is not None:
                    progress("holding", 0, 0)
                hold.freeze()
                with up.export_snapshot(label=f"verify-{job.changefeed}") as exp:
                    hold.hold_at(exp.ts)
                    wait_for_barrier(job, info, exp.ts)
                    with target_snapshot(job.sink) as tsnap:
                        if tsnap is not None:
                            hold.release()  # the target's state at Y is exported: the changefeed goes on
                        report = verify_tables(dataclasses.replace(job, snapshot=exp.name, ts=exp.ts,
                                                                   target_snapshot=tsnap, consistency="hold"),
                                               spark=spark, progress=progress)
                hold.release()
            return dataclasses.replace(report, hold_seconds=round(hold.held_seconds, 3),
                                       seconds=round(time.monotonic() - started, 3))


def spark_before_hold(job: VerifyJob, spark: Any) -> Any:
    """The SparkSession (or None) a held comparison will use, started now when the target keeps the hold while its
    chunks are read (MySQL/MariaDB, SQLite): otherwise the JVM's start (half a minute on a loaded host) would stand
    inside the hold. Decided by the rows planned without a snapshot (the plan's estimate), as
    :func:`verify_tables` decides; a PostgreSQL target (released before any chunk) keeps the factory."""
    if not callable(spark):
        return spark
    target = Target(job.sink)
    try:
        dialect = target.dialect
    finally:
        target.close()
    if dialect == "postgresql":
        return spark
    rows = sum(t.plan.rows for t in plan_tables(dataclasses.replace(job, snapshot=None), dialect))
    return spark() if rows >= job.spark_min_rows else None


def _lake_spark(spark: Any) -> Any:
    """The SparkSession that builds a storage sink's lake (started before any hold: a JVM takes seconds)."""
    if spark is None:
        raise TidewaterError("a storage sink is verified through its lake, which Spark builds (spark_jobs.lake): "
                             "this job runs without Spark (--local)")
    return spark() if callable(spark) else spark


def verify_lake(job: VerifyJob, store: MetaStore, runs: bool, spans: list[int], *, spark: Any,
                progress: Progress | None = None, started: float | None = None) -> VerifyReport:
    """Compare a storage sink's lake with the upstream at one point (docs/verify.md, "A storage sink: the lake").

    A running changefeed is frozen and held at the Ts ``Y`` of an upstream snapshot exported while it stood still,
    as for a SQL target; once every span applied up to ``Y`` the sink's ``metadata`` checkpoint reaches ``Y``
    (:func:`spark_jobs.verify_lake.wait_published`): every change at or below ``Y`` is in a published file, so the
    hold is released there, before any Spark work, and the lake job applies the files cut at exactly ``Y``
    (whole transactions, nothing after). The lake's Parquet version at ``Y`` is then compared chunk by chunk with
    the upstream under the snapshot. A stopped or failed changefeed: the lake at the sink's published checkpoint
    ``C``, the upstream at a fresh snapshot; ``note`` says so when the upstream moved past ``C``."""
    started = time.monotonic() if started is None else started
    with open_upstream(job.upstream) as up:
        if not runs:
            cut = published(job.sink)
            with up.export_snapshot(label=f"verify-{job.changefeed}") as exp:
                paths = build_lake(spark, job.sink, job.changefeed, job.tables, cut)
                report = verify_tables(dataclasses.replace(job, snapshot=exp.name, ts=exp.ts, lake=paths,
                                                           consistency="checkpoint"), spark=spark, progress=progress)
            if exp.ts > cut:
                report = dataclasses.replace(report, note=(
                    f"changefeed stopped: its storage sink's lake at the published checkpoint {cut}, compared with "
                    f"the upstream at {exp.ts}; a difference may be a change the changefeed has not published"))
            return dataclasses.replace(report, seconds=round(time.monotonic() - started, 3))
        with VerifyHoldSession(store, job.changefeed, spans, ttl=job.hold_ttl, timeout=job.hold_timeout) as hold:
            if progress is not None:
                progress("holding", 0, 0)
            hold.freeze()
            with up.export_snapshot(label=f"verify-{job.changefeed}") as exp:
                hold.hold_at(exp.ts)
                published_at = wait_published(job.sink, exp.ts, job.hold_timeout)
                hold.release()  # every change up to Y is in a published file: the lake is cut there
                log.info("verify changefeed=%s: held at %d, metadata %d, released after %.3fs", job.changefeed,
                         exp.ts, published_at, hold.held_seconds)
                paths = build_lake(spark, job.sink, job.changefeed, job.tables, exp.ts)
                report = verify_tables(dataclasses.replace(job, snapshot=exp.name, ts=exp.ts, lake=paths,
                                                           consistency="hold"), spark=spark, progress=progress)
        return dataclasses.replace(report, hold_seconds=round(hold.held_seconds, 3),
                                   seconds=round(time.monotonic() - started, 3))


def _interrupt(_signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt


def _store_report(job: VerifyJob, report: VerifyReport) -> None:
    """The job's outcome into its VerifyRun (the launching capture marks it failed if this never happens)."""
    try:
        with EtcdClient(list(job.etcd)) as client:
            store = MetaStore(client, job.cluster)
            run = store.get_verify_run(job.changefeed, job.run_id) or VerifyRun(job.run_id, tables=job.tables)
            store.put_verify_run(job.changefeed, dataclasses.replace(
                run, state=VERIFY_DONE, finished=time.time(), report=serde.to_dict(report),
                chunks=sum(t.chunks for t in report.tables), chunks_done=sum(t.chunks for t in report.tables)))
    except TidewaterError as exc:
        log.error("verify changefeed=%s run=%s: report not stored: %s", job.changefeed, job.run_id, exc)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m spark_jobs.verify --plan FILE [--out FILE]``: the report as JSON on stdout (or in ``--out``);
    the exit code is the report's (:attr:`cdc.verify.VerifyReport.exit_code`)."""
    parser = argparse.ArgumentParser(prog="python -m spark_jobs.verify", description=__doc__.split("\n")[0])
    parser.add_argument("--plan", required=True, help="the VerifyJob as JSON")
    parser.add_argument("--out", help="write the report here instead of stdout")
    parser.add_argument("--local", action="store_true", help="run the tasks in this process, without Spark")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    signal.signal(signal.SIGTERM, _interrupt)  # stopped by its capture (the CLI's Ctrl-C): release the hold first
    job: VerifyJob | None = None
    try:
        job = serde.from_json(VerifyJob, Path(args.plan).read_bytes())
        spark: Any = None
        if not args.local:
            from spark_jobs.cds import DRIVER_CONF
            from spark_jobs.session import spark_session

            conf = {**DRIVER_CONF, **job.spark_conf}  # (the snapshot job's driver options: it only schedules)
            master = job.spark_master

            def spark() -> Any:
                return spark_session(master, conf, app_name="tidewater-verify")
        report = verify_changefeed(job, spark=spark) if job.changefeed and job.etcd else verify_tables(job, spark=spark)
    except TidewaterError as exc:
        report = VerifyReport(error=str(exc))
    except KeyboardInterrupt:
        report = VerifyReport(error="interrupted (the hold, if any, was released)")
    except Exception as exc:  # noqa: BLE001 - a driver's or Spark's error: the report says it, the job exits 2
        log.exception("verify failed")
        report = VerifyReport(error=f"{type(exc).__name__}: {' '.join(str(exc).split())[:1000]}")
    raw = serde.to_json(report)
    if job is not None and job.run_id and job.etcd:
        _store_report(job, report)
    if args.out:
        Path(args.out).write_bytes(raw)
    else:
        sys.stdout.write(raw.decode() + "\n")
    return report.exit_code


if __name__ == "__main__":
    sys.exit(main())
