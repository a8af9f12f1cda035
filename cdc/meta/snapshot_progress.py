"""Snapshot copy progress in etcd: each table's chunk plan and each copied chunk (keys: ``cdc.meta.keys``).

Written by the Spark snapshot job (``spark_jobs.snapshot``): the driver stores a table's plan once, every task
records its chunk after the chunk's downstream transaction committed. Read by the job (to skip what is done)
and by whoever shows progress (:func:`read_progress`, meant for the HTTP API and ``changefeed query``).

Guarantees:
- :meth:`SnapshotProgressStore.put_plan` is create-if-absent (one etcd transaction): the first plan stored
  for a table wins and is returned to every later caller, so concurrent or repeated jobs agree on the chunks.
- :meth:`SnapshotProgressStore.record_chunk` is one put, made only after the chunk is durable downstream. A
  crash between the two leaves the chunk unrecorded: it is copied again, which is harmless (keyed rows are
  upserts; a key-less table's only chunk replaces the table's rows), or, for a table whose key is deferred, recorded
  by the next run from the marker its transaction committed (``sinks.sql.ops.deferred_key``).
- :meth:`SnapshotProgressStore.set_key_state` moves a plan's ``key_state`` forward only (compare-and-set).
- :meth:`SnapshotProgressStore.forget_table` drops a table's plan and chunks and adds their rows to the table's
  :class:`cdc.snapshot.CopyRedone` in the same etcd transaction: the rows copied that progress shows never go back.
- Reads are linearizable (etcd); every failure is ``cdc.errors.MetaStoreError``. Thread-safe (stateless
  apart from the client).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence

from cdc import serde
from cdc.errors import MetaStoreError, SnapshotSuperseded
from cdc.events import TableName
from cdc.meta import keys
from cdc.meta.etcd import EtcdClient
from cdc.meta.keys import KeyKind
from cdc.meta.kv import KV, Compare, Op
from cdc.snapshot import (
    KEY_BUILT,
    KEY_DEFERRED,
    KEY_RANGES,
    WHOLE_TABLE,
    ChunkDone,
    CopyRedone,
    SnapshotProgress,
    SnapshotRun,
    TablePlan,
    TableProgress,
)

log = logging.getLogger(__name__)

_FORGET_TRIES = 5


def _decode(cls: type, kv: KV) -> object:
    try:
        return serde.from_json(cls, kv.value)
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise MetaStoreError(f"corrupt {cls.__name__} at etcd key {kv.key}: {e}", cause=e) from e


class SnapshotProgressStore:
    """Typed access to the snapshot keys of cluster ``cluster_id``."""

    def __init__(self, client: EtcdClient, cluster_id: str) -> None:
        keys.cluster_prefix(cluster_id)  # validates
        self.client = client
        self.cluster_id = cluster_id

    # ---- the run fence (driver, tasks, and whoever ends the copy)
    def begin_run(self, cf: str, span: int, run: SnapshotRun) -> None:
        """Make ``run`` the only run of the span allowed to commit chunks (earlier runs are fenced out)."""
        self.client.put(keys.snapshot_run_key(self.cluster_id, cf, span), serde.to_json(run))

    def current_run(self, cf: str, span: int) -> SnapshotRun | None:
        kv = self.client.get(keys.snapshot_run_key(self.cluster_id, cf, span))
        return None if kv is None else _decode(SnapshotRun, kv)  # type: ignore[return-value]

    def end_run(self, cf: str, span: int, run: SnapshotRun | None = None) -> bool:
        """Fence out every run of the span (call before the span streams: a late chunk must not overwrite newer
        rows), or, with ``run``, only that run if it is still the current one (a job stopping itself). Chunk
        records stay. Returns whether a run was removed."""
        key = keys.snapshot_run_key(self.cluster_id, cf, span)
        if run is None:
            return self.client.delete(key)
        return self.client.txn([Compare(key, "value", "=", serde.to_json(run))], [Op.delete(key)])

    def check_run(self, cf: str, span: int, run_id: str) -> None:
        """Raise ``SnapshotSuperseded`` unless ``run_id`` is the span's current run (the fence of each chunk's
        downstream commit: ``TxnSink.write(..., fence=...)``)."""
        run = self.current_run(cf, span)
        if run is None or run.run_id != run_id:
            now = "no run" if run is None else f"run {run.run_id}"
            raise SnapshotSuperseded(f"snapshot copy of changefeed {cf} span {span}: run {run_id} was superseded "
                                     f"({now} is current); its chunk was not committed")

    # ---- plans (driver)
    def get_plan(self, cf: str, span: int, table: TableName) -> TablePlan | None:
        kv = self.client.get(keys.snapshot_plan_key(self.cluster_id, cf, span, table))
        return None if kv is None else _decode(TablePlan, kv)  # type: ignore[return-value]

    def all_plans(self, cf: str, span: int) -> dict[TableName, TablePlan]:
        """Every stored plan of the span, by table name (one range read)."""
        _, kvs = self.client.get_prefix(keys.snapshot_prefix(self.cluster_id, cf, span))
        out: dict[TableName, TablePlan] = {}
        for kv in kvs:
            if keys.parse_key(kv.key).kind is KeyKind.SNAPSHOT_PLAN:
                plan: TablePlan = _decode(TablePlan, kv)  # type: ignore[assignment]
                out[plan.table_name] = plan
        return out

    def put_plan(self, cf: str, span: int, plan: TablePlan) -> TablePlan:
        """Store ``plan`` unless the table has one already; return the stored one (ours or the earlier)."""
        key = keys.snapshot_plan_key(self.cluster_id, cf, span, plan.table_name)
        if self.client.txn([Compare.absent(key)], [Op.put(key, serde.to_json(plan))]):
            return plan
        stored = self.get_plan(cf, span, plan.table_name)
        if stored is None:  # deleted in between (changefeed removed): nothing to agree with
            raise MetaStoreError(f"snapshot plan of {plan.table_name} vanished while it was being stored")
        return stored

    def set_key_state(self, cf: str, span: int, plan: TablePlan, state: str) -> TablePlan:
        """Move the stored plan of ``plan``'s table from ``plan.key_state`` to ``state`` (compare-and-set on the
        whole stored value: ``"" -> deferred -> built`` only); return the stored plan afterwards. Raises
        ``MetaStoreError`` when the stored plan is neither ``plan`` nor already in ``state`` (changed or removed
        under this run)."""
        order = ("", KEY_DEFERRED, KEY_BUILT)
        if order.index(state) != order.index(plan.key_state) + 1:
            raise ValueError(f"key state of {plan.table_name} cannot move from {plan.key_state!r} to {state!r}")
        key = keys.snapshot_plan_key(self.cluster_id, cf, span, plan.table_name)
        new = dataclasses.replace(plan, key_state=state)
        if self.client.txn([Compare(key, "value", "=", serde.to_json(plan))], [Op.put(key, serde.to_json(new))]):
            return new
        stored = self.get_plan(cf, span, plan.table_name)
        if stored is not None and stored.key_state == state and stored.chunks == plan.chunks:
            return stored
        raise MetaStoreError(f"snapshot plan of {plan.table_name} changed while its key state was set to {state!r} "
                             f"(stored: {'none' if stored is None else repr(stored.key_state)})")

    # ---- chunks (tasks)
    def record_chunk(self, cf: str, span: int, table: TableName, chunk: int, done: ChunkDone) -> None:
        self.client.put(keys.snapshot_chunk_key(self.cluster_id, cf, span, table, chunk), serde.to_json(done))

    def done_chunks(self, cf: str, span: int, table: TableName) -> dict[int, ChunkDone]:
        """The recorded chunks of one table, by chunk index."""
        _, kvs = self.client.get_prefix(keys.snapshot_table_prefix(self.cluster_id, cf, span, table))
        out: dict[int, ChunkDone] = {}
        for kv in kvs:
            k = keys.parse_key(kv.key)
            if k.kind is KeyKind.SNAPSHOT_CHUNK:
                out[k.chunk] = _decode(ChunkDone, kv)  # type: ignore[assignment]
        return out

    def forget(self, cf: str, span: int | None = None) -> int:
        """Delete the snapshot keys of a changefeed (or one span of it); return how many went."""
        return self.client.delete_prefix(keys.snapshot_prefix(self.cluster_id, cf, span))

    def forget_table(self, cf: str, span: int, table: TableName) -> int:
        """Delete one table's plan and chunks (its copy starts over from a new plan: a resync, a changed definition,
        a restart under a new snapshot); the rows and chunks they recorded are added to the table's
        :class:`CopyRedone` in the same transaction (retried while a chunk is recorded meanwhile). Returns how many
        chunk records went."""
        prefix = keys.snapshot_table_prefix(self.cluster_id, cf, span, table)
        plan_key = keys.snapshot_plan_key(self.cluster_id, cf, span, table)
        redone_key = keys.snapshot_redone_key(self.cluster_id, cf, span, table)
        start, end = keys.snapshot_chunk_range(self.cluster_id, cf, span, table)
        for _ in range(_FORGET_TRIES):
            revision, kvs = self.client.get_prefix(prefix)
            redone = CopyRedone()
            chunks: list[ChunkDone] = []
            guards = [Compare.unchanged_since(prefix, revision)]  # no chunk recorded (nor plan replaced) meanwhile
            for kv in kvs:
                kind = keys.parse_key(kv.key).kind
                if kind is KeyKind.SNAPSHOT_CHUNK:
                    chunks.append(_decode(ChunkDone, kv))  # type: ignore[arg-type]
                elif kind is KeyKind.SNAPSHOT_REDONE:
                    redone = _decode(CopyRedone, kv)  # type: ignore[assignment]
                else:  # the plan: still there (a changefeed removed meanwhile gets no redone record)
                    guards.append(Compare(plan_key, "mod", "=", kv.mod_revision))
            if not chunks and len(guards) == 1:
                return 0
            total = CopyRedone(redone.rows + sum(c.rows for c in chunks), redone.chunks + len(chunks),
                               redone.restarts + 1)
            if self.client.txn(guards, [Op.delete_range(start, end), Op.delete(plan_key),
                                        Op.put(redone_key, serde.to_json(total))]):
                return len(chunks)
        raise MetaStoreError(f"snapshot records of {table} kept changing while they were being dropped ({_FORGET_TRIES} "
                             "tries): is an earlier copy job of the span still running?")

    # ---- progress (API)
    def progress(self, cf: str, span: int | None = None) -> SnapshotProgress:
        """Per table: chunks done / total, rows copied (and redone) / planned, rows/s and ETA; one range read."""
        _, kvs = self.client.get_prefix(keys.snapshot_prefix(self.cluster_id, cf, span))
        return summarize(cf, -1 if span is None else span, kvs)


def summarize(cf: str, span: int, kvs: Sequence[KV]) -> SnapshotProgress:
    """:class:`SnapshotProgress` from the raw snapshot keys of one range read (tables of several spans are
    kept apart by span; a key-less table's ``chunking`` says it is one whole chunk).

    ``rows_copied`` counts every row written, the rows of dropped plans (:class:`CopyRedone`) included, so it never
    goes backwards; chunks and ``rows_planned`` are the current plan's. Rates are measured over the current run
    only (the chunks read under the snapshot of the latest chunk: a run before a restart, and the time in between,
    say nothing of this one): its rows over the wall time from its first chunk's start to its last chunk's finish
    (parallel chunks count once). The ETA is the rows left at that rate: the planned rows not copied yet, or, when
    the plan's count was an estimate that is already reached, the chunks left at the rows per chunk so far; None
    until a rate is measured, 0 once every chunk is done, never 0 while a chunk is left."""
    plans: dict[tuple[int, TableName], TablePlan] = {}
    done: dict[tuple[int, TableName], list[ChunkDone]] = {}
    redone: dict[tuple[int, TableName], CopyRedone] = {}
    runs: list[SnapshotRun] = []
    for kv in kvs:
        try:
            k = keys.parse_key(kv.key)
        except ValueError:
            log.warning("ignoring unknown key %s under the snapshot prefix", kv.key)
            continue
        if k.kind is KeyKind.SNAPSHOT_RUN:
            runs.append(_decode(SnapshotRun, kv))  # type: ignore[arg-type]
            continue
        assert k.table is not None
        ident = (k.span, k.table)
        if k.kind is KeyKind.SNAPSHOT_PLAN:
            plans[ident] = _decode(TablePlan, kv)  # type: ignore[assignment]
        elif k.kind is KeyKind.SNAPSHOT_CHUNK:
            done.setdefault(ident, []).append(_decode(ChunkDone, kv))  # type: ignore[arg-type]
        elif k.kind is KeyKind.SNAPSHOT_REDONE:
            redone[ident] = _decode(CopyRedone, kv)  # type: ignore[assignment]
    tables: list[TableProgress] = []
    spans: dict[int, _SpanCopy] = {}
    for ident in sorted(plans.keys() | redone.keys()):
        plan, again = plans.get(ident), redone.get(ident, CopyRedone())
        sp = spans.setdefault(ident[0], _SpanCopy())
        label = str(ident[1]) if span >= 0 else f"{ident[0]}:{ident[1]}"
        if plan is None:  # its copy starts over and is not planned again yet: only what it wrote before
            sp.unknown = True
            tables.append(TableProgress(label, 0, 0, again.rows, 0, None, None, KEY_RANGES, again.rows))
            continue
        chunks = done.get(ident, [])
        sp.chunks.extend(chunks)
        rows = sum(c.rows for c in chunks)
        n_done = min(len(chunks), len(plan.chunks))
        left = _rows_left(plan, rows, n_done)
        rate = current_rate(chunks)
        if left is None:
            eta: float | None = 0.0
        else:
            sp.left += left
            eta = left / rate if rate and left > 0 else None
            sp.unknown |= left <= 0
        tables.append(TableProgress(label, n_done, len(plan.chunks), again.rows + rows, plan.rows, rate, eta,
                                    KEY_RANGES if plan.has_key else WHOLE_TABLE, again.rows))
    rates = [r for sp in spans.values() if (r := current_rate(sp.chunks)) is not None]
    etas = [sp.eta() for sp in spans.values() if sp.left or sp.unknown]  # the spans with chunks left
    total_eta: float | None = None
    if tables and None not in etas:
        total_eta = max((e for e in etas if e is not None), default=0.0)
    return SnapshotProgress(cf, span, tuple(tables), tuple(runs), sum(rates) if rates else None, total_eta)


class _SpanCopy:
    """One span's chunks (of the current plans), rows left, and whether some are unknown (a table not planned)."""

    def __init__(self) -> None:
        self.chunks: list[ChunkDone] = []
        self.left = 0.0
        self.unknown = False

    def eta(self) -> float | None:
        rate = current_rate(self.chunks)
        return None if self.unknown or not rate or self.left <= 0 else self.left / rate


def _rows_left(plan: TablePlan, rows: int, n_done: int) -> float | None:
    """Rows of ``plan`` left to copy (None: every chunk is done), given ``rows`` copied in ``n_done`` chunks: the
    planned rows not copied yet; once those are reached while chunks are left (the planned count of a large table is
    PostgreSQL's estimate), the chunks left at the rows per chunk so far. 0 when nothing tells (no row copied)."""
    chunks_left = len(plan.chunks) - n_done
    if chunks_left <= 0:
        return None
    if plan.rows > rows:
        return float(plan.rows - rows)
    return rows / n_done * chunks_left if n_done else 0.0


def current_rate(chunks: Sequence[ChunkDone]) -> float | None:
    """Rows/s of the current run among ``chunks``: those read under the snapshot of the chunk that finished last,
    their rows over the wall time from the first one's start to the last one's finish; None when there is no such
    chunk, no row or no time."""
    if not chunks:
        return None
    latest = max(chunks, key=lambda c: c.finished_at).snapshot
    rows, start, end = 0, float("inf"), float("-inf")
    for c in chunks:
        if c.snapshot == latest:
            rows += c.rows
            start = min(start, c.finished_at - c.seconds)
            end = max(end, c.finished_at)
    wall = end - start
    return rows / wall if rows > 0 and wall > 0 else None


def read_progress(client: EtcdClient, cluster_id: str, cf: str, span: int | None = None) -> SnapshotProgress:
    """The progress a person watches (``changefeed query``, the HTTP API): see :meth:`SnapshotProgressStore.
    progress`. With ``span`` None the tables of every span are listed as ``span:schema.table``."""
    return SnapshotProgressStore(client, cluster_id).progress(cf, span)
