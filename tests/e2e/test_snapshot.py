"""End to end: the initial snapshot (issue 10). Existing rows are copied by the Spark job the capture launches,
under an exported snapshot, while the application keeps writing; then the span streams from its slot with each
table's floor, so every row ends exactly once: keyed, composite-keyed and key-less (REPLICA IDENTITY FULL, with
duplicate rows) tables compared row by row with the upstream. A non-empty target is refused unless told what to
do. PostgreSQL -> MariaDB / PostgreSQL / SQLite."""

from __future__ import annotations

import random
import re
import time
from typing import Any

import psycopg2
import pytest
from e2e_workload import BackgroundWriter, assert_converged, run_on_target, run_sql, wait_for

from playground.cluster import ApiError, CdcServer
from playground.compare import compare_tables
from playground.servers import PostgresServer

pytestmark = pytest.mark.e2e

SCHEMA = """
CREATE TABLE big (id int PRIMARY KEY, v text, n int);
CREATE TABLE comp (a int, b text, c numeric(10,2), PRIMARY KEY (a, b));
CREATE TABLE bag (g int, s text);
ALTER TABLE bag REPLICA IDENTITY FULL;
"""
TABLES = ["public.big", "public.comp", "public.bag"]
PRELOAD = ("INSERT INTO big SELECT g, 'v' || g, g % 97 FROM generate_series(1, 30000) g",
           "INSERT INTO comp SELECT g % 500, 'b' || (g / 500), g / 3.0 FROM generate_series(1, 5000) g",
           "INSERT INTO bag SELECT g % 300, 's' || (g % 7) FROM generate_series(1, 4000) g")  # duplicates


@pytest.fixture
def source_schema() -> str:
    return SCHEMA


def _writes(seed: int) -> Any:
    rnd = random.Random(seed)

    def step(conn: Any, n: int) -> int:
        with conn.cursor() as cur:
            k = rnd.randint(1, 40000)
            cur.execute("INSERT INTO big VALUES (%s, 'w', 1) ON CONFLICT (id) DO UPDATE SET v = 'u' || big.n, n = big.n + 1",
                        (k,))
            cur.execute("DELETE FROM big WHERE id = %s", (rnd.randint(1, 40000),))
            cur.execute("UPDATE comp SET c = c + 1 WHERE a = %s", (rnd.randint(0, 499),))
            cur.execute("INSERT INTO bag VALUES (%s, 'new')", (rnd.randint(0, 299),))
            cur.execute("DELETE FROM bag WHERE ctid = (SELECT ctid FROM bag WHERE g = %s LIMIT 1)", (rnd.randint(0, 299),))
        conn.commit()
        return 1
    return step


def test_existing_rows_are_copied_under_concurrent_writes_and_end_exactly_once(
        cdc_server: CdcServer, pg_server: PostgresServer, pg_database: str, source: Any, sink_uri: str) -> None:
    cdc = cdc_server
    run_sql(source, *PRELOAD)
    writer_conn = psycopg2.connect(pg_server.dsn(pg_database))
    with BackgroundWriter(writer_conn, _writes(1), pause=0.005) as writer:
        cdc.create_changefeed("snap", pg_server.uri(pg_database), sink_uri, "span-count = 2\n[snapshot]\nchunk-rows = 4000\n")
        q = wait_for(cdc, "snap", lambda q: q["phase"] == "snapshot", "the snapshot phase", timeout=30)
        q = wait_for(cdc, "snap", lambda q: q["phase"] == "streaming" or q["state"] != "normal", "the copy",
                     timeout=240)
        assert q["state"] == "normal", q
        time.sleep(1.0)  # writes after the copy, streamed
        writer.finish()
    assert writer.txns > 0
    assert_converged(cdc, "snap", source, sink_uri, tables=TABLES)
    q = wait_for(cdc, "snap", lambda q: True, "query")
    assert q["state"] == "normal" and not q["warnings"], q
    snap = q["snapshot"]
    assert snap["chunks_done"] == snap["chunks_total"] >= 8, snap  # 30k rows in 4k-row chunks, and the others
    assert snap["rows_copied"] >= 38000, snap  # (the writer deleted some before the snapshot)
    assert {t["table"].split(":", 1)[1] for t in snap["tables"]} == set(TABLES), snap  # "span:table"


