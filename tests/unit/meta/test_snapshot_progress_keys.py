"""Snapshot keys in the one key codec, and progress summed from them (no etcd: raw KVs)."""

from __future__ import annotations

import pytest

from cdc import serde
from cdc.events import TableName
from cdc.meta import keys
from cdc.meta.keys import KeyKind
from cdc.meta.kv import KV
from cdc.meta.snapshot_progress import summarize
from cdc.snapshot import ChunkDone, SnapshotRun, plan_from_bounds

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
