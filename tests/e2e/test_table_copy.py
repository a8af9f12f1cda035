"""End to end: table copies (issue 10 item 4; docs/snapshot.md, "Table copies"). A table that joins a running
changefeed with rows already in it (CREATE TABLE AS, picked up by the owner) gets them copied, and
``cdc cli changefeed snapshot --table`` copies a diverged table again, while the span streams its other tables and
the application keeps writing; a capture SIGKILLed in the middle of a table copy resumes it. Every test ends with a
row-by-row compare of every table."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path
from typing import Any

import psycopg2
import pytest
from e2e_workload import (
    FAST_LEASE,
    BackgroundWriter,
    assert_converged,
    cdc_cli,
    run_sql,
    server_config,
    wait_for,
)

from cdc.events import TableName
from playground.cluster import CdcServer
from playground.compare import compare_tables
from playground.servers import EtcdServer, PostgresServer

pytestmark = pytest.mark.e2e

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
def cdc(etcd_server: EtcdServer, cluster_id: str, tmp_path: Path, request: pytest.FixtureRequest) -> Any:
    lease = FAST_LEASE if request.node.get_closest_marker("kills") else ""
    server = CdcServer(etcd_server.url, tmp_path / "cdc", cluster_id=cluster_id,
                       extra_args=server_config(tmp_path, "upstream-check-interval = 0.5\n" + lease)).start()
    yield server
    server.terminate()


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


# the wait is the processor's, the same for every target
@pytest.mark.parametrize("sink_uri", ["postgresql"], indirect=True)
def test_a_joining_table_whose_add_waits_for_a_writer_is_copied_without_a_warning(
        cdc: CdcServer, pg_server: PostgresServer, pg_database: str, source: Any, sink_uri: str) -> None:
    """docs/snapshot.md, "Table copies". The owner asks for a joining table's copy just before it adds the table to
    the span's publication; the add waits for the table's writers (its SHARE lock: at most 1 s, then again at the
    next look). The span takes the copy up meanwhile and finds the table not published yet: its copy waits for the
    add, quietly, and copies the table once it joined. Before, the copy failed the span at once with the retryable
    ``CDC:ErrTableCopyWaiting`` and the changefeed was ``warning`` until the retry: the Kafka table-copy test below
    failed so once at load average 13, where the add (a few statements) came later than the span's restart."""
    run_sql(source, "INSERT INTO big SELECT g, 'v' || g, g FROM generate_series(1, 2000) g",
            "INSERT INTO side SELECT g, 's' FROM generate_series(1, 50) g",
            "INSERT INTO bag SELECT g % 10, 's' FROM generate_series(1, 50) g")
    cdc.create_changefeed("jw", pg_server.uri(pg_database), sink_uri)
    wait_for(cdc, "jw", lambda q: q["phase"] == "streaming", "the initial copy", timeout=120)
    # paused, nothing picks the new table up before a writer holds it: at the resume, the owner's add waits for it
    cdc_cli(cdc.url, "changefeed", "pause", "-c", "jw")
    wait_for(cdc, "jw", lambda q: q["state"] == "stopped" and all(not s.get("running", False) for s in q["spans"]),
             "paused")
    run_sql(source, "CREATE TABLE late AS SELECT g AS id, 'before ' || g AS v FROM generate_series(1, 3000) g",
            "ALTER TABLE late ADD PRIMARY KEY (id)")
    writer = psycopg2.connect(pg_server.dsn(pg_database))
    try:
        writer.cursor().execute("UPDATE late SET v = 'held' WHERE id = 1")  # ROW EXCLUSIVE until its commit
        cdc_cli(cdc.url, "changefeed", "resume", "-c", "jw")
        # the span takes the copy up while the add waits; its copy finds the table outside the publication
        q = wait_for(cdc, "jw", lambda q: q["state"] != "normal" or "to join publication" in cdc.log_tail(400),
                     "the table copy of public.late waiting for the table to join", timeout=120)
        assert q["state"] == "normal", (q["error"], q["warnings"])
        deadline = time.monotonic() + 60
        while _waiting_on(pg_server, pg_database, "late") < 1:  # the owner's add behind the writer (tried each look)
            assert time.monotonic() < deadline, f"the owner's add did not wait for the writer\n{cdc.log_tail()}"
            time.sleep(0.1)
        q = cdc.changefeed("jw")
        assert q["state"] == "normal", (q["error"], q["warnings"])  # the copy taken up and waiting: no error
        writer.commit()  # the add goes through at the owner's next look
    finally:
        writer.close()
    q = wait_for(cdc, "jw", lambda q: any((s["table_copy"] or {}).get("tables") == ["public.late"]
                                           and s["table_copy"]["phase"] == "done" for s in q["spans"])
                 or q["state"] != "normal", "the table copy of public.late", timeout=120)
    assert q["state"] == "normal", (q["error"], q["warnings"])
    run_sql(source, "UPDATE late SET v = v || '!' WHERE id % 10 = 0")  # late streams after its copy
    assert_converged(cdc, "jw", source, sink_uri, tables=[*TABLES, "public.late"])
    q = wait_for(cdc, "jw", lambda q: True, "query")
    assert q["state"] == "normal" and not q["warnings"] and q["error"] is None and q["table_copies"] == [], q


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
        q = cdc_cli(cdc.url, "changefeed", "snapshot", "-c", "rs", "--table", "public.big", "--table", "public.bag")
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
        cdc_cli(cdc.url, "changefeed", "snapshot", "-c", "rs", "--table", "public.nope")
    assert_converged(cdc, "rs", source, sink_uri, tables=TABLES)
    q = wait_for(cdc, "rs", lambda q: True, "query")
    assert q["state"] == "normal" and not q["warnings"] and q["table_copies"] == [], q


