"""A table altered upstream between two runs of its copy (docs/snapshot.md, "A table changed between two runs"),
driven through the span's copy phase (processor.snapshot.InitialCopy) against real PostgreSQL (upstream and
target), etcd and the job's code (run in this process, no Spark):

- run 1 plans every table, copies some chunks of ``big`` into a PostgreSQL target it creates without the key (chunk
  markers) and is killed; then ``big`` gets a column with a default, ``comp`` another primary key and the key-less
  ``bag`` a column; run 2 drops their targets and markers, plans them again and copies them under its snapshot:
  each target equals the upstream row by row (a multiset for ``bag``), has the new shape and its key, and every
  floor is run 2's Ts. Without the restart, run 2 fails on the missing column (checked: the old behaviour);
- under ``on-existing-rows = "merge"`` run 2 is refused naming the table and the fix, and the user's target keeps
  its rows."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from cdc.errors import SnapshotTableChanged
from cdc.events import TableName
from cdc.meta.etcd import EtcdClient
from cdc.meta.snapshot_progress import SnapshotProgressStore
from cdc.model import ChangefeedInfo, SpanInfo, SpanSnapshot
from cdc.snapshot import KEY_BUILT, SnapshotRun
from playground.compare import compare_tables
from playground.compare_schema import assert_schemas_equal
from processor.snapshot import CopyRequest, InitialCopy
from sinks.factory import open_sink
from spark_jobs.copy import copy_chunks
from spark_jobs.plan import SnapshotJob
from spark_jobs.snapshot import plan_tasks, run
from tests.snapshot_helpers import execute
from upstream import open_upstream

pytestmark = pytest.mark.integration

TABLES = ["public.big", "public.comp", "public.bag"]


@pytest.fixture
def target(pg_server: Any) -> Iterator[str]:
    name = f"tgt_{uuid.uuid4().hex[:12]}"
    pg_server.create_database(name)
    yield name
    pg_server.drop_database(name)


def _load(pg_server: Any, db: str) -> None:
    execute(pg_server, db,
            "CREATE TABLE big (id int PRIMARY KEY, v text, n int)",
            "INSERT INTO big SELECT g, 'v' || g, g % 97 FROM generate_series(1, 3000) g",
            "CREATE TABLE comp (a int, b text, c int, PRIMARY KEY (a, b))",
            "INSERT INTO comp SELECT g % 50, 'b' || (g / 50), g FROM generate_series(1, 1000) g",
            "CREATE TABLE bag (g int, s text)", "ALTER TABLE bag REPLICA IDENTITY FULL",
            "INSERT INTO bag SELECT CASE WHEN g % 9 = 0 THEN NULL ELSE g % 30 END, "
            "CASE WHEN g % 4 = 0 THEN NULL ELSE 's' || (g % 2) END FROM generate_series(1, 600) g",
            "CREATE PUBLICATION p_alt FOR TABLE big, comp, bag")


class Launcher:
    """The job, in this process: ``chunks`` copies only that many chunks of ``big`` and then 'dies' (run 1); None runs
    it."""

    def __init__(self, etcd: str, cluster: str, chunks: int | None) -> None:
        self.etcd, self.cluster, self.chunks = etcd, cluster, chunks

    def prepare(self, changefeed: str, span: int, sink_uri: str = "") -> None:
        pass  # runs in this process: nothing to start ahead

    def discard(self, changefeed: str, span: int) -> None:
        pass

    def __call__(self, request: CopyRequest, stop: threading.Event) -> None:
        job = SnapshotJob(changefeed=request.changefeed, upstream=request.upstream_uri, sink=request.sink_uri,
                          tables=tuple(str(t) for t in request.tables), etcd=(self.etcd,), span=request.span,
                          cluster=self.cluster, snapshot=request.snapshot, commit_ts=request.commit_ts,
                          commit_time=request.commit_time, chunk_rows=request.chunk_rows, local=True,
                          defer_keys=request.defer_keys)
        if self.chunks is None:
            run(job)
            return
        with EtcdClient([self.etcd]) as client:
            store = SnapshotProgressStore(client, self.cluster)
            store.begin_run(job.changefeed, job.span, SnapshotRun("run-1", time.time()))
            tasks, _ = plan_tasks(job, store, "run-1")
        big = [t for t in tasks if t.chunk.table == "big"]  # bag and comp: planned, nothing copied
        assert all(r.error is None for r in copy_chunks(big[:self.chunks]))
        raise RuntimeError("the job was killed")


def _copy(pg_server: Any, db: str, sink: str, etcd: Any, cluster: str, state: SpanSnapshot | None,
          chunks: int | None, merge: bool = False) -> tuple[InitialCopy, list[SpanSnapshot]]:
    info = ChangefeedInfo("cf-alt", pg_server.uri(db), sink, {}, 0, 0.0, 0.0, (SpanInfo(0, "unused", "p_alt"),),
                          initial_copy=True)
    stored: list[SpanSnapshot] = []

    def restart(schema: Any, ts: int, at: float) -> None:
        s = open_sink(sink)
        try:
            s.restart_copy_target(schema, info.id, 0, ts, at)
        finally:
            s.close()

    client = EtcdClient([etcd.url])
    copy = InitialCopy(info, info.spans[0], open_upstream(info.upstream_uri), SnapshotProgressStore(client, cluster),
                       Launcher(etcd.url, cluster, chunks), stored.append, state, chunk_rows=500,
                       spark_master="local[1]", label="cf-alt/0", defer_keys=not merge, restart_target=restart,
                       merge=merge)
    return copy, stored


def _alter(pg_server: Any, db: str, keyless: bool = True) -> None:
    execute(pg_server, db,
            "ALTER TABLE big ADD COLUMN c int DEFAULT 7",  # rows copied before have no c; the new ones 7
            "UPDATE big SET c = id WHERE id % 11 = 0", "DELETE FROM big WHERE id % 13 = 0",
            "ALTER TABLE comp DROP CONSTRAINT comp_pkey, ADD PRIMARY KEY (a, b, c)")
    if keyless:  # (merge is refused for key-less tables at create)
        execute(pg_server, db, "ALTER TABLE bag ADD COLUMN t text DEFAULT 'x'",
                "INSERT INTO bag VALUES (1, NULL, 'y'), (1, NULL, 'y'), (NULL, NULL, NULL)")


def test_tables_altered_between_two_runs_are_copied_again_from_new_targets_and_equal_the_upstream(
        pg_server: Any, pg_database: str, target: str, etcd_server: Any, cluster_id: str) -> None:
    _load(pg_server, pg_database)
    sink = pg_server.uri(target)
    first, _ = _copy(pg_server, pg_database, sink, etcd_server, cluster_id, None, chunks=3)
    with pytest.raises(RuntimeError, match="killed"):
        first(threading.Event())
    with EtcdClient([etcd_server.url]) as client:
        store = SnapshotProgressStore(client, cluster_id)
        assert len(store.done_chunks("cf-alt", 0, TableName("public", "big"))) == 3
        assert store.get_plan("cf-alt", 0, TableName("public", "big")).definition == "(id:integer, v:text, " \
            "n:integer) key(id)"
    markers = pg_server.execute('SELECT count(*) FROM "tidewater"."tidewater_copy_chunk"', db=target)
    assert markers == [(3,)]  # big's target was created without its key: chunks committed with markers
    _alter(pg_server, pg_database)

    second, stored = _copy(pg_server, pg_database, sink, etcd_server, cluster_id, first.state, chunks=None)
    floors = second(threading.Event())
    state = stored[-1]
    assert state.phase == "done" and len(state.exports) == 2
    run2 = state.exports[1][1]
    assert floors == {t: run2 for t in TABLES}  # every row of every table read at run 2's snapshot
    conn = pg_server.connect(pg_database)
    try:
        diffs = compare_tables(conn, TABLES, sink)
        assert all(d.equal for d in diffs), diffs
        assert all(d.source_rows > 0 for d in diffs), diffs
        assert_schemas_equal(conn, TABLES, sink)  # the new columns, types and keys
    finally:
        conn.close()
    with EtcdClient([etcd_server.url]) as client:
        store = SnapshotProgressStore(client, cluster_id)
        plan = store.get_plan("cf-alt", 0, TableName("public", "big"))
        assert plan.key_state == KEY_BUILT and plan.ts == run2 and "c:integer" in plan.definition
        assert {d.snapshot for d in store.done_chunks("cf-alt", 0, TableName("public", "big")).values()} == {
            state.exports[1][0]}
    assert pg_server.execute('SELECT count(*) FROM "tidewater"."tidewater_copy_chunk"', db=target) == [(0,)]


def test_under_merge_an_altered_table_is_refused_and_the_users_target_is_kept(
        pg_server: Any, pg_database: str, target: str, etcd_server: Any, cluster_id: str) -> None:
    _load(pg_server, pg_database)
    sink = pg_server.uri(target)
    execute(pg_server, target, "CREATE TABLE big (id int PRIMARY KEY, v text, n int)",
            "INSERT INTO big VALUES (-1, 'mine', 0)")
    first, _ = _copy(pg_server, pg_database, sink, etcd_server, cluster_id, None, chunks=2, merge=True)
    with pytest.raises(RuntimeError, match="killed"):
        first(threading.Event())
    _alter(pg_server, pg_database, keyless=False)
    second, stored = _copy(pg_server, pg_database, sink, etcd_server, cluster_id, first.state, chunks=None,
                           merge=True)
    with pytest.raises(SnapshotTableChanged) as err:
        second(threading.Event())
    msg = err.value.message
    assert "public.big" in msg and "c:integer" in msg and "merge" in msg and "resume -c cf-alt" in msg, msg
    assert stored[-1].phase == "copying"
    assert pg_server.execute("SELECT count(*) FROM big WHERE id = -1", db=target) == [(1,)]
    assert pg_server.execute("SELECT count(*) FROM big", db=target)[0][0] > 1  # run 1's chunks are still there


def _half_read_then(pg_server: Any, db: str, reader: Any, table: str, ddl: str) -> tuple[Any, Any]:
    """Plan ``public.<table>`` (1,000 rows, ids 1..1000) in two chunks, read the first under the reader's snapshot
    (500 rows), release it, then run ``ddl`` upstream; returns the schema and the plan."""
    from cdc.snapshot import plan_from_bounds

    schema = reader.table_schema(TableName("public", table))
    plan = plan_from_bounds(schema.name, 1000, 500, ("id",), [("501",)])
    assert len(list(reader.read_chunk(schema, plan.chunks[0]))) == 500
    reader.release()
    execute(pg_server, db, ddl)
    return schema, plan


def test_a_table_rewritten_after_the_snapshot_is_refused_not_read_empty(
        pg_server: Any, pg_database: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rewriting ALTER TABLE (or TRUNCATE) committed between two chunk reads under one exported snapshot makes
    PostgreSQL show the table empty to that snapshot: the reader refuses (retryable) instead of copying nothing."""
    from cdc.errors import SnapshotTableRewritten
    from tests.snapshot_helpers import exported_snapshot
    from upstream.postgres.snapshot_read import PgSnapshotReader

    execute(pg_server, pg_database, "CREATE TABLE big (id int PRIMARY KEY, v text, n int)",
            "INSERT INTO big SELECT g, 'v' || g, g FROM generate_series(1, 1000) g")
    with exported_snapshot(pg_server, pg_database) as exp:
        reader = PgSnapshotReader(pg_server.uri(pg_database), exp.snapshot)
        try:
            schema, plan = _half_read_then(pg_server, pg_database, reader, "big",
                                           "ALTER TABLE big ALTER COLUMN n TYPE bigint")  # rewrites the table
            with pytest.raises(SnapshotTableRewritten, match="public.big") as err:
                list(reader.read_chunk(schema, plan.chunks[1]))
            assert err.value.retryable
            reader.release()
            with pytest.raises(SnapshotTableRewritten):
                reader.read_chunk_text(schema, plan.chunks[1]).blocks.__next__()  # the passthrough, too
            reader.release()
            # what the check prevents: the same read, unchecked, finds none of the 500 rows
            monkeypatch.setattr(PgSnapshotReader, "_check_not_rewritten", lambda self, conn, name: None)
            assert list(reader.read_chunk(schema, plan.chunks[1])) == []
        finally:
            reader.close()


