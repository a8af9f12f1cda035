"""A table whose columns or key changed upstream between two runs of its copy (processor.snapshot.InitialCopy,
spark_jobs.snapshot): its copy starts over under the new run's snapshot (target removed before its records go,
planned again, floor = the new run's Ts), unless the target holds the user's rows (merge: refused, naming the fix).
A table whose chunks are all done, or whose definition did not change, is left alone. Fakes for etcd, the upstream,
the sink and the job."""

from __future__ import annotations

import dataclasses
import json
import threading

import pytest

from cdc import serde
from cdc.errors import InvalidArgument, SnapshotTableChanged
from cdc.events import ColumnSchema, TableName
from cdc.model import SpanSnapshot
from cdc.snapshot import ChunkDone, TablePlan, plan_from_bounds, table_definition
from spark_jobs.plan import SnapshotJob
from spark_jobs.snapshot import check_definition
from tests.snapshot_copy_fakes import (
    BAG,
    KEYED,
    Job,
    Progress,
    Restarts,
    Upstream,
    bag_plan,
    done,
    initial_copy,
    keyed_plan,
    table_schema,
)

pytestmark = pytest.mark.unit

C = ColumnSchema("c", 23, "int4", type_name="integer", default="5")


def test_the_definition_names_columns_types_and_key_but_not_nullability_or_defaults() -> None:
    base = table_schema(KEYED, True)
    assert table_definition(base) == "(id:integer, v:text) key(id)"
    assert table_definition(table_schema(BAG, False)) == "(id:integer, v:text) key(-)"
    assert table_definition(table_schema(KEYED, True, C)) != table_definition(base)  # ADD COLUMN
    wider = dataclasses.replace(base, columns=(base.columns[0], dataclasses.replace(base.columns[1],
                                                                                     type_name="character varying(9)")))
    assert table_definition(wider) != table_definition(base)  # ALTER COLUMN TYPE
    assert table_definition(dataclasses.replace(base, key=("id", "v"))) != table_definition(base)  # another key
    relaxed = dataclasses.replace(base, columns=(base.columns[0], dataclasses.replace(base.columns[1], nullable=False,
                                                                                       default="'x'")))
    assert table_definition(relaxed) == table_definition(base)


def test_a_plan_stored_before_definitions_were_recorded_still_reads() -> None:
    data = json.loads(serde.to_json(plan_from_bounds(KEYED, 10, 100, ("id",))))
    for field in ("definition", "snapshot", "ts"):
        del data[field]
    plan = serde.from_json(TablePlan, json.dumps(data).encode())
    assert plan.definition == "" and plan.ts == 0 and plan.snapshot is None


def _run1(progress: Progress, up: Upstream) -> SpanSnapshot:
    """Run 1 (export A at 100) plans both tables and copies chunk 0 of the keyed one, then is killed."""
    first, _ = initial_copy(progress, None, up, _KillAfterOne(progress))
    with pytest.raises(RuntimeError, match="killed"):
        first(threading.Event())
    assert progress.plans[KEYED].definition == "(id:integer, v:text) key(id)"
    assert progress.plans[KEYED].snapshot == "A" and progress.plans[KEYED].ts == 100
    return first.state


class _KillAfterOne(Job):
    def __call__(self, request, stop):  # type: ignore[no-untyped-def,override]
        self.requests.append(request)
        self.progress.record_chunk("cf", 0, KEYED, 0, done(request.snapshot, request.commit_ts))
        raise RuntimeError("job killed")


def _upstream() -> Upstream:
    up = Upstream([BAG, KEYED], [("A", 100), ("B", 200)])
    up.plans = {KEYED: keyed_plan(), BAG: bag_plan()}
    up.schemas = {KEYED: table_schema(KEYED, True), BAG: table_schema(BAG, False)}
    return up


def test_a_table_altered_between_two_runs_is_copied_again_from_the_start_under_the_new_snapshot() -> None:
    progress, up = Progress(), _upstream()
    state = _run1(progress, up)
    up.schemas = {KEYED: table_schema(KEYED, True, C), BAG: table_schema(BAG, False, C)}  # ALTER TABLE .. ADD c
    restarts, job = Restarts(progress), Job(progress)
    second, stored = initial_copy(progress, state, up, job, restart=restarts)
    floors = second(threading.Event())
    # the target goes before the records (a run that dies in between removes it again), then it is planned anew
    assert progress.events == ["restart public.bag", "forget public.bag", "restart public.big", "forget public.big"]
    assert restarts.calls == [(BAG, 200), (KEYED, 200)]
    assert progress.plans[KEYED].definition == "(id:integer, v:text, c:integer) key(id)"
    assert progress.plans[KEYED].ts == 200
    assert {c.snapshot for c in progress.chunks[KEYED].values()} == {"B"}  # chunk 0 of run 1 was forgotten
    assert floors == {"public.bag": 200, "public.big": 200}  # every row of both read at 200
    assert [set(r.tables) for r in job.requests] == [{BAG, KEYED}]
    assert stored[-1].phase == "done"


