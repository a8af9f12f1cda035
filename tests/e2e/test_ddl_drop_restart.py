"""End to end: a DROP TABLE committed upstream while its span is not running is applied when the span starts again
(docs/ddl.md, "A DROP TABLE decoded after a restart").

A DROP TABLE takes the table out of the span's publication in the dropping transaction. A span that starts after
that commit, from a checkpoint before it (paused, or its capture restarted), decodes the DROP with the table no longer
in its publication, and its new stream has shown no row of the table yet; it used to decide from the publication
whether the DDL concerned it and left the DROP out: the old rows stayed downstream and the changefeed said
``normal``. Here the table is dropped while its span is stopped (paused, or its capture SIGKILLed): once the span
runs again the table must be gone downstream, and a new table of the name must start empty there. Each case ends with a row-by-row
compare and the changefeed ``normal`` without warnings (measured without the fix: ``gone`` stayed downstream with its
20 rows, state ``normal``; the CREATE TABLE of the new incarnation then failed the changefeed on the old rows).
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from e2e_workload import assert_converged, run_sql, wait_for

from cdc.events import TableName
from cdc.spans import span_of
from playground.cluster import CdcServer
from playground.compare_schema import target_tables
from playground.servers import PostgresServer

pytestmark = pytest.mark.e2e

SPANS = 2
SCHEMA = """
CREATE TABLE gone (id int PRIMARY KEY, v text);
CREATE TABLE kept (id int PRIMARY KEY, v text);
"""
TABLES = ["public.gone", "public.kept"]


@pytest.fixture
def source_schema() -> str:
    return SCHEMA


@pytest.fixture(params=["postgresql"])  # the span's decision is the upstream's: one target is enough
def sink_uri(request: pytest.FixtureRequest, tmp_path: Any, pg_server: PostgresServer) -> str:
    from e2e_workload import make_sink_uri

    return make_sink_uri(request.param, request, tmp_path, pg_server)


def _wait_spans_stopped(cdc: CdcServer, cf: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        q = cdc.changefeed(cf)
        if q["state"] == "stopped" and all(s["capture"] is None and not s["running"] for s in q["spans"]):
            return
        assert time.monotonic() < deadline, f"the spans of {cf} did not stop: {q}\n{cdc.log_tail()}"
        time.sleep(0.2)


@pytest.mark.kills
@pytest.mark.parametrize("how", ["pause", "restart"])
def test_a_drop_committed_while_the_span_is_stopped_is_applied_when_it_starts(
    cdc_server: CdcServer, pg_server: PostgresServer, pg_database: str, source: Any, sink_uri: str, how: str,
) -> None:
    assert span_of(TableName("public", "gone"), SPANS) != span_of(TableName("public", "kept"), SPANS)
    cdc = cdc_server
    cdc.create_changefeed("drop", pg_server.uri(pg_database), sink_uri, config=f"span-count = {SPANS}\n",
                          snapshot="none")
    run_sql(source, "INSERT INTO gone SELECT g, 'old ' || g FROM generate_series(1, 20) g",
            "INSERT INTO kept SELECT g, 'kept ' || g FROM generate_series(1, 20) g")
    assert_converged(cdc, "drop", source, sink_uri, tables=TABLES, schemas=True)

    if how == "pause":
        cdc.request("POST", "/api/v2/changefeeds/drop/pause")
        _wait_spans_stopped(cdc, "drop")
    else:
        cdc.kill()
    # committed upstream, not applied downstream: the table leaves its span's publication with this commit
    run_sql(source, "DROP TABLE gone", "INSERT INTO kept VALUES (21, 'after the drop')")
    if how == "pause":
        cdc.request("POST", "/api/v2/changefeeds/drop/resume")
    else:
        cdc.start()

    assert_converged(cdc, "drop", source, sink_uri, tables=["public.kept"], schemas=True)
    assert "gone" not in target_tables(sink_uri), "the dropped table's rows are still downstream"
    q = wait_for(cdc, "drop", lambda q: True, "query")
    assert q["state"] == "normal" and not q["warnings"], q

    # a new table of the name starts empty downstream, with only its own rows
    run_sql(source, "CREATE TABLE gone (id int PRIMARY KEY, w int)", "INSERT INTO gone VALUES (1, 10), (30, 300)")
    assert_converged(cdc, "drop", source, sink_uri, tables=TABLES, schemas=True)
    q = wait_for(cdc, "drop", lambda q: True, "query")
    assert q["state"] == "normal" and not q["warnings"], q