def _waiting_on(pg_server: PostgresServer, db: str, table: str) -> int:
    """Sessions of ``db`` waiting for a lock on ``table``."""
    ((n,),) = pg_server.execute(
        "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation WHERE NOT l.granted AND c.relname = %s "
        "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())", db=db, params=(table,))
    return int(n)


# the hold and the copy's reads are the processor's and the upstream's; the lock that orders the test: PostgreSQL's
@pytest.mark.parametrize("sink_uri", ["postgresql"], indirect=True)
def test_a_table_renamed_while_its_resync_runs_is_copied_and_ends_equal_under_its_new_name(
        cdc: CdcServer, pg_server: PostgresServer, pg_database: str, source: Any, sink_uri: str) -> None:
    """docs/snapshot.md, "A table renamed while it is copied". ``big`` is resynced; its copy has exported its snapshot
    and waits to empty the target (a lock on the downstream ``big``, SHARE mode) when the upstream changes ``big``,
    renames it to ``big2`` and changes it again. The copy goes on under the name ``big`` had at its snapshot, reading
    the table by its relation oid; the stream, which held the changes and the rename, applies them after it. Before the
    read by oid the plan's query failed ("relation big does not exist"), the next run found no table ``big`` to copy
    and ended as if it had been dropped: the target emptied, then renamed and given only the later changes, the
    changefeed ``normal`` (measured: ``big2`` 151 rows of 19,901 downstream)."""
    run_sql(source, "INSERT INTO big SELECT g, 'v' || g, g FROM generate_series(1, 20000) g",
            "INSERT INTO side SELECT g, 's' FROM generate_series(1, 500) g",
            "INSERT INTO bag SELECT g % 100, 's' FROM generate_series(1, 200) g")
    cdc.create_changefeed("rn", pg_server.uri(pg_database), sink_uri, "[snapshot]\nchunk-rows = 2000\n")
    assert_converged(cdc, "rn", source, sink_uri, tables=TABLES, timeout=180)
    target = _target(pg_server, sink_uri)
    run_sql(target, "DELETE FROM big WHERE id % 7 = 0", "UPDATE big SET v = 'wrong' WHERE id % 11 = 0")
    tdb = sink_uri.rsplit("/", 1)[1].split("?", 1)[0]
    holder = pg_server.connect(tdb)
    holder.autocommit = False
    try:
        holder.cursor().execute("LOCK TABLE big IN SHARE MODE")  # the resync's TRUNCATE of the target waits
        cdc_cli(cdc.url, "changefeed", "snapshot", "-c", "rn", "--table", "public.big")
        deadline = time.monotonic() + 60
        while _waiting_on(pg_server, tdb, "big") < 1:
            assert time.monotonic() < deadline, f"the resync did not reach the target\n{cdc.log_tail()}"
            time.sleep(0.2)
        q = cdc.changefeed("rn")
        assert [s["table_copy"] for s in q["spans"]] == [{"tables": ["public.big"], "phase": "copying"}], q
        run_sql(source, "UPDATE big SET v = 'before the rename' WHERE id <= 100", "ALTER TABLE big RENAME TO big2",
                "UPDATE big2 SET v = 'after the rename' WHERE id BETWEEN 50 AND 150",
                "DELETE FROM big2 WHERE id > 19900", "INSERT INTO big2 VALUES (30000, 'new', 0)",
                "INSERT INTO side VALUES (9001, 'during the copy')")
    finally:
        holder.rollback()
        holder.close()
    wait_for(cdc, "rn", lambda q: all((s["table_copy"] or {}).get("phase") == "done" for s in q["spans"])
             and q["state"] == "normal", "the table copy", timeout=180)  # (a retried run shows warning meanwhile)
    assert_converged(cdc, "rn", source, sink_uri, tables=["public.big2", "public.side", "public.bag"])
    ((old,),) = pg_server.execute("SELECT count(*) FROM pg_tables WHERE tablename = 'big'", db=tdb)
    assert old == 0  # renamed downstream by the stream
    q = wait_for(cdc, "rn", lambda q: True, "query")
    assert q["state"] == "normal" and not q["warnings"] and q["table_copies"] == [], q


