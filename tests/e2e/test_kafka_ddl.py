"""End to end: real PostgreSQL DDL through Kafka, rebuilt by ``cdc cli kafka-consumer`` (docs/sinks.md, "Consumer
library"): ADD COLUMN with a default (the rows that existed get it), RENAME COLUMN (the values stay), DROP COLUMN,
CREATE TABLE, TRUNCATE, with rows before and after each DDL, also in the DDL's own transaction; the consumer's
tables equal the upstream row by row and in shape (columns, types, key: playground/compare_schema.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from e2e_workload import kafka_consumer, run_sql, wait_for

from playground.cluster import CdcServer, current_lsn
from playground.compare import compare_tables
from playground.compare_schema import assert_schemas_equal
from playground.servers import KafkaServer, PostgresServer

pytestmark = pytest.mark.e2e

TABLES = ["public.items", "public.extra"]


@pytest.fixture
def source_schema() -> str:
    return "CREATE TABLE items (id int PRIMARY KEY, name text, qty int);\n"


@pytest.mark.parametrize("protocol", ["canal-json", "debezium"])
def test_column_ddl_truncate_and_create_table_reach_the_consumer_exactly(
        cdc_server: CdcServer, kafka_server: KafkaServer, kafka_topic: str, pg_server: PostgresServer,
        pg_database: str, source: Any, tmp_path: Path, protocol: str) -> None:
    run_sql(source, "INSERT INTO items SELECT g, 'n' || g, g FROM generate_series(1, 50) g")  # copied at create
    sink = kafka_server.uri(kafka_topic, protocol=protocol, partition_num="2")
    cdc_server.create_changefeed("kd", pg_server.uri(pg_database), sink)
    # (DDL while the initial copy runs fails it: the copy reads the catalog's current columns under its snapshot)
    wait_for(cdc_server, "kd", lambda q: q["phase"] == "streaming" and q["checkpoint_ts"] > 0, "the initial copy")
    run_sql(source,
            "INSERT INTO items SELECT g, 'n' || g, g FROM generate_series(51, 80) g",
            # the rows that exist get the default upstream (no row change is replicated for them)
            "ALTER TABLE items ADD COLUMN price numeric(10,2) DEFAULT 1.50",
            "INSERT INTO items VALUES (81, 'n81', 81, 9.99)",
            "UPDATE items SET qty = qty + 1 WHERE id % 10 = 0",
            # a rename inside a transaction, with rows of both shapes around it
            "BEGIN", "UPDATE items SET name = 'before ' || id WHERE id % 7 = 0",
            "ALTER TABLE items RENAME COLUMN name TO title",
            "UPDATE items SET title = title || ' after' WHERE id % 5 = 0", "COMMIT",
            "INSERT INTO items VALUES (82, 't82', 82, 2.00)",
            "ALTER TABLE items DROP COLUMN qty",
            "DELETE FROM items WHERE id % 9 = 0", "INSERT INTO items VALUES (83, 't83', 3.00)",
            "CREATE TABLE extra (k text PRIMARY KEY, v int)",
            "INSERT INTO extra SELECT 'k' || g, g FROM generate_series(1, 20) g",
            "TRUNCATE extra", "INSERT INTO extra VALUES ('again', 1), ('and', 2)",
            "ALTER TABLE extra ADD COLUMN note varchar(20) DEFAULT 'x'", "UPDATE extra SET v = v + 10")
    checkpoint = cdc_server.wait_checkpoint("kd", current_lsn(source), timeout=90)["checkpoint_ts"]
    q = cdc_server.changefeed("kd")
    assert q["state"] == "normal" and not q["warnings"], q
    target = f"sqlite:///{tmp_path / 'rebuilt.db'}"
    _, stderr = kafka_consumer(sink, target, pg_server.uri(pg_database), checkpoint)
    assert "dropped and added" not in stderr, stderr[-3000:]  # the rename was applied as a rename
    bad = [d for d in compare_tables(source, TABLES, target) if not d.equal]
    assert not bad, f"the consumer's tables differ from the upstream: {bad}"
    assert_schemas_equal(source, TABLES, target)
