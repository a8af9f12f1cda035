"""The key built after the load, decided and reconciled by the job's driver (spark_jobs.deferred.prepare_table) and
guarded by the span (processor.snapshot.InitialCopy.check_keys_built), with fakes for the sink and etcd."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from cdc.errors import SinkError
from cdc.events import TableName
from cdc.meta.snapshot_progress import SnapshotProgressStore
from cdc.snapshot import KEY_BUILT, KEY_DEFERRED, ChunkDone, ChunkMarker, TablePlan, plan_from_bounds
from processor.snapshot import InitialCopy
from sinks.testing import MemoryDeferredKeySink
from spark_jobs.deferred import prepare_table
from spark_jobs.plan import SnapshotJob

pytestmark = pytest.mark.unit

T = TableName("public", "big")


class Schema:
    name = T
    has_key = True
    key = ("id",)


class FakeSink(MemoryDeferredKeySink):
    """The deferred-key twin (``sinks.testing``), the creation of its target logged with the store's steps."""

    def __init__(self, exists: bool = False, refusal: str | None = None,
                 markers: dict[int, ChunkMarker] | None = None, log: list[str] | None = None) -> None:
        super().__init__(exists, refusal, markers)
        self.log = log if log is not None else []

    def create_deferred_target(self, schema: Any) -> None:
        self.log.append("create")
        super().create_deferred_target(schema)


class FakeStore:
    def __init__(self, plan: TablePlan, log: list[str]) -> None:
        self.plan = plan
        self.log = log
        self.recorded: dict[int, ChunkDone] = {}

    def set_key_state(self, cf: str, span: int, plan: TablePlan, state: str) -> TablePlan:
        assert plan == self.plan
        self.log.append(f"etcd {state}")
        self.plan = dataclasses.replace(plan, key_state=state)
        return self.plan

    def record_chunk(self, cf: str, span: int, table: TableName, chunk: int, done: ChunkDone) -> None:
        self.recorded[chunk] = done

    def get_plan(self, cf: str, span: int, table: TableName) -> TablePlan | None:
        return self.plan


def _plan(state: str = "", key: bool = True) -> TablePlan:
    p = plan_from_bounds(T, 400, 100, ("id",) if key else None, [("100",), ("200",), ("300",)] if key else [])
    return dataclasses.replace(p, key_state=state)


def _job(defer: bool = True) -> SnapshotJob:
    return SnapshotJob("cf", "postgresql://u@h/db", "postgresql://u@h/t", ("public.big",), ("http://e:2379",),
                       snapshot="00000003-1", commit_ts=77, defer_keys=defer)


def test_a_missing_target_gets_the_fact_stored_before_the_keyless_table_is_created() -> None:
    log: list[str] = []
    store, sink = FakeStore(_plan(), log), FakeSink(log=log)
    plan = prepare_table(_job(), sink, store, Schema(), store.plan, {})  # type: ignore[arg-type]
    assert plan.key_state == KEY_DEFERRED
    assert log == [f"etcd {KEY_DEFERRED}", "create"]  # a crash in between: the next run creates it


@pytest.mark.parametrize("case", ["exists", "refused", "not asked", "chunks done", "no key"])
def test_the_key_stays_while_copied_unless_the_copy_creates_the_table(case: str) -> None:
    log: list[str] = []
    plan0 = _plan(key=case != "no key")
    store = FakeStore(plan0, log)
    sink = FakeSink(exists=case == "exists", refusal="a mysql target" if case == "refused" else None, log=log)
    done = {0: ChunkDone(100, 1.0, 1.0)} if case == "chunks done" else {}
    plan = prepare_table(_job(defer=case != "not asked"), sink, store, Schema(), plan0, done)  # type: ignore
    assert plan.key_state == ""
    assert log == []


