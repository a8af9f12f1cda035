"""What one Spark task of the snapshot job does: copy its chunks into the sink and record each one in etcd.

This module imports no Spark: :func:`copy_chunks` is a plain function over :class:`ChunkTask` objects, run by
``mapPartitions`` in the executors (and callable directly in tests).

Guarantees of :func:`copy_chunks` (per task, in order):

- Each chunk is read under the job's snapshot and written in one downstream transaction: the chunk is downstream
  entirely or not at all. Where the sink can store the upstream's text of the rows exactly as it stores the parsed
  rows (``sinks.copy_roles.TextCopy``: PostgreSQL targets, ``sinks.sql.ops.bulk``), the text is passed through unparsed
  (``SnapshotReader.read_chunk_text``); otherwise, or when the target already holds rows of the chunk, the rows are
  read parsed (``SnapshotReader.read_chunk``) and written with one ``TxnSink.write`` call (upserts by key; a
  ``CopyAnnouncer``, the Kafka sink, writes them with ``write_copy_chunk``, which adds the chunk's marker for its
  consumers). A ``BufferedSink`` (the storage sink) is flushed right after, so the chunk is durable (its files
  published) before it is recorded. A ``BulkLoad`` sink is told it loads a copy before its first chunk.
  A key-less table's single ``whole`` chunk is written as a TRUNCATE of the table followed by its rows in that
  same transaction, so copying it again replaces the rows instead of duplicating them.
- The downstream commit is fenced: ``TxnSink.write``'s ``fence`` checks, right before the commit, that the task's
  run is still the span's current run in etcd (:meth:`SnapshotProgressStore.check_run`); a run superseded by a
  newer one, or ended before streaming, commits nothing more (``SnapshotSuperseded``).
- A chunk of a table whose key is deferred (``ChunkTask.deferred``: the copy created the target table without its
  primary key) is written as text together with its marker row (``DeferredKeyCopy.write_marked_chunk``): the marker's key
  lets at most one transaction per chunk commit, so a chunk committed but not recorded is not written again (its
  marker's rows are recorded instead). There is no parsed fallback for it (no key to upsert by).
- A job that names its span's origin (``SnapshotJob.origin``: the capture's jobs do) binds its sinks to the
  changefeed's record of target tables (``TablesHad.bind_tables_had``, :func:`open_job_sink`): a table is recorded as
  the changefeed's before its first chunk commits (SQL: at binding, or in the chunk's transaction on SQLite), so a
  table only the copy filled that is dropped downstream before the stream's first change of it fails the changefeed
  with ``CDC:ErrTargetTableDropped``; so does a chunk of a recorded table found missing.
- Only after ``write`` returned is the chunk recorded in etcd (:class:`cdc.snapshot.ChunkDone`); a crash in
  between leaves it unrecorded, and copying it again is harmless (upserts by key; the whole-table replace).
- A chunk the target refuses (``DataRejected``: a constraint, a column too narrow) is searched for the refused row
  (:mod:`spark_jobs.rejected`: probes that are all rolled back), and its error names the table and the row's key.
- Nothing is raised for a chunk that fails: the task stops there and returns a :class:`ChunkResult` with the
  error's code and one-line message (the driver turns it back into a ``TidewaterError``), so Spark neither
  retries nor prints a Python traceback; chunks copied before the failure stay recorded.
- One upstream connection (one snapshot transaction), one sink and one etcd client per task, reused across its
  chunks; no per-row logging or I/O besides the sink's own batched statements.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from cdc.errors import DataRejected, SinkError, TidewaterError
from cdc.events import OpType, RowChange, TableSchema
from cdc.meta.etcd import EtcdClient
from cdc.meta.snapshot_progress import SnapshotProgressStore
from cdc.snapshot import ChunkDone, ChunkMarker, CopiedChunk, SnapshotChunk
from cdc.uri import parse_sink_uri, redact_text
from sinks.base import BufferedSink, TxnSink
from sinks.copy_roles import BulkLoad, CopyAnnouncer, DeferredKeyCopy, TablesHad, TextCopy
from sinks.factory import open_sink, sink_class
from spark_jobs.plan import SnapshotJob
from spark_jobs.rejected import find_refused_row
from upstream import open_upstream
from upstream.base import SnapshotReader

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ChunkTask:
    """One chunk to copy, with everything a task needs (picklable: it travels to the executors)."""

    job: SnapshotJob
    schema: TableSchema
    chunk: SnapshotChunk
    run_id: str = ""
    deferred: bool = False  # the target table's key is deferred: the chunk commits with its marker (text only)


@dataclass(frozen=True)
class ChunkResult:
    """The outcome of one chunk: rows written and seconds taken, or the error (code and message) that ended
    its task."""

    table: str
    chunk: int
    rows: int = 0
    seconds: float = 0.0
    error_code: str | None = None
    error: str | None = None
    as_text: bool = False  # written from the upstream's text, unparsed (TextCopy.write_copy_text)
    ended: float = 0.0  # wall-clock time (time.time()) the chunk was recorded: where a task's time went


def one_line(text: str) -> str:
    """``text`` on one line, any password of a URI in it redacted."""
    return redact_text(" ".join(str(text).split()))


def _counted(changes: Iterator[RowChange], counter: list[int]) -> Iterator[RowChange]:
    n = 0
    for ch in changes:
        n += 1
        yield ch
    counter[0] = n


def copy_one(reader: SnapshotReader, sink: TxnSink, task: ChunkTask, fence: Callable[[], None] | None = None) -> int:
    """Copy one chunk in one downstream transaction (``fence`` called before its commit); return the rows
    written (see the module docstring)."""
    return copy_chunk(reader, sink, task, fence)[0]


def chunk_commit_ts(reader: SnapshotReader, job: SnapshotJob) -> int:
    """The Ts a chunk read now by ``reader`` carries and is recorded with: the reader's own transaction's
    (``SnapshotReader.read_ts``, an upstream whose readers each take a snapshot at a position >= the export's:
    MySQL/MariaDB), else the job's export's; 0 without an exported snapshot."""
    if job.snapshot is None:
        return 0
    own = reader.read_ts()
    return job.commit_ts if own is None else own


def copy_chunk(reader: SnapshotReader, sink: TxnSink, task: ChunkTask, fence: Callable[[], None] | None = None
               ) -> tuple[int, bool]:
    """:func:`copy_one`, and whether the chunk went as text (``TextCopy.write_copy_text``) rather than parsed."""
    return copy_chunk_at(reader, sink, task, fence)[:2]


def copy_chunk_at(reader: SnapshotReader, sink: TxnSink, task: ChunkTask, fence: Callable[[], None] | None = None
                  ) -> tuple[int, bool, int]:
    """:func:`copy_chunk`, and the Ts the chunk was read at (:func:`chunk_commit_ts`: record it with that)."""
    job, schema, chunk = task.job, task.schema, task.chunk
    if task.deferred:  # no key to upsert by: the chunk and its marker in one transaction, at most once (as text)
        if not isinstance(sink, DeferredKeyCopy):
            raise SinkError(f"table {schema.name}: its key is deferred, and this sink cannot defer a table's key")
        at = chunk_commit_ts(reader, job)
        marker = ChunkMarker(job.changefeed, job.span, str(chunk.table_name), chunk.index, task.run_id,
                             snapshot=job.snapshot, commit_ts=at)
        try:
            written, _already = sink.write_marked_chunk(schema, lambda: reader.read_chunk_text(schema, chunk), marker,
                                                        fence)
        finally:
            reader.release()
        return written, True, at
    try:  # the rows as text, unparsed, where the sink stores them exactly as parsed rows (TextCopy.write_copy_text)
        written = sink.write_copy_text(schema, lambda: reader.read_chunk_text(schema, chunk), fence,
                                       replace=chunk.whole) if isinstance(sink, TextCopy) else None
    finally:
        reader.release()
    if written is not None:
        return written, True, job.commit_ts if job.snapshot is not None else 0
    counter = [0]
    at = chunk_commit_ts(reader, job)  # (opens the read's transaction: stamped with the Ts it reads at)
    stamp = at or job.commit_ts
    rows = _counted(reader.read_chunk(schema, chunk, commit_ts=stamp, commit_time=job.commit_time), counter)
    if chunk.whole:  # replace the key-less table's rows, atomically with the copy
        rows = itertools.chain([RowChange(OpType.TRUNCATE, schema, stamp, job.commit_time)], rows)
    try:  # (a log-shaped sink also records where the chunk's rows went: its chunk marker)
        if isinstance(sink, CopyAnnouncer):
            sink.write_copy_chunk(rows, CopiedChunk(schema.name, chunk.index, stamp), fence)
        else:
            sink.write(rows, fence)
        if isinstance(sink, BufferedSink):
            sink.flush(fence)  # (the storage sink's files) the chunk is durable and visible now
    finally:
        reader.release()  # the chunk's table lock goes now, not when the task ends (deadlocks with the app's DDL)
    return counter[0], False, at


def open_job_sink(job: SnapshotJob, *, bulk: bool = False) -> TxnSink:
    """The job's sink (``bulk``: told first that it loads chunks, ``BulkLoad``), bound to its changefeed's span where
    the job names the span's origin and the sink records the target tables a changefeed has had (``TablesHad``): each
    table the copy fills is recorded before its first chunk commits, and one recorded but missing downstream is
    refused (``CDC:ErrTargetTableDropped``). One ``SELECT`` of the record per sink; an upsert per table it binds that
    the record does not show yet."""
    sink = open_sink(job.sink, job.sink_settings)
    if bulk and isinstance(sink, BulkLoad):
        sink.set_bulk_load()  # chunks in any order: the target's foreign keys unchecked while copying
    if job.origin is not None and isinstance(sink, TablesHad):
        try:
            sink.bind_tables_had(job.changefeed, job.span, job.origin)
        except BaseException:
            sink.close()
            raise
    return sink


def preload(jobs: Iterable[SnapshotJob]) -> Iterator[int]:
    """Import, in the Spark Python worker this runs in, the modules its chunk tasks need (this module, by
    unpickling this function; the job's sink and upstream classes), and yield the worker's pid: run as a Spark
    job before the chunks (``spark_jobs.snapshot``), it starts the executors' reused Python workers while the driver
    still copies, so the chunk tasks start on warm workers. No I/O (no connection is opened)."""
    import os

    for job in jobs:
        sink_class(parse_sink_uri(job.sink).scheme)
        open_upstream(job.upstream).close()
        yield os.getpid()


def _refused_row(reader: SnapshotReader, sink: TxnSink, task: ChunkTask, exc: DataRejected) -> DataRejected:
    """The error to report for a chunk the target refused: the refused row's, naming its table and key, when the
    search finds it (:mod:`spark_jobs.rejected`, run only after such a failure), else the chunk's own."""
    try:
        return find_refused_row(reader, sink, task, exc) or exc
    except Exception as search:  # noqa: BLE001 - the chunk's own error is the one to report then
        log.warning("%s: chunk %s: could not search for the refused row: %s", task.job.label, task.chunk.label,
                    one_line(str(search)))
        return exc


def copy_chunks(tasks: Iterable[ChunkTask]) -> Iterator[ChunkResult]:
    """Copy ``tasks`` in order (all of one job) and record each in etcd; see the module docstring."""
    reader: SnapshotReader | None = None
    sink: TxnSink | None = None
    client: EtcdClient | None = None
    try:
        for task in tasks:
            job, chunk = task.job, task.chunk
            t0 = time.monotonic()
            try:
                if reader is None:
                    reader = open_upstream(job.upstream).snapshot_reader(job.snapshot, label=job.label)
                if sink is None:
                    sink = open_job_sink(job, bulk=True)
                if client is None:
                    client = EtcdClient(list(job.etcd))
                store = SnapshotProgressStore(client, job.cluster)
                run_id = task.run_id

                def fence(store: SnapshotProgressStore = store, job: SnapshotJob = job, run_id: str = run_id) -> None:
                    store.check_run(job.changefeed, job.span, run_id)

                rows, as_text, at = copy_chunk_at(reader, sink, task, fence if run_id else None)
                seconds = time.monotonic() - t0
                store.record_chunk(job.changefeed, job.span, chunk.table_name, chunk.index,
                                   ChunkDone(rows, round(seconds, 6), time.time(), job.snapshot, at))
            except Exception as exc:  # noqa: BLE001 - reported to the driver, which raises it
                if isinstance(exc, DataRejected) and reader is not None and sink is not None:
                    exc = _refused_row(reader, sink, task, exc)
                code = exc.code if isinstance(exc, TidewaterError) else "CDC:ErrUnknown"
                msg = exc.message if isinstance(exc, TidewaterError) else f"{type(exc).__name__}: {exc}"
                log.error("%s: chunk %s failed: [%s] %s", job.label, chunk.label, code, one_line(msg))
                yield ChunkResult(str(chunk.table_name), chunk.index, error_code=code,
                                  error=one_line(f"chunk {chunk.label}: {msg}"))
                return
            log.info("%s: chunk %s copied %s: %d rows in %.2f s", job.label, chunk.label,
                     "as COPY text" if as_text else "parsed", rows, seconds)
            yield ChunkResult(str(chunk.table_name), chunk.index, rows, seconds, as_text=as_text, ended=time.time())
    finally:
        for closer in (reader, sink, client):
            if closer is not None:
                try:
                    closer.close()
                except Exception:  # noqa: BLE001 - closing after the work is done or failed
                    pass
