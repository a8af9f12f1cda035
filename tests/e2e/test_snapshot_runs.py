"""End to end: an initial copy that takes more than one run (issue 10; docs/snapshot.md, "Floors" and "A table
changed between two runs"), and what a changefeed leaves behind when it is removed during its copy.

- A key-less table (REPLICA IDENTITY FULL, duplicate rows and NULLs) whose copy is forced under a *second* export:
  the capture is SIGKILLed while the keyed table before it (tables are copied in name order, one at a time into
  SQLite) is being copied, writers change the key-less table's duplicates before and after the second export, and
  the target ends equal as a multiset. The test checks from etcd that the key-less table really was copied under
  the second export and got its Ts as floor.
- A table altered upstream (a column added with a default, a key changed) between two runs: its copy starts over
  under the new snapshot from a new target, and target and upstream end equal, rows and shapes.
- A changefeed removed during its copy leaves no job process, no Spark Python daemon (own process group: found by
  its ancestry and command line) and no slot upstream, and no chunk lands afterwards.
- A table created with rows (CREATE TABLE AS) while the initial copy still runs ends equal.
"""

from __future__ import annotations

import os
import random
import threading
import time
from typing import Any

import psycopg2
import pytest
from e2e_workload import BackgroundWriter, assert_converged, run_sql, server_config, wait_for

from cdc.events import TableName
from cdc.meta.etcd import EtcdClient
from cdc.meta.snapshot_progress import SnapshotProgressStore
from cdc.meta.store import MetaStore
from cdc.model import SpanSnapshot
from playground.cluster import ApiError, CdcServer
from playground.servers import EtcdServer, PostgresServer

pytestmark = pytest.mark.e2e

# "zbag" sorts after "big": copied last, one chunk at a time into SQLite
SCHEMA = """
CREATE TABLE big (id int PRIMARY KEY, v text, n int);
CREATE TABLE comp (a int, b text, c numeric(10,2), PRIMARY KEY (a, b));
CREATE TABLE zbag (g int, s text);
ALTER TABLE zbag REPLICA IDENTITY FULL;
"""
TABLES = ["public.big", "public.comp", "public.zbag"]
ZBAG = TableName("public", "zbag")
PRELOAD = ("INSERT INTO big SELECT g, repeat('v', 200) || g, g % 97 FROM generate_series(1, 60000) g",
           "INSERT INTO comp SELECT g % 500, 'b' || (g / 500), g / 3.0 FROM generate_series(1, 5000) g",
           # duplicates (g % 100 repeats, s one of three) and NULLs in both columns
           "INSERT INTO zbag SELECT CASE WHEN g % 41 = 0 THEN NULL ELSE g % 100 END, "
           "CASE WHEN g % 5 = 0 THEN NULL ELSE 's' || (g % 3) END FROM generate_series(1, 4000) g")


@pytest.fixture
def source_schema() -> str:
    return SCHEMA


def _writes(seed: int) -> Any:
    """Keyed upserts and deletes, and on the key-less table: pairs of identical rows (NULLs too), the deletion of one
    of several duplicates, an update of one of them, an update of all rows of a group."""
    rnd = random.Random(seed)

    def step(conn: Any, n: int) -> int:
        with conn.cursor() as cur:
            cur.execute("INSERT INTO big (id, v, n) VALUES (%s, 'w', 1) ON CONFLICT (id) DO UPDATE "
                        "SET v = 'u' || big.n, n = big.n + 1", (rnd.randint(1, 70000),))
            cur.execute("DELETE FROM big WHERE id = %s", (rnd.randint(1, 70000),))
            cur.execute("UPDATE comp SET c = c + 1 WHERE a = %s", (rnd.randint(0, 499),))
            g = None if rnd.random() < 0.1 else rnd.randint(0, 99)
            s = None if rnd.random() < 0.3 else f"s{rnd.randint(0, 2)}"
            cur.execute("INSERT INTO zbag VALUES (%s, %s), (%s, %s)", (g, s, g, s))
            cur.execute("DELETE FROM zbag WHERE ctid = (SELECT ctid FROM zbag WHERE g IS NOT DISTINCT FROM %s "
                        "LIMIT 1)", (rnd.randint(0, 99),))
            cur.execute("UPDATE zbag SET s = %s WHERE ctid = (SELECT ctid FROM zbag WHERE g = %s AND s IS NULL "
                        "LIMIT 1)", (f"u{n}", rnd.randint(0, 99)))
            if n % 10 == 0:
                cur.execute("UPDATE zbag SET s = NULL WHERE g = %s", (rnd.randint(0, 99),))
        conn.commit()
        return 1
    return step