# the refusal is the API's, the same for every target: checked once
@pytest.mark.parametrize("sink_uri", ["sqlite"], indirect=True)
def test_a_non_empty_target_is_refused_unless_told_what_to_do(
        cdc_server: CdcServer, pg_server: PostgresServer, pg_database: str, source: Any, sink_uri: str) -> None:
    cdc = cdc_server
    run_sql(source, "INSERT INTO big SELECT g, 'v' || g, g FROM generate_series(1, 100) g",
            "INSERT INTO bag VALUES (1, 'x'), (1, 'x')", "INSERT INTO comp VALUES (1, 'a', 1)")
    cdc.create_changefeed("first", pg_server.uri(pg_database), sink_uri, "[snapshot]\nchunk-rows = 40\n")
    assert_converged(cdc, "first", source, sink_uri, tables=TABLES)
    cdc.request("DELETE", "/api/v2/changefeeds/first")

    with pytest.raises(ApiError) as refused:
        cdc.create_changefeed("second", pg_server.uri(pg_database), sink_uri)
    msg = refused.value.body["error_msg"]
    assert "public.big" in msg and "public.bag" in msg and "on-existing-rows" in msg and "--snapshot none" in msg, msg
    with pytest.raises(ApiError) as keyless:
        cdc.create_changefeed("second", pg_server.uri(pg_database), sink_uri, "[snapshot]\non-existing-rows = \"merge\"\n")
    assert "public.bag" in keyless.value.body["error_msg"] and "no key" in keyless.value.body["error_msg"]

    run_sql(source, "INSERT INTO big VALUES (1000, 'new', 0)", "DELETE FROM bag WHERE ctid = (SELECT min(ctid) FROM bag)")
    cdc.create_changefeed("second", pg_server.uri(pg_database), sink_uri, "[snapshot]\non-existing-rows = \"truncate\"\n")
    assert_converged(cdc, "second", source, sink_uri, tables=TABLES)
    q = wait_for(cdc, "second", lambda q: True, "query")
    assert q["state"] == "normal" and not q["warnings"], q


@pytest.mark.parametrize("sink_uri", ["sqlite", "mariadb"], indirect=True)
def test_a_merge_says_how_many_rows_of_the_target_it_kept_until_the_table_is_copied_again(
        cdc_server: CdcServer, pg_server: PostgresServer, pg_database: str, source: Any, sink_uri: str) -> None:
    """on-existing-rows = "merge" keeps the target's rows the upstream does not have: the changefeed goes to
    warning naming the table and how many (not the tables merged without such rows); a resync of that table
    makes it equal again and resume acknowledges the warning."""
    cdc = cdc_server
    run_sql(source, "INSERT INTO big SELECT g, 'v' || g, g FROM generate_series(1, 300) g",
            "INSERT INTO comp SELECT g, 'b', g FROM generate_series(1, 50) g",
            "INSERT INTO bag VALUES (1, 'x'), (1, 'x')")
    cdc.create_changefeed("first", pg_server.uri(pg_database), sink_uri, "[snapshot]\nchunk-rows = 100\n")
    assert_converged(cdc, "first", source, sink_uri, tables=TABLES)
    cdc.request("DELETE", "/api/v2/changefeeds/first")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # removal is asynchronous: its span stops, then the changefeed is gone
        try:
            cdc.changefeed("first")
        except ApiError:
            break
        time.sleep(0.2)
    else:
        raise AssertionError("changefeed first not removed within 60 s")
    # the target now holds rows of its own: 3 keys the upstream lacks in big, a stale value the merge overwrites,
    # comp with a row changed but none extra, bag emptied (a key-less table can only merge into an empty target)
    run_on_target(sink_uri, "INSERT INTO big VALUES (5001, 'mine', 0), (5002, 'mine', 0), (5003, 'mine', 0)",
               "UPDATE big SET v = 'stale' WHERE id = 7", "UPDATE comp SET c = -1 WHERE a = 3", "DELETE FROM bag")
    run_sql(source, "DELETE FROM big WHERE id = 300")  # copied by the first changefeed: the merge keeps it too

    cdc.create_changefeed("merged", pg_server.uri(pg_database), sink_uri,
                          "[snapshot]\non-existing-rows = \"merge\"\nchunk-rows = 100\n")
    q = wait_for(cdc, "merged", lambda q: q["phase"] == "streaming" and q["state"] != "normal",
                 "streaming, in warning")
    assert q["state"] == "warning", q
    (w,) = q["warnings"]
    assert (w["code"], w["table"], w["severity"], w["count"]) == (
        "CDC:WarnMergedRowsKept", "public.big", "divergence", 4), w
    assert "on-existing-rows" in w["message"] and "--table public.big" in w["message"], w
    diffs = {d.table: d for d in compare_tables(source, TABLES, sink_uri)}
    assert diffs["public.big"].target_rows == diffs["public.big"].source_rows + 4, diffs
    assert diffs["public.comp"].equal and diffs["public.bag"].equal, diffs  # merged without rows kept

    cdc.request("POST", "/api/v2/changefeeds/merged/snapshot", {"tables": ["public.big"]})
    wait_for(cdc, "merged", lambda q: q["table_copies"] == [] and all(
        not s["table_copy"] or s["table_copy"].get("phase") == "done" for s in q["spans"]), "the resync", timeout=120)
    assert_converged(cdc, "merged", source, sink_uri, tables=TABLES)
    assert cdc.changefeed("merged")["state"] == "warning"  # until acknowledged
    cdc.request("POST", "/api/v2/changefeeds/merged/resume")
    q = wait_for(cdc, "merged", lambda q: q["state"] == "normal" and not q["warnings"], "normal after resume")


