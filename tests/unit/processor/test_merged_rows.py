"""processor.merged_rows: the rows a merge copy keeps are counted per table that held rows, warned as a divergence
with the count, or as uncountable for a table copied under more than one snapshot; and how InitialCopy decides which
(recorded by the first run, counted only when the table was planned and all its chunks read under the last one)."""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import pytest

from cdc.events import ColumnSchema, TableName, TableSchema
from cdc.model import DataWarning
from processor.merged_rows import CODE, MergedRows
from sinks.testing import MemoryCopySink
from tests.snapshot_copy_fakes import (
    KEYED,
    Job,
    Progress,
    Upstream,
    done,
    initial_copy,
    keyed_plan,
    table_schema,
)

pytestmark = pytest.mark.unit


def _schema(name: str) -> TableSchema:
    return TableSchema(TableName.parse(name), (ColumnSchema("id", 23, "int4", is_key=True),), ("id",))


class _Sink(MemoryCopySink):
    """The copy twin (``sinks.testing``): ``counts`` rows per target table (None: it cannot count), ``holding`` tables
    holding rows; ``closed`` counts the closes (the test's ``open_sink`` hands the same sink out again)."""

    def __init__(self, counts: dict[str, int] | None, holding: tuple[str, ...] = ()) -> None:
        super().__init__({**dict.fromkeys(holding, 1), **(counts or {})}, countable=counts is not None)
        self.closed = 0  # type: ignore[assignment]

    def close(self) -> None:
        self.closed += 1


class _Reader:
    def __init__(self, counts: dict[str, int]) -> None:
        self.counts = counts
        self.released = 0

    def count_rows(self, schema: TableSchema) -> int:
        return self.counts[str(schema.name)]

    def release(self) -> None:
        self.released += 1


def _check(target: dict[str, int] | None, upstream: dict[str, int], exact: set[str]) -> tuple[list[DataWarning], Any]:
    sink = _Sink(target)
    raised: list[DataWarning] = []
    check = MergedRows("cf", lambda: sink, raised.extend, "cf/0")
    out = check.check(_Reader(upstream), {t: _schema(t) for t in upstream}, exact)  # type: ignore[arg-type]
    assert out == raised and sink.closed == 1
    return out, sink


def test_kept_rows_are_counted_per_table_and_tables_without_any_are_not_warned() -> None:
    out, _ = _check({"public.a": 13, "public.b": 5}, {"public.a": 10, "public.b": 5}, {"public.a", "public.b"})
    (w,) = out
    assert (w.code, w.table, w.count, w.severity.value) == (CODE, "public.a", 3, "divergence")
    assert "13 rows" in w.message and "upstream 10" in w.message and "--table public.a" in w.message


def test_a_table_copied_under_several_snapshots_is_warned_as_uncountable() -> None:
    out, _ = _check({"public.a": 10}, {"public.a": 10}, set())
    (w,) = out
    assert w.table == "public.a" and "could not be counted" in w.message


def test_a_sink_that_cannot_count_warns_nothing_and_nothing_held_reads_nothing() -> None:
    assert _check(None, {"public.a": 1}, {"public.a"})[0] == []
    sink = _Sink({})
    assert MergedRows("cf", lambda: sink, lambda w: None).check(_Reader({}), {}, set()) == []  # type: ignore[arg-type]
    assert sink.closed == 0


def test_holding_rows_names_the_targets_that_hold_rows() -> None:
    sink = _Sink({}, holding=("public.b",))
    check = MergedRows("cf", lambda: sink, lambda w: None)
    assert check.holding_rows([TableName.parse("public.a"), TableName.parse("public.b")]) == ("public.b",)
    assert sink.closed == 1


class _KillAfterOne(Job):
    def __call__(self, request, stop):  # type: ignore[no-untyped-def,override]
        self.requests.append(request)
        self.progress.record_chunk("cf", 0, KEYED, 0, done(request.snapshot, request.commit_ts))
        raise RuntimeError("job killed")


@pytest.mark.parametrize(("identity", "counted"), [("d", True), ("f", False)])
def test_the_copy_counts_a_table_read_under_one_snapshot_and_says_uncountable_otherwise(
        identity: str, counted: bool) -> None:
    """Run 1 (export A) records the target that held rows, copies one chunk and dies; run 2 (export B) finishes. A
    table whose stream may leave values unsent (identity d) is copied again whole under B: counted exactly. Under
    REPLICA IDENTITY FULL its chunks resume under B over A's: not countable, and said so."""
    progress = Progress()
    up = Upstream([KEYED], [("A", 100), ("B", 200)])
    up.plans = {KEYED: keyed_plan()}
    up.schemas = {KEYED: dataclasses.replace(table_schema(KEYED, True), replica_identity=identity)}
    up.counts = {KEYED: 300}
    sink = _Sink({"public.big": 305}, holding=("public.big",))
    raised: list[DataWarning] = []
    merged = MergedRows("cf", lambda: sink, raised.extend, "cf/0")
    first, _ = initial_copy(progress, None, up, _KillAfterOne(progress), merge=True, merged_rows=merged)
    with pytest.raises(RuntimeError, match="killed"):
        first(threading.Event())
    assert first.state.merged == ("public.big",) and raised == []
    second, stored = initial_copy(progress, first.state, up, Job(progress), merge=True, merged_rows=merged)
    second(threading.Event())
    (w,) = raised
    assert w.code == CODE and w.table == "public.big"
    if counted:
        assert w.count == 5 and "the target has 305 rows, the upstream 300" in w.message
    else:
        assert "could not be counted" in w.message
    assert stored[-1].phase == "done" and stored[-1].merged == ("public.big",)