def _span_state(etcd: EtcdServer, cluster_id: str, cf: str) -> tuple[SpanSnapshot, SnapshotProgressStore, Any]:
    client = EtcdClient([etcd.url])
    status = MetaStore(client, cluster_id).get_span_status(cf, 0)
    assert status is not None and status.value.snapshot is not None, status
    return status.value.snapshot, SnapshotProgressStore(client, cluster_id), client


def _slow_big(pg_server: PostgresServer, sink_uri: str) -> None:
    """Create the target's ``big`` (what the copy would create) with a trigger that slows each row's insert (~0.3 ms),
    so that a test finds ``big`` half copied for sure: unslowed, its 61 chunks go in about a second, inside two of
    the tests' polls (a fresh-clone run missed the window); slowed, the first half takes ~9 s. A restarted copy
    drops and creates the target anew."""
    if sink_uri.startswith("sqlite:"):
        import sqlite3

        conn = sqlite3.connect(sink_uri.split("sqlite:///", 1)[1])
        conn.executescript(  # SQLite has no sleep: each row counts to 2,000 (~0.3 ms)
            "CREATE TABLE big (id INTEGER PRIMARY KEY, v TEXT, n INTEGER);"
            "CREATE TRIGGER slow_down BEFORE INSERT ON big BEGIN SELECT count(*) FROM (WITH RECURSIVE c(x) AS "
            "(SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 2000) SELECT x FROM c); END;")
        conn.close()
        return
    tdb = sink_uri.rsplit("/", 1)[1].split("?", 1)[0]
    for ddl in ("CREATE TABLE big (id integer PRIMARY KEY, v text, n integer)",
                "CREATE FUNCTION slow_down() RETURNS trigger LANGUAGE plpgsql AS "
                "$$ BEGIN PERFORM pg_sleep(0.0003); RETURN NEW; END $$",
                "CREATE TRIGGER slow_down BEFORE INSERT ON big FOR EACH ROW EXECUTE FUNCTION slow_down()",
                "ALTER TABLE big ENABLE ALWAYS TRIGGER slow_down"):  # (the copy writes as session_replication_role
        # replica, where ordinary triggers do not fire)
        pg_server.execute(ddl, db=tdb)


def _unslow_big(pg_server: PostgresServer, sink_uri: str) -> None:
    """Drop ``_slow_big``'s trigger once the test has done what it needed ``big`` half copied for: the rest of ``big``
    then goes in at the target's own speed instead of ~0.3 ms a row (its second half was ~9 s of waiting, more on a
    loaded host). The copy keeps writing meanwhile: the DROP waits for the chunk in flight."""
    if sink_uri.startswith("sqlite:"):
        import sqlite3

        conn = sqlite3.connect(sink_uri.split("sqlite:///", 1)[1], timeout=60)
        try:
            conn.execute("DROP TRIGGER IF EXISTS slow_down")
        finally:
            conn.close()
        return
    pg_server.execute("DROP TRIGGER IF EXISTS slow_down ON big", db=sink_uri.rsplit("/", 1)[1].split("?", 1)[0])


def _kill_during_big(cdc: CdcServer, cf: str, seen: list[dict[str, Any]] | None = None) -> None:
    """SIGKILL the capture while ``big`` (the first table) is half copied, start it again. ``seen``: gets the copy's
    progress of every query made meanwhile."""
    def half(q: dict[str, Any]) -> bool:
        if seen is not None:
            seen.append(q["snapshot"])
        big = [t for t in q["snapshot"]["tables"] if t["table"].endswith("public.big")]
        return bool(big) and 0 < big[0]["chunks_done"] < big[0]["chunks_total"] // 2
    q = wait_for(cdc, cf, half, "big half copied", timeout=120)
    zbag = [t for t in q["snapshot"]["tables"] if t["table"].endswith("public.zbag")]
    assert not zbag or zbag[0]["chunks_done"] == 0, q["snapshot"]  # not copied under the first export
    cdc.kill()  # the job dies with it; its exported snapshot goes with its connection


def _assert_progress_trustworthy(seen: list[dict[str, Any]]) -> None:
    """The copy's progress as the API showed it, query after query across the kill and the run after it: rows copied
    never go backwards (in total and per table), and while chunks are left the ETA is absent or positive, never 0."""
    assert len(seen) > 5, seen
    last_total, last_table, measured = 0, {}, 0
    for snap in seen:
        assert snap["rows_copied"] >= last_total, (last_total, snap)
        last_total = snap["rows_copied"]
        if snap["chunks_done"] < snap["chunks_total"]:
            assert snap["eta_seconds"] is None or snap["eta_seconds"] > 0, snap
            measured += snap["eta_seconds"] is not None
        for t in snap["tables"]:
            assert t["rows_copied"] >= last_table.get(t["table"], 0), (last_table, snap)
            last_table[t["table"]] = t["rows_copied"]
            assert t["rows_copied"] - t["rows_redone"] == t["rows_done"], t
            if not t["chunks_total"] or t["chunks_done"] < t["chunks_total"]:
                assert t["eta_seconds"] is None or t["eta_seconds"] > 0, t
    assert measured, "no ETA was ever estimated while the copy ran"


