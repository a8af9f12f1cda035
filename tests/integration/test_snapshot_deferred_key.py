"""The initial copy into PostgreSQL tables it creates itself builds their primary key after the load
(docs/snapshot.md, "The key after the load"), against real PostgreSQL, etcd and the job's code:

- a run killed after some chunks committed (rows + marker) but before etcd recorded them resumes without copying
  them again, builds the key, and the target equals the upstream at the snapshot row by row;
- a run killed between "every chunk done" and "key built" (and one killed after the key's commit but before etcd
  said so) is finished by the next run, which copies nothing;
- the final table's definition (columns, NOT NULL, constraints and their names, indexes) is the one the sink's
  streaming CREATE TABLE makes, also for a table name long enough that PostgreSQL truncates the key's name;
- a duplicate row in a key-less target (a broken proof) fails the run loudly naming the table, and the key stays
  owed; a table that exists before the copy keeps its key while copied;
- an error of the upstream's side of a marked chunk (a column renamed after the export, the upstream session
  terminated mid-chunk, a reader raising after rows went into the COPY) is raised as itself, retryable, with nothing
  of the chunk nor its marker committed."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from cdc.config import SinkConfig
from cdc.errors import SinkError, SnapshotTableAltered, TidewaterError, UpstreamUnavailable
from cdc.events import TableName
from cdc.meta.etcd import EtcdClient
from cdc.meta.snapshot_progress import SnapshotProgressStore
from cdc.snapshot import KEY_BUILT, KEY_DEFERRED, ChunkMarker
from playground.compare import compare_tables
from sinks.factory import open_sink
from sinks.sql.ops.deferred_key import CREATE_MARKERS
from spark_jobs.copy import copy_chunk, copy_chunks
from spark_jobs.deferred import OwedKey
from spark_jobs.plan import SnapshotJob
from spark_jobs.snapshot import plan_tasks, run
from tests.snapshot_helpers import at_snapshot, execute, exported_snapshot, text_killed_after_first_block
from upstream.postgres.snapshot_read import PgSnapshotReader

pytestmark = pytest.mark.integration

LONG = "t" * 60  # <name>_pkey is truncated to 63 bytes by PostgreSQL: the same way for CREATE and ALTER
TABLES = ("public.big", "public.comp", f"public.{LONG}", "public.nk")


@pytest.fixture
def targets(pg_server: Any) -> Iterator[list[str]]:
    names = [f"tgt_{uuid.uuid4().hex[:12]}" for _ in range(2)]
    for n in names:
        pg_server.create_database(n)
    yield names
    for n in names:
        pg_server.drop_database(n)


def _load(pg_server: Any, db: str) -> None:
    execute(pg_server, db,
            "CREATE TABLE big (id bigint PRIMARY KEY, k int NOT NULL, c varchar(60), pad varchar(20), ts timestamp)",
            "INSERT INTO big SELECT i, i % 97, repeat('c', i % 60), 'pad', timestamp '2026-01-01' + i * interval '1 s' "
            "FROM generate_series(1, 3000) i",
            "CREATE TABLE comp (a int, b text, v numeric(10,2), PRIMARY KEY (b, a))",
            "INSERT INTO comp SELECT i % 7, 'b' || (i / 7), i / 4.0 FROM generate_series(1, 1400) i",
            f"CREATE TABLE {LONG} (id int PRIMARY KEY, v text)",
            f"INSERT INTO {LONG} SELECT i, 'v' || i FROM generate_series(1, 500) i",
            "CREATE TABLE nk (a int, b text)", "ALTER TABLE nk REPLICA IDENTITY FULL",
            "INSERT INTO nk SELECT i % 4, 'dup' FROM generate_series(1, 300) i")


def _job(pg_server: Any, db: str, target: str, exp: Any, etcd: str, cluster: str, cf: str, *,
         defer: bool = True) -> SnapshotJob:
    return SnapshotJob(changefeed=cf, upstream=pg_server.uri(db), sink=pg_server.uri(target), tables=TABLES,
                       etcd=(etcd,), span=0, cluster=cluster, snapshot=exp.snapshot, commit_ts=exp.commit_ts,
                       chunk_rows=200, local=True, defer_keys=defer)


def _definition(pg_server: Any, db: str, table: str) -> list[Any]:
    """Everything of ``table``'s definition a reader could tell apart (names of constraints and indexes too)."""
    q = [
        "SELECT attnum, attname, format_type(atttypid, atttypmod), attnotnull, atthasdef, attidentity, attgenerated "
        "FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
        "SELECT conname, contype, pg_get_constraintdef(oid), condeferrable, convalidated, conislocal "
        "FROM pg_constraint WHERE conrelid = %s::regclass ORDER BY conname",
        "SELECT c.relname, pg_get_indexdef(i.indexrelid), i.indisprimary, i.indisunique, i.indisvalid "
        "FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = %s::regclass ORDER BY c.relname",
        "SELECT relkind, relpersistence, relreplident, relhasindex FROM pg_class WHERE oid = %s::regclass",
    ]
    return [[tuple(r) for r in pg_server.execute(s, db=db, params=(table,)) or []] for s in q]