def _spark_jobs(cdc: CdcServer, tag: str) -> list[str]:
    """Processes of changefeed ``tag``'s snapshot job of ``cdc`` still running: the job and everything in its
    process group (its Spark JVM and Python workers). Only jobs whose plan is under ``cdc``'s directory count: other
    xdist workers and other suites on the host run changefeeds of the same name."""
    import subprocess

    rows = [line.split(None, 2) for line in
            subprocess.run(["ps", "-eo", "pid=,pgid=,args="], capture_output=True, text=True).stdout.splitlines()]
    jobs = {r[0] for r in rows if len(r) == 3 and f"/snapshot-{tag}-" in r[2] and "--plan" in r[2]
            and f"{cdc.base_dir}/" in r[2]}
    return [r[2][:120] for r in rows if len(r) == 3 and (r[0] in jobs or r[1] in jobs)]


# the kill/resume protocol on the two fast paths of the copy: PostgreSQL's COPY passthrough and MariaDB's literal rows
# rendered in C (big and comp; the key-less bag is parsed); the job's own tests cover every target
@pytest.mark.kills
@pytest.mark.parametrize("sink_uri", ["postgresql", "mariadb"], indirect=True)
def test_a_capture_killed_mid_copy_resumes_with_the_chunks_left_and_ends_exactly_once(
        cdc_server: CdcServer, pg_server: PostgresServer, pg_database: str, source: Any, sink_uri: str) -> None:
    cdc = cdc_server
    run_sql(source, "INSERT INTO big SELECT g, repeat('v', 200) || g, g % 97 FROM generate_series(1, 60000) g",
            "INSERT INTO comp SELECT g % 500, 'b' || (g / 500), g / 3.0 FROM generate_series(1, 5000) g",
            "INSERT INTO bag SELECT g % 300, 's' || (g % 7) FROM generate_series(1, 4000) g")
    writer_conn = psycopg2.connect(pg_server.dsn(pg_database))
    with BackgroundWriter(writer_conn, _writes(2), pause=0.01) as writer:
        cdc.create_changefeed("kill", pg_server.uri(pg_database), sink_uri, "[snapshot]\nchunk-rows = 1500\n")
        q = wait_for(cdc, "kill", lambda q: 0 < q["snapshot"]["chunks_done"] < q["snapshot"]["chunks_total"],
                     "some chunks copied", timeout=120)
        cdc.kill()  # SIGKILL: the job dies with it; its exported snapshot goes with its connection
        time.sleep(1.0)
        cdc.start()
        q = wait_for(cdc, "kill", lambda q: q["phase"] == "streaming" or q["state"] != "normal", "the copy",
                     timeout=240)
        assert q["state"] == "normal", q
        time.sleep(1.0)
        writer.finish()
    assert_converged(cdc, "kill", source, sink_uri, tables=TABLES)
    q = wait_for(cdc, "kill", lambda q: True, "query")
    assert q["state"] == "normal" and not q["warnings"], q
    assert q["snapshot"]["chunks_done"] == q["snapshot"]["chunks_total"] > 30, q["snapshot"]
    logs = "".join(p.read_text() for p in cdc.base_dir.glob("data-*/snapshot/snapshot-kill-0.log"))
    assert re.search(r"chunk public\.big#\d+ copied as COPY text", logs), logs[-3000:]  # the fast path was taken