@pytest.mark.kills
@pytest.mark.parametrize("sink_uri", ["sqlite"], indirect=True)
def test_a_keyless_table_copied_under_a_second_export_while_writers_run_ends_exact(
        cdc_server: CdcServer, etcd_server: EtcdServer, cluster_id: str, pg_server: PostgresServer,
        pg_database: str, source: Any, sink_uri: str) -> None:
    cdc = cdc_server
    run_sql(source, *PRELOAD)
    writer_conn = psycopg2.connect(pg_server.dsn(pg_database))
    with BackgroundWriter(writer_conn, _writes(11), pause=0.005) as writer:
        # no Spark (a copy this small runs in the job's process): into SQLite one chunk at a time, in table order
        _slow_big(pg_server, sink_uri)
        cdc.create_changefeed("kr", pg_server.uri(pg_database), sink_uri,
                              "[snapshot]\nchunk-rows = 1000\nspark-min-rows = 100000000\n")
        seen: list[dict[str, Any]] = []  # the copy's progress as `changefeed query` shows it, across the kill
        _kill_during_big(cdc, "kr", seen)
        time.sleep(1.5)  # the key-less table's duplicates change between the two exports
        cdc.start()
        q = wait_for(cdc, "kr", lambda q: bool(seen.append(q["snapshot"])) or q["phase"] == "streaming"
                     or q["state"] != "normal", "the copy", timeout=240)
        assert q["state"] == "normal", q
        time.sleep(1.5)  # and after the second export, streamed on top of its copy
        writer.finish()
    assert writer.txns > 50
    assert_converged(cdc, "kr", source, sink_uri, tables=TABLES)
    q = wait_for(cdc, "kr", lambda q: True, "query")
    assert q["state"] == "normal" and not q["warnings"], q
    # the test proves something only if the key-less table was copied under the second export, not the first
    state, progress, client = _span_state(etcd_server, cluster_id, "kr")
    try:
        record = progress.done_chunks("kr", 0, ZBAG)[0]
    finally:
        client.close()
    assert len(state.exports) >= 2, state
    first_ts = state.exports[0][1]
    assert (record.snapshot, record.commit_ts) in state.exports[1:] and record.commit_ts > first_ts, (record, state)
    assert state.floors["public.zbag"] == record.commit_ts, state
    # big was half copied under the first export; with a text column under REPLICA IDENTITY DEFAULT its copy started
    # over whole under the second (processor.snapshot, _restart_split): its floor is that one
    assert state.floors["public.big"] in [ts for _, ts in state.exports[1:]], state
    # so big's rows copied before the kill were copied again: shown as redone, never as fewer rows copied
    _assert_progress_trustworthy(seen)
    (big,) = [t for t in seen[-1]["tables"] if t["table"].endswith("public.big")]
    assert big["rows_redone"] > 0 and big["rows_done"] == big["rows_planned"], big


@pytest.mark.kills
@pytest.mark.parametrize("sink_uri", ["postgresql"], indirect=True)
def test_tables_altered_between_two_runs_of_the_copy_are_copied_again_and_end_equal(
        cdc_server: CdcServer, etcd_server: EtcdServer, cluster_id: str, pg_server: PostgresServer,
        pg_database: str, source: Any, sink_uri: str) -> None:
    """Run 1 copies part of ``big`` (into a PostgreSQL target it creates without its key: chunk markers) and is
    killed; then ``big`` gets a column with a default, ``comp`` (planned, not copied) another key, ``zbag`` a column;
    run 2 copies all three again from new targets under its snapshot, while writers go on in both definitions."""
    cdc = cdc_server
    run_sql(source, *PRELOAD)
    _slow_big(pg_server, sink_uri)  # run 2 drops it
    writer_conn = psycopg2.connect(pg_server.dsn(pg_database))
    with BackgroundWriter(writer_conn, _writes(12), pause=0.01) as writer:
        cdc.create_changefeed("alt", pg_server.uri(pg_database), sink_uri,
                              "[snapshot]\nchunk-rows = 1000\nspark-min-rows = 100000000\n")
        _kill_during_big(cdc, "alt")
        run_sql(source, "ALTER TABLE big ADD COLUMN c int DEFAULT 7",
                "ALTER TABLE comp DROP CONSTRAINT comp_pkey, ADD PRIMARY KEY (a, b, c)",
                "ALTER TABLE zbag ADD COLUMN t text DEFAULT 'x'")
        time.sleep(1.0)
        cdc.start()
        q = wait_for(cdc, "alt", lambda q: q["phase"] == "streaming" or q["state"] != "normal", "the copy",
                     timeout=240)
        assert q["state"] == "normal", q
        # (the set-wide UPDATE takes big's SHARE ROW EXCLUSIVE lock first, so that it waits for the writer's open
        # transaction instead of locking rows under it: else PostgreSQL may pick the writer as a deadlock victim)
        run_sql(source, "LOCK TABLE big IN SHARE ROW EXCLUSIVE MODE; UPDATE big SET c = id WHERE id % 13 = 0",
                "INSERT INTO zbag VALUES (1, 'after', 'y')")
        time.sleep(1.0)
        writer.finish()
    assert_converged(cdc, "alt", source, sink_uri, tables=TABLES, schemas=True)
    q = wait_for(cdc, "alt", lambda q: True, "query")
    assert q["state"] == "normal" and not q["warnings"], q
    state, progress, client = _span_state(etcd_server, cluster_id, "alt")
    try:
        plans = {t: progress.get_plan("alt", 0, TableName.parse(t)) for t in TABLES}
    finally:
        client.close()
    first = state.exports[0][1]
    for t, plan in plans.items():  # every table planned again under a later export, with its new definition
        assert plan is not None and (plan.snapshot, plan.ts) in state.exports[1:] and plan.ts > first, (t, plan, state)
        assert state.floors[t] == plan.ts, (t, plan, state)
    assert "c:integer" in plans["public.big"].definition and "key(a,b,c)" in plans["public.comp"].definition


