"""The snapshot copy job: ``python -m spark_jobs.snapshot --plan FILE`` (docs/snapshot.md).

Runs as its own process, never inside a capture's interpreter. Steps of :func:`run`:

1. Check the sink (``open_sink(uri).check()``) and etcd before anything else, so a wrong URI or an unreachable
   target fails at once with its own message.
2. Open one :class:`upstream.base.SnapshotReader` at the job's snapshot; for each table read its schema at the
   snapshot, then take its stored chunk plan from etcd or plan it now and store it (create-if-absent: the
   first plan of a table is the one every later run uses), and list its chunks not yet recorded as done.
   The reader is closed before Spark starts. The run then stores itself as the span's current run
   (:class:`cdc.snapshot.SnapshotRun`): every chunk commit is fenced on it, so a previous run's processes
   that outlived their driver (Spark's Python daemon has a process group of its own) commit nothing more.
3. Copy the pending chunks in Spark: ``sc.parallelize(tasks, n).mapPartitions(copy_chunks)`` with ``n`` from
   :func:`partitions` (a few per core, at most one per chunk), except into SQLite, which has a single writer:
   then all chunks go through one partition, in order. Every task reads its chunks under the same snapshot, writes
   each in one downstream transaction and records it in etcd (:mod:`spark_jobs.copy`). While the SparkSession
   starts (seconds: a JVM, then the executors' Python workers) the driver copies chunks itself, from the front of
   the list, the same way (:class:`CopyWhileStarting`); once Spark is up the driver keeps copying its share of the
   chunks left (:func:`driver_share`) and Spark gets the others (each chunk goes to exactly one of them); Spark is not
   waited for when none is left (a copy of a few seconds does not pay Spark's start-up).
4. Collect the results: if a chunk failed, raise its error (chunks copied before stay recorded, so running
   the job again copies only the rest).
5. Tables whose target the copy creates without its primary key (``SnapshotJob.defer_keys``, PostgreSQL:
   :mod:`spark_jobs.deferred`) are prepared in step 2 (the fact stored in etcd, the table created, chunks committed
   with a marker but not recorded recorded from it), their chunks commit with markers, and each table's key is built
   once etcd records all its chunks (during the copy of later tables, the rest after the last chunk); a run with no
   chunk left still builds a key that is owed.
A copy without Spark (``SnapshotJob.local``) runs the same task code on :func:`local_threads` threads.

Exit codes of :func:`main`: 0 copied (or nothing left to copy), 1 the job cannot work as given (bad plan, URI,
table, snapshot: the message says what to fix), 2 a resource is unavailable (retry later), 3 anything else,
130 stopped by SIGTERM or SIGINT. On SIGTERM the run first fences itself out in etcd (its tasks commit no further
chunk), then cancels its Spark jobs and stops the SparkContext (Spark's Python workers end); chunks recorded
stay done.
Errors are printed as one line ``snapshot copy failed: [CODE] message``, without a traceback or a password. That
line (or ``snapshot copy done``/``interrupted``) is the job's last: a JVM it started is killed and reaped first.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import logging
import os
import re
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from cdc import errors
from cdc.errors import InvalidArgument, TidewaterError, error_for_code
from cdc.events import TableSchema
from cdc.meta.etcd import EtcdClient
from cdc.meta.snapshot_progress import SnapshotProgressStore
from cdc.procs import end_children
from cdc.snapshot import KEY_DEFERRED, ChunkDone, SnapshotRun, TablePlan, table_definition
from cdc.uri import parse_sink_uri
from sinks.base import TxnSink
from sinks.factory import open_sink, sink_class
from spark_jobs.cds import DRIVER_CONF
from spark_jobs.copy import ChunkResult, ChunkTask, copy_chunks, one_line, open_job_sink, preload
from spark_jobs.deferred import KeyBuilder, OwedKey, prepare_table
from spark_jobs.plan import SnapshotJob, read_job
from spark_jobs.session import spark_session
from upstream import open_upstream
from upstream.base import SnapshotReader, planned_schema

log = logging.getLogger(__name__)


@dataclass
class CopyReport:
    """What one run did: chunks in the plans, chunks that were already done, chunks copied now, rows copied now
    per table, and the seconds the copying took (from the first chunk, Spark's start-up included: the driver copies
    meanwhile)."""

    chunks_total: int = 0
    chunks_skipped: int = 0
    chunks_copied: int = 0
    rows: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    unaligned_keyless: list[str] = field(default_factory=list)
    """Key-less tables copied now without an exported snapshot: exact only if streaming starts from a slot whose
    consistent point is what the copy read (docs/snapshot.md); the caller must make that so or copy them again."""

    @property
    def rows_copied(self) -> int:
        return sum(self.rows.values())


def plan_tasks(job: SnapshotJob, store: SnapshotProgressStore, run_id: str = "",
               owed: list[OwedKey] | None = None) -> tuple[list[ChunkTask], int]:
    """The job's pending chunks (not recorded as done) and the number of chunks in its tables' plans. Tables whose
    key is (or now becomes) deferred are prepared (``spark_jobs.deferred.prepare_table``: target created, chunks
    committed with a marker recorded) and appended to ``owed``."""
    tasks: list[ChunkTask] = []
    total = 0
    upstream = open_upstream(job.upstream)
    sink: TxnSink | None = None
    try:
        with upstream.snapshot_reader(job.snapshot, label=job.label) as reader:
            for name in job.table_names:
                plan = store.get_plan(job.changefeed, job.span, name)
                # (a table renamed since its plan: found by the plan's oid, copied under the plan's name)
                schema = planned_schema(reader, name, plan.oid if plan is not None else 0)
                if plan is None:
                    plan = store.put_plan(job.changefeed, job.span, dataclasses.replace(
                        reader.plan(schema, job.chunk_rows), definition=table_definition(schema),
                        snapshot=job.snapshot, ts=job.commit_ts if job.snapshot is not None else 0))
                reader.release()  # no lock kept on one table while the next is read: it could deadlock the app's DDL
                done = store.done_chunks(job.changefeed, job.span, name)
                check_definition(job, plan, schema, done)
                if (job.defer_keys and plan.key_state == "" and _may_defer(job, reader)) or plan.key_state == KEY_DEFERRED:
                    if sink is None:
                        sink = open_job_sink(job)  # (bound: a deferred table is recorded as it is created)
                    plan = prepare_table(job, sink, store, schema, plan, done)
                deferred = plan.key_state == KEY_DEFERRED
                if deferred and owed is not None:
                    owed.append(OwedKey(schema, plan))
                pending = [c for c in plan.chunks if c.index not in done]
                log.info("%s: table %s: %d rows planned, %d/%d chunks done%s%s", job.label, name, plan.rows,
                         len(plan.chunks) - len(pending), len(plan.chunks), ", key deferred" if deferred else "",
                         "" if plan.has_key else ", copied as one chunk: the table has no key (one task, one "
                         "transaction that replaces the target's rows; no progress inside it)")
                total += len(plan.chunks)
                tasks.extend(ChunkTask(job, schema, c, run_id, deferred) for c in pending)
    finally:
        upstream.close()
        if sink is not None:
            sink.close()
    return tasks, total


def check_definition(job: SnapshotJob, plan: TablePlan, schema: TableSchema, done: dict[int, ChunkDone]) -> None:
    """Chunks left of a plan made for another definition of the table (columns, types, key) must not be read: their
    rows would not fit the target the earlier chunks made (the span plans such a table again before it runs the job:
    ``processor.snapshot.InitialCopy``; this is the job's own guard)."""
    now = table_definition(schema)
    if plan.definition and now != plan.definition and len(done) < len(plan.chunks):
        raise InvalidArgument(f"{job.label}: table {schema.name} was planned as {plan.definition} and is {now} at "
                              f"snapshot {job.snapshot}; its chunks left cannot be copied into the target the others "
                              "made. The span plans the table again (a new run); do not run this job by hand")


def _may_defer(job: SnapshotJob, reader: SnapshotReader) -> bool:
    """Whether the job's sink may build keys after the load at all (PostgreSQL, ``sinks.sql.ops.deferred_key``): other
    sinks are not even opened to ask; and whether the upstream reads chunks as text (a deferred chunk is written
    only so: ``SnapshotReader.reads_text``; a MySQL upstream's copy keeps the target's key while it loads)."""
    return reader.reads_text and parse_sink_uri(job.sink).scheme in ("postgresql", "postgres")


def run(job: SnapshotJob, *, spark: Any = None) -> CopyReport:
    """Copy every chunk of ``job`` not yet recorded in etcd (see the module docstring). ``spark``: a session to
    use (tests share one); None builds one on ``job.spark_master``. Raises ``TidewaterError``."""
    sink = open_sink(job.sink, job.sink_settings)
    try:
        sink.check()
    finally:
        sink.close()
    run = SnapshotRun(uuid.uuid4().hex, time.time(), socket.gethostname(), os.getpid())
    run_id = run.run_id
    client = EtcdClient(list(job.etcd))
    owed: list[OwedKey] = []
    try:
        store = SnapshotProgressStore(client, job.cluster)
        if job.defer_keys:  # fence out an older run before tables are found missing and created key-less
            store.begin_run(job.changefeed, job.span, run)
        tasks, total = plan_tasks(job, store, run_id, owed)
        if (tasks or owed) and not job.defer_keys:  # from now on only this run commits chunks of the span
            store.begin_run(job.changefeed, job.span, run)
    finally:
        client.close()
    keys = KeyBuilder(job, owed, run_id).start()  # a table's key is built once its last chunk is recorded
    try:
        report = _copy(job, spark, run, tasks, total)
    except BaseException:
        with contextlib.suppress(Exception):  # the copy's error is the one to report
            keys.finish(copied=False)
        raise
    built = keys.finish(copied=True)  # every chunk is copied (else _copy raised): the keys still owed
    if built:
        log.info("%s: built the primary key of %d table(s) after their copy: %s", job.label, len(built),
                 ", ".join(built))
    return report


def _copy(job: SnapshotJob, spark: Any, run: SnapshotRun, tasks: list[ChunkTask], total: int) -> CopyReport:
    """Copy ``tasks`` (locally, or in Spark with the driver copying while it starts); raise the first failure."""
    run_id = run.run_id
    report = CopyReport(chunks_total=total, chunks_skipped=total - len(tasks))
    if job.snapshot is None:
        report.unaligned_keyless = sorted({str(t.chunk.table_name) for t in tasks if t.chunk.whole})
        for name in report.unaligned_keyless:
            log.warning("%s: key-less table %s is copied at the reader's own snapshot, not at a slot's exported "
                        "snapshot: streaming replays would duplicate its rows unless the slot's consistent point is "
                        "that snapshot (docs/snapshot.md)", job.label, name)
    if not tasks:
        log.info("%s: nothing to copy (%d chunks already done)", job.label, total)
        return report
    if job.local and spark is None:  # too small for a JVM: the same task code, in this process, in order
        threads = local_threads(job)
        log.info("%s: run %s copying %d chunk(s) of %d in this process on %d thread(s) (no Spark)", job.label,
                 run_id, len(tasks), total, threads)
        t0 = time.monotonic()
        idle = threading.Event()
        copier = CopyWhileStarting(tasks, job.label, on_idle=idle.set, threads=threads, halt=_Stop.requested)
        copier.start()
        try:
            wait_for(idle)
        finally:
            results, _left = copier.finish()  # (left: only after a failure, which is raised)
        report.seconds = time.monotonic() - t0
        return _report(job, report, results)
    t0 = time.monotonic()
    early: list[ChunkResult] = []
    starter: _SparkStarter | None = None
    driver: CopyWhileStarting | None = None  # the driver copying its share alongside Spark's tasks
    if spark is None:
        # Spark takes seconds to start (a JVM, then the executors' Python workers): meanwhile this process copies
        # chunks itself, from the front of the list; Spark gets the rest once it is up, and is not waited for when
        # nothing is left (its JVM ends with this process: it reads a pipe from it)
        _Stop.fence_out = lambda: _end_own_run(job, run)  # a SIGTERM from now on fences this run out
        starter = _SparkStarter(job)
        mine, tasks = (tasks, []) if job.driver_copies else ([], tasks)
        local = CopyWhileStarting(mine, job.label, on_idle=starter.ready.set, halt=_Stop.requested)
        local.start()
        starter.start()
        try:
            wait_for(starter.ready)  # Spark is up (or failed), or this process copied everything (or failed)
            if starter.up() and not local.failed():
                # the driver is one more worker, not an idle coordinator: it keeps its share of the chunks left
                share = driver_share(local.pending(), starter.session().sparkContext.defaultParallelism, job.sink)
                if share > 0:
                    spark = starter.session()
                    _Stop.spark = spark
                    tasks = local.hand_off(keep=share) + tasks
                    driver = local
                    log.info("%s: spark is up: the driver keeps copying %d chunk(s) of the %d left", job.label,
                             share, share + len(tasks))
        finally:
            if driver is None:
                early, left = local.finish()
                tasks = left + tasks
        if driver is None and tasks and not any(r.error for r in early):
            spark = starter.session()  # raises SparkUnavailable when it could not start
            _Stop.spark = spark
    results = early
    try:
        spark_results: list[ChunkResult] = []
        if tasks and not any(r.error for r in early):
            wait_for_executors(spark, job)  # (a cluster master without workers: a retryable error, not a stall)
            slices = partitions(len(tasks), spark.sparkContext.defaultParallelism, job.sink)
            log.info("%s: run %s copying %d chunk(s) of %d in %d partition(s) on %s", job.label, run_id, len(tasks),
                     total, slices, spark.sparkContext.master)
            t1, wall1 = time.monotonic(), time.time()
            try:
                spark_results = spark.sparkContext.parallelize(tasks, slices).mapPartitions(copy_chunks).collect()
            except Exception:
                if _Stop.requested.is_set():  # the jobs were cancelled on request (SIGTERM)
                    raise KeyboardInterrupt("stop requested") from None
                raise
            # what Spark's tasks cost besides their chunks (task and Python worker start, imports, connections):
            # the wall time times the tasks at once, less the seconds their chunks took
            first = min((r.ended - r.seconds for r in spark_results if r.ended), default=wall1)
            log.info("%s: spark copied %d chunk(s), %d rows in %.1f s (first chunk began after %.1f s: task and Python "
                     "worker start); its chunks took %.1f s of its %d task slot(s)", job.label, len(spark_results),
                     sum(r.rows for r in spark_results), time.monotonic() - t1, first - wall1,
                     sum(r.seconds for r in spark_results), min(slices, spark.sparkContext.defaultParallelism))
        if driver is not None:  # the driver's share: copied to its end unless one of its chunks failed
            early, _left = driver.finish(drain=True)
            driver = None
        results = early + spark_results
        report.seconds = time.monotonic() - t0
    finally:
        if driver is not None:  # Spark failed or the job was stopped: the driver takes no further chunk
            driver.finish()
        if starter is not None:  # also when stopped: ends the Python workers, so nothing keeps writing
            _Stop.spark = _Stop.fence_out = None
            starter.stop()
    return _report(job, report, results)


def wait_for_executors(spark: Any, job: SnapshotJob, poll: float = 0.5) -> None:
    """Return once a cluster master gave the job an executor (a ``local`` master runs tasks in the driver: at once);
    raise the retryable ``SparkNoExecutors`` after ``job.executor_timeout`` seconds without one: a master without
    workers, or whose workers lack the cores or memory asked for, would otherwise leave the job waiting forever,
    with nothing to show."""
    sc = spark.sparkContext
    master = str(sc.master)
    if master.startswith("local"):
        return
    t0 = time.monotonic()
    deadline = t0 + job.executor_timeout
    while True:
        # the block managers Spark knows: the driver's, then one per executor
        executors = int(sc._jsc.sc().getExecutorMemoryStatus().size()) - 1
        if executors > 0:
            log.info("%s: %d executor(s) registered after %.1f s on %s", job.label, executors,
                     time.monotonic() - t0, master)
            return
        if _Stop.requested.is_set():
            raise KeyboardInterrupt("stop requested")
        if time.monotonic() >= deadline:
            raise errors.SparkNoExecutors(
                f"no Spark executor registered for the copy job within {job.executor_timeout:.0f} s on master {master}: "
                "the master has no worker, or none with the free cores and memory the job asks for. Fix: start a "
                f"worker (spark-class org.apache.spark.deploy.worker.Worker {master}) or free its cores; the copy is "
                "retried (copied chunks stay done)")
        time.sleep(poll)


class _SparkStarter:
    """Builds the job's SparkSession on a daemon thread; ``ready`` is set when it is up or failed (and by whoever
    else wants the waiter to wake up). :meth:`stop` stops a session that came up; one still starting is left to
    end with this process."""

    def __init__(self, job: SnapshotJob) -> None:
        self._job = job
        self.ready = threading.Event()
        self._done = threading.Event()
        self._abandoned = threading.Event()  # the job is done without Spark: a warm-up cut short is expected
        self._spark: Any = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="tidewater-spark-start", daemon=True)

    def _run(self) -> None:
        job = self._job
        try:
            spark = spark_session(job.spark_master, {**DRIVER_CONF, **job.spark_conf},
                                  app_name=f"tidewater-snapshot-{job.changefeed}")
            self._spark = spark
            warm_workers(spark, job, self._abandoned)
        except BaseException as exc:  # noqa: BLE001 - raised by session() in the caller's thread
            self._error = exc
        finally:
            self._done.set()
            self.ready.set()

    def start(self) -> None:
        self._thread.start()

    def up(self) -> bool:
        """Whether the session is up (not still starting, not failed)."""
        return self._done.is_set() and self._spark is not None

    def session(self) -> Any:
        wait_for(self._done)
        if self._error is not None:
            raise self._error
        return self._spark

    def stop(self) -> None:
        self._abandoned.set()
        if self._done.is_set() and self._spark is not None:
            self._spark.stop()
            self._spark = None


