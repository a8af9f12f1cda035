"""End to end: values TOASTed out of line survive updates that do not send them.

PostgreSQL stores a large value out of line (TOAST). An UPDATE that does not touch it logs only a
pointer, so pgoutput sends that column as 'unchanged TOAST' ('u') instead of its value. With REPLICA
IDENTITY DEFAULT the old row is not sent either (or only its key), so the downstream must keep the value
it has; with REPLICA IDENTITY FULL the old row carries it. Either way the downstream value must never
become NULL or empty: after every phase the target is compared with the source row by row.
"""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa
from e2e_workload import assert_converged

from playground.cluster import CdcServer
from playground.compare import sqlalchemy_url
from playground.servers import PostgresServer

pytestmark = pytest.mark.e2e

TABLES = ["public.toast_default", "public.toast_full"]
SCHEMA = """
CREATE TABLE toast_default (id int PRIMARY KEY, small int NOT NULL, big text NOT NULL);
CREATE TABLE toast_full (id int PRIMARY KEY, small int NOT NULL, big text NOT NULL);
ALTER TABLE toast_full REPLICA IDENTITY FULL;
"""
# 300 md5s: 9600 characters of random hex per row, far above the 2 kB TOAST threshold and not
# compressible below it, so the value is stored out of line. Correlated with g: one value per row.
BIG = "(SELECT string_agg(md5(random()::text || g::text || x::text), '') FROM generate_series(1, 300) x)"
CONFIG = "[filter]\nrules = ['public.toast_*']\n"


@pytest.fixture
def source_schema() -> str:
    return SCHEMA






def run(conn: Any, *statements: str) -> None:
    """Run ``statements`` in one upstream transaction, once for each of the two tables ({t})."""
    for table in ("toast_default", "toast_full"):
        conn.autocommit = False
        with conn.cursor() as cur:
            for stmt in statements:
                cur.execute(stmt.format(t=table, big=BIG))
        conn.commit()
    conn.autocommit = True


def insert(conn: Any, first: int, last: int) -> None:
    run(conn, f"INSERT INTO {{t}} SELECT g, g, {{big}} FROM generate_series({first}, {last}) g")


def assert_big_values_intact(conn: Any, sink: str) -> None:
    """Every downstream big value is a full 9600-character value (also checked by the row comparison,
    stated here so that a failure says what went wrong)."""
    engine = sa.create_engine(sqlalchemy_url(sink))
    try:
        with engine.connect() as tconn:
            for table in ("toast_default", "toast_full"):
                bad = tconn.execute(sa.text(
                    f"SELECT id, length(big) FROM {table} WHERE big IS NULL OR length(big) <> 9600")).fetchall()
                assert bad == [], f"{table}: rows whose big value was lost downstream: {bad}"
    finally:
        engine.dispose()


def converge(cdc: CdcServer, conn: Any, sink: str) -> None:
    info = assert_converged(cdc, "toast", conn, sink, tables=TABLES, timeout=120)
    assert info["state"] == "normal" and info["error"] is None, info
    assert_big_values_intact(conn, sink)


def test_unchanged_toast_values_keep_their_value_downstream(
    cdc_server: CdcServer, pg_server: PostgresServer, pg_database: str, source: Any, sink_uri: str
) -> None:
    cdc_server.create_changefeed("toast", pg_server.uri(pg_database), sink_uri, config=CONFIG, snapshot="none")
    insert(source, 1, 20)
    # the precondition of this test: the values really are stored out of line
    for table in ("toast_default", "toast_full"):
        stored = pg_server.execute(f"SELECT min(length(big)), min(pg_column_size(big)) FROM {table}", db=pg_database)
        assert stored[0][0] == 9600 and stored[0][1] > 2100, f"{table}: big values not TOASTed out of line: {stored}"
    converge(cdc_server, source, sink_uri)

    # only the small column changes: the big one arrives as unchanged TOAST
    run(source, "UPDATE {t} SET small = small + 1000")
    run(source, "UPDATE {t} SET small = -small WHERE id = 4")
    converge(cdc_server, source, sink_uri)

    # a key change (big unchanged), then a delete
    run(source, "UPDATE {t} SET id = id + 100 WHERE id = 3")
    run(source, "DELETE FROM {t} WHERE id = 5")
    run(source, "UPDATE {t} SET small = 7 WHERE id = 103")
    converge(cdc_server, source, sink_uri)

    # everything again while paused, so that it reaches the sink in as few batches as possible: inserts,
    # unchanged-TOAST updates and key moves of the same rows close together, some in one transaction
    assert cdc_server.request("POST", "/api/v2/changefeeds/toast/pause")["state"] == "stopped"
    insert(source, 200, 209)
    run(source, "UPDATE {t} SET small = small + 1 WHERE id >= 200")
    run(source, "UPDATE {t} SET id = id + 1000 WHERE id IN (201, 202)")
    run(source, "UPDATE {t} SET small = -1 WHERE id = 1201")
    run(source, "DELETE FROM {t} WHERE id = 203")
    run(source,
        "INSERT INTO {t} SELECT g, g, {big} FROM generate_series(300, 301) g",
        "UPDATE {t} SET small = 0 WHERE id = 300",
        "UPDATE {t} SET id = 310 WHERE id = 300",
        "UPDATE {t} SET id = 311, small = 5 WHERE id = 301")
    run(source, "UPDATE {t} SET id = 2007 WHERE id = 7", "UPDATE {t} SET small = 70 WHERE id = 2007")
    run(source, "UPDATE {t} SET id = 2008 WHERE id = 8")
    run(source, "UPDATE {t} SET small = 80 WHERE id = 2008")
    run(source, "UPDATE {t} SET id = 8 WHERE id = 2008")  # back onto the key it left in this batch
    assert cdc_server.request("POST", "/api/v2/changefeeds/toast/resume")["state"] == "normal"
    converge(cdc_server, source, sink_uri)

    # a big value that does change is sent in full and replaces the old one
    run(source, "UPDATE {t} SET big = upper(big) WHERE id = 1")
    converge(cdc_server, source, sink_uri)
    counts = pg_server.execute("SELECT count(*) FROM toast_default", db=pg_database)
    assert counts[0][0] == 20 - 1 + 10 - 1 + 2