def _diverge(target: Any) -> None:
    """The downstream ``big`` diverges behind Tidewater's back (what a resync is for)."""
    run_sql(target, "DELETE FROM big WHERE id % 7 = 0", "UPDATE big SET v = 'wrong' WHERE id % 11 = 0")


def _rename_big(source: Any) -> None:
    """The upstream changes ``big``, renames it ``big2`` and changes it again (and another table)."""
    run_sql(source, "UPDATE big SET v = 'before the rename' WHERE id <= 100", "ALTER TABLE big RENAME TO big2",
            "UPDATE big2 SET v = 'after the rename' WHERE id BETWEEN 50 AND 150", "DELETE FROM big2 WHERE id > 4900",
            "INSERT INTO big2 VALUES (30000, 'new', 0)", "INSERT INTO side VALUES (9001, 'meanwhile')")


def _ends_equal_under_the_new_name(cdc: CdcServer, cf: str, pg_server: PostgresServer, source: Any,
                                   sink_uri: str) -> None:
    wait_for(cdc, cf, lambda q: all((s["table_copy"] or {}).get("phase") == "done" for s in q["spans"])
             and q["state"] == "normal" and not q["table_copies"], "the table copy", timeout=180)
    assert_converged(cdc, cf, source, sink_uri, tables=["public.big2", "public.side", "public.bag"])
    tdb = sink_uri.rsplit("/", 1)[1].split("?", 1)[0]
    ((old,),) = pg_server.execute("SELECT count(*) FROM pg_tables WHERE tablename = 'big'", db=tdb)
    assert old == 0  # nothing left under the old name downstream
    q = wait_for(cdc, cf, lambda q: True, "query")
    assert q["state"] == "normal" and not q["warnings"], q


