"""End to end: a changefeed without Tidewater's DDL triggers upstream (a user who may not create event triggers)
says so in its API for as long as it lasts, and what the row stream shows of schema changes still applies,
PostgreSQL -> MariaDB / PostgreSQL / SQLite. Ends with a row-by-row compare."""

from __future__ import annotations

from typing import Any

import pytest
from e2e_workload import assert_converged, run_sql, wait_for

from playground.cluster import CdcServer
from playground.servers import PostgresServer
from upstream.postgres import capture_objects

pytestmark = pytest.mark.e2e

SCHEMA = "CREATE TABLE items (id int PRIMARY KEY, name text);"


@pytest.fixture
def source_schema() -> str:
    return SCHEMA


def test_without_the_triggers_the_changefeed_says_what_it_cannot_see_and_a_table_rename_still_applies(
    cdc_server: CdcServer, pg_server: PostgresServer, pg_database: str, source: Any, sink_uri: str
) -> None:
    cdc = cdc_server
    cdc.create_changefeed("fb", pg_server.uri(pg_database), sink_uri, config="[filter]\nrules = ['public.*']\n", snapshot="none")
    slots = [s for (s,) in pg_server.execute("SELECT slot_name FROM pg_replication_slots WHERE database = "
                                             "current_database()", db=pg_database)]
    assert capture_objects.uninstall(source, *slots)
    q = wait_for(cdc, "fb", lambda q: any(w["code"] == "CDC:NoticeDdlNotCaptured" for w in q["warnings"]),
                 "the notice", timeout=90)
    (notice,) = q["warnings"]
    assert q["state"] == "normal" and notice["severity"] == "notice", q
    assert "column RENAME fails" in notice["message"] and "DROP TABLE" in notice["message"]
    run_sql(source, "INSERT INTO items SELECT g, 'i' || g FROM generate_series(1, 30) g")
    assert_converged(cdc, "fb", source, sink_uri, tables=["public.items"], schemas=True)
    # a table rename is seen in the stream (same table, new name): the downstream table follows with its rows
    run_sql(source, "ALTER TABLE items RENAME TO goods", "UPDATE goods SET name = 'renamed' WHERE id <= 3",
            "INSERT INTO goods VALUES (31, 'new')")
    assert_converged(cdc, "fb", source, sink_uri, tables=["public.goods"], schemas=True)
    q = wait_for(cdc, "fb", lambda q: True, "query")
    assert q["state"] == "normal" and [w["code"] for w in q["warnings"]] == ["CDC:NoticeDdlNotCaptured"], q