def _has_pk(pg_server: Any, db: str, table: str) -> bool:
    rows = pg_server.execute("SELECT count(*) FROM pg_index WHERE indrelid = %s::regclass AND indisprimary", db=db,
                             params=(table,))
    return bool(rows[0][0])


def _markers(pg_server: Any, db: str) -> int:
    return int(pg_server.execute("SELECT count(*) FROM tidewater.tidewater_copy_chunk", db=db)[0][0])


def _equal(pg_server: Any, db: str, snapshot: str, target: str) -> None:
    with at_snapshot(pg_server, db, snapshot) as snap:
        diffs = compare_tables(snap, list(TABLES), target)
    assert all(d.equal for d in diffs), [(d.table, d.missing, d.extra, d.different, d.surplus) for d in diffs]


def test_a_killed_run_resumes_from_the_markers_and_builds_the_key(
        pg_server: Any, pg_database: str, targets: list[str], etcd_server: Any, cluster_id: str) -> None:
    _load(pg_server, pg_database)
    target, streamed_like = targets
    cf = "cf-defer"
    with exported_snapshot(pg_server, pg_database) as exp:
        execute(pg_server, pg_database, "UPDATE big SET c = 'after' WHERE id % 2 = 0", "DELETE FROM comp WHERE a = 1",
                "INSERT INTO nk VALUES (9, 'after')")
        job = _job(pg_server, pg_database, target, exp, etcd_server.url, cluster_id, cf)
        client = EtcdClient([etcd_server.url])
        sink = open_sink(pg_server.uri(target), SinkConfig())
        reader = PgSnapshotReader(pg_server.uri(pg_database), exp.snapshot)
        try:
            store = SnapshotProgressStore(client, cluster_id)
            owed: list[OwedKey] = []
            tasks, total = plan_tasks(job, store, "", owed)  # first run: plans, creates the key-less tables
            assert sorted(str(o.schema.name) for o in owed) == sorted(TABLES[:3])  # nk has no key to defer
            assert not _has_pk(pg_server, target, "public.big")
            keyed = [t for t in tasks if t.deferred]
            # recorded chunks, then three chunks committed (rows + marker) whose etcd record the kill prevented
            results = list(copy_chunks(iter(keyed[:5])))
            assert all(r.error is None and r.as_text for r in results)
            for t in keyed[5:8]:
                copy_chunk(reader, sink, t)
            reader.release()
            assert _markers(pg_server, target) == 8
            # the same chunk again (a zombie, or a run that did not reconcile): nothing lands twice
            marker = ChunkMarker(cf, 0, str(keyed[6].chunk.table_name), keyed[6].chunk.index, "zombie")
            before = pg_server.execute("SELECT count(*) FROM public.big", db=target)[0][0]
            rows, already = sink.write_marked_chunk(keyed[6].schema,
                                                    lambda: reader.read_chunk_text(keyed[6].schema, keyed[6].chunk),
                                                    marker)
            reader.release()
            assert already and rows == 200
            assert pg_server.execute("SELECT count(*) FROM public.big", db=target)[0][0] == before

            report = run(job)  # the next run: the three in-doubt chunks are recorded from their markers
            assert report.chunks_skipped == 8
            assert report.chunks_copied == total - 8
            for name in TABLES[:3]:
                plan = store.get_plan(cf, 0, TableName.parse(name))
                assert plan is not None and plan.key_state == KEY_BUILT
                assert _has_pk(pg_server, target, name)
            assert _markers(pg_server, target) == 0
            assert store.get_plan(cf, 0, TableName("public", "nk")).key_state == ""  # type: ignore[union-attr]
        finally:
            reader.close()
            sink.close()
            client.close()
        _equal(pg_server, pg_database, exp.snapshot, pg_server.uri(target))

        # the same copy with the key kept while chunks arrive: the table the sink's streaming CREATE makes
        run(_job(pg_server, pg_database, streamed_like, exp, etcd_server.url, cluster_id, "cf-keyed", defer=False))
        _equal(pg_server, pg_database, exp.snapshot, pg_server.uri(streamed_like))
    for name in TABLES:
        assert _definition(pg_server, target, name) == _definition(pg_server, streamed_like, name), name
    assert pg_server.execute(
        "SELECT conname FROM pg_constraint WHERE conrelid = %s::regclass AND contype = 'p'", db=target,
        params=(f"public.{LONG}",))[0][0] == f"{LONG[:58]}_pkey"  # the table's part truncated, in both


