"""The convergence argument of docs/snapshot.md, on real PostgreSQL 18: part of a keyed table is copied under the
slot's exported snapshot, the snapshot is lost, the rest is copied under a later snapshot while writes go on,
then every change after the slot's consistent point is replayed (the slot's own pgoutput stream, mounted and
written by the same sink): the target ends equal to the upstream, row by row."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from cdc.events import RowChange, TableName
from cdc.meta.etcd import EtcdClient
from cdc.meta.snapshot_progress import SnapshotProgressStore
from cdc.snapshot import SnapshotRun
from playground.compare import compare_tables
from processor.mounter import Mounter
from sinks.factory import open_sink
from spark_jobs.copy import copy_chunks
from spark_jobs.plan import SnapshotJob
from spark_jobs.snapshot import plan_tasks
from tests.snapshot_helpers import execute, exported_snapshot
from upstream.base import encode_payload
from upstream.postgres import catalog, pgoutput
from upstream.postgres.pgoutput_messages import Begin, Commit
from upstream.postgres.source import PgChangeDecoder

pytestmark = pytest.mark.integration


def replay(pg_server: Any, db: str, slot: str, sink_uri: str, table: TableName, txns: int) -> None:
    """Apply the ``txns`` transactions the slot holds, in commit order, one ``TxnSink.write`` per transaction (what the
    span does once streaming starts). Polls: with ``synchronous_commit=off`` the slot sees a commit only once
    its WAL is flushed, a moment later."""
    conn = pg_server.connect(db)
    deadline = time.monotonic() + 10
    try:
        schema = catalog.table_schema(conn, table)
        while True:
            with conn.cursor() as cur:
                cur.execute("SELECT data FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, 'proto_version', "
                            "'1', 'publication_names', 'p_conv')", (slot,))
                messages = [bytes(r[0]) for r in cur.fetchall()]
            if sum(m[:1] == b"C" for m in messages) >= txns or time.monotonic() > deadline:
                break
            time.sleep(0.1)
    finally:
        conn.close()
    mounter = Mounter(PgChangeDecoder(lambda v: schema))
    sink = open_sink(sink_uri)
    applied = 0
    try:
        pending: list[bytes] = []
        for raw in messages:
            kind = raw[:1]
            if kind in (b"I", b"U", b"D"):
                pending.append(raw)
                continue
            msg = pgoutput.decode(raw, False)
            if isinstance(msg, Begin):
                pending = []
            elif isinstance(msg, Commit):
                changes: list[RowChange] = [mounter.mount(encode_payload(0, r), msg.end_lsn, msg.commit_time)
                                            for r in pending]
                if changes:
                    sink.write(changes)
                    applied += 1
    finally:
        sink.close()
    assert applied == txns


def test_chunks_copied_under_a_later_snapshot_converge_once_the_stream_is_replayed(
        pg_server: Any, pg_database: str, etcd_server: Any, cluster_id: str, tmp_path: Path) -> None:
    execute(pg_server, pg_database,
            "CREATE TABLE kv (id int PRIMARY KEY, v text NOT NULL, n int)",
            "INSERT INTO kv SELECT i, 'v' || i, i FROM generate_series(1, 3000) i",
            "CREATE PUBLICATION p_conv FOR TABLE kv")
    target = f"sqlite:///{tmp_path / 'target.db'}"
    table = TableName("public", "kv")
    with exported_snapshot(pg_server, pg_database) as exp, EtcdClient([etcd_server.url]) as client:
        store = SnapshotProgressStore(client, cluster_id)
        job = SnapshotJob(changefeed="cf-conv", upstream=pg_server.uri(pg_database), sink=target,
                          tables=("public.kv",), etcd=(etcd_server.url,), cluster=cluster_id, snapshot=exp.snapshot,
                          commit_ts=exp.commit_ts, chunk_rows=500)
        # writes after the consistent point, all over the key range, before any chunk is read
        execute(pg_server, pg_database, "UPDATE kv SET v = 'w1', n = n + 1 WHERE id % 7 = 0",
                "DELETE FROM kv WHERE id % 11 = 0", "INSERT INTO kv SELECT i, 'new1', 0 FROM generate_series(3001, 3100) i")
        tasks, total = plan_tasks(job, store, "run-1")
        assert total == 6 and len(tasks) == 6
        store.begin_run("cf-conv", 0, SnapshotRun("run-1", time.time()))
        assert all(r.error is None for r in copy_chunks(tasks[:3]))  # half, under the exported snapshot
        exp.expire()  # the copy's capture died: the exported snapshot is gone
        execute(pg_server, pg_database, "UPDATE kv SET v = 'w2' WHERE id % 5 = 0",
                "DELETE FROM kv WHERE id BETWEEN 2000 AND 2100",
                "INSERT INTO kv SELECT i, 'new2', 0 FROM generate_series(3101, 3200) i",
                "UPDATE kv SET id = id + 10000 WHERE id BETWEEN 10 AND 20")  # key changes across chunks
        later = SnapshotJob(**{**job.__dict__, "snapshot": None})  # the rest at the reader's own, later snapshot
        rest, _ = plan_tasks(later, store, "run-2")
        assert [t.chunk.index for t in rest] == [3, 4, 5]  # the stored plan: same ranges, the done ones skipped
        store.begin_run("cf-conv", 0, SnapshotRun("run-2", time.time()))
        results = list(copy_chunks(rest))
        assert all(r.error is None for r in results)
        store.end_run("cf-conv", 0)
        execute(pg_server, pg_database, "UPDATE kv SET v = 'w3' WHERE id % 3 = 0", "DELETE FROM kv WHERE id < 100")

        # before the replay the target is not the upstream (otherwise this test proves nothing)
        conn = pg_server.connect(pg_database)
        try:
            assert not compare_tables(conn, ["public.kv"], target)[0].equal
            replay(pg_server, pg_database, exp.slot, target, table, 9)  # 3 + 4 + 2 statements, one txn each
            [diff] = compare_tables(conn, ["public.kv"], target)
        finally:
            conn.close()
        assert diff.equal, (diff.missing, diff.extra, diff.different, diff.sample)
        assert diff.source_rows == diff.target_rows > 2500


def _mounted_txns(pg_server: Any, db: str, slot: str, publication: str, table: TableName) -> list[Any]:
    """The slot's transactions as the sorter hands them to the span (SortedTxn of stored payloads), and a mount."""
    from sorter.base import SortedTxn

    conn = pg_server.connect(db)
    try:
        schema = catalog.table_schema(conn, table)
        time.sleep(0.5)  # (synchronous_commit=off: the slot reads WAL once it is flushed)
        with conn.cursor() as cur:
            cur.execute("SELECT pg_current_wal_flush_lsn()")
            cur.execute("SELECT data FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, 'proto_version', "
                        "'1', 'publication_names', %s)", (slot, publication))
            messages = [bytes(r[0]) for r in cur.fetchall()]
    finally:
        conn.close()
    out, pending = [], []
    for raw in messages:
        if raw[:1] in (b"I", b"U", b"D"):
            pending.append(encode_payload(0, raw))
            continue
        msg = pgoutput.decode(raw, False)
        if isinstance(msg, Begin):
            pending = []
        elif isinstance(msg, Commit):
            out.append(SortedTxn(msg.end_lsn, msg.commit_time, len(pending), pending))
    return [out, Mounter(PgChangeDecoder(lambda v: schema)).mount]