def _procs() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line) of every process."""
    out: dict[int, tuple[int, str]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError, IndexError):
            continue
        out[int(d)] = (ppid, cmd)
    return out


def _job_tree(cdc: CdcServer, cf: str) -> dict[int, str]:
    """The snapshot job of changefeed ``cf`` of ``cdc`` and every process descended from it (its Spark JVM, the
    JVM's Python daemon -- in a process group of its own -- and the daemon's workers): pid -> command line. Only a
    job whose plan is under ``cdc``'s directory counts: other xdist workers and other suites on the host run
    changefeeds of the same name."""
    procs = _procs()
    tree = {pid: cmd for pid, (_, cmd) in procs.items()
            if f"/snapshot-{cf}-" in cmd and "--plan" in cmd and f"{cdc.base_dir}/" in cmd}
    grew = True
    while grew:
        grew = False
        for pid, (ppid, cmd) in procs.items():
            if ppid in tree and pid not in tree:
                tree[pid] = cmd
                grew = True
    return tree


def _still_running(seen: dict[int, str]) -> list[str]:
    now = _procs()
    return [cmd[:120] for pid, cmd in seen.items() if pid in now and now[pid][1] == cmd]


def _wait_for_tree(cf: str, seen: dict[int, str], what: str, found: Any, timeout: float, cdc: CdcServer) -> None:
    deadline = time.monotonic() + timeout
    while not found(seen):
        assert time.monotonic() < deadline, f"{what} not seen under the job of {cf}: {seen}\n{cdc.log_tail()}"
        seen.update(_job_tree(cdc, cf))
        time.sleep(0.2)


@pytest.mark.parametrize("sink_uri", ["postgresql"], indirect=True)
def test_a_changefeed_removed_during_its_copy_leaves_nothing_running(
        cdc_server: CdcServer, pg_server: PostgresServer, pg_database: str, source: Any, sink_uri: str) -> None:
    """Spark is made to run the copy for sure: the first table's target is locked until Spark is up (the job's own
    process copies from the front of the list meanwhile, and would otherwise copy everything first), and the last
    one's stays locked, so a Spark worker is inside a chunk when the changefeed is removed."""
    cdc = cdc_server
    run_sql(source, "CREATE TABLE abig (id int PRIMARY KEY, v text)", "CREATE TABLE zlock (id int PRIMARY KEY, v text)",
            "INSERT INTO abig VALUES (1, 'a')", "INSERT INTO zlock SELECT g, 'z' FROM generate_series(1, 100) g",
            "INSERT INTO big SELECT g, repeat('v', 200) || g, g FROM generate_series(1, 300000) g",
            "INSERT INTO comp VALUES (1, 'a', 1)", "INSERT INTO zbag VALUES (1, 'x'), (1, 'x')")
    tdb = sink_uri.rsplit("/", 1)[1].split("?", 1)[0]
    pg_server.execute("CREATE TABLE abig (id int PRIMARY KEY, v text)", db=tdb)  # empty: create accepts them
    pg_server.execute("CREATE TABLE zlock (id int PRIMARY KEY, v text)", db=tdb)
    cdc.create_changefeed("rm", pg_server.uri(pg_database), sink_uri, "[snapshot]\nchunk-rows = 2000\nspark-min-rows = 0\n")
    first, last = pg_server.connect(tdb), pg_server.connect(tdb)
    try:
        first.autocommit = last.autocommit = False
        # SHARE: blocks the chunks' writes, and takes no transaction id (an ACCESS EXCLUSIVE lock does, and a slot's
        # exported snapshot waits for every transaction with one, in any database of the server)
        first.cursor().execute("LOCK TABLE abig IN SHARE MODE")
        last.cursor().execute("LOCK TABLE zlock IN SHARE MODE")
        seen: dict[int, str] = {}
        _wait_for_tree("rm", seen, "Spark's JVM", lambda s: any("/bin/java" in c for c in s.values()), 60, cdc)
        # the job's own process waits on abig meanwhile; Spark's session is up when its log says so (5-13 s here)
        deadline = time.monotonic() + 90
        while not any("spark session up" in p.read_text(errors="replace")
                      for p in cdc.base_dir.rglob("snapshot-rm-*.log")):
            assert time.monotonic() < deadline, f"Spark did not come up for the job\n{cdc.log_tail()}"
            time.sleep(0.2)
        time.sleep(1.0)  # the driver hands the chunks after abig to Spark once it is up
        first.rollback()  # abig may be written now: Spark takes the chunks after it
        _wait_for_tree("rm", seen, "Spark's Python daemon", lambda s: any("pyspark.daemon" in c for c in s.values()),
                       60, cdc)
        time.sleep(2.0)  # a worker reaches zlock's chunk and waits for its lock
        seen.update(_job_tree(cdc, "rm"))
        q = cdc.changefeed("rm")
        assert q["phase"] == "snapshot" and q["snapshot"]["chunks_done"] < q["snapshot"]["chunks_total"], q
        cdc.request("DELETE", "/api/v2/changefeeds/rm")
        deadline = time.monotonic() + 60
        while (_still_running(seen) or _job_tree(cdc, "rm")) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert _still_running(seen) == [], "processes of the copy outlived the remove"
        assert _job_tree(cdc, "rm") == {}, "a snapshot job of the removed changefeed runs"
        slots_sql = "SELECT slot_name, temporary FROM pg_replication_slots WHERE database = %s"
        deadline = time.monotonic() + 15  # (it goes with the copy thread's replication connection, a moment later)
        while (temporary := [s for s in pg_server.execute(slots_sql, params=(pg_database,)) if s[1]]) \
                and time.monotonic() < deadline:
            time.sleep(0.2)
        assert temporary == [], f"the copy's exported snapshot's slot outlived the remove: {temporary}"
        deadline = time.monotonic() + 30  # the span's own slot goes once the owner sees the span stopped
        while (slots := pg_server.execute(slots_sql, params=(pg_database,))) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert slots == [], f"slots left upstream: {slots}"
        # the owner drops the slots and publications first, then the changefeed's keys (owner.apply DropChangefeed):
        # under load the keys may go a moment after the last slot
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                cdc.changefeed("rm")
            except ApiError:
                break
            time.sleep(0.2)
        with pytest.raises(ApiError):
            cdc.changefeed("rm")
        last.rollback()  # a chunk that still waited for zlock could commit now: nothing may land
        time.sleep(3.0)
        assert pg_server.execute("SELECT count(*) FROM zlock", db=tdb) == [(0,)]
        rows = pg_server.execute("SELECT count(*) FROM big", db=tdb)
        time.sleep(2.0)
        assert pg_server.execute("SELECT count(*) FROM big", db=tdb) == rows, "chunks still land after the remove"
    finally:
        first.close()
        last.close()