def test_a_run_killed_before_the_key_is_built_is_finished_by_the_next(
        pg_server: Any, pg_database: str, targets: list[str], etcd_server: Any, cluster_id: str) -> None:
    _load(pg_server, pg_database)
    target = targets[0]
    cf = "cf-finalize"
    with exported_snapshot(pg_server, pg_database) as exp:
        job = _job(pg_server, pg_database, target, exp, etcd_server.url, cluster_id, cf)
        client = EtcdClient([etcd_server.url])
        try:
            store = SnapshotProgressStore(client, cluster_id)
            tasks, total = plan_tasks(job, store, "", [])
            assert all(r.error is None for r in copy_chunks(iter(tasks)))  # every chunk, then the kill
            assert not _has_pk(pg_server, target, "public.big")
            # one table's key committed, the kill before etcd said "built"
            sink = open_sink(pg_server.uri(target), SinkConfig())
            try:
                comp = next(t.schema for t in tasks if str(t.schema.name) == "public.comp")
                assert sink.build_deferred_key(comp, cf, 0) is True
                assert sink.build_deferred_key(comp, cf, 0) is False  # idempotent
            finally:
                sink.close()
            assert store.get_plan(cf, 0, TableName("public", "comp")).key_state == KEY_DEFERRED  # type: ignore
            report = run(job)
            assert (report.chunks_copied, report.chunks_skipped) == (0, total)
            for name in TABLES[:3]:
                assert store.get_plan(cf, 0, TableName.parse(name)).key_state == KEY_BUILT  # type: ignore
                assert _has_pk(pg_server, target, name)
            assert _markers(pg_server, target) == 0
            assert run(job).chunks_copied == 0  # and again: nothing left, nothing breaks
        finally:
            client.close()
        _equal(pg_server, pg_database, exp.snapshot, pg_server.uri(target))


def test_a_duplicate_key_fails_the_copy_loudly(pg_server: Any, pg_database: str, targets: list[str],
                                               etcd_server: Any, cluster_id: str) -> None:
    _load(pg_server, pg_database)
    target = targets[0]
    cf = "cf-dup"
    with exported_snapshot(pg_server, pg_database) as exp:
        job = _job(pg_server, pg_database, target, exp, etcd_server.url, cluster_id, cf)
        client = EtcdClient([etcd_server.url])
        try:
            store = SnapshotProgressStore(client, cluster_id)
            tasks, _ = plan_tasks(job, store, "", [])
            assert all(r.error is None for r in copy_chunks(iter(tasks)))
            execute(pg_server, target, "INSERT INTO public.big SELECT * FROM public.big WHERE id = 7")
            with pytest.raises(SinkError, match=r"public\.big.*(duplicate|unique)"):
                run(job)
            assert store.get_plan(cf, 0, TableName("public", "big")).key_state == KEY_DEFERRED  # type: ignore
            assert not _has_pk(pg_server, target, "public.big")
        finally:
            client.close()


