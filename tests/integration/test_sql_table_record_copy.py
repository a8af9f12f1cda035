"""A table only the initial copy filled, dropped downstream before the stream's first change of it, is refused, never
created again empty (``sinks.sql.target.table_record``, ``spark_jobs.copy.open_job_sink``), on each SQL target the
copy writes (MariaDB, PostgreSQL, SQLite): the copy job's real writers (COPY passthrough, LOAD DATA or literal rows,
parsed rows into SQLite; the key built after the load on PostgreSQL) under a real exported snapshot, progress in a
real etcd, then the span's stream sink. Before, the copy's sinks were bound to no changefeed: the table was recorded
by nobody and the stream created it again with its new rows only. A resync's forgetting still lets it be created."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from cdc.config import SinkConfig
from cdc.errors import TargetTableDropped
from cdc.events import ColumnSchema, OpType, RowChange, TableName, TableSchema
from cdc.meta.etcd import EtcdClient
from cdc.meta.snapshot_progress import SnapshotProgressStore
from cdc.snapshot import KEY_BUILT
from sinks.factory import open_sink
from sinks.sql.sink import SQLSink
from spark_jobs.plan import SnapshotJob
from spark_jobs.snapshot import run
from tests.snapshot_helpers import copy_target, execute, exported_snapshot, pg_target
from tests.sql_targets import KINDS, SqlTarget

pytestmark = pytest.mark.integration

ORIGIN = 70
TABLES = ("public.t", "public.u")


@pytest.fixture(params=KINDS)
def target(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[SqlTarget]:
    yield from copy_target(request, tmp_path)


@pytest.fixture
def pg_target_db(request: pytest.FixtureRequest) -> Iterator[SqlTarget]:
    yield from pg_target(request)


def _load(pg_server: Any, db: str) -> None:
    execute(pg_server, db,
            "CREATE TABLE t (id int PRIMARY KEY, v text)",
            "INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 300) g",
            "CREATE TABLE u (id int PRIMARY KEY, v text)",
            "INSERT INTO u SELECT g, 'u' || g FROM generate_series(1, 50) g")


def _schema(name: str) -> TableSchema:
    return TableSchema(TableName("public", name), (ColumnSchema("id", 0, "int4", nullable=False, is_key=True),
                                                   ColumnSchema("v", 0, "text")), ("id",))


def _copy(pg_server: Any, db: str, target: SqlTarget, etcd: str, cluster: str, cf: str, *,
          origin: int | None = ORIGIN, defer: bool = False) -> None:
    with exported_snapshot(pg_server, db) as exp:
        job = SnapshotJob(changefeed=cf, upstream=pg_server.uri(db), sink=target.uri, tables=TABLES, etcd=(etcd,),
                          span=0, cluster=cluster, snapshot=exp.snapshot, commit_ts=exp.commit_ts, chunk_rows=100,
                          local=True, defer_keys=defer, origin=origin)
        report = run(job)
    assert report.rows == {"public.t": 300, "public.u": 50}


def _stream_sink(target: SqlTarget, cf: str, workers: int = 1) -> SQLSink:
    """The span's sink after the copy (``processor.span``: ``open_position`` with the span's start Ts)."""
    s = open_sink(target.uri, SinkConfig(worker_count=workers))
    assert isinstance(s, SQLSink)
    s.check()
    s.open_position(cf, 0, ORIGIN)
    return s


def _insert(name: str, ts: int, *ids: int) -> list[RowChange]:
    return [RowChange(OpType.INSERT, _schema(name), ts, values={"id": i, "v": f"s{i}"}) for i in ids]


def _recorded(target: SqlTarget, cf: str) -> list[str]:
    rec = "tidewater.tidewater_tables" if target.kind == "postgresql" else "tidewater_tables"
    return sorted(r[0] for r in target.execute(f"SELECT table_name FROM {rec} WHERE changefeed = '{cf}'"))


def _label(target: SqlTarget, table: str) -> str:
    return f"public.{table}" if target.kind == "postgresql" else table


def test_a_table_only_the_copy_filled_and_dropped_before_its_first_change_is_refused(
        pg_server: Any, pg_database: str, target: SqlTarget, etcd_server: Any, cluster_id: str) -> None:
    cf = f"cf-{uuid.uuid4().hex[:8]}"
    _load(pg_server, pg_database)
    _copy(pg_server, pg_database, target, etcd_server.url, cluster_id, cf)
    assert _recorded(target, cf) == [_label(target, "t"), _label(target, "u")]  # by the copy's sinks
    target.execute(f"DROP TABLE {target.qualified('t')}")  # behind the changefeed's back, before any change of it
    sink = _stream_sink(target, cf)
    try:
        sink.write(_insert("u", ORIGIN + 10, 1000))  # a table the copy filled and that is there: written as before
        with pytest.raises(TargetTableDropped) as err:
            sink.write(_insert("t", ORIGIN + 20, 1000))
        msg = str(err.value)
        assert err.value.code == "CDC:ErrTargetTableDropped" and not err.value.retryable
        assert f"target table {_label(target, 't')} (upstream public.t)" in msg
        assert f"cdc cli changefeed snapshot -c {cf} --table public.t" in msg
        assert "t" not in target.tables()  # not created again empty
        # the resync forgets it (cdc cli changefeed snapshot --table, on an instance of its own): created again
        other = _stream_sink(target, f"{cf}-other")
        assert other.forget_tables_had(cf, [TableName("public", "t")]) == 1
        other.close()
    finally:
        sink.close()
    again = _stream_sink(target, cf)
    try:
        again.write(_insert("t", ORIGIN + 30, 1000))
    finally:
        again.close()
    assert target.execute(f"SELECT id, v FROM {target.qualified('t')}") == [(1000, "s1000")]
    assert len(target.execute(f"SELECT id FROM {target.qualified('u')}")) == 51


def test_a_table_the_copy_created_without_its_key_is_recorded_too(
        pg_server: Any, pg_database: str, etcd_server: Any, cluster_id: str, pg_target_db: SqlTarget) -> None:
    """PostgreSQL: the copy creates new targets without their key and builds it after the load
    (``sinks.sql.ops.deferred_key``); its chunks are written without a binding, so the table is recorded when the job
    creates it."""
    target = pg_target_db
    cf = f"cf-{uuid.uuid4().hex[:8]}"
    _load(pg_server, pg_database)
    _copy(pg_server, pg_database, target, etcd_server.url, cluster_id, cf, defer=True)
    with EtcdClient([etcd_server.url]) as client:
        plan = SnapshotProgressStore(client, cluster_id).get_plan(cf, 0, TableName("public", "t"))
    assert plan is not None and plan.key_state == KEY_BUILT  # (the deferred path was taken)
    assert _recorded(target, cf) == ["public.t", "public.u"]
    target.execute('DROP TABLE "public"."t"')
    sink = _stream_sink(target, cf)
    try:
        with pytest.raises(TargetTableDropped, match="public.t"):
            sink.write(_insert("t", ORIGIN + 10, 1000))
    finally:
        sink.close()
    assert "t" not in target.tables()


def test_a_copy_job_that_names_no_origin_records_nothing(
        pg_server: Any, pg_database: str, target: SqlTarget, etcd_server: Any, cluster_id: str) -> None:
    """A tool's copy (no span origin in the plan): its sinks are bound to no changefeed, as before."""
    cf = f"cf-{uuid.uuid4().hex[:8]}"
    _load(pg_server, pg_database)
    _copy(pg_server, pg_database, target, etcd_server.url, cluster_id, cf, origin=None)
    sink = _stream_sink(target, cf)  # (creates the record table if missing)
    sink.close()
    assert _recorded(target, cf) == []


def test_a_table_a_copy_recorded_after_the_stream_sink_read_the_record_is_refused_too(target: SqlTarget) -> None:
    """A table copy runs beside the stream: its job records a table after the span's sink read the record. The sink
    looks the table up again before it would create it (``TableRecord.had``)."""
    cf = f"cf-{uuid.uuid4().hex[:8]}"
    stream = _stream_sink(target, cf)  # reads the record now: nothing yet
    try:
        copier = open_sink(target.uri)  # the table copy's job's sink (spark_jobs.copy.open_job_sink)
        assert isinstance(copier, SQLSink)
        copier.check()
        copier.bind_tables_had(cf, 0, ORIGIN)
        copier.write(_insert("t", ORIGIN + 5, 1, 2))  # a chunk: creates and records t
        copier.close()
        assert _recorded(target, cf) == [_label(target, "t")]
        target.execute(f"DROP TABLE {target.qualified('t')}")
        with pytest.raises(TargetTableDropped, match="cdc cli changefeed snapshot"):
            stream.write(_insert("t", ORIGIN + 10, 3))
    finally:
        stream.close()
    assert "t" not in target.tables()