@pytest.mark.parametrize("sink_uri", ["postgresql"], indirect=True)
def test_a_table_renamed_after_its_resync_was_asked_for_is_copied_under_its_new_name(
        cdc: CdcServer, pg_server: PostgresServer, pg_database: str, source: Any, sink_uri: str) -> None:
    """docs/snapshot.md, "A table renamed while it is copied". A resync of ``big`` is asked for while the changefeed
    is paused; ``big`` is renamed ``big2`` before the span takes the request up. The span finds it by the relation oid
    the request recorded, under its new name, holds it by that oid and copies it: the diverged target, renamed by the
    stream before the copy (the rename is older than its snapshot), is replaced. Before, the request named a table
    the span no longer published, taken for dropped: nothing was copied and the changefeed said ``normal`` with
    ``big2`` still diverged downstream (measured: 679 rows missing or wrong)."""
    run_sql(source, "INSERT INTO big SELECT g, 'v' || g, g FROM generate_series(1, 5000) g",
            "INSERT INTO side SELECT g, 's' FROM generate_series(1, 500) g",
            "INSERT INTO bag SELECT g % 100, 's' FROM generate_series(1, 200) g")
    cdc.create_changefeed("ra", pg_server.uri(pg_database), sink_uri, "[snapshot]\nchunk-rows = 1000\n")
    assert_converged(cdc, "ra", source, sink_uri, tables=TABLES, timeout=180)
    _diverge(_target(pg_server, sink_uri))
    cdc_cli(cdc.url, "changefeed", "pause", "-c", "ra")
    wait_for(cdc, "ra", lambda q: q["state"] == "stopped" and all(not s.get("running", False) for s in q["spans"]),
             "paused")
    q = cdc_cli(cdc.url, "changefeed", "snapshot", "-c", "ra", "--table", "public.big")
    assert [c["table"] for c in q["table_copies"]] == ["public.big"], q
    _rename_big(source)
    cdc_cli(cdc.url, "changefeed", "resume", "-c", "ra")
    _ends_equal_under_the_new_name(cdc, "ra", pg_server, source, sink_uri)


@pytest.mark.kills
@pytest.mark.parametrize("sink_uri", ["postgresql"], indirect=True)
def test_a_table_renamed_while_its_resync_is_killed_is_copied_again_under_its_new_name(
        cdc: CdcServer, pg_server: PostgresServer, pg_database: str, source: Any, sink_uri: str) -> None:
    """docs/snapshot.md, "A table renamed while it is copied". The resync of ``big`` has exported its first snapshot
    ``B`` and waits to empty the target (a lock on the downstream ``big``) when the capture is SIGKILLed; ``big`` is
    renamed ``big2`` (after ``B``: the hold keeps the rename back) before the capture starts again. The next run finds
    the table by oid under its new name and a later snapshot: it removes the target of the name the table had at
    ``B`` (what the stream wrote there) and copies the table whole under its new name; the held changes, the rename
    among them, are in that copy. Before, the run took the table for dropped: nothing was copied, and the stream then
    renamed the diverged target and applied the later changes to it, the changefeed ``normal`` (measured: 679 rows
    missing or wrong)."""
    run_sql(source, "INSERT INTO big SELECT g, 'v' || g, g FROM generate_series(1, 5000) g",
            "INSERT INTO side SELECT g, 's' FROM generate_series(1, 500) g",
            "INSERT INTO bag SELECT g % 100, 's' FROM generate_series(1, 200) g")
    cdc.create_changefeed("rk", pg_server.uri(pg_database), sink_uri, "[snapshot]\nchunk-rows = 1000\n")
    assert_converged(cdc, "rk", source, sink_uri, tables=TABLES, timeout=180)
    target = _target(pg_server, sink_uri)
    _diverge(target)
    tdb = sink_uri.rsplit("/", 1)[1].split("?", 1)[0]
    holder = pg_server.connect(tdb)
    holder.autocommit = False
    try:
        holder.cursor().execute("LOCK TABLE big IN SHARE MODE")  # the resync's TRUNCATE of the target waits
        cdc_cli(cdc.url, "changefeed", "snapshot", "-c", "rk", "--table", "public.big")
        deadline = time.monotonic() + 60
        while _waiting_on(pg_server, tdb, "big") < 1:
            assert time.monotonic() < deadline, f"the resync did not reach the target\n{cdc.log_tail()}"
            time.sleep(0.2)
        cdc.kill()
        _rename_big(source)
    finally:
        holder.rollback()
        holder.close()
    time.sleep(1.0)
    cdc.start()
    _ends_equal_under_the_new_name(cdc, "rk", pg_server, source, sink_uri)