def test_a_table_whose_chunks_are_all_done_or_whose_definition_is_the_same_is_left_alone() -> None:
    progress, up = Progress(), _upstream()
    state = _run1(progress, up)
    for i in (1, 2):  # the keyed table finished (its DDL then streams after its floor, as any DDL)
        progress.record_chunk("cf", 0, KEYED, i, done("A", 100))
    up.schemas = {KEYED: table_schema(KEYED, True, C), BAG: table_schema(BAG, False)}
    restarts = Restarts(progress)
    second, _ = initial_copy(progress, state, up, Job(progress), restart=restarts)
    assert second(threading.Event()) == {"public.bag": 200, "public.big": 100}
    assert restarts.calls == [] and progress.forgotten == []


def test_under_merge_a_changed_table_is_refused_naming_it_and_the_fix_and_planned_again_after_resume() -> None:
    progress, up = Progress(), _upstream()
    state = _run1(progress, up)
    up.schemas = {KEYED: table_schema(KEYED, True, C), BAG: table_schema(BAG, False)}
    restarts = Restarts(progress)
    second, stored = initial_copy(progress, state, up, Job(progress), restart=restarts, merge=True)
    with pytest.raises(SnapshotTableChanged) as err:
        second(threading.Event())
    msg = err.value.message
    assert "public.big" in msg and "c:integer" in msg and "merge" in msg and "cdc cli changefeed resume -c cf" in msg
    assert not err.value.retryable
    assert restarts.calls == [] and progress.forgotten == [KEYED]  # the user's target is not touched
    assert stored[-1].phase == "copying"
    up.exports.append(("C", 300))
    third, _ = initial_copy(progress, second.state, up, Job(progress), restart=restarts, merge=True)
    assert third(threading.Event())["public.big"] == 300


def test_the_job_refuses_chunks_left_of_a_plan_made_for_another_definition() -> None:
    job = SnapshotJob("cf", "postgresql://u@h/db", "postgresql://u@h/t", ("public.big",), ("http://e:2379",),
                      snapshot="B", commit_ts=200)
    plan = dataclasses.replace(keyed_plan(), definition=table_definition(table_schema(KEYED, True)))
    now = table_schema(KEYED, True, C)
    with pytest.raises(InvalidArgument, match="planned as"):
        check_definition(job, plan, now, {0: ChunkDone(1, 0.1, 1.0)})
    check_definition(job, plan, now, {i: ChunkDone(1, 0.1, 1.0) for i in range(3)})  # nothing left to read
    check_definition(job, dataclasses.replace(plan, definition=""), now, {})  # a plan from before: as it is
    check_definition(job, plan, table_schema(KEYED, True), {})


def test_keyed_floor_falls_back_to_the_first_export_for_a_plan_without_a_known_export() -> None:
    progress = Progress()
    progress.plans[KEYED] = dataclasses.replace(keyed_plan(), snapshot="Z", ts=150)  # not an export of this span
    progress.plans[TableName("public", "old")] = dataclasses.replace(keyed_plan(), table="old")  # no ts recorded
    copy, _ = initial_copy(progress, SpanSnapshot("copying", (("A", 100), ("B", 200))))
    assert copy.floors([KEYED, TableName("public", "old")]) == {"public.big": 100, "public.old": 100}