@pytest.mark.parametrize("sink_uri", ["sqlite", "postgresql"], indirect=True)
def test_a_table_created_with_rows_while_the_initial_copy_runs_ends_equal(
        etcd_server: EtcdServer, cluster_id: str, tmp_path: Any, pg_server: PostgresServer, pg_database: str,
        source: Any, sink_uri: str) -> None:
    cdc = CdcServer(etcd_server.url, tmp_path / "cdc", cluster_id=cluster_id,
                    extra_args=server_config(tmp_path, "upstream-check-interval = 0.5\n")).start()
    try:
        run_sql(source, *PRELOAD)
        writer_conn = psycopg2.connect(pg_server.dsn(pg_database))
        with BackgroundWriter(writer_conn, _writes(13), pause=0.01) as writer:
            cdc.create_changefeed("ctas", pg_server.uri(pg_database), sink_uri, "[snapshot]\nchunk-rows = 1000\n")
            wait_for(cdc, "ctas", lambda q: q["snapshot"]["chunks_done"] > 0, "the copy under way", timeout=120)
            run_sql(source, "BEGIN", "CREATE TABLE late AS SELECT g AS id, 'before ' || g AS v FROM "
                    "generate_series(1, 3000) g", "ALTER TABLE late ADD PRIMARY KEY (id)", "COMMIT")
            q = cdc.changefeed("ctas")
            assert q["phase"] == "snapshot", q  # created while the initial copy still ran
            run_sql(source, "UPDATE late SET v = 'changed' WHERE id % 3 = 0", "DELETE FROM late WHERE id % 7 = 0",
                    "INSERT INTO late SELECT g, 'new' FROM generate_series(3001, 3100) g")
            q = wait_for(cdc, "ctas", lambda q: (q["phase"] == "streaming" and not q["table_copies"]
                                                 and all((s["table_copy"] or {}).get("phase", "done") == "done"
                                                         for s in q["spans"])) or q["state"] != "normal",
                         "the copy and the table copy of late", timeout=240)
            assert q["state"] == "normal", q
            run_sql(source, "UPDATE late SET v = 'after' WHERE id % 5 = 0")
            time.sleep(1.0)
            writer.finish()
        assert_converged(cdc, "ctas", source, sink_uri, tables=[*TABLES, "public.late"])
        q = wait_for(cdc, "ctas", lambda q: True, "query")
        assert q["state"] == "normal" and not q["warnings"], q
    finally:
        cdc.terminate()


