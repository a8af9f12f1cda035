"""The snapshot job's side of the primary key built after the load (docs/snapshot.md, "The key after the load").

Per table, in the driver, before the run copies (:func:`prepare_table`):

1. A keyed table planned for the first time by an initial copy (``SnapshotJob.defer_keys``), with no chunk done,
   whose target table does not exist and whose rows can pass through as text (``DeferredKeyCopy.defer_key_refusal``): its
   plan's ``key_state`` becomes ``deferred`` in etcd (compare-and-set) *before* the key-less target table is
   created (``DeferredKeyCopy.create_deferred_target``). So whoever finds the table key-less also finds the fact that its key
   is owed, in etcd, durably.
2. A table whose key is deferred: the target table is created if missing (a crash between 1 and its creation),
   and every chunk whose marker is in the target but that etcd does not record (a crash between the chunk's commit
   and its record) is recorded now from its marker: it is never copied again.

Its chunks are then written with their markers (``spark_jobs.copy``, ``DeferredKeyCopy.write_marked_chunk``: at most one
transaction per chunk commits). After the run copied every chunk, :func:`build_keys` builds each deferred table's
key (``DeferredKeyCopy.build_deferred_key``: the key as streaming creates it and the markers deleted, one transaction, fenced
on the run) and only then stores ``key_state = built``. Every step is idempotent: a run killed at any point leaves
either chunks to copy or a key to build, and the next run (even one with no chunk left) finishes it; the span does
not stream while a key is owed (``processor.snapshot``). A duplicate key while building it fails the job with
``SinkError``: the target would differ from the upstream.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from cdc.errors import SinkError
from cdc.events import TableSchema
from cdc.meta.etcd import EtcdClient
from cdc.meta.snapshot_progress import SnapshotProgressStore
from cdc.snapshot import KEY_BUILT, KEY_DEFERRED, ChunkDone, TablePlan
from sinks.base import TxnSink
from sinks.copy_roles import DeferredKeyCopy
from sinks.factory import open_sink
from spark_jobs.plan import SnapshotJob

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OwedKey:
    """A table whose key is deferred and not built yet."""

    schema: TableSchema
    plan: TablePlan


def prepare_table(job: SnapshotJob, sink: TxnSink, store: SnapshotProgressStore, schema: TableSchema, plan: TablePlan,
                  done: dict[int, ChunkDone]) -> TablePlan:
    """Steps 1 and 2 of the module docstring for one table; returns its plan as stored now. ``done`` (the chunks
    etcd records) gets the chunks recorded from their markers."""
    cf, span = job.changefeed, job.span
    if plan.key_state == "" and job.defer_keys and plan.has_key and not done:
        why = sink.defer_key_refusal(schema) if isinstance(sink, DeferredKeyCopy) else \
            "this sink keeps the key while chunks arrive"
        if why is None and not sink.copy_target_exists(schema):
            plan = store.set_key_state(cf, span, plan, KEY_DEFERRED)
            log.info("%s: table %s: its target is created without its primary key, built after the copy",
                     job.label, schema.name)
        elif why is not None:
            log.info("%s: table %s keeps its key while copied: %s", job.label, schema.name, why)
    if plan.key_state != KEY_DEFERRED:
        return plan
    if not isinstance(sink, DeferredKeyCopy):
        raise SinkError(f"table {schema.name}: its key is deferred, and this sink cannot defer a table's key")
    sink.create_deferred_target(schema)
    found = 0
    for index, m in sorted(sink.copy_markers(cf, span, schema.name).items()):
        if index in done:
            continue
        if not 0 <= index < len(plan.chunks):
            raise SinkError(f"table {schema.name}: the target holds a copy marker of chunk {index}, which its plan "
                            f"({len(plan.chunks)} chunks) does not have; drop the table and copy it again")
        d = ChunkDone(m.rows, 0.0, time.time(), m.snapshot, m.commit_ts)
        store.record_chunk(cf, span, schema.name, index, d)
        done[index] = d
        found += 1
    if found:
        log.info("%s: table %s: %d chunk(s) committed by an earlier run but not recorded: recorded from their "
                 "markers, not copied again", job.label, schema.name, found)
    return plan


class KeyBuilder:
    """Builds the owed keys of tables whose chunks are all recorded while the run copies the others (a thread of
    the driver polling etcd every ``interval`` seconds): a table's index is built while later tables load, instead
    of every index after the last chunk. :meth:`finish` stops it and, when the copy succeeded, builds the rest (in
    parallel); the first error of a background build is raised there. A table is built at most once per run, and
    only when etcd records every one of its chunks (each committed: recorded only after its commit)."""

    def __init__(self, job: SnapshotJob, owed: list[OwedKey], run_id: str, interval: float = 0.25) -> None:
        self._job = job
        self._waiting = list(owed)
        self._run_id = run_id
        self._interval = interval
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self.built: list[str] = []
        self._thread = threading.Thread(target=self._loop, name="tidewater-key-builder", daemon=True)

    def start(self) -> KeyBuilder:
        if self._waiting:
            self._thread.start()
        return self

    def _loop(self) -> None:
        job = self._job
        client = EtcdClient(list(job.etcd))
        try:
            store = SnapshotProgressStore(client, job.cluster)
            while self._waiting and not self._stop.wait(self._interval):
                for o in list(self._waiting):
                    if self._stop.is_set():
                        return
                    if len(store.done_chunks(job.changefeed, job.span, o.schema.name)) >= len(o.plan.chunks):
                        self._waiting.remove(o)
                        self.built.append(_build_one(job, o, self._run_id))
        except BaseException as exc:  # noqa: BLE001 - raised by finish() in the driver's thread
            self._error = exc
        finally:
            client.close()

    def finish(self, copied: bool) -> list[str]:
        """Stop the background builds (the one in progress ends first); if ``copied`` (every chunk is recorded)
        build the keys still owed. Returns the tables whose keys were built by this run."""
        self._stop.set()
        if self._thread.ident is not None:  # started
            self._thread.join()
        if self._error is not None:
            raise self._error
        if copied:
            self.built.extend(build_keys(self._job, self._waiting, self._run_id))
            self._waiting = []
        return self.built


def build_keys(job: SnapshotJob, owed: list[OwedKey], run_id: str) -> list[str]:
    """Build the key of every table in ``owed`` (in parallel, one sink connection each) once all its chunks are
    recorded, then store ``key_state = built``; returns the tables built. Raises the first error (``SinkError``
    for a duplicate key; a table with chunks left is an error too: the caller copied them all)."""
    if not owed:
        return []
    with ThreadPoolExecutor(max_workers=len(owed), thread_name_prefix="tidewater-build-key") as pool:
        futures = [pool.submit(_build_one, job, o, run_id) for o in owed]
        return [f.result() for f in futures]


def _build_one(job: SnapshotJob, owed: OwedKey, run_id: str) -> str:
    cf, span = job.changefeed, job.span
    client = EtcdClient(list(job.etcd))
    sink = open_sink(job.sink, job.sink_settings)
    try:
        store = SnapshotProgressStore(client, job.cluster)
        plan = store.get_plan(cf, span, owed.schema.name)
        if plan is None or plan.chunks != owed.plan.chunks:
            raise SinkError(f"table {owed.schema.name}: its snapshot plan changed or vanished during the copy")
        if plan.key_state == KEY_BUILT:
            return str(owed.schema.name)
        left = len(plan.chunks) - len(store.done_chunks(cf, span, owed.schema.name))
        if left > 0:
            raise SinkError(f"table {owed.schema.name}: {left} chunk(s) not copied; its key cannot be built yet")
        t0 = time.monotonic()

        def fence() -> None:
            store.check_run(cf, span, run_id)

        if not isinstance(sink, DeferredKeyCopy):
            raise SinkError(f"table {owed.schema.name}: its key is deferred, and this sink cannot build it")
        sink.build_deferred_key(owed.schema, cf, span, fence if run_id else None)
        store.set_key_state(cf, span, plan, KEY_BUILT)
        log.info("%s: table %s: primary key built after the copy in %.1f s", job.label, owed.schema.name,
                 time.monotonic() - t0)
        return str(owed.schema.name)
    finally:
        sink.close()
        client.close()