# the kill/resume protocol is the processor's: one target
@pytest.mark.kills
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
        # it joined (the copy brings every row it missed): its warning ended by itself, nothing else went wrong
        q = wait_for(cdc, "lbag", lambda q: q["state"] == "normal" and not q["warnings"]
                     or q["state"] not in ("normal", "warning"), "the warning ended by the table's joining")
        assert q["state"] == "normal" and q["error"] is None, q
        time.sleep(1.5)  # its writes after the copy, streamed
        writer.finish()
    assert writer.txns > 0
    assert_converged(cdc, "lbag", source, sink_uri, tables=[*TABLES, "public.lbag"])
    [diff] = compare_tables(source, ["public.lbag"], sink_uri)
    assert diff.equal and diff.source_rows > 2900, diff
    q = wait_for(cdc, "lbag", lambda q: True, "query")
    assert q["state"] == "normal" and not q["warnings"] and q["table_copies"] == [], q


@pytest.mark.kills
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
    # the resync's rows go in slowly (1 ms per row: ~1 s per chunk), so that the kill finds it half way for sure
    # (unslowed it copies 25,000 rows in well under a poll interval here); its restart drops this target table
    tdb = sink_uri.rsplit("/", 1)[1].split("?", 1)[0]
    pg_server.execute("CREATE FUNCTION slow_down() RETURNS trigger LANGUAGE plpgsql AS "
                      "$$ BEGIN PERFORM pg_sleep(0.001); RETURN NEW; END $$", db=tdb)
    pg_server.execute("CREATE TRIGGER slow_down BEFORE INSERT ON big FOR EACH ROW EXECUTE FUNCTION slow_down()",
                      db=tdb)
    pg_server.execute("ALTER TABLE big ENABLE ALWAYS TRIGGER slow_down", db=tdb)  # (also as replica: the copy's role)
    writer_conn = psycopg2.connect(pg_server.dsn(pg_database))
    with BackgroundWriter(writer_conn, _writes(7, ("big", "side", "bag")), pause=0.01) as writer:
        cdc.request("POST", "/api/v2/changefeeds/ta/snapshot", {"tables": ["public.big"]})
        wait_for(cdc, "ta", lambda q: any(s["table_copy"] for s in q["spans"])
                 and any(t["table"].endswith("public.big") and 0 < t["chunks_done"] < t["chunks_total"] // 2
                         for t in q["snapshot"]["tables"]), "the table copy of big under way", timeout=120)
        cdc.kill()
        # (the set-wide UPDATEs take big's SHARE ROW EXCLUSIVE lock first: they wait for the writer's open transaction
        # instead of locking rows under it, which made PostgreSQL pick the writer as a deadlock victim once)
        run_sql(source, "ALTER TABLE big ADD COLUMN c int DEFAULT 7",
                "LOCK TABLE big IN SHARE ROW EXCLUSIVE MODE; UPDATE big SET c = id WHERE id % 17 = 0")
        time.sleep(1.0)
        cdc.start()
        q = wait_for(cdc, "ta", lambda q: (q["spans"][0]["table_copy"] or {}).get("phase") == "done"
                     or q["state"] != "normal", "the table copy", timeout=240)
        assert q["state"] == "normal", q
        run_sql(source, "LOCK TABLE big IN SHARE ROW EXCLUSIVE MODE; UPDATE big SET c = -1 WHERE id % 19 = 0")
        time.sleep(1.0)
        writer.finish()
    assert_converged(cdc, "ta", source, sink_uri, tables=TABLES, schemas=True)
    q = wait_for(cdc, "ta", lambda q: True, "query")
    assert q["state"] == "normal" and not q["warnings"], q


# ---- table copies into Kafka and files (docs/sinks.md, "Table copies and resyncs") ------------------------------
LOG_SINK_CONFIG = "[snapshot]\nchunk-rows = 1000\nspark-min-rows = 1000000\n"  # copies without Spark: the suite's time
DISPATCH = "[[sink.dispatchers]]\nmatcher = ['public.*']\npartition = 'index-value'\n"