def test_chunks_committed_with_a_marker_but_not_recorded_are_recorded_not_copied_again() -> None:
    log: list[str] = []
    markers = {i: ChunkMarker("cf", 0, "public.big", i, "old-run", 100, "00000002-1", 55) for i in (0, 1, 2)}
    store = FakeStore(_plan(KEY_DEFERRED), log)
    sink = FakeSink(exists=True, markers=markers, log=log)
    done = {0: ChunkDone(100, 1.0, 1.0)}
    prepare_table(_job(), sink, store, Schema(), store.plan, done)  # type: ignore[arg-type]
    assert sorted(done) == [0, 1, 2]
    assert sorted(store.recorded) == [1, 2]  # chunk 0 was recorded already
    assert store.recorded[1].rows == 100 and store.recorded[1].snapshot == "00000002-1"
    assert store.recorded[1].commit_ts == 55
    assert log == ["create"]  # IF NOT EXISTS: a crash before the creation is repaired


def test_a_marker_outside_the_plan_fails_loudly() -> None:
    store = FakeStore(_plan(KEY_DEFERRED), [])
    sink = FakeSink(exists=True, markers={9: ChunkMarker("cf", 0, "public.big", 9)})
    with pytest.raises(SinkError, match="chunk 9"):
        prepare_table(_job(), sink, store, Schema(), store.plan, {})  # type: ignore[arg-type]


def test_the_key_state_only_moves_forward() -> None:
    store = SnapshotProgressStore.__new__(SnapshotProgressStore)  # the transition is checked before any I/O
    with pytest.raises(ValueError):
        store.set_key_state("cf", 0, _plan(), KEY_BUILT)
    with pytest.raises(ValueError):
        store.set_key_state("cf", 0, _plan(KEY_BUILT), KEY_DEFERRED)
    with pytest.raises(ValueError):
        store.set_key_state("cf", 0, _plan(KEY_DEFERRED), "")


class _Progress:
    def __init__(self, plans: dict[TableName, TablePlan]) -> None:
        self.plans = plans

    def get_plan(self, cf: str, span: int, table: TableName) -> TablePlan | None:
        return self.plans.get(table)


def test_a_span_never_streams_a_table_whose_key_is_owed() -> None:
    copy = InitialCopy.__new__(InitialCopy)
    copy.info = type("I", (), {"id": "cf"})()  # type: ignore[assignment]
    copy.span = type("S", (), {"index": 0})()  # type: ignore[assignment]
    copy.label = "cf/0"
    other = TableName("public", "other")
    copy.progress = _Progress({T: _plan(KEY_BUILT), other: _plan("")})  # type: ignore[assignment]
    copy.check_keys_built([T, other])
    copy.progress = _Progress({T: _plan(KEY_DEFERRED)})  # type: ignore[assignment]
    with pytest.raises(SinkError, match=r"public\.big.*primary key"):
        copy.check_keys_built([T])


class _Reader:
    def __enter__(self) -> _Reader:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass


class _Upstream:
    def snapshot_reader(self, snapshot: str, *, label: str = "") -> _Reader:
        return _Reader()


class _PlannedProgress(_Progress):
    def __init__(self, plans: dict[TableName, TablePlan], done: dict[TableName, int]) -> None:
        super().__init__(plans)
        self.done = done

    def done_chunks(self, cf: str, span: int, table: TableName) -> dict[int, ChunkDone]:
        return {i: ChunkDone(100, 1.0, 1.0) for i in range(self.done[table])}


def test_a_table_with_every_chunk_done_but_its_key_owed_still_goes_to_the_job() -> None:
    copy = InitialCopy.__new__(InitialCopy)
    copy.info = type("I", (), {"id": "cf"})()  # type: ignore[assignment]
    copy.span = type("S", (), {"index": 0})()  # type: ignore[assignment]
    copy.label = "cf/0"
    copy.truncate = None
    copy.upstream = _Upstream()  # type: ignore[assignment]
    owed, built, keyed = TableName("public", "owed"), TableName("public", "built"), TableName("public", "keyed")
    copy.progress = _PlannedProgress(  # type: ignore[assignment]
        {owed: _plan(KEY_DEFERRED), built: _plan(KEY_BUILT), keyed: _plan("")}, {owed: 4, built: 4, keyed: 4})
    pending, rows = copy.plan_tables([owed, built, keyed], "snap", 7)
    assert pending == [owed] and rows == 0  # (a job with nothing to copy: it builds the key)