def warm_workers(spark: Any, job: SnapshotJob, abandoned: threading.Event | None = None) -> None:
    """Start Spark's Python workers (one per task slot; reused by the chunk tasks: ``spark.python.worker.reuse``)
    and import the task code in them (:func:`spark_jobs.copy.preload`) while the driver still copies: measured on
    2 cores under load, a chunk job's first chunk began 5.4 s after its submission, most of it this start-up. Only
    for a ``local`` master (a cluster's executors may not be there yet: ``wait_for_executors``); a failure here is
    logged (at debug level once ``abandoned`` is set: the job ended without Spark), the chunk tasks then start their
    workers themselves."""
    sc = spark.sparkContext
    if not str(sc.master).startswith("local"):
        return
    t0 = time.monotonic()
    slots = max(1, sc.defaultParallelism)
    try:
        pids = sc.parallelize([job] * slots, slots).mapPartitions(preload).collect()
    except Exception as exc:  # noqa: BLE001 - only an optimisation: the chunk job reports its own errors
        if abandoned is not None and abandoned.is_set():  # the driver copied everything first: Spark is going away
            log.debug("%s: Spark's Python workers' start cut short: %s", job.label, one_line(str(exc)))
            return
        log.warning("%s: could not start Spark's Python workers ahead of the copy: %s", job.label, one_line(str(exc)))
        return
    log.info("%s: %d Spark Python worker(s) started in %.1f s", job.label, len(set(pids)), time.monotonic() - t0)


