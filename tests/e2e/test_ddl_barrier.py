"""End to end: a DDL that changes which table a name belongs to waits at a changefeed barrier (issue 9 item 2).

``DROP TABLE dst; ALTER TABLE src RENAME TO dst`` with ``src`` and ``dst`` in two spans: the span of ``src``
must not rename onto the downstream ``dst`` before the span of ``dst`` has written its last rows and dropped it
(the target would refuse the rename, or worse, mix two tables' rows). The span of ``dst`` is held back by a lock
on the downstream table; the rename waits for it, then everything ends equal.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from e2e_workload import assert_converged, make_sink_uri, run_sql, wait_for

from cdc.events import TableName
from cdc.spans import span_of
from playground.cluster import CdcServer
from playground.servers import PostgresServer

pytestmark = pytest.mark.e2e

SCHEMA = """
CREATE TABLE src (id int PRIMARY KEY, v text);
CREATE TABLE dst (id int PRIMARY KEY, v text);
"""
FILL = ("INSERT INTO src SELECT g, 'src ' || g FROM generate_series(1, 20) g",
        "INSERT INTO dst SELECT g, 'dst ' || g FROM generate_series(1, 20) g")


@pytest.fixture
def source_schema() -> str:
    return SCHEMA


@pytest.fixture(params=["postgresql"])  # the hold-back below uses PostgreSQL's table locks
def sink_uri(request: pytest.FixtureRequest, tmp_path: Path, pg_server: PostgresServer) -> str:
    return make_sink_uri(request.param, request, tmp_path, pg_server)


def test_a_rename_onto_a_name_dropped_in_another_span_waits_for_that_span(
    cdc_server: CdcServer, pg_server: PostgresServer, pg_database: str, source: Any, sink_uri: str
) -> None:
    assert span_of(TableName("public", "src"), 2) != span_of(TableName("public", "dst"), 2)
    cdc = cdc_server
    # the rows are written after create: streamed, no initial copy needed (the barrier is what this test is about)
    cdc.create_changefeed("bar", pg_server.uri(pg_database), sink_uri, config="span-count = 2\n", snapshot="none")
    run_sql(source, *FILL, "UPDATE src SET v = v || '!'", "UPDATE dst SET v = v || '!'")
    assert_converged(cdc, "bar", source, sink_uri, tables=["public.src", "public.dst"], schemas=True)

    target_db = sink_uri.rsplit("/", 1)[1].split("?")[0]
    holder = pg_server.connect(target_db)  # holds the downstream dst: the span of dst cannot write or drop it
    holder.autocommit = False
    with holder.cursor() as cur:
        cur.execute("LOCK TABLE public.dst IN ACCESS EXCLUSIVE MODE")
    released = threading.Event()

    def release_later() -> None:
        time.sleep(6)
        holder.commit()
        released.set()

    run_sql(source, "INSERT INTO dst VALUES (100, 'last row of the old dst')", "DROP TABLE dst",
            "ALTER TABLE src RENAME TO dst", "INSERT INTO dst VALUES (200, 'first row after the rename')")
    t = threading.Thread(target=release_later, daemon=True)
    t.start()
    try:
        time.sleep(3)
        q = wait_for(cdc, "bar", lambda q: True, "query")
        assert q["state"] == "normal", q  # waiting, not failed
        t.join()
    finally:
        released.wait(10)
        holder.close()
    assert_converged(cdc, "bar", source, sink_uri, tables=["public.dst"], schemas=True)
    q = wait_for(cdc, "bar", lambda q: True, "query")
    assert q["state"] == "normal" and not q["warnings"], q


def test_a_capture_killed_while_a_span_waits_at_the_barrier_loses_nothing(
    cdc_server: CdcServer, pg_server: PostgresServer, pg_database: str, source: Any, sink_uri: str
) -> None:
    """``DROP TABLE src`` waits at the barrier while the span of ``dst`` is held back (the lock), and the capture is
    SIGKILLed and restarted then. The waiting span counts as just below the DROP's commit (``SpanStatus.covered_ts``)
    but its stored checkpoint, where it restarts and what its slot is confirmed up to, stays below that transaction: a
    checkpoint at its commit Ts - 1 (inside the commit record) made PostgreSQL skip the whole transaction on restart
    (seen: the restart began at exactly that LSN), and the DROP was lost, ``src`` staying downstream with the changefeed
    ``normal`` (a RENAME was caught later by the stream's Relation message, a DROP cannot be)."""
    cdc = cdc_server
    cdc.create_changefeed("bar", pg_server.uri(pg_database), sink_uri, config="span-count = 2\n", snapshot="none")
    run_sql(source, *FILL)
    assert_converged(cdc, "bar", source, sink_uri, tables=["public.src", "public.dst"], schemas=True)
    target_db = sink_uri.rsplit("/", 1)[1].split("?")[0]
    holder = pg_server.connect(target_db)
    holder.autocommit = False
    with holder.cursor() as cur:
        cur.execute("LOCK TABLE public.dst IN ACCESS EXCLUSIVE MODE")
    try:
        run_sql(source, "INSERT INTO dst VALUES (100, 'held back')", "DROP TABLE src",
                "INSERT INTO dst VALUES (101, 'after the drop')")
        time.sleep(4)  # the span of src waits at the DROP's barrier; its status (and slot) stored meanwhile
        cdc.kill()
    finally:
        holder.commit()
        holder.close()
    cdc.start()
    assert_converged(cdc, "bar", source, sink_uri, tables=["public.dst"], schemas=True)
    q = wait_for(cdc, "bar", lambda q: q["state"] == "normal", "state normal")
    assert not q["warnings"], q
    # (the checkpoint passed the DROP's commit: it is applied, or lost)
    assert pg_server.execute("SELECT to_regclass('public.src') IS NULL", db=target_db) == [(True,)], \
        "DROP TABLE src never reached the target"