def test_an_error_of_the_upstreams_side_of_a_deferred_chunk_is_raised_as_itself(
        pg_server: Any, pg_database: str, targets: list[str], etcd_server: Any, cluster_id: str) -> None:
    """A chunk of a table whose key is deferred fails half way on the upstream's side (the retryable
    CDC:ErrSnapshotTableAltered of a table renamed since the snapshot: tests/e2e/test_ddl_barrier_copy.py). psycopg2
    turns an exception of ``read()`` into a driver error of the target's COPY, which the sink classified as its own
    fatal error (CDC:ErrSinkFatal, "fix the target"), failing the changefeed for good instead of copying again under a
    fresh snapshot. It is raised as itself, as in the passthrough (sinks/sql/ops/bulk.py), and nothing of the chunk
    (rows or marker) is committed."""
    from cdc.errors import SnapshotTableAltered
    from cdc.snapshot import PG_COPY_TEXT, CopyText

    _load(pg_server, pg_database)
    target = targets[0]
    cf = "cf-altered"
    with exported_snapshot(pg_server, pg_database) as exp:
        job = _job(pg_server, pg_database, target, exp, etcd_server.url, cluster_id, cf)
        client = EtcdClient([etcd_server.url])
        sink = open_sink(pg_server.uri(target), SinkConfig())
        try:
            tasks, _ = plan_tasks(job, SnapshotProgressStore(client, cluster_id), "", [])  # big created key-less
            task = next(t for t in tasks if t.deferred and str(t.chunk.table_name) == "public.big")

            def blocks() -> Iterator[bytes]:
                yield b"1\t1\tc\tpad\t2026-01-01 00:00:01\n"
                raise SnapshotTableAltered('relation "public.big" does not exist: it was renamed or dropped')

            marker = ChunkMarker(cf, 0, "public.big", task.chunk.index, "run")
            with pytest.raises(SnapshotTableAltered, match="renamed or dropped"):
                sink.write_marked_chunk(task.schema, lambda: CopyText(PG_COPY_TEXT, "UTF8", blocks()), marker)
            assert pg_server.execute("SELECT count(*) FROM public.big", db=target) == [(0,)]
            assert _markers(pg_server, target) == 0
        finally:
            sink.close()
            client.close()


def test_a_target_that_exists_keeps_its_key_while_copied(pg_server: Any, pg_database: str, targets: list[str],
                                                         etcd_server: Any, cluster_id: str) -> None:
    _load(pg_server, pg_database)
    target = targets[0]
    execute(pg_server, target, "CREATE TABLE public.big (id bigint PRIMARY KEY, k int NOT NULL, c varchar(60), "
            "pad varchar(20), ts timestamp)")
    with exported_snapshot(pg_server, pg_database) as exp:
        job = _job(pg_server, pg_database, target, exp, etcd_server.url, cluster_id, "cf-exists")
        run(job)
        client = EtcdClient([etcd_server.url])
        try:
            store = SnapshotProgressStore(client, cluster_id)
            assert store.get_plan("cf-exists", 0, TableName("public", "big")).key_state == ""  # type: ignore
            assert store.get_plan("cf-exists", 0, TableName("public", "comp")).key_state == KEY_BUILT  # type: ignore
        finally:
            client.close()
        _equal(pg_server, pg_database, exp.snapshot, pg_server.uri(target))


def test_a_table_created_behind_the_copy_is_refused(pg_server: Any, pg_database: str, targets: list[str],
                                                    etcd_server: Any, cluster_id: str) -> None:
    _load(pg_server, pg_database)
    target = targets[0]
    with exported_snapshot(pg_server, pg_database) as exp:
        job = _job(pg_server, pg_database, target, exp, etcd_server.url, cluster_id, "cf-behind")
        client = EtcdClient([etcd_server.url])
        try:
            plan_tasks(job, SnapshotProgressStore(client, cluster_id), "", [])  # the key is owed from here on
        finally:
            client.close()
        # someone else's table of that name, of other types (the passthrough would store other values)
        execute(pg_server, target, "DROP TABLE public.big",
                "CREATE TABLE public.big (id bigint NOT NULL, k bigint, c text, pad text, ts timestamptz)")
        with pytest.raises(SinkError, match=r"public.*big.*created behind the copy"):
            run(job)


