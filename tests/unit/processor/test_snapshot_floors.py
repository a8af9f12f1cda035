"""The floors of the initial copy (processor.snapshot.InitialCopy.floors): which changes of each table the copy holds.

A keyed table's floor is the first export's Ts (every later change is replayed, idempotently by key); a key-less
table's is exactly the Ts its one whole chunk was read at, found by the position its ChunkDone records, never by the
snapshot name alone (PostgreSQL's names repeat after an upstream restart). A record whose name and position are not
one export of the span, or that has no position, is refused loudly and dropped, so the next run copies the table
again. Fakes for etcd, the upstream and the job."""

from __future__ import annotations

import dataclasses
import threading

import pytest

from cdc.errors import SnapshotPositionUnknown, SnapshotTableChanged
from cdc.events import TableName
from cdc.model import SpanSnapshot
from cdc.snapshot import plan_from_bounds, table_definition
from tests.snapshot_copy_fakes import (
    BAG,
    KEYED,
    NAME,
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

def test_a_keyed_table_floor_is_the_first_export_ts_also_with_chunks_read_under_a_later_one() -> None:
    progress = Progress()
    progress.plans[KEYED] = keyed_plan()
    progress.chunks[KEYED] = {0: done("A", 100), 1: done("B", 200), 2: done("B", 200)}
    copy, _ = initial_copy(progress, SpanSnapshot("copying", (("A", 100), ("B", 200))))
    assert copy.floors([KEYED]) == {"public.big": 100}


@pytest.mark.parametrize(("recorded", "floor"), [(("A", 100), 100), (("B", 200), 200)])
def test_a_keyless_table_floor_is_the_ts_its_whole_chunk_was_read_at(recorded: tuple[str, int], floor: int) -> None:
    progress = Progress()
    progress.plans[BAG] = bag_plan()
    progress.chunks[BAG] = {0: done(*recorded)}
    copy, _ = initial_copy(progress, SpanSnapshot("copying", (("A", 100), ("B", 200))))
    assert copy.floors([BAG]) == {"public.bag": floor}


@pytest.mark.parametrize("read_at", [100, 300])
def test_a_repeated_snapshot_name_is_told_apart_by_its_position(read_at: int) -> None:
    """The upstream restarted between the runs and exported the same name again: the record's Ts decides (a lookup by
    name took the last export's Ts, 300, for a copy read at 100: every change in (100, 300] would have been lost)."""
    progress = Progress()
    progress.plans[BAG] = bag_plan()
    progress.chunks[BAG] = {0: done(NAME, read_at)}
    copy, _ = initial_copy(progress, SpanSnapshot("copying", ((NAME, 100), (NAME, 300))))
    assert copy.floors([BAG]) == {"public.bag": read_at}


@pytest.mark.parametrize(("recorded", "why"), [
    (("B", 100), "disagree"),                 # the Ts of export A under the name of export B
    ((NAME, 250), "disagree"),                # an exported name at a Ts it was not exported at
    (("C", 150), "none of this span"),        # neither
    (("A", 0), "without the Ts"),             # no position recorded
    ((None, 0), "without the Ts"),
])
def test_a_keyless_record_whose_name_and_position_are_not_one_export_is_refused(
        recorded: tuple[str | None, int], why: str) -> None:
    progress = Progress()
    progress.plans[BAG] = bag_plan()
    progress.chunks[BAG] = {0: done(*recorded)}
    copy, _ = initial_copy(progress, SpanSnapshot("copying", (("A", 100), ("B", 200), (NAME, 300))))
    with pytest.raises(SnapshotPositionUnknown, match=why) as err:
        copy.floors([BAG])
    assert err.value.table == "public.bag"
    assert "public.bag" in err.value.message and "cdc cli changefeed resume -c cf" in err.value.message
    assert not err.value.retryable  # the changefeed fails: loudly, until resumed


def test_a_keyless_table_recopied_under_a_later_export_gets_that_exports_ts_and_keyed_ones_keep_the_first() -> None:
    """Run 1 (export A at 100) copies the keyed table and is killed before the key-less one; run 2 (export B at 200)
    copies the key-less table whole: its floor is 200, the keyed table's stays 100."""
    progress = Progress()
    up = Upstream([BAG, KEYED], [("A", 100), ("B", 200)])
    up.plans = {KEYED: keyed_plan(), BAG: bag_plan()}
    up.schemas = {KEYED: table_schema(KEYED, True), BAG: table_schema(BAG, False)}
    killed = Job(progress, copy={KEYED})
    first, _ = initial_copy(progress, None, up, killed)
    with pytest.raises(RuntimeError, match="killed"):
        first(threading.Event())
    assert 0 not in progress.chunks.get(BAG, {}) and progress.runs_ended == 1
    assert killed.prepared == []  # the process started ahead of the run is ended with it
    job = Job(progress)
    second, stored = initial_copy(progress, first.state, up, job)
    floors = second(threading.Event())
    assert floors == {"public.bag": 200, "public.big": 100}
    assert [r.tables for r in job.requests] == [(BAG,)]  # only what was left
    assert job.prepared == []
    assert stored[-1].phase == "done" and stored[-1].exports == (("A", 100), ("B", 200))


def test_an_empty_keyless_table_is_recorded_at_its_exports_position() -> None:
    progress = Progress()
    up = Upstream([BAG], [(NAME, 100)])
    up.plans = {BAG: plan_from_bounds(BAG, 0, 100, None)}
    up.schemas = {BAG: table_schema(BAG, False)}
    job = Job(progress)
    copy, _ = initial_copy(progress, None, up, job)
    assert copy(threading.Event()) == {"public.bag": 100}
    assert job.requests == []  # nothing to copy: no job at all
    assert job.prepared == []  # and the process started ahead of the plan is ended
    assert progress.chunks[BAG][0].commit_ts == 100


def test_a_run_that_finds_a_keyless_copy_it_cannot_place_drops_it_and_the_next_run_copies_it_again() -> None:
    progress = Progress()
    progress.plans = {KEYED: keyed_plan(), BAG: bag_plan()}
    progress.chunks = {KEYED: {i: done("A", 100) for i in range(3)}, BAG: {0: done("A", 0)}}  # an older record
    up = Upstream([BAG, KEYED], [("B", 200), ("C", 300)])
    up.plans = {KEYED: keyed_plan(), BAG: bag_plan()}
    up.schemas = {KEYED: table_schema(KEYED, True), BAG: table_schema(BAG, False)}
    first, stored = initial_copy(progress, SpanSnapshot("copying", (("A", 100),)), up)
    with pytest.raises(SnapshotPositionUnknown):
        first(threading.Event())
    assert progress.forgotten == [BAG] and BAG not in progress.plans
    assert stored[-1].phase == "copying"  # never done: nothing streams
    job = Job(progress)
    second, stored = initial_copy(progress, first.state, up, job)
    assert second(threading.Event()) == {"public.bag": 300, "public.big": 100}
    assert [r.tables for r in job.requests] == [(BAG,)]


def test_a_keyed_table_read_under_several_snapshots_gets_a_ceiling_others_none() -> None:
    """The ceiling (the last snapshot one of its chunks was read under) bounds the window in which replayed changes
    are checked (processor.batcher): only for a keyed table whose chunks are newer than its floor."""
    progress = Progress()
    progress.plans[KEYED] = keyed_plan()
    progress.chunks[KEYED] = {0: done("A", 100), 1: done("B", 200), 2: done("C", 300)}
    progress.plans[BAG] = bag_plan()
    progress.chunks[BAG] = {0: done("B", 200)}
    copy, _ = initial_copy(progress, SpanSnapshot("copying", (("A", 100), ("B", 200), ("C", 300))))
    floors = copy.floors([KEYED, BAG])
    assert copy.chunk_ceilings([KEYED, BAG], floors) == {"public.big": 300}  # key-less: one snapshot, exact
    progress.chunks[KEYED] = {i: done("A", 100) for i in range(3)}
    assert copy.chunk_ceilings([KEYED], floors) == {}  # one snapshot: no window


# ---- relation oids: floors found by oid, a table renamed between two runs --------------------------------------
BAG2 = TableName("public", "bag2")


def _renamed_between_runs(merge: bool = False) -> tuple[Progress, Upstream, Restarts]:
    """Run 1 (export A at 100) planned ``public.bag`` (relation 7001) and copied its whole chunk (a committed chunk's
    rows are in the target ``bag``), then died; the table was renamed to ``bag2`` before run 2 (export B at 200)."""
    progress = Progress()
    progress.plans[BAG] = dataclasses.replace(bag_plan(), ts=100, snapshot="A", oid=7001)
    progress.chunks[BAG] = {0: done("A", 100)}
    up = Upstream([KEYED, BAG2], [("B", 200)])
    up.plans = {KEYED: keyed_plan(), BAG2: plan_from_bounds(BAG2, 50, 100, None)}
    up.schemas = {KEYED: dataclasses.replace(table_schema(KEYED, True), relation_id=7000),
                  BAG2: dataclasses.replace(table_schema(BAG2, False), relation_id=7001)}
    progress.plans[KEYED] = dataclasses.replace(keyed_plan(), ts=100, snapshot="A", oid=7000,
                                                definition=table_definition(up.schemas[KEYED]))
    progress.chunks[KEYED] = {i: done("A", 100) for i in range(3)}
    return progress, up, Restarts(progress)


def test_each_floor_is_stored_with_its_tables_relation_oid() -> None:
    progress, up, restart = _renamed_between_runs()
    del progress.plans[BAG], progress.chunks[BAG]
    up.tables = [KEYED]
    copy, stored = initial_copy(progress, SpanSnapshot("copying", (("A", 100),)), up, restart=restart)
    assert copy(threading.Event()) == {"public.big": 100}
    assert stored[-1].oids == {"public.big": 7000} == copy.oids


def test_a_table_renamed_between_two_runs_is_copied_again_under_its_new_name_and_its_old_target_removed() -> None:
    """Its old target is removed before its old records go, it is planned (with its oid) and copied whole under the
    new run's snapshot: its floor, found by oid, covers its changes under the old name and the rename. Left as it
    was, the target kept a stale ``bag`` beside ``bag2`` and etcd a plan of a table the span no longer has."""
    progress, up, restart = _renamed_between_runs()
    job = Job(progress)
    copy, stored = initial_copy(progress, SpanSnapshot("copying", (("A", 100),)), up, job, restart=restart)
    assert copy(threading.Event()) == {"public.big": 100, "public.bag2": 200}
    assert progress.events == ["restart public.bag", "forget public.bag"] and restart.calls == [(BAG, 200)]
    assert BAG not in progress.plans and progress.plans[BAG2].oid == 7001
    assert [r.tables for r in job.requests] == [(BAG2,)]
    assert stored[-1].oids == {"public.big": 7000, "public.bag2": 7001}


def test_a_keyed_table_renamed_between_two_runs_goes_on_under_its_planned_name_and_plan() -> None:
    """docs/ddl.md, "A table renamed during its initial copy": ``big`` (keyed, REPLICA IDENTITY FULL: its replay sends
    every value) was planned by run 1 at 100 with one chunk of three copied, and renamed ``big2`` before run 2. Run 2
    finds it by the plan's oid and goes on under the planned name and plan: nothing removed, nothing planned again,
    the job asked for ``big``'s chunks left (read by oid under run 2's snapshot), the floor the plan's Ts (the stream
    replays the rename), the ceiling run 2's. Without it the table was copied again whole under ``big2`` at 200,
    after the rename: ahead of another span's barrier at it."""
    big2 = TableName("public", "big2")
    progress = Progress()
    schema = dataclasses.replace(table_schema(big2, True), relation_id=7000, replica_identity="f")
    progress.plans[KEYED] = dataclasses.replace(keyed_plan(), ts=100, snapshot="A", oid=7000,
                                                definition=table_definition(schema))
    progress.chunks[KEYED] = {0: done("A", 100)}
    up = Upstream([big2], [("B", 200)])
    up.schemas = {big2: schema}
    restart = Restarts(progress)
    job = Job(progress)
    copy, stored = initial_copy(progress, SpanSnapshot("copying", (("A", 100),)), up, job, restart=restart)
    assert copy(threading.Event()) == {"public.big": 100}
    assert restart.calls == [] and big2 not in progress.plans and progress.plans[KEYED].ts == 100
    assert [r.tables for r in job.requests] == [(KEYED,)]
    assert stored[-1].oids == {"public.big": 7000} and stored[-1].ceilings == {"public.big": 200}


def test_a_keyed_table_renamed_between_two_runs_whose_replay_may_leave_values_unsent_is_copied_again() -> None:
    """The same without REPLICA IDENTITY FULL (a text column: an UPDATE may leave its value unsent): such a table is
    never copied under two snapshots, so it is copied again whole under its new name (and a barrier at the rename may
    refuse that copy, loudly)."""
    big2 = TableName("public", "big2")
    progress = Progress()
    schema = dataclasses.replace(table_schema(big2, True), relation_id=7000)
    progress.plans[KEYED] = dataclasses.replace(keyed_plan(), ts=100, snapshot="A", oid=7000,
                                                definition=table_definition(schema))
    progress.chunks[KEYED] = {0: done("A", 100)}
    up = Upstream([big2], [("B", 200)])
    up.schemas = {big2: schema}
    up.plans = {big2: plan_from_bounds(big2, 300, 100, ("id",), [("100",), ("200",)])}
    restart = Restarts(progress)
    copy, _ = initial_copy(progress, SpanSnapshot("copying", (("A", 100),)), up, Job(progress), restart=restart)
    assert copy(threading.Event()) == {"public.big2": 200}
    assert restart.calls == [(KEYED, 200)] and KEYED not in progress.plans


def test_a_table_renamed_between_two_runs_of_a_merge_is_refused_naming_the_fix() -> None:
    """Under merge the old target holds the user's rows: not removed; the records go, the fix is named."""
    progress, up, restart = _renamed_between_runs()
    copy, _ = initial_copy(progress, SpanSnapshot("copying", (("A", 100),)), up, restart=restart, merge=True)
    with pytest.raises(SnapshotTableChanged, match="rename the target table public.bag to public.bag2"):
        copy(threading.Event())
    assert restart.calls == [] and BAG not in progress.plans


def test_a_table_copy_never_takes_another_tables_plan_for_a_renamed_ones() -> None:
    """A table copy plans only its tables, and the stream has applied every rename downstream already: the plan of a
    table it does not copy, stored under a name that now belongs to another relation, is no orphan; nothing is
    removed."""
    progress, up, restart = _renamed_between_runs()
    progress.chunks[BAG2] = {}
    copy, _ = initial_copy(progress, SpanSnapshot("copying", (), {"public.big": 100}, ("public.bag2",)), up,
                           restart=restart)
    copy(threading.Event())
    assert restart.calls == [] and BAG in progress.plans