def wait_for(event: threading.Event) -> None:
    """Wait for ``event`` in short steps. In the main thread a SIGTERM's handler (:class:`_Stop`) then runs within
    a step: a blocked wait is cut short only when the kernel delivers the signal to the waiting thread, and with a
    copy thread, Spark's starter and gRPC's threads in this process it may pick another; the handler then ran only
    once the wait ended, i.e. after this process had copied every chunk (seen under load: a stopped job copied all
    600 chunks of tests/integration/test_spark_snapshot_resume.py)."""
    while not event.wait(0.1):
        pass


class CopyWhileStarting:
    """Copies chunks in this process (:func:`copy_chunks` on ``threads`` threads, each with its own upstream reader,
    sink and etcd client) from the front of the pending list while the SparkSession starts, or, for a copy without
    Spark, all of them; :meth:`finish` lets the chunks in progress end (no chunk is left half written: each is one
    downstream transaction, recorded after its commit) and returns the results and the chunks left for Spark. A
    failed chunk stops every thread (its result carries the error). ``on_idle`` is called when all threads stopped
    by themselves (no chunk left, or one failed). Once ``halt`` is set (a stop request: SIGTERM) no thread takes a
    further chunk, without waiting for the run's fence-out in etcd to reach the chunks' commits."""

    def __init__(self, tasks: list[ChunkTask], label: str,
                 copy: Callable[[Iterator[ChunkTask]], Iterator[ChunkResult]] = copy_chunks,
                 on_idle: Callable[[], None] | None = None, threads: int = 1,
                 halt: threading.Event | None = None) -> None:
        self._copy = copy
        self._halt = halt if halt is not None else threading.Event()
        self._on_idle = on_idle
        self._pending = collections.deque(tasks)
        self._label = label
        self._stop = threading.Event()
        self._results: list[ChunkResult] = []
        self._lock = threading.Lock()
        self._running = n = max(1, min(threads, len(tasks)))
        self._threads = [threading.Thread(target=self._run, name=f"tidewater-copy-in-driver-{i}", daemon=True)
                         for i in range(n)]
        self._t0 = 0.0

    def _take(self) -> Iterator[ChunkTask]:
        while not self._stop.is_set() and not self._halt.is_set():
            try:
                task = self._pending.popleft()
            except IndexError:
                return
            yield task

    def _run(self) -> None:
        try:
            for r in self._copy(self._take()):
                with self._lock:
                    self._results.append(r)
                if r.error is not None:
                    self._stop.set()  # the other threads take no further chunk
        finally:  # every chunk copied, a chunk failed, or stopped
            with self._lock:
                self._running -= 1
                last = self._running == 0
            if last and self._on_idle is not None:
                self._on_idle()

    def start(self) -> None:
        self._t0 = time.monotonic()
        for t in self._threads:
            t.start()

    def pending(self) -> int:
        """Chunks not yet taken by a thread."""
        return len(self._pending)

    def failed(self) -> bool:
        """Whether a chunk copied here failed (the threads take no further chunk)."""
        with self._lock:
            return any(r.error is not None for r in self._results)

    def hand_off(self, keep: int) -> list[ChunkTask]:
        """Take the pending chunks past the first ``keep`` away from this copier, in their order, and return them
        (for Spark); the threads go on with the ``keep`` first. Each chunk is either returned or copied here,
        never both (the deque's pops are atomic)."""
        taken: list[ChunkTask] = []
        while len(self._pending) > keep:
            try:
                taken.append(self._pending.pop())
            except IndexError:  # (the threads took the last ones meanwhile)
                break
        taken.reverse()
        return taken

    def finish(self, drain: bool = False) -> tuple[list[ChunkResult], list[ChunkTask]]:
        """Stop taking chunks (``drain``: only once none is left, or one failed), let the chunks in progress end,
        and return the results and the chunks not copied."""
        if not drain:
            self._stop.set()
        for t in self._threads:
            t.join()
        if self._results:
            log.info("%s: %d chunk(s), %d rows copied in this process (%d thread(s)) in %.1f s", self._label,
                     len(self._results), sum(r.rows for r in self._results), len(self._threads),
                     time.monotonic() - self._t0)
        return self._results, list(self._pending)