def _streaming_writes(seed: int) -> Any:
    """``side`` in every transaction (the span streams past each copy's snapshot), ``big`` and ``bag`` in every
    fifth (a resync holds them back), ``late`` not at all (its copy runs while the others stream freely)."""
    rnd = random.Random(seed)

    def step(conn: Any, n: int) -> int:
        with conn.cursor() as cur:
            cur.execute("INSERT INTO side VALUES (%s, 's') ON CONFLICT (id) DO UPDATE SET v = side.v || 'x'",
                        (rnd.randint(1, 500),))
        conn.commit()
        if n % 5:
            return 1
        with conn.cursor() as cur:
            cur.execute("INSERT INTO big VALUES (%s, 'w', 1) ON CONFLICT (id) DO UPDATE SET v = 'u' || big.n, "
                        "n = big.n + 1", (rnd.randint(1, 6000),))
            cur.execute("DELETE FROM big WHERE id = %s", (rnd.randint(1, 6000),))
            cur.execute("INSERT INTO bag VALUES (%s, 'new')", (rnd.randint(0, 99),))
            cur.execute("DELETE FROM bag WHERE ctid = (SELECT ctid FROM bag WHERE g = %s LIMIT 1)",
                        (rnd.randint(0, 99),))
        conn.commit()
        return 2
    return step


class PublishWatch(threading.Thread):
    """Lists the storage sink's data files every 0.1 s: a file must hold only rows above every ``metadata``
    checkpoint published before it appeared (the checkpoint a lake reader cuts at), also a table copy's files."""

    def __init__(self, uri: str) -> None:
        super().__init__(daemon=True)
        from sinks.storage.reader import StorageReader

        self.reader = StorageReader(uri)
        self.seen: set[str] = set()
        self.violations: list[tuple[str, int, int]] = []
        self.halt = threading.Event()

    def run(self) -> None:
        before = 0  # read before the previous listing, which did not show the new files yet
        while not self.halt.wait(0.1):
            meta = self.reader.checkpoint() or 0
            for table in self.reader.tables():
                for df in self.reader.data_files(table):
                    if df.path in self.seen:
                        continue
                    self.seen.add(df.path)
                    low = min((c.commit_ts for c in self.reader.read_file(df)), default=before + 1)
                    if low <= before:
                        self.violations.append((df.path, low, before))
            before = meta


def _inject_a_row_behind_tidewaters_back(kafka: Any, topic: str, upstream: str, ts: int) -> None:
    """A row the upstream never had, in the topic (another producer, a bug, a skipped DDL: what a resync repairs)."""
    from kafka import KafkaProducer

    from cdc.events import OpType, RowChange, TableName
    from cli.kafka_consumer import upstream_lookups
    from sinks.codec import EncoderConfig, encoder_for

    closers, schemas, _ = upstream_lookups(upstream)
    try:
        schema = schemas(TableName.parse("public.big"))
    finally:
        for c in closers:
            c.close()
    enc = encoder_for("canal-json", EncoderConfig())
    enc.append_row(RowChange(OpType.INSERT, schema, ts, time.time(), {"id": -5, "v": "not upstream", "n": 0}))
    producer = KafkaProducer(bootstrap_servers=[kafka.bootstrap])
    try:
        for msg in enc.build():
            producer.send(topic, key=msg.key, value=msg.value, partition=0)
        producer.flush()
    finally:
        producer.close()


