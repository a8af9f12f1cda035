"""End to end: a target table dropped behind the changefeed's back (sinks/sql/target/table_record.py). A PostgreSQL
upstream streams into a PostgreSQL target through a real ``cdc server``; an operator drops a replicated table
downstream mid-stream. Before, the next write failed on the missing table, the span restarted, the sink created the
table again empty and went on with the new changes only: every row the table held was gone, the changefeed ``normal``.
Now the changefeed fails (as TiCDC fails on a sink error it cannot retry) with ``CDC:ErrTargetTableDropped`` naming the
table and the fix, in the API and in ``cdc cli changefeed query``, and the table stays missing; following the fix
(``cdc cli changefeed snapshot --table``, then ``resume``) copies it again and the end is a row-by-row compare.

The copy-only case: a table the initial copy filled and that no streamed change touched yet, dropped downstream
before its first change. Before, the copy job's sinks recorded nothing (bound to no changefeed), so that change
created the table again holding only itself, the changefeed ``normal``. Now the copy records it, and the change fails
the changefeed the same way, on PostgreSQL and MariaDB targets."""

from __future__ import annotations

from typing import Any

import psycopg2
import pytest
from e2e_workload import BackgroundWriter, assert_converged, cdc_cli, run_sql, wait_for

from playground.cluster import CdcServer
from playground.servers import PostgresServer

pytestmark = pytest.mark.e2e

SCHEMA = """
CREATE TABLE t (id int PRIMARY KEY, v text);
CREATE TABLE side (id int PRIMARY KEY, v text);
"""
TABLES = ["public.t", "public.side"]


@pytest.fixture
def source_schema() -> str:
    return SCHEMA


def _writes(conn: Any, n: int) -> int:
    with conn.cursor() as cur:
        cur.execute("INSERT INTO t VALUES (%s, 'w') ON CONFLICT (id) DO UPDATE SET v = t.v || 'u'", (1000 + n % 3000,))
        cur.execute("INSERT INTO side VALUES (%s, 's') ON CONFLICT (id) DO UPDATE SET v = side.v || 'x'", (n % 200,))
    conn.commit()
    return 1


@pytest.mark.parametrize("sink_uri", ["postgresql"], indirect=True)
def test_a_target_table_dropped_mid_stream_fails_the_changefeed_and_its_resync_repairs_it(
        cdc_server: CdcServer, pg_server: PostgresServer, pg_database: str, source: Any, sink_uri: str) -> None:
    cdc = cdc_server
    run_sql(source, "INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 500) g",
            "INSERT INTO side SELECT g, 's' FROM generate_series(1, 100) g")
    cdc.create_changefeed("drop", pg_server.uri(pg_database), sink_uri)
    wait_for(cdc, "drop", lambda q: q["phase"] == "streaming", "the initial copy", timeout=120)
    run_sql(source, "UPDATE t SET v = 'streamed' WHERE id <= 50")  # the stream writes t: its sink binds it
    assert_converged(cdc, "drop", source, sink_uri, tables=TABLES)
    target = pg_server.connect(sink_uri.rsplit("/", 1)[1].split("?", 1)[0])
    target.autocommit = True

    writer_conn = psycopg2.connect(pg_server.dsn(pg_database))
    with BackgroundWriter(writer_conn, _writes, pause=0.01) as writer:
        wait_for(cdc, "drop", lambda q: writer.txns > 20, "the writer's first transactions")
        run_sql(target, "DROP TABLE public.t")  # behind the changefeed's back
        q = wait_for(cdc, "drop", lambda q: q["state"] == "failed", "state failed", timeout=120)
        writer.finish()
    err = q["error"]
    assert err["code"] == "CDC:ErrTargetTableDropped", q
    assert "target table public.t" in err["message"] and "dropped behind the changefeed's back" in err["message"]
    assert "cdc cli changefeed snapshot -c drop --table public.t" in err["message"], err
    shown = cdc_cli(cdc.url, "changefeed", "query", "-c", "drop")
    assert shown["state"] == "failed" and shown["error"]["code"] == "CDC:ErrTargetTableDropped", shown
    with target.cursor() as cur:
        cur.execute("SELECT to_regclass('public.t') IS NULL")
        assert cur.fetchone()[0], "the dropped table was created again"

    # a plain resume (the cause not fixed) fails again the same way: before, this is where the sink created the table
    # again empty, every earlier row gone downstream, and the changefeed went on normal
    run_sql(source, "INSERT INTO t VALUES (9000, 'while failed')")
    cdc_cli(cdc.url, "changefeed", "resume", "-c", "drop")
    q = wait_for(cdc, "drop", lambda q: q["state"] == "failed", "state failed after a resume", timeout=120)
    assert q["state"] == "failed" and q["error"]["code"] == "CDC:ErrTargetTableDropped", q
    with target.cursor() as cur:
        cur.execute("SELECT to_regclass('public.t') IS NULL")
        assert cur.fetchone()[0], "the dropped table was created again"
    target.close()

    _fix_and_converge(cdc, "drop", source, sink_uri)


