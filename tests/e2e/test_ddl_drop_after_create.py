"""End to end: a table dropped right after ``changefeed create`` is dropped downstream (docs/ddl.md, "Schema
history").

``changefeed create`` used to store each table's first schema history in an etcd transaction *after* the one that
made the changefeed visible to the owner. A span that started in between had no schema of a table whose rows it
had not streamed (here: rows the initial copy wrote), took the table's DROP TABLE for one from before the table
joined the span and left it out: the copied rows stayed downstream and the changefeed said ``normal`` (1 run in 6;
every run with a 1.5 s sleep before the history write). Now the histories are written no later than the info: checked
exactly on the etcd revisions (which fails without the fix every time), then the drop ends with the table gone
downstream and a new table of the same name compared row by row.
"""

from __future__ import annotations

from typing import Any

import pytest
from e2e_workload import assert_converged, run_sql, wait_for

from cdc.events import TableName
from cdc.meta import keys
from cdc.meta.etcd import EtcdClient
from cdc.spans import span_of
from playground.cluster import CdcServer
from playground.compare_schema import target_tables
from playground.servers import EtcdServer, PostgresServer

pytestmark = pytest.mark.e2e

SPANS = 2
SCHEMA = """
CREATE TABLE victim (id int PRIMARY KEY, v text);
CREATE TABLE kept (id int PRIMARY KEY, v text);
INSERT INTO victim SELECT g, 'copied ' || g FROM generate_series(1, 20) g;
INSERT INTO kept SELECT g, 'kept ' || g FROM generate_series(1, 20) g;
"""


@pytest.fixture
def source_schema() -> str:
    return SCHEMA


@pytest.fixture(params=["postgresql"])  # the span's decision is the upstream's: one target is enough
def sink_uri(request: pytest.FixtureRequest, tmp_path: Any, pg_server: PostgresServer) -> str:
    from e2e_workload import make_sink_uri

    return make_sink_uri(request.param, request, tmp_path, pg_server)


def test_a_table_dropped_right_after_create_is_dropped_downstream(
    cdc_server: CdcServer, etcd_server: EtcdServer, cluster_id: str, pg_server: PostgresServer, pg_database: str,
    source: Any, sink_uri: str,
) -> None:
    assert span_of(TableName("public", "victim"), SPANS) != span_of(TableName("public", "kept"), SPANS)
    cdc = cdc_server
    cdc.create_changefeed("early", pg_server.uri(pg_database), sink_uri, config=f"span-count = {SPANS}\n")
    # whoever saw the changefeed (the owner, then a span starting) saw every table's first schema history
    with EtcdClient([etcd_server.url]) as client:
        info = client.get(keys.changefeed_info_key(cluster_id, "early"))
        _, histories = client.get_prefix(keys.schema_history_prefix(cluster_id, "early"))
    assert info is not None and len(histories) == 2
    late = [(h.key, h.create_revision) for h in histories if h.create_revision > info.create_revision]
    assert not late, f"schema histories stored after the changefeed info (revision {info.create_revision}): {late}"

    wait_for(cdc, "early", lambda q: q["phase"] == "streaming", "the initial copy done", timeout=180)
    assert_converged(cdc, "early", source, sink_uri, tables=["public.victim", "public.kept"], schemas=True)
    # no row of victim streamed: the span knows the table from the history alone
    run_sql(source, "DROP TABLE victim", "INSERT INTO kept VALUES (21, 'after the drop')")
    assert_converged(cdc, "early", source, sink_uri, tables=["public.kept"], schemas=True)
    assert "victim" not in target_tables(sink_uri), "the dropped table's copied rows are still downstream"
    q = wait_for(cdc, "early", lambda q: True, "query")
    assert q["state"] == "normal" and not q["warnings"], q

    run_sql(source, "CREATE TABLE victim (id int PRIMARY KEY, w int)", "INSERT INTO victim VALUES (1, 10), (30, 300)")
    assert_converged(cdc, "early", source, sink_uri, tables=["public.victim", "public.kept"], schemas=True)
    q = wait_for(cdc, "early", lambda q: True, "query")
    assert q["state"] == "normal" and not q["warnings"], q
