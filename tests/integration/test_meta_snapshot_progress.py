"""cdc.meta.snapshot_progress against a real etcd: a table's copy that starts over (forget_table) keeps the rows it
wrote as redone, so the progress a person reads never counts fewer rows copied; a chunk recorded while the records
are dropped is not lost from the count; other tables and spans are left alone."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from cdc import serde
from cdc.events import TableName
from cdc.meta import keys
from cdc.meta.etcd import EtcdClient
from cdc.meta.kv import KV
from cdc.meta.snapshot_progress import SnapshotProgressStore
from cdc.snapshot import ChunkDone, CopyRedone, plan_from_bounds
from playground.servers import EtcdServer

pytestmark = pytest.mark.integration

T, U = TableName("public", "t"), TableName("public", "u")


@pytest.fixture
def client(etcd_server: EtcdServer) -> Iterator[EtcdClient]:
    c = EtcdClient([etcd_server.url], timeout=3.0)
    yield c
    c.close()


def _plan(table: TableName, rows: int = 400) -> Any:
    return plan_from_bounds(table, rows, 100, ("id",), [("101",), ("201",), ("301",)])


def test_a_table_copied_again_keeps_its_rows_as_redone(client: EtcdClient, cluster_id: str) -> None:
    store = SnapshotProgressStore(client, cluster_id)
    for span, table in ((0, T), (0, U), (1, T)):
        store.put_plan("cf", span, _plan(table))
    for i in range(3):
        store.record_chunk("cf", 0, T, i, ChunkDone(100, 1.0, 10.0 + i, "s1", 5))
    store.record_chunk("cf", 0, U, 0, ChunkDone(7, 1.0, 10.0, "s1", 5))
    store.record_chunk("cf", 1, T, 0, ChunkDone(9, 1.0, 10.0, "s1", 5))
    assert store.progress("cf", 0).rows_copied == 307

    assert store.forget_table("cf", 0, T) == 3
    assert store.get_plan("cf", 0, T) is None and store.done_chunks("cf", 0, T) == {}
    p = store.progress("cf", 0)
    assert (p.rows_copied, p.rows_redone) == (307, 300)  # not 7: the rows written stay counted
    assert store.done_chunks("cf", 0, U) == {0: ChunkDone(7, 1.0, 10.0, "s1", 5)}  # the other table and span stay
    assert store.progress("cf", 1).rows_copied == 9

    # planned again, one chunk copied, then started over once more: redone adds up, copied never goes backwards
    store.put_plan("cf", 0, _plan(T))
    store.record_chunk("cf", 0, T, 0, ChunkDone(100, 2.0, 120.0, "s2", 9))
    by = {t.table: t for t in store.progress("cf", 0).tables}
    assert (by["public.t"].rows_copied, by["public.t"].rows_redone, by["public.t"].rows_done) == (400, 300, 100)
    assert store.forget_table("cf", 0, T) == 1
    by = {t.table: t for t in store.progress("cf", 0).tables}
    assert (by["public.t"].rows_copied, by["public.t"].rows_redone, by["public.t"].chunks_total) == (400, 400, 0)
    redone = client.get(keys.snapshot_redone_key(cluster_id, "cf", 0, T))
    assert redone is not None
    assert store.forget_table("cf", 0, T) == 0  # nothing planned: nothing to drop, the record unchanged
    again = client.get(keys.snapshot_redone_key(cluster_id, "cf", 0, T))
    assert again is not None and again.mod_revision == redone.mod_revision
    assert store.forget("cf") > 0 and store.progress("cf").tables == ()  # a removed changefeed leaves nothing


class _WhileReading(EtcdClient):
    """A client that runs ``meanwhile`` (through another client) right after its first read of a prefix: something
    else changing the table's records while they are dropped."""

    def __init__(self, urls: list[str], meanwhile: Callable[[], object]) -> None:
        super().__init__(urls, timeout=3.0)
        self.meanwhile: Callable[[], object] | None = meanwhile

    def get_prefix(self, prefix: str, *, below: str | None = None) -> tuple[int, list[KV]]:
        out = super().get_prefix(prefix, below=below)
        if self.meanwhile is not None:
            self.meanwhile()
            self.meanwhile = None
        return out


def _forget_while(etcd_server: EtcdServer, cluster_id: str, meanwhile: Callable[[], object]) -> int:
    racing = _WhileReading([etcd_server.url], meanwhile)
    try:
        return SnapshotProgressStore(racing, cluster_id).forget_table("cf", 0, T)
    finally:
        racing.close()


def test_a_chunk_recorded_while_the_records_are_dropped_is_counted(client: EtcdClient, etcd_server: EtcdServer,
                                                                   cluster_id: str) -> None:
    store = SnapshotProgressStore(client, cluster_id)
    store.put_plan("cf", 0, _plan(T))
    store.record_chunk("cf", 0, T, 0, ChunkDone(100, 1.0, 10.0, "s1", 5))
    # a late task of an earlier run commits its chunk meanwhile: the second try sees both
    late = lambda: store.record_chunk("cf", 0, T, 3, ChunkDone(50, 1.0, 20.0, "s1", 5))  # noqa: E731
    assert _forget_while(etcd_server, cluster_id, late) == 2
    stored = client.get(keys.snapshot_redone_key(cluster_id, "cf", 0, T))
    assert stored is not None
    assert serde.from_json(CopyRedone, stored.value) == CopyRedone(rows=150, chunks=2, restarts=1)
    assert store.progress("cf", 0).rows_copied == 150


def test_a_changefeed_removed_while_a_table_is_dropped_gets_no_record_back(client: EtcdClient, etcd_server: EtcdServer,
                                                                          cluster_id: str) -> None:
    store = SnapshotProgressStore(client, cluster_id)
    store.put_plan("cf", 0, _plan(T))
    store.record_chunk("cf", 0, T, 0, ChunkDone(100, 1.0, 10.0, "s1", 5))
    assert _forget_while(etcd_server, cluster_id, lambda: store.forget("cf")) == 0
    assert client.get_prefix(keys.snapshot_prefix(cluster_id, "cf"))[1] == []