def test_remove_deletes_the_changefeeds_markers_and_positions(pg_server: Any, targets: list[str]) -> None:
    """``PositionStore.forget`` (run by the owner after ``changefeed remove``) deletes the changefeed's copy markers and
    its position rows, and only its own: it used to fail once the marker table existed (a second ``begin`` on a
    connection that had autobegun), leaving both behind with a warning in the log."""
    target = targets[0]
    sink = open_sink(pg_server.uri(target), SinkConfig())
    try:
        assert sink.forget("cf") == 0  # neither table exists yet
        sink.open_position("cf", 0)
        sink.open_position("other", 0)
        pg_server.execute("CREATE SCHEMA IF NOT EXISTS tidewater", db=target)
        pg_server.execute(CREATE_MARKERS, db=target)
        for cf, chunk in (("cf", 0), ("cf", 1), ("other", 0)):
            pg_server.execute("INSERT INTO tidewater.tidewater_copy_chunk (changefeed, span, table_name, chunk, run, "
                              f"rows, commit_ts) VALUES ('{cf}', 0, 'public.big', {chunk}, 'r', 10, 1)", db=target)
        assert sink.forget("cf") == 1  # its position row (the markers are counted apart)
        assert _markers(pg_server, target) == 1
        rows = pg_server.execute("SELECT changefeed FROM tidewater.tidewater_copy_chunk", db=target)
        assert [r[0] for r in rows] == ["other"]
        assert sink.forget("cf") == 0  # again: nothing left, nothing breaks
    finally:
        sink.close()


def _marked_chunk_setup(pg_server: Any, db: str, target: str, ddl: str) -> tuple[Any, Any, Any]:
    """(sink, schema, chunk) of ``public.r`` (one chunk), its key-less target created as the copy creates it."""
    execute(pg_server, db, ddl)
    sink = open_sink(pg_server.uri(target), SinkConfig())
    reader = PgSnapshotReader(pg_server.uri(db))
    try:
        schema = reader.table_schema(TableName("public", "r"))
        (chunk,) = reader.plan(schema, 1_000_000).chunks
    finally:
        reader.close()
    sink.create_deferred_target(schema)
    return sink, schema, chunk


def _marker(chunk: Any) -> ChunkMarker:
    return ChunkMarker("cf-read-error", 0, str(chunk.table_name), chunk.index, "run-1", 0, None, 0)


@pytest.mark.parametrize("error", [SnapshotTableAltered, UpstreamUnavailable])
def test_an_error_of_the_upstreams_side_of_a_marked_chunk_is_raised_as_itself(
        pg_server: Any, pg_database: str, targets: list[str], error: type[TidewaterError]) -> None:
    """The chunk's text fails half way on the upstream's side, after rows went into the target's COPY: psycopg2
    turns an exception of ``read()`` into a driver error of the target's COPY ("COPY from stdin failed: error in
    .read() call"), which the sink wrapped as its own fatal CDC:ErrSinkFatal, failing the changefeed for good instead
    of retrying (a column renamed after the snapshot: CDC:ErrSnapshotTableAltered; the upstream gone mid-chunk:
    CDC:ErrUpstreamUnavailable). The reader's own error is raised, with its code, retryability and cause; nothing of
    the chunk nor its marker is committed, and the chunk is written whole by the next attempt."""
    from cdc.snapshot import PG_COPY_TEXT, CopyText

    target = targets[0]
    sink, schema, chunk = _marked_chunk_setup(pg_server, pg_database, target,
                                              "CREATE TABLE r (id int PRIMARY KEY, v text)")
    cause = RuntimeError("the upstream's own failure")

    def failing() -> Iterator[bytes]:
        yield b"".join(b"%d\tv%d\n" % (i, i) for i in range(1, 1001))
        raise error("reading chunk 0 of public.r failed", cause=cause)

    def good() -> Iterator[bytes]:
        yield b"".join(b"%d\tv%d\n" % (i, i) for i in range(1, 1001))

    try:
        with pytest.raises(error) as err:
            sink.write_marked_chunk(schema, lambda: CopyText(PG_COPY_TEXT, "UTF8", failing()), _marker(chunk))
        assert type(err.value) is error and err.value.code == error.code and err.value.retryable, err.value
        assert err.value.__cause__ is cause, err.value.__cause__
        assert pg_server.execute("SELECT count(*) FROM public.r", db=target) == [(0,)]
        assert _markers(pg_server, target) == 0
        assert sink.write_marked_chunk(schema, lambda: CopyText(PG_COPY_TEXT, "UTF8", good()), _marker(chunk)) \
            == (1000, False)  # the connection and the table are fine: the next attempt copies the chunk
        assert pg_server.execute("SELECT count(*) FROM public.r", db=target) == [(1000,)]
    finally:
        sink.close()


