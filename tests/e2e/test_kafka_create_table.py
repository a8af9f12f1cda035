"""End to end: a PostgreSQL table created upstream that stays empty reaches the targets rebuilt from Kafka by
``cdc cli kafka-consumer`` (docs/sinks.md, "Consumer library"): the consumer creates it at its CREATE TABLE message
from the schema in the sink's ``tidewater-ddl`` header (it used to create tables only at their first row), in
SQLite and in PostgreSQL, with the upstream's columns, types and key; a table created after it, with rows, ends
equal row by row; a consumer that starts again from an earlier watermark (a new position: everything is read
again) takes each CREATE of a table the target has in that shape as a no-op."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from e2e_workload import kafka_consumer, run_sql, wait_for

from playground.cluster import CdcServer, current_lsn
from playground.compare import compare_tables
from playground.compare_schema import assert_schemas_equal, target_tables
from playground.servers import KafkaServer, PostgresServer

pytestmark = pytest.mark.e2e

TABLES = ["public.items", "public.empty_one", "public.filled"]


@pytest.fixture
def source_schema() -> str:
    return "CREATE TABLE items (id int PRIMARY KEY, name text);\n"


def test_an_empty_created_table_reaches_sqlite_and_postgresql_and_a_replay_is_a_no_op(
        cdc_server: CdcServer, kafka_server: KafkaServer, kafka_topic: str, pg_server: PostgresServer,
        pg_database: str, source: Any, tmp_path: Path) -> None:
    sink = kafka_server.uri(kafka_topic, protocol="canal-json", partition_num="2")
    cdc_server.create_changefeed("kc", pg_server.uri(pg_database), sink, snapshot="none")
    wait_for(cdc_server, "kc", lambda q: q["phase"] == "streaming" and q["checkpoint_ts"] > 0, "streaming")
    run_sql(source,
            "INSERT INTO items VALUES (1, 'a'), (2, 'b')",
            "CREATE TABLE empty_one (id bigint PRIMARY KEY, price numeric(10,2), label varchar(20) NOT NULL, "
            "at timestamptz)",
            "CREATE TABLE filled (k text PRIMARY KEY, v int, note varchar(8))",
            "INSERT INTO filled SELECT 'k' || g, g, 'n' FROM generate_series(1, 20) g",
            "UPDATE filled SET v = v * 10 WHERE v % 3 = 0", "DELETE FROM filled WHERE v = 7",
            "INSERT INTO items VALUES (3, 'c')")
    checkpoint = cdc_server.wait_checkpoint("kc", current_lsn(source), timeout=90)["checkpoint_ts"]
    q = cdc_server.changefeed("kc")
    assert q["state"] == "normal" and not q["warnings"], q
    pg_target = f"target_{uuid.uuid4().hex[:10]}"
    pg_server.create_database(pg_target)
    for target in (f"sqlite:///{tmp_path / 'rebuilt.db'}", pg_server.uri(pg_target)):
        for position in ("kafka-consumer", "from-the-start"):  # the second: every CREATE read and applied again
            kafka_consumer(sink, target, pg_server.uri(pg_database), checkpoint, "--position", position)
            assert {"empty_one", "filled", "items"} <= target_tables(target), target
            bad = [d for d in compare_tables(source, TABLES, target) if not d.equal]
            assert not bad, f"the consumer's tables differ from the upstream ({position}): {bad}"
            assert_schemas_equal(source, TABLES, target)
