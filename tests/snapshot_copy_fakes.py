"""Fakes of the span's copy phase (processor.snapshot.InitialCopy) for unit tests: etcd's snapshot progress, an
upstream that exports snapshots and plans tables, and a job that 'copies' the pending chunks."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from cdc.errors import InvalidArgument
from cdc.events import ColumnSchema, TableName, TableSchema
from cdc.model import ChangefeedInfo, SpanInfo, SpanSnapshot
from cdc.snapshot import ChunkDone, TablePlan, plan_from_bounds
from processor.snapshot import CopyRequest, InitialCopy
from upstream.base import ExportedSnapshot

KEYED = TableName("public", "big")
BAG = TableName("public", "bag")
NAME = "00000003-00000002-1"  # what PostgreSQL exports again after a restart (procNumber-lxid-n)


class Progress:
    """The parts of SnapshotProgressStore the span uses, in memory."""

    def __init__(self) -> None:
        self.plans: dict[TableName, TablePlan] = {}
        self.chunks: dict[TableName, dict[int, ChunkDone]] = {}
        self.forgotten: list[TableName] = []
        self.runs_ended = 0
        self.events: list[str] = []  # forget and (with Restarts) restart calls, in order

    def get_plan(self, cf: str, span: int, table: TableName) -> TablePlan | None:
        return self.plans.get(table)

    def all_plans(self, cf: str, span: int) -> dict[TableName, TablePlan]:
        return dict(self.plans)

    def put_plan(self, cf: str, span: int, plan: TablePlan) -> TablePlan:
        return self.plans.setdefault(plan.table_name, plan)

    def done_chunks(self, cf: str, span: int, table: TableName) -> dict[int, ChunkDone]:
        return dict(self.chunks.get(table, {}))

    def record_chunk(self, cf: str, span: int, table: TableName, chunk: int, done: ChunkDone) -> None:
        self.chunks.setdefault(table, {})[chunk] = done

    def forget_table(self, cf: str, span: int, table: TableName) -> int:
        self.forgotten.append(table)
        self.events.append(f"forget {table}")
        return len(self.chunks.pop(table, {})) + (self.plans.pop(table, None) is not None)

    def end_run(self, cf: str, span: int, run: Any = None) -> bool:
        self.runs_ended += 1
        return True


def keyed_plan() -> TablePlan:
    return plan_from_bounds(KEYED, 300, 100, ("id",), [("100",), ("200",)])


def bag_plan() -> TablePlan:
    return plan_from_bounds(BAG, 50, 100, None)


def done(snapshot: str | None, ts: int) -> ChunkDone:
    return ChunkDone(10, 0.1, 1.0, snapshot, ts)


class Reader:
    """A snapshot reader of the fake upstream: plans from ``plans`` (by table)."""

    def __init__(self, upstream: Upstream) -> None:
        self.upstream = upstream

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def table_schema(self, table: TableName) -> Any:
        if table not in self.upstream.schemas:
            raise InvalidArgument(f"table {table} does not exist in the upstream database")
        return self.upstream.schemas[table]

    def relation_schema(self, oid: int) -> Any:
        return next((s for s in self.upstream.schemas.values() if s.relation_id == oid), None)

    def plan(self, schema: Any, chunk_rows: int) -> TablePlan:
        return self.upstream.plans[schema.name]

    def count_rows(self, schema: Any) -> int:
        return self.upstream.counts[schema.name]

    def release(self) -> None:
        pass


class Upstream:
    """Exports the snapshots of ``exports`` in turn; the span publishes ``tables``."""

    sends_whole_rows = False  # (upstream.base.Upstream's: PostgreSQL's rule for values left unsent applies)

    def __init__(self, tables: list[TableName], exports: list[tuple[str, int]]) -> None:
        self.tables = tables
        self.exports = list(exports)
        self.schemas: dict[TableName, Any] = {}
        self.plans: dict[TableName, TablePlan] = {}
        self.counts: dict[TableName, int] = {}  # rows at the snapshot (count_rows)

    def span_tables(self, span: SpanInfo) -> list[TableName]:
        return list(self.tables)

    def table_schema(self, table: TableName | int) -> Any:
        found = (self.schemas.get(table) if isinstance(table, TableName) else
                 next((s for s in self.schemas.values() if s.relation_id == table), None))
        if found is None:
            raise InvalidArgument(f"table {table} does not exist in the upstream database")
        return found

    @contextlib.contextmanager
    def export_snapshot(self, *, label: str = "", resume: str | None = None) -> Iterator[ExportedSnapshot]:
        name, ts = self.exports.pop(0)
        yield ExportedSnapshot(name, ts, float(ts))

    def snapshot_reader(self, snapshot: str | None = None, *, label: str = "") -> Reader:
        return Reader(self)


class Job:
    """The launcher: records each request and 'copies' the pending chunks of the tables it is given."""

    def __init__(self, progress: Progress, copy: set[TableName] | None = None) -> None:
        self.progress = progress
        self.copy = copy  # None: every pending chunk; else only these tables' (the run is killed after them)
        self.requests: list[CopyRequest] = []
        self.prepared: list[tuple[str, int]] = []  # prepare() calls not yet discarded

    def prepare(self, changefeed: str, span: int, sink_uri: str = "") -> None:
        self.prepared.append((changefeed, span))

    def discard(self, changefeed: str, span: int) -> None:
        self.prepared.remove((changefeed, span))

    def __call__(self, request: CopyRequest, stop: threading.Event) -> None:
        self.requests.append(request)
        for t in request.tables:
            if self.copy is not None and t not in self.copy:
                continue
            plan = self.progress.plans[t]
            for c in plan.chunks:
                if c.index not in self.progress.chunks.get(t, {}):
                    self.progress.record_chunk("cf", 0, t, c.index, done(request.snapshot, request.commit_ts))
        if self.copy is not None:
            raise RuntimeError("job killed")


class Restarts:
    """``restart_target``: records which tables' targets were removed, and at which export."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.calls: list[tuple[TableName, int]] = []

    def __call__(self, schema: TableSchema, ts: int, at: float) -> None:
        self.calls.append((schema.name, ts))
        self.progress.events.append(f"restart {schema.name}")


