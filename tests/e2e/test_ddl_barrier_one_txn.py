"""End to end: name-changing DDLs of two spans inside *one* transaction go downstream in the upstream's order
(docs/ddl.md, "Changefeed barrier").

``BEGIN; DROP TABLE dst; ALTER TABLE src RENAME TO dst; COMMIT`` with ``src`` and ``dst`` in two spans: both spans
meet their changefeed barrier at the same commit Ts. Before the fix each lowered its own checkpoint to that Ts - 1
and both passed at once, and both DDLs were recorded downstream under the same ``(commit Ts, seq 0)``, so the one
applied second was taken for a replay and skipped: ``dst`` ended with 1 row of 21 downstream (the rename never
happened, the old ``src`` stayed behind) while the changefeed said ``normal``. Now each DDL carries its position in
the transaction, counted the same in every span, and a span waiting at ``(commit Ts, seq)`` passes only once every
other span finished that commit or waits at a later DDL of it. On PostgreSQL the span of ``dst`` is also held back
by a lock on its downstream table, so the rename reaches its barrier first and must wait for the DROP.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from e2e_workload import assert_converged, make_sink_uri, run_sql, wait_for

from cdc.events import TableName
from cdc.spans import span_of
from playground.cluster import CdcServer
from playground.compare import sqlalchemy_url
from playground.servers import PostgresServer

pytestmark = pytest.mark.e2e

SCHEMA = """
CREATE TABLE src (id int PRIMARY KEY, v text);
CREATE TABLE dst (id int PRIMARY KEY, v text);
"""
FILL = ("INSERT INTO src SELECT g, 'src ' || g FROM generate_series(1, 20) g",
        "INSERT INTO dst SELECT g, 'dst ' || g FROM generate_series(1, 20) g")
# one upstream transaction: the old dst's last row, its DROP, the rename onto its name, a row of the new dst
ONE_TXN = ("BEGIN", "INSERT INTO dst VALUES (100, 'last row of the old dst')", "DROP TABLE dst",
           "ALTER TABLE src RENAME TO dst", "INSERT INTO dst VALUES (200, 'first row after the rename')", "COMMIT")


@pytest.fixture
def source_schema() -> str:
    return SCHEMA


@pytest.fixture(params=["postgresql", "sqlite", "mariadb"])
def sink_uri(request: pytest.FixtureRequest, tmp_path: Path, pg_server: PostgresServer) -> str:
    return make_sink_uri(request.param, request, tmp_path, pg_server)


def _downstream_tables(sink_uri: str) -> set[str]:
    engine = sa.create_engine(sqlalchemy_url(sink_uri))
    try:
        schema = "public" if sink_uri.startswith("postgres") else None
        return set(sa.inspect(engine).get_table_names(schema=schema))
    finally:
        engine.dispose()


def test_drop_and_rename_onto_its_name_in_one_transaction_across_spans(
    cdc_server: CdcServer, pg_server: PostgresServer, pg_database: str, source: Any, sink_uri: str
) -> None:
    assert span_of(TableName("public", "src"), 2) != span_of(TableName("public", "dst"), 2)
    cdc = cdc_server
    cdc.create_changefeed("one", pg_server.uri(pg_database), sink_uri, config="span-count = 2\n", snapshot="none")
    run_sql(source, *FILL, "UPDATE src SET v = v || '!'", "UPDATE dst SET v = v || '!'")
    assert_converged(cdc, "one", source, sink_uri, tables=["public.src", "public.dst"], schemas=True)

    holder = None
    if sink_uri.startswith("postgres"):  # the span of dst cannot write or drop it until released: the rename waits
        holder = pg_server.connect(sink_uri.rsplit("/", 1)[1].split("?")[0])
        holder.autocommit = False
        with holder.cursor() as cur:
            cur.execute("LOCK TABLE public.dst IN ACCESS EXCLUSIVE MODE")
    try:
        run_sql(source, *ONE_TXN)
        if holder is not None:
            time.sleep(4)
            q = wait_for(cdc, "one", lambda q: True, "query")
            assert q["state"] == "normal", q  # waiting, not failed
            assert "src" in _downstream_tables(sink_uri), "the rename did not wait for the DROP of its new name"
    finally:
        if holder is not None:
            holder.commit()
            holder.close()
    assert_converged(cdc, "one", source, sink_uri, tables=["public.dst"], schemas=True)
    assert "src" not in _downstream_tables(sink_uri)  # renamed, not left behind
    q = wait_for(cdc, "one", lambda q: True, "query")
    assert q["state"] == "normal" and not q["warnings"], q


def test_drop_and_rename_in_one_transaction_while_other_ddl_interleaves(
    cdc_server: CdcServer, pg_server: PostgresServer, pg_database: str, source: Any, sink_uri: str
) -> None:
    """Several name-changing DDLs of both spans interleaved in one transaction: each span passes its barrier at
    each of its DDLs in the transaction's order (dst moved away and back, src renamed onto a name twice)."""
    cdc = cdc_server
    cdc.create_changefeed("many", pg_server.uri(pg_database), sink_uri, config="span-count = 2\n", snapshot="none")
    run_sql(source, *FILL)
    assert_converged(cdc, "many", source, sink_uri, tables=["public.src", "public.dst"], schemas=True)
    run_sql(source, "BEGIN",
            "ALTER TABLE dst RENAME TO old_dst",          # span of dst: the name dst is free
            "ALTER TABLE src RENAME TO dst",              # span of src: takes it
            "INSERT INTO dst VALUES (300, 'renamed src')",
            "DROP TABLE old_dst",                         # span of dst again, after the other span's rename
            "CREATE TABLE src (id int PRIMARY KEY, v text)",
            "INSERT INTO src VALUES (1, 'a new src')",
            "COMMIT")
    assert_converged(cdc, "many", source, sink_uri, tables=["public.dst", "public.src"], schemas=True)
    assert "old_dst" not in _downstream_tables(sink_uri)
    q = wait_for(cdc, "many", lambda q: True, "query")
    assert q["state"] == "normal" and not q["warnings"], q