@pytest.mark.parametrize("kind", ["kafka", "storage"])
def test_table_copies_into_kafka_and_files_reach_consumers_that_cut_at_watermarks(
        cdc: CdcServer, pg_server: PostgresServer, pg_database: str, source: Any, tmp_path: Path,
        request: pytest.FixtureRequest, kind: str) -> None:
    """A table that joins with rows and a resync of a keyed and a key-less table, under concurrent writes, into
    Kafka (rebuilt by the consumer library up to the published checkpoint) and into files (rebuilt up to
    ``metadata``): equal row by row. The copies' rows carry their snapshot's Ts while the span streams past it; a
    consumer that had cut past it would drop them (the library stops instead), and a resync's TRUNCATE removes a row
    the consumers held that the upstream never had."""
    from playground.cluster import current_lsn
    from playground.compare import compare_rows

    run_sql(source, "INSERT INTO big SELECT g, 'v' || g, g FROM generate_series(1, 5000) g",
            "INSERT INTO side SELECT g, 's' FROM generate_series(1, 500) g",
            "INSERT INTO bag SELECT g % 100, 's' || (g % 3) FROM generate_series(1, 1000) g")
    up = pg_server.uri(pg_database)
    if kind == "kafka":
        kafka, topic = request.getfixturevalue("kafka_server"), request.getfixturevalue("kafka_topic")
        sink = kafka.uri(topic, protocol="canal-json", partition_num="3")
        cdc.create_changefeed("tc", up, sink, LOG_SINK_CONFIG + DISPATCH)
    else:
        sink = f"file://{tmp_path / 'lake'}?protocol=csv&flush-interval=200ms"
        cdc.create_changefeed("tc", up, sink, LOG_SINK_CONFIG)
    wait_for(cdc, "tc", lambda q: q["phase"] == "streaming" and q["checkpoint_ts"] > 0, "the initial copy",
             timeout=120)
    watch = PublishWatch(sink) if kind == "storage" else None
    if watch is not None:
        watch.start()

    def copied(tables: list[str]) -> Any:
        return lambda q: q["state"] != "normal" or any(
            sorted((s["table_copy"] or {}).get("tables") or []) == tables and s["table_copy"]["phase"] == "done"
            for s in q["spans"])

    try:
        with BackgroundWriter(psycopg2.connect(pg_server.dsn(pg_database)), _streaming_writes(7), pause=0.01) as w:
            time.sleep(0.5)
            source.autocommit = False
            with source.cursor() as cur:
                cur.execute("CREATE TABLE late AS SELECT g AS id, 'before ' || g AS v FROM generate_series(1, 4000) g")
                cur.execute("ALTER TABLE late ADD PRIMARY KEY (id)")
            source.commit()
            source.autocommit = True
            q = wait_for(cdc, "tc", copied(["public.late"]), "the table copy of public.late", timeout=120)
            assert q["state"] == "normal", (q.get("error"), q.get("warnings"))
            if kind == "kafka":
                _inject_a_row_behind_tidewaters_back(kafka, topic, up, current_lsn(source))
            cdc_cli(cdc.url, "changefeed", "snapshot", "-c", "tc", "--table", "public.big", "--table", "public.bag")
            q = wait_for(cdc, "tc", copied(["public.bag", "public.big"]), "the resync", timeout=120)
            assert q["state"] == "normal", (q.get("error"), q.get("warnings"))
            time.sleep(1.0)
            w.finish()
        run_sql(source, "UPDATE late SET v = v || '!' WHERE id % 10 = 0")  # late streams after its copy
        lsn = current_lsn(source)
        info = cdc.wait_checkpoint("tc", lsn, timeout=120)
        assert info["state"] == "normal" and not info["warnings"], info
        tables = [*TABLES, "public.late"]
        if kind == "kafka":
            from cli.kafka_consumer import upstream_lookups
            from sinks.kafka.applier import SinkApplier
            from sinks.kafka.consumer import rebuild

            target = f"sqlite:///{tmp_path / 'rebuilt.db'}"
            closers, schemas, fetch = upstream_lookups(up)
            applier = SinkApplier(target, position=f"kafka:{topic}", schemas=schemas, fetch_row=fetch)
            try:
                core = rebuild([kafka.bootstrap], [topic], "canal-json", applier, until=info["checkpoint_ts"],
                               timeout=90, schemas=schemas)
            finally:
                applier.close()
                for c in closers:
                    c.close()
            bad = [d for d in compare_tables(source, tables, target) if not d.equal]
            assert not bad, f"the consumer's tables differ from the upstream: {bad}"
            # each copy's chunks checked against their markers: the initial copy's three tables, late's table copy,
            # the resync of big and bag (docs/sinks.md, "Copy markers")
            assert core.stats.chunks_verified >= 6, core.stats
        else:
            from sinks.storage.reader import StorageReader
            from sinks.storage.reader import rebuild as rebuild_files

            deadline = time.monotonic() + 60
            while (StorageReader(sink).checkpoint() or 0) < lsn and time.monotonic() < deadline:
                time.sleep(0.2)
            _, states = rebuild_files(sink)
            for t in tables:
                state = states[TableName.parse(t)]
                assert not state.problems, state.problems[:5]
                diff = compare_rows(source, t, state.rows())
                assert diff.equal, f"{t} rebuilt from the files differs from the upstream: {diff}"
            assert watch is not None
            time.sleep(0.3)
            assert not watch.violations, f"files published below an earlier metadata checkpoint: {watch.violations}"
            assert len(watch.seen) > 3, watch.seen
    finally:
        if watch is not None:
            watch.halt.set()