def driver_share(pending: int, parallelism: int, sink: str) -> int:
    """How many of the ``pending`` chunks the driver keeps copying itself once Spark is up: it is one worker next
    to Spark's ``parallelism`` tasks, so one share in ``parallelism + 1`` (rounded down; on a 2-core host with the
    databases on it Spark's two Python workers were measured slower together than the driver's one thread,
    docs/benchmarks.md), none into SQLite (a single writer: every chunk in one Spark partition, in order)."""
    if sink.lower().startswith("sqlite:") or pending <= 0:
        return 0
    return pending // (max(1, parallelism) + 1)


def local_threads(job: SnapshotJob) -> int:
    """Threads of a copy without Spark (``SnapshotJob.local``): as many as a ``local[N]``/``local[*]`` master's
    cores, since Spark would run as many tasks on the same machine; 1 for SQLite (one writer) and other masters."""
    if job.sink.lower().startswith("sqlite:"):
        return 1
    m = re.fullmatch(r"local\[(\d+|\*)(?:,\s*\d+)?\]", job.spark_master.strip())
    if m is None:
        return 1
    return (os.cpu_count() or 1) if m.group(1) == "*" else max(1, int(m.group(1)))


def _report(job: SnapshotJob, report: CopyReport, results: list[ChunkResult]) -> CopyReport:
    """Fill ``report`` from the chunks' results; the first failed chunk's error is raised."""
    failed = [r for r in results if r.error is not None]
    for r in results:
        if r.error is None:
            report.chunks_copied += 1
            report.rows[r.table] = report.rows.get(r.table, 0) + r.rows
    log.info("%s: copied %d chunk(s) (%d as COPY text, the others parsed), %d rows in %.1f s; %d failed", job.label,
             report.chunks_copied, sum(1 for r in results if r.error is None and r.as_text), report.rows_copied,
             report.seconds, len(failed))
    if failed:
        first = failed[0]
        more = f" ({len(failed) - 1} more chunk(s) failed)" if len(failed) > 1 else ""
        raise error_for_code(first.error_code, f"{first.error}{more}; copied chunks stay done: run the job again")
    return report