@pytest.mark.parametrize(("identity", "risky"), [("d", True), ("f", False)])
def test_a_table_half_copied_whose_stream_may_leave_values_unsent_is_copied_again_under_one_snapshot(
        identity: str, risky: bool) -> None:
    """Run 1 copied chunk 0 of ``big`` (REPLICA IDENTITY DEFAULT, a text column: the stream may leave a TOASTed value
    unsent) and was killed: run 2 copies it again from the start under its snapshot (a key change replayed over rows
    a later chunk holds would take unsent values from another row). With REPLICA IDENTITY FULL the old row carries
    every value: the chunks left are copied under run 2's snapshot and the floor is the first chunk's."""
    progress, up = Progress(), _upstream()
    up.schemas[KEYED] = dataclasses.replace(up.schemas[KEYED], replica_identity=identity)
    state = _run1(progress, up)
    restarts = Restarts(progress)
    second, _ = initial_copy(progress, state, up, Job(progress), restart=restarts)
    floors = second(threading.Event())
    if risky:
        assert restarts.calls == [(KEYED, 200)] and progress.forgotten == [KEYED]
        assert {c.snapshot for c in progress.chunks[KEYED].values()} == {"B"} and floors["public.big"] == 200
    else:
        assert restarts.calls == [] and progress.forgotten == []
        assert {c.snapshot for c in progress.chunks[KEYED].values()} == {"A", "B"} and floors["public.big"] == 100
        assert second.ceilings == {"public.big": 200}  # replayed one transaction at a time up to there


def test_the_stream_may_leave_values_unsent_only_without_full_identity_and_with_a_variable_width_column() -> None:
    from cdc.snapshot import may_leave_values_unsent

    base = table_schema(KEYED, True)  # id int, v text; identity d
    assert may_leave_values_unsent(base)
    assert not may_leave_values_unsent(dataclasses.replace(base, replica_identity="f"))
    fixed = dataclasses.replace(base, columns=(base.columns[0], ColumnSchema("t", 1184, "timestamptz")))
    assert not may_leave_values_unsent(fixed)
    arr = dataclasses.replace(base, columns=(base.columns[0], ColumnSchema("a", 1007, "int4", is_array=True)))
    assert may_leave_values_unsent(arr)


class _KillBeforeAnyRecord(Job):
    """Run 1's job: killed after writing some rows of the keyed table's chunk and before recording any chunk (a
    SQL chunk committed just before the kill; a part of a chunk already in Kafka or files)."""

    def __call__(self, request, stop):  # type: ignore[no-untyped-def,override]
        self.requests.append(request)
        raise RuntimeError("job killed")


@pytest.mark.parametrize(("identity", "risky"), [("d", True), ("f", False)])
def test_a_table_planned_under_an_earlier_export_but_recorded_under_a_later_one_replays_from_the_plans_export(
        identity: str, risky: bool) -> None:
    """Run 1 (export A at 100) plans ``big`` and is killed before any chunk is recorded, but rows of it may already
    be downstream, read at 100 (one deleted upstream before run 2's export B at 200 is in none of B's chunks).
    Values all sent (REPLICA IDENTITY FULL): B's chunks are copied and the floor stays 100, so the DELETE is
    replayed (one transaction at a time up to the ceiling 200). Values maybe unsent: the copy starts over whole under
    B, target emptied (a TRUNCATE downstream), floor 200. Before, the floor was 200 either way: measured as a row
    deleted upstream left in a Kafka consumer's rebuilt table after a capture kill during the copy."""
    progress, up = Progress(), _upstream()
    up.schemas[KEYED] = dataclasses.replace(up.schemas[KEYED], replica_identity=identity)
    first, _ = initial_copy(progress, None, up, _KillBeforeAnyRecord(progress))
    with pytest.raises(RuntimeError, match="killed"):
        first(threading.Event())
    assert progress.plans[KEYED].ts == 100 and not progress.chunks.get(KEYED)
    restarts = Restarts(progress)
    second, _ = initial_copy(progress, first.state, up, Job(progress), restart=restarts)
    floors = second(threading.Event())
    assert {c.snapshot for c in progress.chunks[KEYED].values()} == {"B"}
    if risky:
        assert restarts.calls == [(KEYED, 200)] and progress.forgotten == [KEYED]
        assert floors["public.big"] == 200 and "public.big" not in second.ceilings
    else:
        assert restarts.calls == [] and progress.forgotten == []
        assert floors["public.big"] == 100 and second.ceilings == {"public.big": 200}


def test_the_copy_request_names_the_spans_start_ts_so_the_tables_it_fills_are_recorded_as_the_spans() -> None:
    """``CopyRequest.origin`` (``SnapshotJob.origin``): the copy job's sinks record the tables they fill for the span's
    origin, the one its stream's sink reads the record with (``open_position``); None would record nothing."""
    progress, up = Progress(), _upstream()
    job = Job(progress)
    copy, _ = initial_copy(progress, None, up, job)
    copy(threading.Event())
    assert [r.origin for r in job.requests] == [copy.span.start_ts] == [10]
