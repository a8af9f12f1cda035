"""Snapshot keys in the one key codec, and progress summed from them (no etcd: raw KVs)."""

from __future__ import annotations

import pytest

from cdc import serde
from cdc.events import TableName
from cdc.meta import keys
from cdc.meta.keys import KeyKind
from cdc.meta.kv import KV
from cdc.meta.snapshot_progress import summarize
from cdc.snapshot import ChunkDone, CopyRedone, SnapshotRun, plan_from_bounds

pytestmark = pytest.mark.unit

ODD = [TableName("public", "t"), TableName("my.schema", "a/b%c"), TableName("Ünï", "t~ x"), TableName("s", "plan")]


@pytest.mark.parametrize("table", ODD, ids=str)
def test_snapshot_keys_round_trip_for_any_table_name(table: TableName) -> None:
    plan = keys.snapshot_plan_key("c1", "cf-1", 2, table)
    chunk = keys.snapshot_chunk_key("c1", "cf-1", 2, table, 17)
    assert keys.parse_key(plan) == keys.EtcdKey(KeyKind.SNAPSHOT_PLAN, "c1", changefeed="cf-1", span=2, table=table)
    assert keys.parse_key(chunk).chunk == 17 and keys.parse_key(chunk).table == table
    prefix = keys.snapshot_table_prefix("c1", "cf-1", 2, table)
    assert plan.startswith(prefix) and chunk.startswith(prefix) and prefix.startswith(keys.snapshot_prefix("c1", "cf-1", 2))
    assert prefix.count("/") == keys.snapshot_prefix("c1", "cf-1", 2).count("/") + 1  # the table is one segment
    run = keys.snapshot_run_key("c1", "cf-1", 2)
    assert keys.parse_key(run).kind is KeyKind.SNAPSHOT_RUN and not run.startswith(prefix)


def test_snapshot_keys_sort_outside_the_cluster_snapshot_range_and_reject_forgeries() -> None:
    assert keys.SCHEMA < keys.SNAPSHOT  # MetaStore.snapshot() reads below "schema": never these keys
    for bad in ["/tidewater/c1/snapshot/cf-1/0/public.t/x", "/tidewater/c1/snapshot/cf-1/0/public.t/01",
                "/tidewater/c1/snapshot/cf-1/0/publict/plan", "/tidewater/c1/snapshot/cf-1/0/public.%2e/plan",
                "/tidewater/c1/snapshot/cf-1/x/public.t/plan", "/tidewater/c1/snapshot/cf-1/0/runs"]:
        with pytest.raises(ValueError):
            keys.parse_key(bad)
    with pytest.raises(ValueError):
        keys.EtcdKey(KeyKind.SNAPSHOT_CHUNK, "c1", changefeed="cf-1", span=0, table=TableName("s", "t"))


def _kv(key: str, value: object) -> KV:
    return KV(key, serde.to_json(value), 1, 1, 0)


def test_progress_counts_chunks_rows_rate_and_eta_per_table() -> None:
    t, u = TableName("public", "t"), TableName("public", "u")
    kvs = [_kv(keys.snapshot_plan_key("c1", "cf", 0, t), plan_from_bounds(t, 1000, 250, ("id",), [("251",), ("501",), ("751",)])),
           _kv(keys.snapshot_chunk_key("c1", "cf", 0, t, 0), ChunkDone(250, 1.0, 101.0)),
           _kv(keys.snapshot_chunk_key("c1", "cf", 0, t, 2), ChunkDone(250, 1.0, 102.0)),
           _kv(keys.snapshot_plan_key("c1", "cf", 0, u), plan_from_bounds(u, 10, 250, None)),
           _kv(keys.snapshot_run_key("c1", "cf", 0), SnapshotRun("r", 99.0))]
    p = summarize("cf", 0, kvs)
    tp, up = p.tables
    assert (tp.table, tp.chunks_done, tp.chunks_total, tp.rows_copied, tp.rows_planned) == ("public.t", 2, 4, 500, 1000)
    assert tp.rows_per_second == pytest.approx(250.0)  # 500 rows from t=100 (first start) to t=102
    assert tp.eta_seconds == pytest.approx(2.0) and not tp.done
    assert (up.chunks_done, up.chunks_total, up.rows_per_second, up.eta_seconds) == (0, 1, None, None)
    assert (p.chunks_done, p.chunks_total, p.rows_copied, p.done) == (2, 5, 500, False)
    assert p.runs == (SnapshotRun("r", 99.0),)