def test_a_partitioned_table_is_read_and_a_rewrite_of_its_leaves_after_the_snapshot_is_refused(
        pg_server: Any, pg_database: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A partitioned root has no storage of its own (relfilenode 0): its leaves are checked. A root read at the
    snapshot is not refused (it was, on every run, so a changefeed over a partitioned table never finished its copy);
    a rewrite of its leaves after the snapshot is, as for a plain table."""
    from cdc.errors import SnapshotTableRewritten
    from tests.snapshot_helpers import exported_snapshot
    from upstream.postgres.snapshot_read import PgSnapshotReader

    execute(pg_server, pg_database, "CREATE TABLE m (id int PRIMARY KEY, v text) PARTITION BY RANGE (id)",
            "CREATE TABLE m1 PARTITION OF m FOR VALUES FROM (0) TO (500)",
            "CREATE TABLE m2 PARTITION OF m FOR VALUES FROM (500) TO (2000)",
            "INSERT INTO m SELECT g, 'v' || g FROM generate_series(1, 1000) g")
    with exported_snapshot(pg_server, pg_database) as exp:
        reader = PgSnapshotReader(pg_server.uri(pg_database), exp.snapshot)
        try:
            schema, plan = _half_read_then(pg_server, pg_database, reader, "m",
                                           "ALTER TABLE m ALTER COLUMN v TYPE int USING length(v)")  # rewrites
            with pytest.raises(SnapshotTableRewritten, match="public.m"):
                list(reader.read_chunk(schema, plan.chunks[1]))
            reader.release()
            monkeypatch.setattr(PgSnapshotReader, "_check_not_rewritten", lambda self, conn, name: None)
            assert list(reader.read_chunk(schema, plan.chunks[1])) == []  # what the check prevents
        finally:
            reader.close()


@pytest.mark.parametrize("statement", ["TRUNCATE t", "TRUNCATE t2", "VACUUM FULL t", "CLUSTER t USING t_pkey"])
def test_new_storage_with_the_same_columns_is_read_as_the_snapshot_shows_it(pg_server: Any, pg_database: str,
                                                                            statement: str) -> None:
    """TRUNCATE, VACUUM FULL and CLUSTER give a table new storage without changing its columns: no retry. A
    TRUNCATE makes the table read empty at the snapshot (the stream replays the TRUNCATE after it, so the target ends
    as the upstream: tests/e2e/test_random_apply.py truncates during the copy); VACUUM FULL and CLUSTER keep every
    row the snapshot sees. A partition's leaf (t2's) is checked the same way."""
    from cdc.snapshot import plan_from_bounds
    from tests.snapshot_helpers import exported_snapshot
    from upstream.postgres.snapshot_read import PgSnapshotReader

    execute(pg_server, pg_database, "CREATE TABLE t (id int PRIMARY KEY, v text)",
            "INSERT INTO t SELECT g, repeat('v', 50) || g FROM generate_series(1, 1000) g",
            "CREATE TABLE t2 (id int PRIMARY KEY, v text) PARTITION BY RANGE (id)",
            "CREATE TABLE t2a PARTITION OF t2 FOR VALUES FROM (0) TO (5000)",
            "INSERT INTO t2 SELECT g, 'x' FROM generate_series(1, 1000) g", "DELETE FROM t WHERE id % 3 = 0")
    table = "t2" if statement.endswith("t2") else "t"
    with exported_snapshot(pg_server, pg_database) as exp:
        reader = PgSnapshotReader(pg_server.uri(pg_database), exp.snapshot)
        try:
            schema = reader.table_schema(TableName("public", table))
            plan = plan_from_bounds(schema.name, 1000, 500, ("id",), [("501",)])
            first = len(list(reader.read_chunk(schema, plan.chunks[0])))
            reader.release()
            execute(pg_server, pg_database, statement)
            second = len(list(reader.read_chunk(schema, plan.chunks[1])))
            if statement.startswith("TRUNCATE"):
                assert second == 0  # (the stream's TRUNCATE after the snapshot empties the target anyway)
            else:
                assert first + second == (667 if table == "t" else 1000)  # every row of the snapshot
        finally:
            reader.close()