def initial_copy(progress: Progress, state: SpanSnapshot | None = None, upstream: Upstream | None = None,
                 job: Job | None = None, *, restart: Restarts | None = None, merge: bool = False,
                 merged_rows: Any = None, announce: Any = None, join_wait: float = 0.0,
                 clock: Callable[[], float] = time.monotonic) -> tuple[InitialCopy, list[SpanSnapshot]]:
    info = ChangefeedInfo("cf", "postgresql://u@h/db", "sqlite:///t.db", {}, 10, 1.0, 1.0,
                          (SpanInfo(0, "slot0", "pub0", 10),), initial_copy=True)
    stored: list[SpanSnapshot] = []
    copy = InitialCopy(info, info.spans[0], upstream or Upstream([], []), progress,  # type: ignore[arg-type]
                       job or Job(progress), stored.append, state, chunk_rows=100,  # type: ignore[arg-type]
                       spark_master="local[1]", label="cf/0", restart_target=restart, merge=merge,
                       merged_rows=merged_rows, announce=announce, join_wait=join_wait, clock=clock)
    return copy, stored




def table_schema(name: TableName, has_key: bool, *extra: ColumnSchema) -> TableSchema:
    cols = (ColumnSchema("id", 23, "int4", type_name="integer", nullable=not has_key, is_key=has_key),
            ColumnSchema("v", 25, "text", type_name="text"), *extra)
    return TableSchema(name, cols, ("id",) if has_key else ("id", "v"), "d" if has_key else "f", has_key=has_key)
