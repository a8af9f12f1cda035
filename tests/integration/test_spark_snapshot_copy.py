"""The Spark snapshot job end to end on real servers: PostgreSQL 18 with a real exported snapshot -> SQLite,
PostgreSQL and MariaDB targets, progress in a real etcd, one shared local SparkSession."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from cdc.events import TableName
from cdc.meta.etcd import EtcdClient
from cdc.meta.snapshot_progress import SnapshotProgressStore, read_progress
from playground.compare import compare_tables
from spark_jobs.plan import SnapshotJob
from spark_jobs.snapshot import run
from tests.snapshot_helpers import at_snapshot, copy_target, execute, exported_snapshot
from tests.sql_targets import KINDS, SqlTarget

pytestmark = pytest.mark.integration

TABLES = ["public.orders", "public.items", "public.nk"]


@pytest.fixture(params=KINDS)
def target(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[SqlTarget]:
    yield from copy_target(request, tmp_path)


def preload(pg_server: Any, db: str) -> None:
    execute(pg_server, db,
            "CREATE TABLE orders (id bigint PRIMARY KEY, customer text NOT NULL, amount numeric(12,2), "
            "placed timestamptz, tags text[], doc jsonb, raw bytea, ok boolean, ratio float8)",
            "INSERT INTO orders SELECT i, 'c' || (i % 97) || E'\\t\\\\x', (i * 1.25)::numeric(12,2), "
            "'2024-01-01 00:00:00+00'::timestamptz + i * interval '37 minutes', ARRAY['t' || (i % 5), NULL], "
            "jsonb_build_object('i', i, 's', repeat('z', i % 7)), decode(lpad(to_hex(i), 8, '0'), 'hex'), "
            "i % 2 = 0, i / 7.0 FROM generate_series(1, 2000) i",
            "UPDATE orders SET amount = NULL, tags = NULL, doc = NULL WHERE id % 50 = 0",
            "CREATE TABLE items (order_id bigint, line text, qty int, PRIMARY KEY (order_id, line))",
            "INSERT INTO items SELECT i % 400, 'L' || i, i FROM generate_series(1, 1500) i",
            "CREATE TABLE nk (a int, b text)",
            "ALTER TABLE nk REPLICA IDENTITY FULL",
            "INSERT INTO nk SELECT i % 10, 'same' FROM generate_series(1, 120) i")


def write_after_export(pg_server: Any, db: str) -> None:
    """Changes after the snapshot: none of them may arrive through the copy."""
    execute(pg_server, db,
            "INSERT INTO orders (id, customer) SELECT i, 'late' FROM generate_series(2001, 2100) i",
            "UPDATE orders SET customer = 'changed' WHERE id % 3 = 0",
            "DELETE FROM orders WHERE id BETWEEN 100 AND 300",
            "INSERT INTO items VALUES (-5, 'first', 1), (9999, 'last', 1)",
            "DELETE FROM items WHERE order_id = 7",
            "INSERT INTO nk VALUES (1, 'same'), (99, 'late')",
            "DELETE FROM nk WHERE a = 2")


def test_snapshot_copy_into_each_target_equals_the_snapshot_row_by_row(
        pg_server: Any, pg_database: str, target: SqlTarget, etcd_server: Any, cluster_id: str, spark: Any) -> None:
    preload(pg_server, pg_database)
    with exported_snapshot(pg_server, pg_database) as exp:
        write_after_export(pg_server, pg_database)
        job = SnapshotJob(changefeed="cf-copy", upstream=pg_server.uri(pg_database), sink=target.uri,
                          tables=tuple(TABLES), etcd=(etcd_server.url,), span=0, cluster=cluster_id,
                          snapshot=exp.snapshot, commit_ts=exp.commit_ts, chunk_rows=400)
        report = run(job, spark=spark)
        # orders: 2000 rows in 5 chunks, items: 1500 in 4, nk: one whole chunk
        assert (report.chunks_total, report.chunks_copied, report.chunks_skipped) == (10, 10, 0)
        assert report.rows == {"public.orders": 2000, "public.items": 1500, "public.nk": 120}

        with at_snapshot(pg_server, pg_database, exp.snapshot) as snap:
            diffs = compare_tables(snap, TABLES, target.uri)
        assert [d.table for d in diffs if not d.equal] == [], [(d.table, d.missing, d.extra, d.different, d.sample)
                                                            for d in diffs if not d.equal]
        assert [(d.source_rows, d.target_rows) for d in diffs] == [(2000, 2000), (1500, 1500), (120, 120)]

        with EtcdClient([etcd_server.url]) as client:
            progress = read_progress(client, cluster_id, "cf-copy", 0)
            assert progress.done and (progress.chunks_done, progress.chunks_total) == (10, 10)
            assert {t.table: (t.rows_copied, t.rows_planned) for t in progress.tables} == {
                "public.orders": (2000, 2000), "public.items": (1500, 1500), "public.nk": (120, 120)}
            assert all(t.eta_seconds == 0.0 and t.rows_per_second for t in progress.tables)
            store = SnapshotProgressStore(client, cluster_id)
            plan = store.get_plan("cf-copy", 0, TableName("public", "orders"))
            assert plan is not None and len(plan.chunks) == 5
            done = store.done_chunks("cf-copy", 0, TableName("public", "nk"))[0]
            assert (done.rows, done.snapshot, done.commit_ts) == (120, exp.snapshot, exp.commit_ts)

        # the same plan again: every chunk is recorded, nothing is copied (no Spark stage at all)
        again = run(job, spark=spark)
        assert (again.chunks_copied, again.chunks_skipped, again.rows_copied) == (0, 10, 0)
