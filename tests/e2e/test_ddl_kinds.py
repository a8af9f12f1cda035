"""End to end: the DDL kinds not covered by test_ddl_replication.py, each interleaved with inserts, updates and
deletes, in the DDL's own transaction and in separate ones, PostgreSQL -> MariaDB / PostgreSQL / SQLite (issue 9
item 6): key changes (drop the primary key, add one on other columns, a key swap), SET/DROP DEFAULT, SET/DROP
NOT NULL, widening to numeric of more precision and scale, varchar to text, TRUNCATE, a multi-statement DDL
transaction over two tables, a table without a key gaining one. Every step ends with a row-by-row compare.
"""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa
from e2e_workload import assert_converged, run_sql, wait_for

from playground.cluster import CdcServer
from playground.compare import sqlalchemy_url
from playground.servers import PostgresServer

pytestmark = pytest.mark.e2e

SCHEMA = """
CREATE TABLE acct (id int PRIMARY KEY, code varchar(10) NOT NULL, amount numeric(8,2), note varchar(20));
CREATE TABLE logs (n int NOT NULL, msg text);
ALTER TABLE logs REPLICA IDENTITY FULL;
"""
TABLES = ["public.acct", "public.logs"]
FILL = ("INSERT INTO acct SELECT g, 'c' || g, g * 1.25, 'n' || g FROM generate_series(1, 40) g",
        "INSERT INTO logs SELECT g % 10, 'm' || g FROM generate_series(1, 30) g")


@pytest.fixture
def source_schema() -> str:
    return SCHEMA


def _target_key(sink: str, table: str) -> list[str]:
    engine = sa.create_engine(sqlalchemy_url(sink))
    try:
        schema = "public" if sink.startswith("postgresql") else None
        return list(sa.inspect(engine).get_pk_constraint(table, schema=schema)["constrained_columns"])
    finally:
        engine.dispose()


def test_key_default_not_null_widening_truncate_and_multi_table_ddl_transactions_end_equal(
    cdc_server: CdcServer, pg_server: PostgresServer, pg_database: str, source: Any, sink_uri: str
) -> None:
    cdc = cdc_server
    cdc.create_changefeed("kinds", pg_server.uri(pg_database), sink_uri, snapshot="none")
    run_sql(source, *FILL)
    assert_converged(cdc, "kinds", source, sink_uri, tables=TABLES, schemas=True)

    # defaults and NOT NULL, with rows between them in one transaction
    run_sql(source, "BEGIN", "ALTER TABLE acct ALTER COLUMN note SET DEFAULT 'dflt'",
            "INSERT INTO acct (id, code, amount) VALUES (41, 'c41', 1)", "ALTER TABLE acct ALTER COLUMN note SET NOT NULL",
            "UPDATE acct SET note = 'upd' WHERE id = 2", "ALTER TABLE acct ALTER COLUMN note DROP NOT NULL",
            "ALTER TABLE acct ALTER COLUMN note DROP DEFAULT", "INSERT INTO acct (id, code) VALUES (42, 'c42')",
            "COMMIT")
    assert_converged(cdc, "kinds", source, sink_uri, tables=TABLES, schemas=True)

    # widening: numeric to more precision and scale (stored values gain digits as upstream), varchar to text
    run_sql(source, "ALTER TABLE acct ALTER COLUMN amount TYPE numeric(14,4)",
            "UPDATE acct SET amount = 123456.1234 WHERE id = 3", "DELETE FROM acct WHERE id = 4")
    run_sql(source, "ALTER TABLE acct ALTER COLUMN note TYPE text", f"UPDATE acct SET note = '{'t' * 300}' WHERE id = 5")
    assert_converged(cdc, "kinds", source, sink_uri, tables=TABLES, schemas=True)

    # key change: the primary key moves from id to code, rows written and deleted by the new key after it
    run_sql(source, "BEGIN", "UPDATE acct SET amount = 7 WHERE id = 6", "ALTER TABLE acct DROP CONSTRAINT acct_pkey",
            "ALTER TABLE acct ADD PRIMARY KEY (code)", "UPDATE acct SET amount = 8 WHERE code = 'c7'",
            "DELETE FROM acct WHERE code = 'c8'", "INSERT INTO acct VALUES (7, 'c7b', 1, 'same id, other key')",
            "COMMIT")
    assert_converged(cdc, "kinds", source, sink_uri, tables=TABLES, schemas=True)
    assert _target_key(sink_uri, "acct") == ["code"]

    # a key-less table gains a key (its duplicates removed first), a multi-statement DDL transaction over two tables
    run_sql(source, "DELETE FROM logs WHERE ctid NOT IN (SELECT min(ctid) FROM logs GROUP BY n)")
    run_sql(source, "BEGIN", "ALTER TABLE logs ADD PRIMARY KEY (n)", "INSERT INTO logs VALUES (100, 'keyed')",
            "ALTER TABLE acct ADD COLUMN flag boolean DEFAULT true", "UPDATE acct SET flag = false WHERE code = 'c9'",
            "ALTER TABLE logs ALTER COLUMN msg SET DEFAULT 'x'", "UPDATE logs SET msg = 'upd' WHERE n = 1", "COMMIT")
    assert_converged(cdc, "kinds", source, sink_uri, tables=TABLES, schemas=True)
    assert _target_key(sink_uri, "logs") == ["n"]

    # TRUNCATE of both tables in one statement, then new rows; then the key dropped (back to a key-less table)
    run_sql(source, "TRUNCATE acct, logs", "INSERT INTO acct VALUES (1, 'c1', 1, 'after truncate', true)",
            "INSERT INTO logs VALUES (1, 'after truncate')")
    run_sql(source, "ALTER TABLE logs DROP CONSTRAINT logs_pkey", "INSERT INTO logs VALUES (1, 'after truncate')",
            "DELETE FROM logs WHERE n = 1 AND msg = 'after truncate' AND ctid = (SELECT min(ctid) FROM logs)")
    assert_converged(cdc, "kinds", source, sink_uri, tables=TABLES, schemas=True)
    q = wait_for(cdc, "kinds", lambda q: True, "query")
    assert q["state"] == "normal" and not q["warnings"], q