def test_a_keyless_table_is_shown_as_one_whole_chunk_and_a_keyed_one_by_key_ranges() -> None:
    from capture.changefeed_view import snapshot_view
    from cdc.snapshot import KEY_RANGES, WHOLE_TABLE

    bag, big = TableName("public", "bag"), TableName("public", "big")
    kvs = [KV(keys.snapshot_plan_key("c1", "cf", 0, bag), serde.to_json(plan_from_bounds(bag, 300, 100, None)), 1, 1, 0),
           KV(keys.snapshot_plan_key("c1", "cf", 0, big),
              serde.to_json(plan_from_bounds(big, 250, 100, ("id",), [("100",), ("200",)])), 1, 1, 0),
           KV(keys.snapshot_chunk_key("c1", "cf", 0, big, 0), serde.to_json(ChunkDone(100, 1.0, 1000.0)), 1, 1, 0)]
    p = summarize("cf", -1, kvs)
    by = {t.table: t for t in p.tables}
    assert by["0:public.bag"].chunking == WHOLE_TABLE == "whole table (no key)"
    assert (by["0:public.bag"].chunks_total, by["0:public.big"].chunking, by["0:public.big"].chunks_total) == (
        1, KEY_RANGES, 3)
    shown = {t["table"]: t for t in snapshot_view(p)["tables"]}  # changefeed query and the API show it
    assert shown["0:public.bag"]["chunking"] == "whole table (no key)" and shown["0:public.big"]["chunking"] == "key ranges"
    assert shown["0:public.big"]["rows_per_second"] == 100.0 and shown["0:public.big"]["eta_seconds"] == 1.5


def test_redone_keys_round_trip_and_sort_outside_the_chunk_range() -> None:
    t = TableName("s", "plan")
    redone = keys.snapshot_redone_key("c1", "cf-1", 2, t)
    assert keys.parse_key(redone) == keys.EtcdKey(KeyKind.SNAPSHOT_REDONE, "c1", changefeed="cf-1", span=2, table=t)
    start, end = keys.snapshot_chunk_range("c1", "cf-1", 2, t)
    chunks = [keys.snapshot_chunk_key("c1", "cf-1", 2, t, i) for i in (0, 9, 10, 12345)]
    assert all(start <= k < end for k in chunks)
    assert not start <= redone < end and not start <= keys.snapshot_plan_key("c1", "cf-1", 2, t) < end


T = TableName("public", "t")


def _table_keys(plan: object, chunks: dict[int, ChunkDone], redone: CopyRedone | None = None) -> list[KV]:
    kvs = [_kv(keys.snapshot_plan_key("c1", "cf", 0, T), plan)]
    kvs += [_kv(keys.snapshot_chunk_key("c1", "cf", 0, T, i), c) for i, c in chunks.items()]
    if redone is not None:
        kvs.append(_kv(keys.snapshot_redone_key("c1", "cf", 0, T), redone))
    return kvs


def test_a_restart_that_redoes_the_table_never_takes_rows_copied_back_and_measures_the_new_run() -> None:
    """Run 1 (snapshot s1) copies 3 of 4 chunks and is killed; run 2 (snapshot s2, 100 s later) drops the plan (its
    table must be read at one snapshot: forget_table keeps its rows as redone) and copies 1 chunk of the new plan."""
    plan = plan_from_bounds(T, 400, 100, ("id",), [("101",), ("201",), ("301",)])
    run1 = {i: ChunkDone(100, 1.0, 10.0 + i, "s1", 5) for i in range(3)}
    before = summarize("cf", 0, _table_keys(plan, run1))
    (t1,) = before.tables
    assert (t1.rows_copied, t1.rows_redone, t1.rows_done, t1.chunks_done) == (300, 0, 300, 3)
    assert t1.rows_per_second == pytest.approx(100.0) and t1.eta_seconds == pytest.approx(1.0)

    dropped = CopyRedone(rows=300, chunks=3, restarts=1)  # what forget_table stores, atomically with the deletes
    between = summarize("cf", 0, [_kv(keys.snapshot_redone_key("c1", "cf", 0, T), dropped)])
    (tb,) = between.tables  # not planned again yet: still shown, with what it wrote, and no ETA
    assert (tb.rows_copied, tb.rows_redone, tb.chunks_total, tb.eta_seconds, tb.done) == (300, 300, 0, None, False)
    assert between.eta_seconds is None and not between.done

    run2 = {0: ChunkDone(100, 4.0, 114.0, "s2", 9)}
    after = summarize("cf", 0, _table_keys(plan, run2, dropped))
    (t2,) = after.tables
    assert t2.rows_copied == 400 >= t1.rows_copied  # never backwards: rows written downstream over both runs
    assert (t2.rows_redone, t2.rows_done, t2.rows_planned, t2.chunks_done, t2.chunks_total) == (300, 100, 400, 1, 4)
    assert t2.rows_per_second == pytest.approx(25.0)  # run 2's chunk alone (not 400 rows over 104 s)
    assert t2.eta_seconds == pytest.approx(300 / 25.0)  # the current plan's rows left at run 2's rate
    assert (after.rows_copied, after.rows_redone) == (400, 300)
    assert after.eta_seconds == pytest.approx(12.0) and after.rows_per_second == pytest.approx(25.0)

    # run 2 also records a chunk of run 1's snapshot that it found committed (deferred key marker): still run 2's rate
    run2[1] = ChunkDone(100, 1.0, 50.0, "s1", 5)
    assert summarize("cf", 0, _table_keys(plan, run2, dropped)).tables[0].rows_per_second == pytest.approx(25.0)


