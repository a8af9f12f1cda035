"""spark_jobs.datasource: a DataFrame of a table at an exported snapshot, one Spark partition per chunk."""

from __future__ import annotations

from typing import Any

import pytest

from cdc import serde
from cdc.events import TableName
from spark_jobs.datasource import FORMAT, SnapshotDataSource
from tests.snapshot_helpers import execute, exported_snapshot
from upstream import open_upstream

pytestmark = pytest.mark.integration


def test_a_table_at_a_snapshot_as_a_dataframe_of_chunks(pg_server: Any, pg_database: str, spark: Any) -> None:
    uri = pg_server.uri(pg_database)
    execute(pg_server, pg_database, "CREATE TABLE d (id int PRIMARY KEY, v text, n numeric(6,2))",
            "INSERT INTO d SELECT i, CASE WHEN i % 10 = 0 THEN NULL ELSE 'v' || i END, i / 4.0 "
            "FROM generate_series(1, 950) i")
    spark.dataSource.register(SnapshotDataSource)
    with exported_snapshot(pg_server, pg_database) as exp:
        execute(pg_server, pg_database, "DELETE FROM d WHERE id <= 100", "INSERT INTO d VALUES (5000, 'late', 1)")
        df = (spark.read.format(FORMAT).option("upstream", uri).option("table", "public.d")
              .option("snapshot", exp.snapshot).option("chunk_rows", "200").load())
        assert [(f.name, f.dataType.simpleString()) for f in df.schema.fields] == [
            ("id", "string"), ("v", "string"), ("n", "string")]
        assert df.rdd.getNumPartitions() == 5  # 950 rows in chunks of 200
        rows = sorted((tuple(r) for r in df.collect()), key=lambda r: int(r[0]))
        with open_upstream(uri).snapshot_reader(exp.snapshot) as reader:
            schema = reader.table_schema(TableName("public", "d"))
            plan = reader.plan(schema, 200)
            expected = [tuple(c.row_text) for ch in plan.chunks for c in reader.read_chunk(schema, ch)]
        assert rows == expected and len(rows) == 950
        assert rows[9] == ("10", None, "2.50") and rows[0] == ("1", "v1", "0.25")  # the upstream's text
        # a stored plan's chunks exactly
        stored = (spark.read.format(FORMAT).option("upstream", uri).option("table", "public.d")
                  .option("snapshot", exp.snapshot).option("plan", serde.to_json(plan).decode()).load())
        assert stored.rdd.getNumPartitions() == 5 and stored.count() == 950