_FIXES = {
    "CDC:ErrUpstreamUnavailable": "start the upstream or correct host and port in the upstream URI, then run the job "
                                  "again (copied chunks stay done)",
    "CDC:ErrSinkUnavailable": "start the target or correct the sink URI, then run the job again (copied chunks stay "
                              "done)",
    "CDC:ErrEtcd": "check the etcd endpoints of the plan and that etcd is running, then run the job again",
    "CDC:ErrSinkFatal": "fix the target (or the table it names), then run the job again",
    "CDC:ErrSinkDataRejected": "make the target take the row (widen the column, relax the constraint) or correct the "
                               "row upstream, then run the job again (copied chunks stay done)",
}


def message(exc: TidewaterError) -> str:
    """The one line the job prints for ``exc``: code, message and, where the message gives none, the fix."""
    text = one_line(exc.message)
    fix = _FIXES.get(exc.code)
    if fix and "fix:" not in text.lower():
        text = f"{text.rstrip('.')}. Fix: {fix}"
    return f"[{exc.code}] {text}"



PARTITIONS_PER_CORE = 3


def partitions(n_tasks: int, parallelism: int, sink: str) -> int:
    """How many Spark partitions the pending chunks are split into (contiguous runs of chunks, each task reusing
    one upstream connection, sink and etcd client for its chunks): one for SQLite (a single writer), else
    ``PARTITIONS_PER_CORE`` per core Spark has, at most one per chunk. Several per core keep the cores busy when
    chunks differ in cost; fewer than one per chunk save a connection, a sink check and an etcd client per
    chunk (measured: 100 chunks of 10k rows in 100 partitions ran at half the speed of 20 chunks of 50k)."""
    if sink.lower().startswith("sqlite:"):
        return 1
    return max(1, min(n_tasks, max(1, parallelism) * PARTITIONS_PER_CORE))