def test_the_eta_is_absent_until_measured_and_never_zero_while_chunks_are_left() -> None:
    a, b = TableName("public", "a"), TableName("public", "b")
    kvs = [_kv(keys.snapshot_plan_key("c1", "cf", 0, a), plan_from_bounds(a, 200, 100, ("id",), [("101",)])),
           _kv(keys.snapshot_chunk_key("c1", "cf", 0, a, 0), ChunkDone(100, 1.0, 11.0, "s")),
           _kv(keys.snapshot_chunk_key("c1", "cf", 0, a, 1), ChunkDone(100, 1.0, 12.0, "s")),
           _kv(keys.snapshot_plan_key("c1", "cf", 0, b),
               plan_from_bounds(b, 1100, 100, ("id",), [(str(i * 100),) for i in range(1, 11)]))]
    p = summarize("cf", 0, kvs)
    ta, tb = p.tables
    # 2 of 13 chunks done, all of table a: a is done (0), b has no rate of its own yet; the span's copy (one job for
    # both) has one: b's 1100 planned rows at 100 rows/s, not 0 (the max of the tables' ETAs was 0 here)
    assert (p.chunks_done, p.chunks_total) == (2, 13)
    assert ta.eta_seconds == 0.0 and tb.eta_seconds is None
    assert p.rows_per_second == pytest.approx(100.0) and p.eta_seconds == pytest.approx(11.0)
    # before any chunk is copied there is no rate: no ETA at all
    assert summarize("cf", 0, [kvs[0], kvs[3]]).eta_seconds is None

    # b's planned count was an estimate (1,000,000+ rows, dense key) that the rows copied already passed
    kvs[3] = _kv(keys.snapshot_plan_key("c1", "cf", 0, b),
                 plan_from_bounds(b, 150, 100, ("id",), [(str(i * 100),) for i in range(1, 11)]))
    kvs += [_kv(keys.snapshot_chunk_key("c1", "cf", 0, b, i), ChunkDone(100, 1.0, 12.0 + i, "s")) for i in (0, 1)]
    p = summarize("cf", 0, kvs)
    tb = p.tables[1]
    assert tb.rows_done == 200 > tb.rows_planned and tb.chunks_done == 2
    assert tb.eta_seconds is not None and tb.eta_seconds > 0  # 9 chunks left at 100 rows a chunk, at 100 rows/s
    assert tb.eta_seconds == pytest.approx(900 / 100.0)
    assert p.eta_seconds is not None and p.eta_seconds > 0

    # every chunk done: 0
    kvs += [_kv(keys.snapshot_chunk_key("c1", "cf", 0, b, i), ChunkDone(1, 1.0, 20.0 + i, "s")) for i in range(2, 11)]
    p = summarize("cf", 0, kvs)
    assert p.done and p.eta_seconds == 0.0 and p.tables[1].eta_seconds == 0.0


def test_the_changefeed_eta_is_the_slowest_span_at_its_own_rate() -> None:
    a, b = TableName("public", "a"), TableName("public", "b")
    kvs = [_kv(keys.snapshot_plan_key("c1", "cf", 0, a), plan_from_bounds(a, 300, 100, ("id",), [("101",), ("201",)])),
           _kv(keys.snapshot_chunk_key("c1", "cf", 0, a, 0), ChunkDone(100, 1.0, 11.0, "s0")),  # 200 left at 100/s
           _kv(keys.snapshot_plan_key("c1", "cf", 1, b), plan_from_bounds(b, 300, 100, ("id",), [("101",), ("201",)])),
           _kv(keys.snapshot_chunk_key("c1", "cf", 1, b, 0), ChunkDone(100, 10.0, 20.0, "s1"))]  # 200 left at 10/s
    p = summarize("cf", -1, kvs)
    assert p.eta_seconds == pytest.approx(20.0) and p.rows_per_second == pytest.approx(110.0)
