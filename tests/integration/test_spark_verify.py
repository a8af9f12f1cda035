"""``changefeed verify``'s comparison engine (spark_jobs/verify.py) on real servers and Spark: PostgreSQL 18 at an
exported snapshot against PostgreSQL, MariaDB and SQLite targets filled by the initial copy. Equal tables are
called equal; a divergence injected downstream (one row updated, one deleted, one inserted, in three different
chunks) is reported with exactly those three keys, the updated row with its column; a key-less table's extra
duplicate is found as a multiset difference."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from cdc.verify import DIFFERENT, EXIT_DIFFERS, EXIT_EQUAL, EXTRA, MISSING, VerifyReport
from spark_jobs.plan import SnapshotJob
from spark_jobs.snapshot import run
from spark_jobs.verify import VerifyJob, verify_tables
from tests.snapshot_helpers import copy_target, execute, exported_snapshot
from tests.sql_targets import KINDS, SqlTarget

pytestmark = pytest.mark.integration

TABLES = ("public.vorders", "public.vitems", "public.vnk")


@pytest.fixture(params=KINDS)
def target(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[SqlTarget]:
    yield from copy_target(request, tmp_path)


def preload(pg_server: Any, db: str) -> None:
    execute(pg_server, db,
            "CREATE TABLE vorders (id bigint PRIMARY KEY, customer text NOT NULL, amount numeric(12,2), "
            "big numeric, placed timestamptz, local timestamp, day date, at time, tags text[], doc jsonb, "
            "js json, raw bytea, ok boolean, ratio float8, r4 real, u uuid, pad char(6), empty text)",
            "INSERT INTO vorders SELECT i, 'c' || (i % 97) || E'\\t\\\\x', (i * 1.25)::numeric(12,2), "
            "(i || '.' || repeat('0', i % 4) || '10')::numeric, "
            "'2024-01-01 00:00:00.5+02'::timestamptz + i * interval '37 minutes', "
            "'2024-01-01 10:00:00.25'::timestamp + i * interval '1 minute', '2020-02-29'::date + i, "
            "'10:00:00.125'::time + i * interval '1 second', ARRAY['t' || (i % 5), NULL], "
            "jsonb_build_object('i', i, 's', repeat('z', i % 7), 'f', 1.50), "
            "('{\"b\": 1, \"a\": [1.0, 2.5e-7]}')::json, decode(lpad(to_hex(i), 8, '0'), 'hex'), "
            "i % 2 = 0, i / 7.0, (i / 3.0)::real, md5(i::text)::uuid, 'p' || (i % 10), "
            "CASE WHEN i % 2 = 0 THEN '' END FROM generate_series(1, 2000) i",
            "UPDATE vorders SET amount = NULL, tags = NULL, doc = NULL, ratio = -0.0 WHERE id % 50 = 0",
            "CREATE TABLE vitems (order_id bigint, line text, qty int, PRIMARY KEY (order_id, line))",
            "INSERT INTO vitems SELECT i % 400, 'L' || i, i FROM generate_series(1, 1500) i",
            "CREATE TABLE vnk (a int, b text)",
            "ALTER TABLE vnk REPLICA IDENTITY FULL",
            "INSERT INTO vnk SELECT i % 10, 'same' FROM generate_series(1, 120) i")


def verify(pg_server: Any, db: str, target: SqlTarget, spark: Any, progress: Any = None) -> VerifyReport:
    with exported_snapshot(pg_server, db) as exp:
        return verify_tables(VerifyJob(upstream=pg_server.uri(db), sink=target.uri, tables=TABLES,
                                       snapshot=exp.snapshot, chunk_rows=400), spark=spark, progress=progress)


def test_equal_tables_then_an_injected_divergence_named_key_by_key(
        pg_server: Any, pg_database: str, target: SqlTarget, etcd_server: Any, cluster_id: str, spark: Any) -> None:
    preload(pg_server, pg_database)
    with exported_snapshot(pg_server, pg_database) as exp:
        run(SnapshotJob(changefeed="cf-verify", upstream=pg_server.uri(pg_database), sink=target.uri,
                        tables=TABLES, etcd=(etcd_server.url,), span=0, cluster=cluster_id, snapshot=exp.snapshot,
                        chunk_rows=400, local=True))

    report = verify(pg_server, pg_database, target, spark)
    assert report.exit_code == EXIT_EQUAL, [(t.table, t.diffs[:3], t.note) for t in report.tables if not t.equal]
    assert [(t.table, t.source_rows, t.target_rows, t.chunks, t.chunks_differing) for t in report.tables] == [
        ("public.vorders", 2000, 2000, 5, 0), ("public.vitems", 1500, 1500, 4, 0), ("public.vnk", 120, 120, 1, 0)]

    # one row updated (chunk 0), one deleted (chunk 2), one inserted (after the last upstream key: chunk 4), and a
    # duplicate of a key-less row
    orders, nk = target.qualified("vorders"), target.qualified("vnk")
    target.execute(f"UPDATE {orders} SET customer = 'changed' WHERE id = 10")
    target.execute(f"DELETE FROM {orders} WHERE id = 1000")
    target.execute(f"INSERT INTO {orders} (id, customer) VALUES (2500, 'extra')")
    target.execute(f"INSERT INTO {nk} (a, b) VALUES (3, 'same')")
    calls: list[tuple[Any, ...]] = []
    report = verify(pg_server, pg_database, target, spark, lambda *a: calls.append(a))
    # progress: the rows planned, then the tasks of each phase as Spark finishes them, each phase ending complete
    assert calls[0] == ("checksums", 0, 10, 3620)
    assert [c[:3] for c in calls if c[1] == c[2]] == [("checksums", 10, 10), ("drill-down", 4, 4)]
    assert all(c[1] <= c[2] for c in calls)
    assert report.exit_code == EXIT_DIFFERS
    by = {t.table: t for t in report.tables}
    o = by["public.vorders"]
    assert [(d.kind, d.key, d.columns) for d in o.diffs] == [
        (DIFFERENT, ("10",), ("customer",)), (EXTRA, ("2500",), ()), (MISSING, ("1000",), ())]
    assert (o.source_rows, o.target_rows, o.chunks, o.chunks_differing) == (2000, 2000, 5, 3)
    assert (o.missing, o.extra, o.different, o.more) == (1, 1, 1, 0)
    assert by["public.vitems"].equal
    n = by["public.vnk"]
    assert (n.extra, n.missing, n.target_rows) == (1, 0, 121)
    assert [d.kind for d in n.diffs] == [EXTRA]


def test_values_that_differ_only_in_representation_are_found(
        pg_server: Any, pg_database: str, target: SqlTarget, etcd_server: Any, cluster_id: str, spark: Any) -> None:
    """A numeric's scale, a timestamp off by a microsecond, a JSON number, a NULL made empty: each a difference."""
    preload(pg_server, pg_database)
    with exported_snapshot(pg_server, pg_database) as exp:
        run(SnapshotJob(changefeed="cf-verify2", upstream=pg_server.uri(pg_database), sink=target.uri,
                        tables=TABLES, etcd=(etcd_server.url,), span=0, cluster=cluster_id, snapshot=exp.snapshot,
                        chunk_rows=400, local=True))
    orders = target.qualified("vorders")
    big = {"sqlite": "'3.0010'", "mariadb": "3.0000000011", "postgresql": "3.0010"}[target.kind]
    target.execute(f"UPDATE {orders} SET big = {big} WHERE id = 3")
    target.execute(f"UPDATE {orders} SET empty = '' WHERE id = 5")
    target.execute(f"UPDATE {orders} SET empty = NULL WHERE id = 6")
    report = verify(pg_server, pg_database, target, spark)
    o = {t.table: t for t in report.tables}["public.vorders"]
    assert [(d.kind, d.key, d.columns) for d in o.diffs] == [
        (DIFFERENT, ("3",), ("big",)), (DIFFERENT, ("5",), ("empty",)), (DIFFERENT, ("6",), ("empty",))]