def _fix_and_converge(cdc: CdcServer, cf: str, source: Any, sink_uri: str) -> None:
    """The fix the error names: copy the table again, then resume; the target ends equal row by row, ``normal``."""
    cdc_cli(cdc.url, "changefeed", "snapshot", "-c", cf, "--table", "public.t")
    cdc_cli(cdc.url, "changefeed", "resume", "-c", cf)
    run_sql(source, "INSERT INTO t VALUES (9001, 'after the fix')", "DELETE FROM t WHERE id = 7")
    q = wait_for(cdc, cf, lambda q: q["state"] != "normal" or (
        q["table_copies"] == [] and all((s["table_copy"] or {}).get("phase", "done") == "done" for s in q["spans"])),
        "the table copy", timeout=180)
    assert q["state"] == "normal", q
    assert_converged(cdc, cf, source, sink_uri, tables=TABLES)
    q = wait_for(cdc, cf, lambda q: True, "query")
    assert q["state"] == "normal" and not q["warnings"] and q["error"] is None, q


def _target_server(request: pytest.FixtureRequest, sink_uri: str, pg_server: PostgresServer) -> tuple[Any, str]:
    """The target's server and database (the sink URI's)."""
    server = request.getfixturevalue("mariadb_server") if sink_uri.startswith("mysql") else pg_server
    return server, sink_uri.rsplit("/", 1)[1].split("?", 1)[0]


@pytest.mark.parametrize(("sink_uri", "workers"), [("postgresql", 1), ("mariadb", 1), ("postgresql", 2)],
                         indirect=["sink_uri"])
def test_a_table_only_the_initial_copy_filled_dropped_before_its_first_change_fails_the_changefeed(
        cdc_server: CdcServer, pg_server: PostgresServer, pg_database: str, source: Any, sink_uri: str, workers: int,
        request: pytest.FixtureRequest) -> None:
    """``workers``: the sink's ``worker-count`` (2: the parallel apply's planning binds the table and refuses it)."""
    cdc = cdc_server
    run_sql(source, "INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 500) g",
            "INSERT INTO side SELECT g, 's' FROM generate_series(1, 100) g")
    cdc.create_changefeed("copydrop", pg_server.uri(pg_database), sink_uri, f"[sink]\nworker-count = {workers}\n")
    wait_for(cdc, "copydrop", lambda q: q["phase"] == "streaming", "the initial copy", timeout=120)
    server, db = _target_server(request, sink_uri, pg_server)
    mysql = sink_uri.startswith("mysql")
    t = "t" if mysql else "public.t"
    missing = ("SELECT count(*) = 0 FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = 't'"
               if mysql else "SELECT to_regclass('public.t') IS NULL")
    server.execute(f"DROP TABLE {t}", db=db)  # behind the changefeed's back; the stream never wrote t
    run_sql(source, "INSERT INTO t VALUES (9000, 'first change after the drop')", "UPDATE side SET v = 'x'",
            "INSERT INTO t VALUES (9002, 'and another')", "UPDATE side SET v = 'y' WHERE id = 1")
    q = wait_for(cdc, "copydrop", lambda q: q["state"] == "failed", "state failed", timeout=120)
    err = q["error"]
    assert err["code"] == "CDC:ErrTargetTableDropped", q
    assert f"target table {t} (upstream public.t)" in err["message"], err
    assert "cdc cli changefeed snapshot -c copydrop --table public.t" in err["message"], err
    shown = cdc_cli(cdc.url, "changefeed", "query", "-c", "copydrop")
    assert shown["state"] == "failed" and shown["error"]["code"] == "CDC:ErrTargetTableDropped", shown
    assert "cdc cli changefeed resume -c copydrop" in shown["error"]["message"], shown
    assert server.execute(missing, db=db)[0][0], "the dropped table was created again"

    _fix_and_converge(cdc, "copydrop", source, sink_uri)