def exit_code(exc: TidewaterError) -> int:
    if exc.retryable:
        return 2
    if isinstance(exc, InvalidArgument | errors.SnapshotExpired):
        return 1
    return 3


class _Stop:
    """SIGTERM handling: before Spark runs, the signal fences the run out (when chunks are being copied in this
    process while Spark starts) and interrupts at once (KeyboardInterrupt); while Spark runs
    it cancels the running jobs from another thread (a py4j call inside the signal handler would interleave with
    the main thread's own call on the same connection), and :func:`run` turns the cancelled job into a
    KeyboardInterrupt after stopping the SparkContext."""

    requested = threading.Event()
    spark: Any = None
    fence_out: Callable[[], None] | None = None

    @classmethod
    def handler(cls, signum: int, frame: object) -> None:
        cls.requested.set()
        spark, fence_out = cls.spark, cls.fence_out
        if spark is None:
            if fence_out is not None:  # chunks are being copied in this process (Spark starting): none commits more
                log.info("signal %d: fencing out this run", signum)
                fence_out()
            raise KeyboardInterrupt(f"signal {signum}")
        log.info("signal %d: fencing out this run and cancelling the Spark jobs", signum)

        def stop() -> None:
            if fence_out is not None:
                fence_out()  # no chunk commits from now on (Spark kills a cancelled task's worker only later)
            spark.sparkContext.cancelAllJobs()

        threading.Thread(target=stop, name="tidewater-stop", daemon=True).start()


