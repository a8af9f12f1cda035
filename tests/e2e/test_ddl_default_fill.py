"""End to end: ADD COLUMN with a non-constant default on a table with rows (issue 20 item 3), PostgreSQL ->
MariaDB / PostgreSQL / SQLite.

Upstream, the rows that existed get the default: one value for all of them when it is STABLE (``now()``, kept by
PostgreSQL as the column's missing value, which the DDL message carries), one value each when it is VOLATILE
(``clock_timestamp()``, ``gen_random_uuid()``: the table is rewritten, and the sink reads the values back by key).
Rows changed, deleted and inserted around the DDL, in its transaction and after it, converge with the read-back
values. Every step ends with a row-by-row and schema compare and no warning on the changefeed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from e2e_workload import assert_converged, run_sql, wait_for

from cdc.events import TableName
from playground.cluster import CdcServer, current_lsn
from playground.compare import compare_rows, compare_tables
from playground.compare_schema import assert_schemas_equal
from playground.servers import KafkaServer, PostgresServer
from sinks.storage.reader import StorageReader, rebuild

pytestmark = pytest.mark.e2e

SCHEMA = "CREATE TABLE orders (id int PRIMARY KEY, amount int);"
TABLES = ["public.orders"]


@pytest.fixture
def source_schema() -> str:
    return SCHEMA


def test_stable_and_volatile_defaults_fill_the_existing_rows_with_upstreams_values(
    cdc_server: CdcServer, pg_server: PostgresServer, pg_database: str, source: Any, sink_uri: str
) -> None:
    cdc = cdc_server
    cdc.create_changefeed("fill", pg_server.uri(pg_database), sink_uri)
    run_sql(source, "INSERT INTO orders SELECT g, g FROM generate_series(1, 40) g")
    assert_converged(cdc, "fill", source, sink_uri, tables=TABLES, schemas=True)

    # STABLE: every existing row holds the DDL's now(); rows after it in its transaction carry their own values
    run_sql(source, "BEGIN", "UPDATE orders SET amount = 100 WHERE id = 1",
            "ALTER TABLE orders ADD COLUMN created_at timestamptz NOT NULL DEFAULT now()",
            "UPDATE orders SET amount = 200 WHERE id = 2", "INSERT INTO orders (id, amount) VALUES (41, 41)", "COMMIT")
    run_sql(source, "ALTER TABLE orders ADD COLUMN who text DEFAULT current_user",
            "DELETE FROM orders WHERE id = 3")
    assert_converged(cdc, "fill", source, sink_uri, tables=TABLES, schemas=True)

    # VOLATILE: each row its own value, read back by key; rows changed or deleted after it converge
    run_sql(source, "BEGIN", "ALTER TABLE orders ADD COLUMN token uuid DEFAULT gen_random_uuid(), "
            "ADD COLUMN seen timestamptz DEFAULT clock_timestamp(), ADD COLUMN n int DEFAULT 7",
            "UPDATE orders SET amount = 300 WHERE id = 4", "COMMIT")
    run_sql(source, "UPDATE orders SET token = gen_random_uuid() WHERE id = 5", "DELETE FROM orders WHERE id = 6",
            "INSERT INTO orders (id, amount) VALUES (42, 42)")
    assert_converged(cdc, "fill", source, sink_uri, tables=TABLES, schemas=True)
    with source.cursor() as cur:
        cur.execute("SELECT count(DISTINCT token), count(DISTINCT seen), count(DISTINCT created_at) FROM orders")
        tokens, seen, created = cur.fetchone()
    assert tokens > 30 and seen > 1 and created >= 1  # the values really were per row
    q = wait_for(cdc, "fill", lambda q: True, "query")
    assert q["state"] == "normal" and not q["warnings"], q


def test_the_kafka_consumer_fills_the_existing_rows_from_the_ddl_header_and_the_upstream(
        cdc_server: CdcServer, kafka_server: KafkaServer, kafka_topic: str, pg_server: PostgresServer,
        pg_database: str, source: Any, tmp_path: Path) -> None:
    run_sql(source, "INSERT INTO orders SELECT g, g FROM generate_series(1, 30) g")
    sink = kafka_server.uri(kafka_topic, protocol="canal-json", partition_num="2")
    cdc_server.create_changefeed("kf", pg_server.uri(pg_database), sink)
    wait_for(cdc_server, "kf", lambda q: q["phase"] == "streaming" and q["checkpoint_ts"] > 0, "the initial copy")
    run_sql(source, "ALTER TABLE orders ADD COLUMN created_at timestamptz NOT NULL DEFAULT now()",
            "UPDATE orders SET amount = 0 WHERE id = 1",
            "ALTER TABLE orders ADD COLUMN token uuid DEFAULT gen_random_uuid()",
            "DELETE FROM orders WHERE id = 2", "INSERT INTO orders (id, amount) VALUES (31, 31)")
    checkpoint = cdc_server.wait_checkpoint("kf", current_lsn(source), timeout=90)["checkpoint_ts"]
    q = cdc_server.changefeed("kf")
    assert q["state"] == "normal" and not q["warnings"], q
    target = f"sqlite:///{tmp_path / 'rebuilt.db'}"
    out = subprocess.run(
        [sys.executable, "-m", "cdc", "cli", "kafka-consumer", "--kafka-uri", sink, "--sink-uri", target,
         "--upstream", pg_server.uri(pg_database), "--until-ts", str(checkpoint), "--timeout", "90"],
        capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout)["applied_ts"] >= checkpoint
    assert "WarnDdlDefault" not in out.stderr, out.stderr[-3000:]
    bad = [d for d in compare_tables(source, TABLES, target) if not d.equal]
    assert not bad, f"the consumer's tables differ from the upstream: {bad}"
    assert_schemas_equal(source, TABLES, target)


@pytest.mark.parametrize("protocol", ["canal-json", "csv"])
def test_the_storage_reader_fills_the_existing_rows_from_the_schema_file(
        cdc_server: CdcServer, pg_server: PostgresServer, pg_database: str, source: Any, tmp_path: Path,
        protocol: str) -> None:
    import time

    run_sql(source, "INSERT INTO orders SELECT g, g FROM generate_series(1, 30) g")
    sink = f"file://{tmp_path / 'lake'}?protocol={protocol}&flush-interval=200ms"
    cdc_server.create_changefeed("sf", pg_server.uri(pg_database), sink)
    wait_for(cdc_server, "sf", lambda q: q["phase"] == "streaming" and q["checkpoint_ts"] > 0, "the initial copy")
    run_sql(source, "BEGIN", "ALTER TABLE orders ADD COLUMN created_at timestamptz NOT NULL DEFAULT now(), "
            "ADD COLUMN who text DEFAULT current_user", "UPDATE orders SET amount = 0 WHERE id = 1", "COMMIT",
            "DELETE FROM orders WHERE id = 2", "INSERT INTO orders (id, amount) VALUES (31, 31)")
    lsn = current_lsn(source)
    cdc_server.wait_checkpoint("sf", lsn, timeout=90)
    reader = StorageReader(sink)
    deadline = time.monotonic() + 60
    while (reader.checkpoint() or 0) < lsn and time.monotonic() < deadline:
        time.sleep(0.2)
    _, states = rebuild(sink)
    state = states[TableName.parse("public.orders")]
    assert not state.problems, state.problems[:5]
    diff = compare_rows(source, "public.orders", state.rows())
    assert diff.equal, f"the table rebuilt from the files differs from the upstream: {diff}"
    q = cdc_server.changefeed("sf")
    assert q["state"] == "normal" and not q["warnings"], q

    # a volatile default: the storage sink cannot write each row's value, and says so
    run_sql(source, "ALTER TABLE orders ADD COLUMN token uuid DEFAULT gen_random_uuid()")
    q = wait_for(cdc_server, "sf", lambda q: any(w["code"] == "CDC:WarnDdlDefault" for w in q["warnings"]),
                 "the warning")
    (w,) = [w for w in q["warnings"] if w["code"] == "CDC:WarnDdlDefault"]
    assert w["table"] == "public.orders" and "token" in w["message"], w