@pytest.mark.parametrize("sink_uri", ["sqlite"], indirect=True)
def test_columns_dropped_and_renamed_while_the_copy_runs_are_copied_again_and_end_equal(
        cdc_server: CdcServer, etcd_server: EtcdServer, cluster_id: str, pg_server: PostgresServer,
        pg_database: str, source: Any, sink_uri: str) -> None:
    """No kill: ``big`` loses a column while it is half copied and ``zbag`` (not copied yet) has one renamed.
    PostgreSQL resolves the copy's query against the current catalog, so the next chunk's read fails; that is the
    retryable CDC:ErrSnapshotTableAltered (it used to fail the changefeed for good), and the next run copies both
    tables again under their new definitions while writers go on; everything ends equal, rows and shapes."""
    cdc = cdc_server
    run_sql(source, *PRELOAD)
    rnd = random.Random(13)

    def step(conn: Any, n: int) -> int:  # touches no column the DDL drops or renames
        with conn.cursor() as cur:
            cur.execute("INSERT INTO big (id, n) VALUES (%s, 1) ON CONFLICT (id) DO UPDATE SET n = big.n + 1",
                        (rnd.randint(1, 70000),))
            cur.execute("DELETE FROM big WHERE id = %s", (rnd.randint(1, 70000),))
            cur.execute("INSERT INTO zbag (g) VALUES (%s), (%s)", (n % 100, n % 100))
            cur.execute("DELETE FROM zbag WHERE ctid = (SELECT ctid FROM zbag WHERE g = %s LIMIT 1)",
                        (rnd.randint(0, 99),))
        conn.commit()
        return 1

    writer_conn = psycopg2.connect(pg_server.dsn(pg_database))
    with BackgroundWriter(writer_conn, step, pause=0.005) as writer:
        _slow_big(pg_server, sink_uri)
        cdc.create_changefeed("ddl", pg_server.uri(pg_database), sink_uri,
                              "[snapshot]\nchunk-rows = 1000\nspark-min-rows = 100000000\n")

        def half(q: dict[str, Any]) -> bool:
            big = [t for t in q["snapshot"]["tables"] if t["table"].endswith("public.big")]
            return bool(big) and 0 < big[0]["chunks_done"] < big[0]["chunks_total"] // 2
        wait_for(cdc, "ddl", half, "big half copied", timeout=120)
        run_sql(source, "ALTER TABLE big DROP COLUMN v", "ALTER TABLE zbag RENAME COLUMN s TO s2")
        q = wait_for(cdc, "ddl", lambda q: q["phase"] == "streaming" or q["state"] == "failed", "the copy",
                     timeout=240)
        assert q["phase"] == "streaming", q
        time.sleep(1.0)
        writer.finish()
    assert writer.txns > 20
    assert_converged(cdc, "ddl", source, sink_uri, tables=TABLES, schemas=True)
    q = wait_for(cdc, "ddl", lambda q: q["state"] == "normal", "back to normal")
    assert not q["warnings"], q
    state, progress, client = _span_state(etcd_server, cluster_id, "ddl")
    try:
        plans = {t: progress.get_plan("ddl", 0, TableName.parse(t)) for t in ("public.big", "public.zbag")}
    finally:
        client.close()
    for t, plan in plans.items():  # planned again under a later export, with the new definition
        assert plan is not None and plan.ts > state.exports[0][1] and state.floors[t] == plan.ts, (t, plan, state)
    assert ":text" not in plans["public.big"].definition.split("v:")[0] or "v:" not in plans["public.big"].definition
    assert "s2:" in plans["public.zbag"].definition