@pytest.mark.parametrize("toast", [False, True], ids=["values-sent", "toast-unsent"])
def test_key_rotations_replayed_over_a_later_copy_converge(pg_server: Any, pg_database: str, tmp_path: Path,
                                                           toast: bool) -> None:
    """Rows rotate keys (a row moves to a new key, another moves into the key it left) before and after the table
    is copied at a snapshot later than its floor; the changes after the floor are replayed through the span's real
    batcher (the window up to the copy's snapshot marked replayed, one transaction per write) and the SQL sink.
    Found by a kill during a copy: a write netting several replayed transactions kept rows the copy held at keys
    that later moved on (extra rows), and a key change leaving a TOASTed value unsent took the value of the row the
    later copy had put at the old key (or lost the row). Both end equal now."""
    import random

    from processor.batcher import TxnBatcher
    from upstream import open_upstream

    big = "(SELECT string_agg(md5(random()::text), '') FROM generate_series(1, 200))" if toast else "'x' || g"
    execute(pg_server, pg_database, "CREATE TABLE zt (id int PRIMARY KEY, small int, big text)",
            f"INSERT INTO zt SELECT g, 0, {big} FROM generate_series(1, 60) g",
            "CREATE PUBLICATION p_rot FOR TABLE zt")
    target = f"sqlite:///{tmp_path / 't.db'}"
    table = TableName("public", "zt")
    rnd = random.Random(3)
    conn = pg_server.connect(pg_database)
    conn.autocommit = False

    def rotations(first: int, n: int) -> None:
        with conn.cursor() as cur:
            for i in range(first, first + n):
                cur.execute("SELECT id FROM zt")
                ids = [r[0] for r in cur.fetchall()]
                a, b = rnd.sample(ids, 2)
                cur.execute("UPDATE zt SET id = %s WHERE id = %s", (max(ids) + 1 + i, a))
                cur.execute("UPDATE zt SET id = %s WHERE id = %s", (a, b))
                cur.execute("UPDATE zt SET small = small + 1 WHERE id = %s", (rnd.choice(ids),))
                conn.commit()

    up = open_upstream(pg_server.uri(pg_database))
    try:
        with exported_snapshot(pg_server, pg_database) as exp:  # the floor: the first run's snapshot
            rotations(0, 40)
            with up.snapshot_reader(None) as reader:  # the copy, under a later snapshot (the first one lost)
                schema = reader.table_schema(table)
                (chunk,) = reader.plan(schema, 1000).chunks
                copied = list(reader.read_chunk(schema, chunk, commit_ts=1))
            with conn.cursor() as cur:  # (the insert position: with synchronous_commit=off the write one lags)
                cur.execute("SELECT pg_current_wal_insert_lsn()")
                hi, lo = cur.fetchone()[0].split("/")
                ceiling = (int(hi, 16) << 32) | int(lo, 16)
            conn.commit()
            rotations(40, 40)
            txns, mount = _mounted_txns(pg_server, pg_database, exp.slot, "p_rot", table)
        assert len(txns) == 80 and sum(t.commit_ts <= ceiling for t in txns) == 40 and txns[-1].commit_ts > ceiling
        sink = open_sink(target)
        reader_rows = up.row_source(label="test")
        sink.set_row_source(reader_rows)
        try:
            sink.write(copied)
            batcher = TxnBatcher(txns, mount, 20_000, floors={"public.zt": exp.commit_ts},
                                 ceilings={"public.zt": ceiling})
            writes = 0
            while batcher.has_more():
                sink.write(batcher.next_batch())
                writes += 1
            assert writes >= 40  # the replayed transactions one per write, then the rest together
        finally:
            sink.close()
            reader_rows.close()
        [diff] = compare_tables(conn, ["public.zt"], target)
        assert diff.equal, (diff.missing[:5], diff.extra[:5], diff.different[:5], diff.source_rows, diff.target_rows)
    finally:
        conn.close()
        up.close()
