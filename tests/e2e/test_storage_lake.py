"""Spark reads the lake: PostgreSQL -> `cdc server` -> storage sink (CSV files; Parquet files), then the Structured
Streaming job of spark_jobs.lake keeps a Parquet table per upstream table from the files up to the published checkpoint; after each
run it equals the upstream row by row. Run twice (the second run incremental, from the query's checkpoint), with
inserts, updates and deletes in between, also of a key-less table (a multiset with duplicates and nulls); a replayed
batch id changes nothing."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from e2e_workload import TABLES, mixed_workload, run_sql, server_config

from cdc.events import TableName
from playground.cluster import CdcServer, current_lsn
from playground.compare import compare_rows
from playground.servers import PostgresServer
from sinks.storage.reader import StorageReader

pytestmark = pytest.mark.e2e


def _wait_published(sink: str, lsn: int, cdc: CdcServer, timeout: float = 60.0) -> None:
    reader = StorageReader(sink)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ckpt = reader.checkpoint()
        if ckpt is not None and ckpt >= lsn:
            return
        time.sleep(0.2)
    raise AssertionError(f"metadata did not reach {lsn}\n{cdc.log_tail()}")


def _assert_lake_equals(conn: Any, outputs: dict[str, Path]) -> None:
    from spark_jobs.lake import current_path

    for table, out in outputs.items():
        path = current_path(str(out))
        assert path is not None, table
        diff = compare_rows(conn, table, pq.read_table(path).to_pylist())
        assert diff.equal, f"the lake's {table} differs from the upstream: {diff}"


@pytest.mark.parametrize("protocol", ["csv", pytest.param("parquet", marks=pytest.mark.slow)])
def test_the_lake_job_keeps_parquet_tables_equal_to_the_upstream(spark: Any, etcd_server: Any, cluster_id: str,
                                                                 tmp_path: Path, pg_server: PostgresServer,
                                                                 pg_database: str, source: Any, protocol: str) -> None:
    from spark_jobs import lake

    sink = f"file://{tmp_path / 'files'}?protocol={protocol}&flush-interval=300ms"
    mixed_workload(source, 6)  # copied at create
    # a key-less table is a multiset: equal rows, nulls, one of two duplicates deleted, a row found by a null updated
    run_sql(source, "CREATE TABLE bag (a int, b text, c numeric)", "ALTER TABLE bag REPLICA IDENTITY FULL",
            "INSERT INTO bag VALUES (1, 'x', NULL), (1, 'x', NULL), (2, 'y', 1.5), (3, NULL, NULL), (3, NULL, NULL)")
    cdc = CdcServer(etcd_server.url, tmp_path / "cdc", cluster_id=cluster_id, extra_args=server_config(tmp_path))
    cdc.start()
    tables = [*TABLES, "public.bag"]
    outputs = {t: tmp_path / "lake" / t.replace(" ", "_") for t in tables}
    checkpoints = {t: str(tmp_path / "checkpoints" / t.replace(" ", "_")) for t in tables}
    try:
        cdc.create_changefeed("lake", pg_server.uri(pg_database), sink)
        mixed_workload(source, 10, start=6)
        lsn = current_lsn(source)
        cdc.wait_checkpoint("lake", lsn)
        _wait_published(sink, lsn, cdc)
        first = ("public.accounts", "public.bag")  # (two tables twice: the suite's time; the others once, at the end)
        for t in first:
            lake.run_available(spark, sink, t, str(outputs[t]), checkpoints[t])
        _assert_lake_equals(source, {t: outputs[t] for t in first})

        mixed_workload(source, 10, start=16)  # updates and deletes of existing keys too
        run_sql(source, "UPDATE events SET kind = kind || '!' WHERE id % 3 = 0",
                "DELETE FROM \"Ledger Entries\" WHERE \"EntryId\" % 2 = 0",
                "DELETE FROM bag WHERE ctid = (SELECT min(ctid) FROM bag WHERE a = 1)",
                "UPDATE bag SET c = 7 WHERE ctid = (SELECT min(ctid) FROM bag WHERE a = 3)",
                "UPDATE bag SET b = 'w' WHERE a = 2", "INSERT INTO bag VALUES (2, 'w', 1.5), (NULL, NULL, NULL)")
        lsn = current_lsn(source)
        cdc.wait_checkpoint("lake", lsn)
        _wait_published(sink, lsn, cdc)
        for t in tables:
            lake.run_available(spark, sink, t, str(outputs[t]), checkpoints[t])  # from its streaming checkpoint
        _assert_lake_equals(source, outputs)

        # idempotent by batch id: a batch Spark re-runs after a crash (an id already applied) is not read again
        out = str(outputs["public.accounts"])
        before = lake.current_path(out)
        schema = StorageReader(sink).latest_schema(TableName.parse("public.accounts"))
        assert schema is not None

        class NotToBeRead:
            def orderBy(self, *cols: str) -> Any:  # noqa: N802 - the DataFrame method
                raise AssertionError("a replayed batch was applied again")

        lake.merge_batch(spark, out, schema, NotToBeRead(), 1)
        assert lake.current_path(out) == before
    finally:
        cdc.terminate()