@pytest.mark.kills
@pytest.mark.parametrize("sink_uri", ["sqlite"], indirect=True)
def test_key_rotations_during_a_copy_restarted_under_a_new_snapshot_end_equal(
        cdc_server: CdcServer, etcd_server: EtcdServer, cluster_id: str, pg_server: PostgresServer,
        pg_database: str, source: Any, sink_uri: str) -> None:
    """``ztoast`` (REPLICA IDENTITY DEFAULT, TOASTed values that key changes leave unsent) is copied after the kill,
    under the second snapshot, while its rows rotate keys (a row moves to a new key, another into the key it left).
    Its floor used to be the first snapshot (its plan's), so its changes in between were replayed over rows already
    newer: dozens of extra rows (one sink write netted several replayed transactions) and rows with other rows'
    TOASTed values (a key change takes unsent values from the row at its old key). Its floor is now the snapshot
    its chunks were read at, and ``big``, half copied at the kill, is copied again whole under the second one."""
    cdc = cdc_server
    run_sql(source, *PRELOAD, "CREATE TABLE ztoast (id int PRIMARY KEY, small int, big text)",
            "INSERT INTO ztoast SELECT g, 0, (SELECT string_agg(md5(random()::text || g || x), '') "
            "FROM generate_series(1, 150) x) FROM generate_series(1, 60) g")
    rnd = random.Random(17)

    def step(conn: Any, n: int) -> int:
        with conn.cursor() as cur:
            cur.execute("SELECT id FROM ztoast")
            ids = [r[0] for r in cur.fetchall()]
            a, b = rnd.sample(ids, 2)
            cur.execute("UPDATE ztoast SET id = %s WHERE id = %s", (max(ids) + 1 + n, a))
            cur.execute("UPDATE ztoast SET id = %s WHERE id = %s", (a, b))
            cur.execute("UPDATE ztoast SET small = small + 1 WHERE id = %s", (rnd.choice(ids),))
            cur.execute("UPDATE big SET n = n + 1 WHERE id = %s", (rnd.randint(1, 60000),))
        conn.commit()
        return 1

    writer_conn = psycopg2.connect(pg_server.dsn(pg_database))
    with BackgroundWriter(writer_conn, step, pause=0.01) as writer:
        _slow_big(pg_server, sink_uri)
        cdc.create_changefeed("km", pg_server.uri(pg_database), sink_uri,
                              "[snapshot]\nchunk-rows = 1000\nspark-min-rows = 100000000\n")
        _kill_during_big(cdc, "km")
        time.sleep(1.5)  # rotations between the two exports
        cdc.start()
        q = wait_for(cdc, "km", lambda q: q["phase"] == "streaming" or q["state"] != "normal", "the copy",
                     timeout=240)
        assert q["state"] == "normal", q
        time.sleep(1.0)
        writer.finish()
    assert writer.txns > 20
    assert_converged(cdc, "km", source, sink_uri, tables=[*TABLES, "public.ztoast"])
    state, progress, client = _span_state(etcd_server, cluster_id, "km")
    try:
        read_at = {d.commit_ts for d in progress.done_chunks("km", 0, TableName("public", "ztoast")).values()}
    finally:
        client.close()
    # ztoast, planned under the first snapshot, was read whole under the second: that is its floor, no replay window;
    # big, half copied under the first and with a text column under REPLICA IDENTITY DEFAULT, was copied again whole
    assert len(state.exports) >= 2 and read_at == {state.floors["public.ztoast"]} != {state.exports[0][1]}, state
    assert state.floors["public.big"] > state.exports[0][1] and "public.big" not in state.ceilings, state
    q = wait_for(cdc, "km", lambda q: True, "query")
    assert q["state"] == "normal" and not [w for w in q["warnings"] if w["severity"] == "divergence"], q


def _target_tables(sink_uri: str) -> set[str]:
    """``schema.table`` of every table of an SQL target (SQLite: ``main.table``)."""
    import sqlalchemy as sa

    from playground.compare import sqlalchemy_url

    engine = sa.create_engine(sqlalchemy_url(sink_uri))
    try:
        insp = sa.inspect(engine)
        return {f"{schema}.{t}" for schema in insp.get_schema_names() for t in insp.get_table_names(schema=schema)}
    finally:
        engine.dispose()