def _end_own_run(job: SnapshotJob, run: SnapshotRun) -> None:
    try:
        with EtcdClient(list(job.etcd)) as client:
            SnapshotProgressStore(client, job.cluster).end_run(job.changefeed, job.span, run)
    except TidewaterError as exc:
        log.warning("%s: could not fence out run %s: %s", job.label, run.run_id, exc)


def quiet_py4j(record: logging.LogRecord) -> bool:
    """Drop py4j's own INFO/DEBUG lines (with tracebacks) that it logs through the root logger, e.g. when a JVM still
    starting is ended because the driver copied every chunk first: an expected end, not a fault to show."""
    return record.levelno >= logging.WARNING or f"{os.sep}py4j{os.sep}" not in record.pathname


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spark_jobs.snapshot",
                                     description="Copy a span's tables under an upstream snapshot (Spark).")
    parser.add_argument("--plan", required=True, help="the job's JSON file (spark_jobs.plan.SnapshotJob)")
    parser.add_argument("--wait", action="store_true",
                        help="wait for a line on stdin before reading the plan (the capture starts this process ahead "
                             "of its plan): 'go' runs it, the end of the input exits 0 without doing anything")
    parser.add_argument("--preload-sink", default="", metavar="SCHEME",
                        help="with --wait: import the modules of this sink while waiting")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    if args.wait and args.preload_sink:
        with contextlib.suppress(TidewaterError):  # (an unknown scheme: the job's own check says so)
            sink_class(args.preload_sink)
    if args.wait and sys.stdin.readline().strip() != "go":
        return 0  # not needed after all (nothing to copy, or the span stopped first)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    for handler in logging.getLogger().handlers:  # py4j also logs through the root logger (module-level calls)
        handler.addFilter(quiet_py4j)
    signal.signal(signal.SIGTERM, _Stop.handler)  # a stop request: cancel, stop Spark, exit 130
    try:
        job = read_job(args.plan)
        report = run(job)
    except TidewaterError as exc:
        end_children()
        print(f"snapshot copy failed: {message(exc)}", file=sys.stderr, flush=True)
        return exit_code(exc)
    except KeyboardInterrupt:
        end_children()
        print("snapshot copy interrupted; copied chunks stay done: run the job again", file=sys.stderr, flush=True)
        return 130
    except Exception as exc:  # noqa: BLE001 - a bug or a foreign error: still one line, no traceback
        log.debug("unexpected error", exc_info=True)
        end_children()
        print(f"snapshot copy failed: [CDC:ErrUnknown] {type(exc).__name__}: {one_line(str(exc))[:500]}",
              file=sys.stderr, flush=True)
        return 3
    end_children()
    print(f"snapshot copy done: {report.chunks_copied} chunk(s) copied now, {report.chunks_skipped} already done, "
          f"{report.rows_copied} rows in {report.seconds:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
