"""End to end: table copies (issue 10 item 4; docs/snapshot.md, "Table copies"). A table that joins a running
changefeed with rows already in it (CREATE TABLE AS, picked up by the owner) gets them copied, and
``cdc cli changefeed snapshot --table`` copies a diverged table again, while the span streams its other tables and
the application keeps writing; a capture SIGKILLed in the middle of a table copy resumes it. Every test ends with a
row-by-row compare of every table."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg2
import pytest
from e2e_workload import BackgroundWriter, assert_converged, run_sql, server_config, wait_for

from playground.cluster import CdcServer
from playground.compare import compare_tables
from playground.servers import EtcdServer, PostgresServer

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
SCHEMA = """
CREATE TABLE big (id int PRIMARY KEY, v text, n int);
CREATE TABLE side (id int PRIMARY KEY, v text);
CREATE TABLE bag (g int, s text);
ALTER TABLE bag REPLICA IDENTITY FULL;
"""
TABLES = ["public.big", "public.side", "public.bag"]


@pytest.fixture
def source_schema() -> str:
    return SCHEMA


@pytest.fixture
def cdc(etcd_server: EtcdServer, cluster_id: str, tmp_path: Path) -> Any:
    server = CdcServer(etcd_server.url, tmp_path / "cdc", cluster_id=cluster_id,
                       extra_args=server_config(tmp_path, "upstream-check-interval = 0.5\n")).start()
    yield server
    server.terminate()


def _cli(url: str, *args: str) -> Any:
    proc = subprocess.run([sys.executable, "-m", "cdc", "cli", "--server", url, *args], capture_output=True,
                          text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 0, proc
    return json.loads(proc.stdout)


def _writes(seed: int, tables: tuple[str, ...] = ("big", "side", "bag", "late")) -> Any:
    rnd = random.Random(seed)

    def step(conn: Any, n: int) -> int:
        with conn.cursor() as cur:
            if "big" in tables:
                cur.execute("INSERT INTO big VALUES (%s, 'w', 1) ON CONFLICT (id) DO UPDATE SET v = 'u' || big.n, "
                            "n = big.n + 1", (rnd.randint(1, 25000),))
                cur.execute("DELETE FROM big WHERE id = %s", (rnd.randint(1, 25000),))
            if "side" in tables:
                cur.execute("INSERT INTO side VALUES (%s, 's') ON CONFLICT (id) DO UPDATE SET v = side.v || 'x'",
                            (rnd.randint(1, 500),))
            if "bag" in tables:
                cur.execute("INSERT INTO bag VALUES (%s, 'new')", (rnd.randint(0, 99),))
                cur.execute("DELETE FROM bag WHERE ctid = (SELECT ctid FROM bag WHERE g = %s LIMIT 1)",
                            (rnd.randint(0, 99),))
            if "late" in tables:
                cur.execute("SELECT to_regclass('public.late') IS NOT NULL")
                if cur.fetchone()[0]:
                    cur.execute("UPDATE late SET v = v || 'u' WHERE id = %s", (rnd.randint(1, 3000),))
                    cur.execute("INSERT INTO late VALUES (%s, 'new') ON CONFLICT (id) DO NOTHING",
                                (rnd.randint(3001, 6000),))
        conn.commit()
        return 1
    return step


def _target(pg_server: PostgresServer, sink_uri: str) -> Any:
    conn = pg_server.connect(sink_uri.rsplit("/", 1)[1].split("?", 1)[0])
    conn.autocommit = True
    return conn


def test_a_table_created_with_rows_joins_with_its_rows_while_the_others_stream(
        cdc: CdcServer, pg_server: PostgresServer, pg_database: str, source: Any, sink_uri: str) -> None:
    run_sql(source, "INSERT INTO big SELECT g, 'v' || g, g FROM generate_series(1, 2000) g",
            "INSERT INTO bag SELECT g % 100, 's' FROM generate_series(1, 500) g")
    cdc.create_changefeed("late", pg_server.uri(pg_database), sink_uri)
    wait_for(cdc, "late", lambda q: q["phase"] == "streaming", "the initial copy", timeout=120)
    writer_conn = psycopg2.connect(pg_server.dsn(pg_database))
    with BackgroundWriter(writer_conn, _writes(3), pause=0.005) as writer:
        # CREATE TABLE AS writes its rows before any trigger could join it: the owner picks it up with them
        source.autocommit = False
        with source.cursor() as cur:
            cur.execute("CREATE TABLE late AS SELECT g AS id, 'before ' || g AS v FROM generate_series(1, 3000) g")
            cur.execute("ALTER TABLE late ADD PRIMARY KEY (id)")
        source.commit()
        source.autocommit = True
        q = wait_for(cdc, "late", lambda q: any((s["table_copy"] or {}).get("tables") == ["public.late"]
                                                 and s["table_copy"]["phase"] == "done" for s in q["spans"])
                     or q["state"] != "normal", "the table copy of public.late", timeout=120)
        assert q["state"] == "normal", q
        time.sleep(1.0)  # its writes after the copy, streamed
        writer.finish()
    assert writer.txns > 0
    assert_converged(cdc, "late", source, sink_uri, tables=[*TABLES, "public.late"])
    q = wait_for(cdc, "late", lambda q: True, "query")
    assert q["state"] == "normal" and not q["warnings"] and q["table_copies"] == [], q


# the resync is the processor's, the same for every target (the joined-table test runs on all)
@pytest.mark.parametrize("sink_uri", ["postgresql"], indirect=True)
def test_a_resync_replaces_a_diverged_table_while_the_others_stream(
        cdc: CdcServer, pg_server: PostgresServer, pg_database: str, source: Any, sink_uri: str) -> None:
    run_sql(source, "INSERT INTO big SELECT g, repeat('v', 100) || g, g FROM generate_series(1, 20000) g",
            "INSERT INTO side SELECT g, 's' FROM generate_series(1, 500) g",
            "INSERT INTO bag SELECT g % 100, 's' || (g % 3) FROM generate_series(1, 2000) g")  # duplicates
    cdc.create_changefeed("rs", pg_server.uri(pg_database), sink_uri, "[snapshot]\nchunk-rows = 2000\n")
    assert_converged(cdc, "rs", source, sink_uri, tables=TABLES, timeout=180)
    # the target diverges behind Tidewater's back: rows missing, rows extra, rows changed, in both tables
    target = _target(pg_server, sink_uri)
    run_sql(target, "DELETE FROM big WHERE id % 7 = 0", "INSERT INTO big VALUES (-1, 'extra', 0)",
            "UPDATE big SET v = 'wrong' WHERE id % 11 = 0", "DELETE FROM bag WHERE g < 10",
            "INSERT INTO bag VALUES (-1, 'extra'), (-1, 'extra')")
    assert {d.table for d in compare_tables(source, TABLES, sink_uri) if not d.equal} == {"public.big", "public.bag"}

    writer_conn = psycopg2.connect(pg_server.dsn(pg_database))
    with BackgroundWriter(writer_conn, _writes(4, ("big", "bag")), pause=0.01) as writer:
        q = _cli(cdc.url, "changefeed", "snapshot", "-c", "rs", "--table", "public.big", "--table", "public.bag")
        assert {c["table"] for c in q["table_copies"]} <= {"public.big", "public.bag"}, q
        q = wait_for(cdc, "rs", lambda q: any(s["table_copy"] for s in q["spans"]), "the table copy taken up")
        # the other table streams while big and bag are copied
        run_sql(source, "INSERT INTO side VALUES (9001, 'during the copy')")
        q = wait_for(cdc, "rs", lambda q: all((s["table_copy"] or {}).get("phase") == "done" for s in q["spans"]
                                               if s["table_copy"]) or q["state"] != "normal",
                     "the table copy", timeout=180)
        assert q["state"] == "normal", q
        time.sleep(1.0)
        writer.finish()
    with pytest.raises(AssertionError):  # a table it does not replicate is refused, naming it
        _cli(cdc.url, "changefeed", "snapshot", "-c", "rs", "--table", "public.nope")
    assert_converged(cdc, "rs", source, sink_uri, tables=TABLES)
    q = wait_for(cdc, "rs", lambda q: True, "query")
    assert q["state"] == "normal" and not q["warnings"] and q["table_copies"] == [], q


# the kill/resume protocol is the processor's: one target
@pytest.mark.parametrize("sink_uri", ["sqlite"], indirect=True)
def test_a_capture_killed_during_a_table_copy_resumes_it_and_ends_exactly_once(
        cdc: CdcServer, pg_server: PostgresServer, pg_database: str, source: Any, sink_uri: str) -> None:
    run_sql(source, "INSERT INTO big SELECT g, repeat('v', 200) || g, g FROM generate_series(1, 25000) g",
            "INSERT INTO bag SELECT g % 100, 's' || (g % 3) FROM generate_series(1, 2000) g")
    cdc.create_changefeed("tk", pg_server.uri(pg_database), sink_uri,
                          "[snapshot]\nchunk-rows = 1000\nspark-min-rows = 0\n")
    wait_for(cdc, "tk", lambda q: q["phase"] == "streaming", "the initial copy", timeout=240)
    writer_conn = psycopg2.connect(pg_server.dsn(pg_database))
    with BackgroundWriter(writer_conn, _writes(5, ("big", "side", "bag")), pause=0.01) as writer:
        cdc.request("POST", "/api/v2/changefeeds/tk/snapshot", {"tables": ["public.big", "public.bag"]})
        wait_for(cdc, "tk", lambda q: any(s["table_copy"] for s in q["spans"])
                 and any(t["table"].endswith("public.big") and 0 < t["chunks_done"] < t["chunks_total"]
                         for t in q["snapshot"]["tables"]), "the table copy of big under way", timeout=120)
        cdc.kill()
        time.sleep(1.0)
        cdc.start()
        q = wait_for(cdc, "tk", lambda q: (q["spans"][0]["table_copy"] or {}).get("phase") == "done"
                     or q["state"] != "normal", "the table copy", timeout=240)
        assert q["state"] == "normal", q
        time.sleep(1.0)
        writer.finish()
    assert_converged(cdc, "tk", source, sink_uri, tables=TABLES)
    q = wait_for(cdc, "tk", lambda q: True, "query")
    assert q["state"] == "normal" and not q["warnings"], q


# the owner's pick-up and the table copy are the same for every target: one that compares multisets exactly
@pytest.mark.parametrize("sink_uri", ["postgresql"], indirect=True)
def test_a_keyless_table_that_joins_with_rows_ends_equal_as_a_multiset(
        cdc: CdcServer, pg_server: PostgresServer, pg_database: str, source: Any, sink_uri: str) -> None:
    """CREATE TABLE AS makes a table of duplicates and NULLs with neither key nor replica identity (not eligible:
    left out, the changefeed in warning naming it); ALTER TABLE .. REPLICA IDENTITY FULL makes it eligible, the owner
    adds it and its rows are copied (one whole chunk) while writers change its duplicates; then it streams, and once
    the warning is acknowledged (resume) it does not come back."""
    run_sql(source, "INSERT INTO big SELECT g, 'v' || g, g FROM generate_series(1, 2000) g",
            "INSERT INTO bag SELECT g % 100, 's' FROM generate_series(1, 500) g",
            "INSERT INTO side SELECT g, 's' FROM generate_series(1, 50) g")
    cdc.create_changefeed("lbag", pg_server.uri(pg_database), sink_uri)
    wait_for(cdc, "lbag", lambda q: q["phase"] == "streaming", "the initial copy", timeout=120)
    run_sql(source, "CREATE TABLE lbag AS SELECT CASE WHEN g % 17 = 0 THEN NULL ELSE g % 50 END AS g, "
            "CASE WHEN g % 3 = 0 THEN NULL ELSE 's' || (g % 4) END AS s FROM generate_series(1, 3000) g")
    rnd = random.Random(6)

    def lbag(conn: Any, n: int) -> int:
        with conn.cursor() as cur:
            cur.execute("SELECT relreplident FROM pg_class WHERE oid = 'lbag'::regclass")
            if cur.fetchone()[0] == "f":  # (before: UPDATE and DELETE would fail upstream without an identity)
                g = None if rnd.random() < 0.1 else rnd.randint(0, 49)
                cur.execute("INSERT INTO lbag VALUES (%s, NULL), (%s, NULL)", (g, g))
                cur.execute("DELETE FROM lbag WHERE ctid = (SELECT ctid FROM lbag WHERE g IS NOT DISTINCT FROM %s "
                            "LIMIT 1)", (rnd.randint(0, 49),))
                cur.execute("UPDATE lbag SET s = 'u' WHERE ctid = (SELECT ctid FROM lbag WHERE g = %s LIMIT 1)",
                            (rnd.randint(0, 49),))
            cur.execute("INSERT INTO big VALUES (%s, 'w', 1) ON CONFLICT (id) DO UPDATE SET n = big.n + 1",
                        (rnd.randint(1, 3000),))
        conn.commit()
        return 1

    writer_conn = psycopg2.connect(pg_server.dsn(pg_database))
    with BackgroundWriter(writer_conn, lbag, pause=0.01) as writer:
        # the owner sees it and leaves it out (no key, no identity), loudly: its rows are not downstream
        q = wait_for(cdc, "lbag", lambda q: any(w["table"] == "public.lbag" and w["code"] == "CDC:WarnTableIneligible"
                                                 for w in q["warnings"]), "the table left out with a warning")
        assert q["state"] == "warning", q
        run_sql(source, "ALTER TABLE lbag REPLICA IDENTITY FULL")
        q = wait_for(cdc, "lbag", lambda q: any((s["table_copy"] or {}).get("tables") == ["public.lbag"]
                                                 and s["table_copy"]["phase"] == "done" for s in q["spans"])
                     or q["state"] not in ("normal", "warning"), "the table copy of public.lbag", timeout=120)
        assert [w["code"] for w in q["warnings"]] == ["CDC:WarnTableIneligible"], q  # nothing else went wrong
        # its rows are all downstream now: the warning (a divergence while it was left out) is acknowledged
        cdc.request("POST", "/api/v2/changefeeds/lbag/resume")
        q = wait_for(cdc, "lbag", lambda q: q["state"] == "normal" and not q["warnings"], "the warning acknowledged")
        time.sleep(1.5)  # its writes after the copy, streamed
        writer.finish()
    assert writer.txns > 0
    assert_converged(cdc, "lbag", source, sink_uri, tables=[*TABLES, "public.lbag"])
    [diff] = compare_tables(source, ["public.lbag"], sink_uri)
    assert diff.equal and diff.source_rows > 2900, diff
    q = wait_for(cdc, "lbag", lambda q: True, "query")
    assert q["state"] == "normal" and not q["warnings"] and q["table_copies"] == [], q


@pytest.mark.parametrize("sink_uri", ["postgresql"], indirect=True)
def test_a_table_altered_between_two_runs_of_its_table_copy_ends_equal(
        cdc: CdcServer, pg_server: PostgresServer, pg_database: str, source: Any, sink_uri: str) -> None:
    """A resync of ``big`` is killed half way; ``big`` gets a column with a default while the capture is down; the
    resumed table copy starts over from a new target under its snapshot while ``side`` and ``bag`` stream, and
    everything ends equal, rows and shapes (the span's own sink, which wrote ``big`` before, reads it anew)."""
    run_sql(source, "INSERT INTO big SELECT g, repeat('v', 200) || g, g FROM generate_series(1, 25000) g",
            "INSERT INTO side SELECT g, 's' FROM generate_series(1, 50) g",
            "INSERT INTO bag SELECT g % 100, 's' || (g % 3) FROM generate_series(1, 2000) g")
    cdc.create_changefeed("ta", pg_server.uri(pg_database), sink_uri,
                          "[snapshot]\nchunk-rows = 1000\nspark-min-rows = 100000000\n")
    wait_for(cdc, "ta", lambda q: q["phase"] == "streaming", "the initial copy", timeout=240)
    writer_conn = psycopg2.connect(pg_server.dsn(pg_database))
    with BackgroundWriter(writer_conn, _writes(7, ("big", "side", "bag")), pause=0.01) as writer:
        cdc.request("POST", "/api/v2/changefeeds/ta/snapshot", {"tables": ["public.big"]})
        wait_for(cdc, "ta", lambda q: any(s["table_copy"] for s in q["spans"])
                 and any(t["table"].endswith("public.big") and 0 < t["chunks_done"] < t["chunks_total"] // 2
                         for t in q["snapshot"]["tables"]), "the table copy of big under way", timeout=120)
        cdc.kill()
        run_sql(source, "ALTER TABLE big ADD COLUMN c int DEFAULT 7", "UPDATE big SET c = id WHERE id % 17 = 0")
        time.sleep(1.0)
        cdc.start()
        q = wait_for(cdc, "ta", lambda q: (q["spans"][0]["table_copy"] or {}).get("phase") == "done"
                     or q["state"] != "normal", "the table copy", timeout=240)
        assert q["state"] == "normal", q
        run_sql(source, "UPDATE big SET c = -1 WHERE id % 19 = 0")
        time.sleep(1.0)
        writer.finish()
    assert_converged(cdc, "ta", source, sink_uri, tables=TABLES, schemas=True)
    q = wait_for(cdc, "ta", lambda q: True, "query")
    assert q["state"] == "normal" and not q["warnings"], q
