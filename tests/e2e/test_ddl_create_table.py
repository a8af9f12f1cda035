"""End to end: a table created after the changefeed is replicated from its first row (issue 9, CREATE TABLE).

The DDL trigger joins a new table that the filter selects to its span's publication in the creating transaction
(``tidewater.ddl_join``), so rows written right after the CREATE TABLE in the same transaction, also in a
transaction large enough to be streamed before it commits, reach the target; the CREATE TABLE is applied
downstream at its position (behind the changefeed barrier across spans), and a DROP plus CREATE of the same name
starts an empty table. PostgreSQL -> MariaDB / PostgreSQL / SQLite, two spans, ending in a row-by-row compare
with the changefeed ``normal`` and no warning (before, those rows were reported as not replicated)."""

from __future__ import annotations

from typing import Any

import pytest
from e2e_workload import assert_converged, run_sql, wait_for

from playground.cluster import CdcServer
from playground.servers import PostgresServer

pytestmark = pytest.mark.e2e


@pytest.fixture
def source_schema() -> str:
    return "CREATE TABLE base (id int PRIMARY KEY, v text);"


def test_tables_created_later_are_replicated_from_their_first_row(
        cdc_server: CdcServer, pg_server: PostgresServer, pg_database: str, source: Any, sink_uri: str) -> None:
    cdc = cdc_server
    cdc.create_changefeed("fresh", pg_server.uri(pg_database), sink_uri, "span-count = 2\n")
    run_sql(source, "INSERT INTO base SELECT g, 'b' || g FROM generate_series(1, 20) g")
    tables = ["public.base"]
    assert_converged(cdc, "fresh", source, sink_uri, tables=tables, schemas=True)

    # created, filled and changed in one transaction; then more rows in their own transactions
    run_sql(source, "BEGIN", "CREATE TABLE fresh_a (id int PRIMARY KEY, v text, n numeric(6,2))",
            "INSERT INTO fresh_a SELECT g, 'a' || g, g / 4.0 FROM generate_series(1, 50) g",
            "UPDATE fresh_a SET v = 'upd' WHERE id % 7 = 0", "DELETE FROM fresh_a WHERE id = 3",
            "INSERT INTO base VALUES (21, 'same txn')", "COMMIT")
    run_sql(source, "CREATE TABLE fresh_b (k text PRIMARY KEY, at date)",
            "INSERT INTO fresh_b VALUES ('x', '2026-01-01'), ('y', NULL)", "UPDATE fresh_b SET at = now() WHERE k = 'y'")
    # a transaction streamed before it commits (logical_decoding_work_mem = 64kB in the test server)
    run_sql(source, "BEGIN", "CREATE TABLE fresh_c (id bigint PRIMARY KEY, pad text)",
            "INSERT INTO fresh_c SELECT g, repeat('p', 100) FROM generate_series(1, 5000) g", "COMMIT")
    tables += ["public.fresh_a", "public.fresh_b", "public.fresh_c"]
    assert_converged(cdc, "fresh", source, sink_uri, tables=tables, schemas=True)

    # DROP and CREATE of the same name in one transaction: the new incarnation starts empty downstream
    run_sql(source, "BEGIN", "DROP TABLE fresh_a", "CREATE TABLE fresh_a (id int PRIMARY KEY, w int)",
            "INSERT INTO fresh_a VALUES (1, 10), (2, 20)", "COMMIT")
    run_sql(source, "INSERT INTO fresh_a VALUES (3, 30)", "DELETE FROM fresh_b WHERE k = 'x'")
    assert_converged(cdc, "fresh", source, sink_uri, tables=tables, schemas=True)

    q = wait_for(cdc, "fresh", lambda q: True, "query")
    assert q["state"] == "normal" and not q["warnings"], q


def _indexes(sink: str, table: str) -> dict[str, tuple[tuple[str, ...], bool]]:
    import sqlalchemy as sa

    from playground.compare import sqlalchemy_url

    engine = sa.create_engine(sqlalchemy_url(sink))
    try:
        schema = "public" if sink.startswith("postgresql") else None
        return {ix["name"]: (tuple(ix["column_names"]), bool(ix["unique"]))
                for ix in sa.inspect(engine).get_indexes(table, schema=schema)}
    finally:
        engine.dispose()


def test_create_and_drop_index_replay_downstream_with_replicate_indexes(
        cdc_server: CdcServer, pg_server: PostgresServer, pg_database: str, source: Any, sink_uri: str) -> None:
    cdc = cdc_server
    cdc.create_changefeed("ix", pg_server.uri(pg_database), sink_uri, "[ddl]\nreplicate-indexes = true\n", snapshot="none")
    run_sql(source, "INSERT INTO base SELECT g, 'b' || g FROM generate_series(1, 20) g")
    assert_converged(cdc, "ix", source, sink_uri, tables=["public.base"], schemas=True)

    run_sql(source, "ALTER TABLE base ADD COLUMN code int", "UPDATE base SET code = id * 10",
            "BEGIN", "CREATE INDEX base_v_idx ON base (v, id)", "INSERT INTO base VALUES (21, 'x', 210)",
            "CREATE UNIQUE INDEX base_code_key ON base (code)", "COMMIT",
            "CREATE INDEX base_lower_idx ON base (lower(v))",  # an expression: not replayed
            "CREATE INDEX base_part_idx ON base (id) WHERE code > 100")  # partial: not replayed
    assert_converged(cdc, "ix", source, sink_uri, tables=["public.base"], schemas=True)
    ixs = _indexes(sink_uri, "base")
    assert ixs.get("base_v_idx") == (("v", "id"), False), ixs
    assert ixs.get("base_code_key") == (("code",), True), ixs
    assert "base_lower_idx" not in ixs and "base_part_idx" not in ixs, ixs

    run_sql(source, "BEGIN", "DROP INDEX base_v_idx", "UPDATE base SET v = 'after drop' WHERE id = 1", "COMMIT")
    assert_converged(cdc, "ix", source, sink_uri, tables=["public.base"], schemas=True)
    ixs = _indexes(sink_uri, "base")
    assert "base_v_idx" not in ixs and "base_code_key" in ixs, ixs
    q = wait_for(cdc, "ix", lambda q: True, "query")
    assert q["state"] == "normal" and not q["warnings"], q


def test_indexes_are_not_replayed_by_default(
        cdc_server: CdcServer, pg_server: PostgresServer, pg_database: str, source: Any, sink_uri: str) -> None:
    cdc = cdc_server
    cdc.create_changefeed("noix", pg_server.uri(pg_database), sink_uri, snapshot="none")
    run_sql(source, "INSERT INTO base VALUES (1, 'a')", "CREATE INDEX base_v_idx ON base (v)",
            "INSERT INTO base VALUES (2, 'b')")
    assert_converged(cdc, "noix", source, sink_uri, tables=["public.base"], schemas=True)
    assert "base_v_idx" not in _indexes(sink_uri, "base")
