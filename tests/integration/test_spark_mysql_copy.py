"""The Spark snapshot job from a real MariaDB (the shared local SparkSession, every chunk through Spark) into SQLite,
PostgreSQL and MariaDB targets: each chunk recorded with the binlog position its reader's snapshot stood at (at or
after the export), the target equal to the upstream row by row, and a PostgreSQL target the copy creates keeps its key
(a MySQL reader has no COPY text for the deferred-key path)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from cdc.events import TableName
from cdc.meta.etcd import EtcdClient
from cdc.meta.snapshot_progress import SnapshotProgressStore
from playground.compare import compare_mysql_tables
from playground.servers import MariaDBServer
from spark_jobs.plan import SnapshotJob
from spark_jobs.snapshot import run
from upstream import open_upstream
from upstream.mysql.positions import to_ts

pytestmark = pytest.mark.integration


@pytest.fixture(params=["sqlite", "postgresql", "mariadb"])
def sink(request: pytest.FixtureRequest, tmp_path: Any, mariadb_server: MariaDBServer) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'target.db'}"
        return
    if request.param == "postgresql":
        pg = request.getfixturevalue("pg_server")
        yield pg.uri(request.getfixturevalue("pg_database"))
        return
    name = f"tgt_{uuid.uuid4().hex[:12]}"
    mariadb_server.create_database(name)
    try:
        yield mariadb_server.uri(name)
    finally:
        mariadb_server.drop_database(name)


def test_the_spark_job_copies_a_mariadb_database_into_each_target_chunk_by_chunk(
        mariadb_server: MariaDBServer, mariadb_database: str, sink: str, etcd_server: Any, cluster_id: str,
        spark: Any) -> None:
    db = mariadb_database
    mariadb_server.execute(
        "CREATE TABLE orders (id BIGINT UNSIGNED PRIMARY KEY, customer VARCHAR(40) NOT NULL, amount DECIMAL(12,2), "
        "placed DATETIME(6), raw VARBINARY(8), ratio DOUBLE, note TEXT) DEFAULT CHARSET utf8mb4", db=db)
    mariadb_server.execute(
        "INSERT INTO orders SELECT seq + 9223372036854775000, CONCAT('c', seq % 97, '\\t\\\\x ü'), seq * 1.25, "
        "'2024-01-01 00:00:00' + INTERVAL seq * 37 MINUTE, UNHEX(LPAD(HEX(seq), 8, '0')), seq / 7, "
        "IF(seq % 5 = 0, NULL, IF(seq % 3 = 0, '', REPEAT('n', seq % 9))) FROM seq_1_to_2000", db=db)
    mariadb_server.execute("CREATE TABLE items (order_id INT, line VARCHAR(10), qty INT, PRIMARY KEY (order_id, line))",
                           db=db)
    mariadb_server.execute("INSERT INTO items SELECT seq % 400, CONCAT('L', seq), seq FROM seq_1_to_1500", db=db)
    tables = (f"{db}.orders", f"{db}.items")
    with open_upstream(mariadb_server.uri(db)) as up, up.export_snapshot(label="t") as exp:
        # written after the export, before any reader opens: the readers' snapshots stand after these (a MariaDB
        # target on the same server writes to its binlog too: later still)
        mariadb_server.execute("UPDATE orders SET customer = 'late' WHERE id % 3 = 0", db=db)
        mariadb_server.execute("DELETE FROM items WHERE order_id = 7", db=db)
        [(log_file, pos, *_)] = mariadb_server.execute("SHOW MASTER STATUS") or []
        after = to_ts(log_file, int(pos))
        job = SnapshotJob(changefeed="cf-mycopy", upstream=mariadb_server.uri(db), sink=sink, tables=tables,
                          etcd=(etcd_server.url,), span=0, cluster=cluster_id, snapshot=exp.name,
                          commit_ts=exp.ts, chunk_rows=400, driver_copies=False, defer_keys=True)
        report = run(job, spark=spark)
    assert report.chunks_total == report.chunks_copied == 5 + 4, report
    conn = mariadb_server.connect(db)
    try:
        diffs = compare_mysql_tables(conn, list(tables), sink)
    finally:
        conn.close()
    assert [d.table for d in diffs if not d.equal] == [], diffs
    assert [d.source_rows for d in diffs] == [2000, 1500 - 4], diffs
    with EtcdClient([etcd_server.url]) as client:
        store = SnapshotProgressStore(client, cluster_id)
        for t in tables:
            done = store.done_chunks("cf-mycopy", 0, TableName.parse(t))
            assert done and all(d.snapshot == exp.name and d.commit_ts >= after > exp.ts for d in done.values()), done
            plan = store.get_plan("cf-mycopy", 0, TableName.parse(t))
            assert plan is not None and plan.ts == exp.ts and plan.key_state == "", plan  # (never deferred)