# pause is the processor's, the same for every target: checked once
@pytest.mark.parametrize("sink_uri", ["sqlite"], indirect=True)
def test_a_changefeed_paused_during_the_copy_ends_the_job_and_resumes_it(
        cdc_server: CdcServer, pg_server: PostgresServer, pg_database: str, source: Any, sink_uri: str) -> None:
    cdc = cdc_server
    run_sql(source, "INSERT INTO big SELECT g, repeat('v', 200) || g, g FROM generate_series(1, 60000) g",
            "INSERT INTO comp VALUES (1, 'a', 1)", "INSERT INTO bag VALUES (1, 'x'), (1, 'x')")
    cdc.create_changefeed("pz", pg_server.uri(pg_database), sink_uri, "[snapshot]\nchunk-rows = 1500\n")
    wait_for(cdc, "pz", lambda q: q["snapshot"]["chunks_done"] > 0, "the copy under way", timeout=120)
    cdc.request("POST", "/api/v2/changefeeds/pz/pause")
    deadline = time.monotonic() + 30
    while _spark_jobs(cdc, "pz") and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _spark_jobs(cdc, "pz") == [], "the snapshot job still runs after pause"
    time.sleep(2.0)  # a chunk a Spark worker was writing when the job ended is refused at its commit (the fence)
    done = cdc.changefeed("pz")["snapshot"]["chunks_done"]
    time.sleep(3.0)
    assert cdc.changefeed("pz")["snapshot"]["chunks_done"] == done  # nothing copies while paused
    with pytest.raises(ApiError) as refused:  # the copy may read past any target-ts: not while it copies
        cdc.request("PUT", "/api/v2/changefeeds/pz", {"target_ts": 1 << 40})
    assert refused.value.status == 400 and "still copying" in refused.value.body["error_msg"], refused.value.body
    cdc.request("POST", "/api/v2/changefeeds/pz/resume")
    assert_converged(cdc, "pz", source, sink_uri, tables=TABLES)
    q = wait_for(cdc, "pz", lambda q: True, "query")
    assert q["state"] == "normal" and q["phase"] == "streaming" and not q["warnings"], q


@pytest.mark.parametrize("sink_uri", ["postgresql"], indirect=True)
def test_a_row_the_target_refuses_fails_the_changefeed_naming_the_table_and_key(
        cdc_server: CdcServer, pg_server: PostgresServer, pg_database: str, source: Any, sink_uri: str) -> None:
    """Someone created the target table (empty) with a CHECK the upstream does not have: the copy's chunk is refused,
    the changefeed is failed (not retried forever) and `cdc cli changefeed query` names the table, the row's key and
    the database's reason; after the constraint is dropped, resume copies the rest and the target converges."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    cdc = cdc_server
    run_sql(source, "INSERT INTO big SELECT g, 'v' || g, g % 97 FROM generate_series(1, 3000) g",
            "UPDATE big SET n = -1 WHERE id = 2345")
    target_db = sink_uri.rsplit("/", 1)[1]
    pg_server.execute("CREATE TABLE public.big (id int PRIMARY KEY, v text, n int CONSTRAINT n_not_negative "
                      "CHECK (n >= 0))", db=target_db)
    cdc.create_changefeed("refused", pg_server.uri(pg_database), sink_uri,
                          "[filter]\nrules = ['public.big']\n[snapshot]\nchunk-rows = 1000\n")
    q = wait_for(cdc, "refused", lambda q: q["state"] in ("failed", "warning") or q["phase"] == "streaming",
                 "the refused copy", timeout=180)
    assert q["state"] == "failed", q  # fatal at once: the same row would be refused again
    out = subprocess.run([sys.executable, "-m", "cli", "cli", "--server", cdc.url, "changefeed", "query", "-c",
                          "refused"], capture_output=True, text=True, timeout=60,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr
    err = json.loads(out.stdout)["error"]
    assert err["code"] == "CDC:ErrSinkDataRejected", err
    assert "table public.big: the target refused the row with key id=2345" in err["message"], err
    assert 'violates check constraint "n_not_negative"' in err["message"] and "Fix:" in err["message"], err
    pg_server.execute("ALTER TABLE public.big DROP CONSTRAINT n_not_negative", db=target_db)  # the fix
    cdc.request("POST", "/api/v2/changefeeds/refused/resume")
    assert_converged(cdc, "refused", source, sink_uri, tables=["public.big"])