def test_a_column_renamed_after_the_snapshot_fails_a_marked_chunk_retryably(
        pg_server: Any, pg_database: str, targets: list[str]) -> None:
    """tests/e2e/test_ddl_concurrent.py[postgresql]: a column the copy reads is renamed after the export; the chunk's
    COPY of the upstream, run when the target's COPY asks for its first block, fails with the retryable
    CDC:ErrSnapshotTableAltered, which reached the span as the sink's fatal CDC:ErrSinkFatal ("error in .read()
    call") and failed the changefeed instead of copying on under a fresh snapshot."""
    target = targets[0]
    execute(pg_server, pg_database, "CREATE TABLE r (id int PRIMARY KEY, v text)",
            "INSERT INTO r SELECT g, 'v' || g FROM generate_series(1, 500) g")
    sink = open_sink(pg_server.uri(target), SinkConfig())
    try:
        with exported_snapshot(pg_server, pg_database) as exp:
            reader = PgSnapshotReader(pg_server.uri(pg_database), exp.snapshot)
            try:
                schema = reader.table_schema(TableName("public", "r"))
                (chunk,) = reader.plan(schema, 1000).chunks
                reader.release()
                sink.create_deferred_target(schema)
                execute(pg_server, pg_database, "ALTER TABLE r RENAME COLUMN v TO w")
                with pytest.raises(SnapshotTableAltered) as err:
                    sink.write_marked_chunk(schema, lambda: reader.read_chunk_text(schema, chunk), _marker(chunk))
            finally:
                reader.close()
        assert err.value.code == "CDC:ErrSnapshotTableAltered" and err.value.retryable, err.value
        assert 'column "v" does not exist' in err.value.message and ".read() call" not in err.value.message, err.value
        assert pg_server.execute("SELECT count(*) FROM public.r", db=target) == [(0,)]
        assert _markers(pg_server, target) == 0
    finally:
        sink.close()


def test_an_upstream_session_killed_mid_chunk_fails_a_marked_chunk_retryably(
        pg_server: Any, pg_database: str, targets: list[str]) -> None:
    """The upstream's session is terminated after the first block of a ~10 MB chunk went into the target's COPY: the
    reader's CDC:ErrUpstreamUnavailable (retryable) is what the chunk raises, not the target's fatal error, and none of
    the rows already sent is committed."""
    target = targets[0]
    sink, schema, chunk = _marked_chunk_setup(
        pg_server, pg_database, target,
        "CREATE TABLE r (id int PRIMARY KEY, v text); "
        "INSERT INTO r SELECT g, repeat('x', 100) FROM generate_series(1, 100000) g")
    reader = PgSnapshotReader(pg_server.uri(pg_database))
    sent: list[int] = []
    try:
        with pytest.raises(UpstreamUnavailable) as err:
            sink.write_marked_chunk(schema, text_killed_after_first_block(pg_server, reader, schema, chunk, sent),
                                    _marker(chunk))
        assert err.value.code == "CDC:ErrUpstreamUnavailable" and err.value.retryable, err.value
        assert sent and sent[0] > 0
        assert pg_server.execute("SELECT count(*) FROM public.r", db=target) == [(0,)]
        assert _markers(pg_server, target) == 0
    finally:
        reader.close()
        sink.close()