@pytest.mark.parametrize(("sink_uri", "ddl", "new_name"), [
    ("sqlite", "ALTER TABLE zbag RENAME TO zbag2", "public.zbag2"),
    ("postgresql", "ALTER TABLE zbag SET SCHEMA other", "other.zbag"),  # (the changefeed's filter has every schema)
], indirect=["sink_uri"])
def test_a_keyless_table_renamed_inside_its_copys_window_gets_no_change_twice(
        cdc_server: CdcServer, etcd_server: EtcdServer, cluster_id: str, pg_server: PostgresServer,
        pg_database: str, source: Any, sink_uri: str, ddl: str, new_name: str) -> None:
    """Issue 20, item 4. ``zbag`` (key-less, REPLICA IDENTITY FULL, duplicates) is renamed (``RENAME``, ``SET SCHEMA``)
    while ``big`` is half copied and ``zbag`` not yet, under writers that change it before and after the rename. The
    job reads ``zbag`` by its relation oid under the snapshot it was planned at (before the rename), into the target
    of its old name; the stream then replays its later changes under the old name, the rename, and the changes under
    the new name (docs/snapshot.md, "A table renamed while it is copied"). (Before the read by oid the chunk's read
    failed, and the next run copied the table whole under its new name and a later snapshot; before that, floors
    per table *name* let the old name's changes escape the floor.) The target's table equals the upstream's as a
    multiset, nothing is left downstream under the old name, and the changefeed is normal."""
    cdc = cdc_server
    run_sql(source, *PRELOAD, "CREATE SCHEMA other")
    rnd = random.Random(29)
    bag = ["public.zbag"]  # the key-less table's current name (changed under the writer's lock)
    lock = threading.Lock()

    def step(conn: Any, n: int) -> int:
        with lock, conn.cursor() as cur:
            t = bag[0]
            cur.execute("INSERT INTO big (id, n) VALUES (%s, 1) ON CONFLICT (id) DO UPDATE SET n = big.n + 1",
                        (rnd.randint(1, 70000),))
            g = None if rnd.random() < 0.1 else rnd.randint(0, 99)
            cur.execute(f"INSERT INTO {t} VALUES (%s, 'w'), (%s, 'w')", (g, g))  # a pair of duplicates
            cur.execute(f"DELETE FROM {t} WHERE ctid = (SELECT ctid FROM {t} WHERE g IS NOT DISTINCT FROM %s LIMIT 1)",
                        (rnd.randint(0, 99),))
            cur.execute(f"UPDATE {t} SET s = %s WHERE ctid = (SELECT ctid FROM {t} WHERE g = %s LIMIT 1)",
                        (f"u{n}", rnd.randint(0, 99)))
            conn.commit()
        return 1

    writer_conn = psycopg2.connect(pg_server.dsn(pg_database))
    with BackgroundWriter(writer_conn, step, pause=0.005) as writer:
        _slow_big(pg_server, sink_uri)
        cdc.create_changefeed("rn", pg_server.uri(pg_database), sink_uri,
                              "[snapshot]\nchunk-rows = 1000\nspark-min-rows = 100000000\n")

        def half(q: dict[str, Any]) -> bool:
            big = [t for t in q["snapshot"]["tables"] if t["table"].endswith("public.big")]
            return bool(big) and 0 < big[0]["chunks_done"] < big[0]["chunks_total"] // 2
        q = wait_for(cdc, "rn", half, "big half copied", timeout=120)
        zbag = [t for t in q["snapshot"]["tables"] if t["table"].endswith("public.zbag")]
        assert not zbag or zbag[0]["chunks_done"] == 0, q["snapshot"]  # not copied yet
        with lock:
            before = writer.txns
            with source.cursor() as cur:
                cur.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")
                renamed_after = int(cur.fetchone()[0])  # every write under the old name committed below this
            run_sql(source, ddl)
            bag[0] = new_name
        assert before > 5  # changes under the old name, inside the window
        _unslow_big(pg_server, sink_uri)  # (the window is past: zbag's copy comes after big's)
        q = wait_for(cdc, "rn", lambda q: q["phase"] == "streaming" or q["state"] == "failed", "the copy",
                     timeout=240)
        assert q["phase"] == "streaming", (q["state"], q.get("error"), cdc.log_tail())
        time.sleep(1.0)  # and changes under the new name after the copy, streamed on top of it
        writer.finish()
    assert writer.txns > before + 5
    assert_converged(cdc, "rn", source, sink_uri, tables=["public.big", "public.comp", new_name])
    def downstream(name: str) -> str:  # (SQLite has no schemas: every table is main's)
        return f"main.{name.rpartition('.')[2]}" if sink_uri.startswith("sqlite") else name
    tables = _target_tables(sink_uri)
    assert downstream(new_name) in tables and downstream("public.zbag") not in tables, tables
    q = wait_for(cdc, "rn", lambda q: q["state"] == "normal", "back to normal")
    assert not q["warnings"], q
    state, progress, client = _span_state(etcd_server, cluster_id, "rn")
    try:
        plan = progress.get_plan("rn", 0, TableName("public", "zbag"))
        renamed = progress.get_plan("rn", 0, TableName.parse(new_name))
    finally:
        client.close()
    with source.cursor() as cur:
        cur.execute("SELECT %s::regclass::oid::int8", (new_name,))
        oid = int(cur.fetchone()[0])
    # copied once, under its old name and the first export (below the rename); its floor is found by oid
    assert plan is not None and renamed is None and plan.oid == oid and state.oids["public.zbag"] == oid, (plan, state)
    assert state.floors["public.zbag"] == state.exports[0][1] < renamed_after and len(state.exports) == 1, state
