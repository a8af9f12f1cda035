"""Every data warning reaches the changefeed's state (issue 8, item 8), end to end with a real `cdc server`:

- a table created after the changefeed that already holds rows when the owner picks it up puts the changefeed
  in `warning` with a warning naming the table and the row count (query JSON and table output, API, metric);
  the downstream really lacks exactly those rows; after the operator copies them, `resume` acknowledges the
  warning and the changefeed is `normal` again with the target equal to the source;
- a partial UPDATE (unchanged TOAST value) of a row missing downstream is completed from the upstream (the
  span's row source) and shown as a `notice` warning naming the table and key; the state stays `normal`.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_workload import TABLES, assert_converged, mixed_workload, server_config, wait_for

from playground.cluster import CdcServer, current_lsn
from playground.compare import compare_tables
from playground.servers import EtcdServer, PostgresServer

pytestmark = pytest.mark.e2e

WATCH = "upstream-check-interval = 0.5\n"


def _cli(url: str, *args: str) -> str:
    out = subprocess.run([sys.executable, "-m", "cli", "cli", "--server", url, *args], capture_output=True,
                         text=True, timeout=60, cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr
    return out.stdout


def _metric_lines(cdc: CdcServer, name: str) -> list[str]:
    with urllib.request.urlopen(cdc.url + "/metrics", timeout=10) as resp:
        return [line for line in resp.read().decode().splitlines() if line.startswith(name + "{")]


@pytest.fixture
def cdc(etcd_server: EtcdServer, cluster_id: str, tmp_path: Path) -> Iterator[CdcServer]:
    """One `cdc server` whose owner looks at the upstream every second (``WATCH``)."""
    server = CdcServer(etcd_server.url, tmp_path / "cdc", cluster_id=cluster_id,
                       extra_args=server_config(tmp_path, WATCH)).start()
    yield server
    server.terminate()


def test_rows_of_a_table_picked_up_later_without_a_copy_put_the_changefeed_in_warning_until_resumed(
        cdc: CdcServer, tmp_path: Path, pg_server: PostgresServer, pg_database: str, source: Any) -> None:
    target = tmp_path / "target.db"
    sink = f"sqlite:///{target}"
    # without an initial copy (with one, a table picked up with rows gets a table copy: test_table_copy.py)
    cdc.create_changefeed("late", pg_server.uri(pg_database), sink, '[snapshot]\nmode = "none"\n')
    mixed_workload(source, 3)
    assert_converged(cdc, "late", source, sink)
    assert cdc.changefeed("late")["warnings"] == []

    # created with its rows by CREATE TABLE AS (which the DDL trigger never joins to a span: its rows are written
    # before the table could join) and keyed in the same transaction: the owner can only ever see it with its 3 rows
    source.autocommit = False
    with source.cursor() as cur:
        cur.execute("CREATE TABLE latecomer AS SELECT g AS id, 'before ' || g AS v FROM generate_series(1, 3) g")
        cur.execute("ALTER TABLE latecomer ADD PRIMARY KEY (id)")
    source.commit()
    source.autocommit = True

    q = wait_for(cdc, "late", lambda q: q["state"] == "warning", "warning state")
    (w,) = q["warnings"]
    assert (w["code"], w["table"], w["severity"], w["count"]) == (
        "CDC:WarnUnreplicatedRows", "public.latecomer", "divergence", 3), w
    assert "3 row(s)" in w["message"] and w["first_time"] > 0 and w["last_time"] >= w["first_time"]
    assert q["error"]["data_warning"] and "public.latecomer" in q["error"]["message"], q["error"]

    # the CLI shows it (JSON and table), the owner exports it
    queried = json.loads(_cli(cdc.url, "changefeed", "query", "-c", "late"))
    assert queried["state"] == "warning" and queried["warnings"][0]["table"] == "public.latecomer"
    table = _cli(cdc.url, "changefeed", "query", "-c", "late", "--output", "table")
    assert "data warnings" in table and "CDC:WarnUnreplicatedRows" in table and "public.latecomer" in table
    listed = _cli(cdc.url, "changefeed", "list", "--output", "table").splitlines()
    assert "WARNINGS" in listed[0] and listed[1].split()[:2] == ["late", "warning"]
    (series,) = _metric_lines(cdc, "tidewater_data_warnings")
    assert 'table="public.latecomer"' in series and 'severity="divergence"' in series
    assert series.endswith(" 3.0"), series

    # later changes are replicated; the warning is true: the earlier rows are missing downstream, except one
    # a later full-row update wrote (an upsert)
    with source.cursor() as cur:
        cur.execute("INSERT INTO latecomer VALUES (4, 'after'), (5, 'after')")
        cur.execute("UPDATE latecomer SET v = 'updated' WHERE id = 2")
    mixed_workload(source, 2, start=3)
    cdc.wait_checkpoint("late", current_lsn(source))
    (diff,) = compare_tables(source, ["public.latecomer"], sink)
    assert (diff.source_rows, diff.target_rows, diff.missing) == (5, 3, [(1,), (3,)]), diff
    assert cdc.changefeed("late")["state"] == "warning"  # still: nobody acknowledged it

    # the operator copies the rows by hand, then acknowledges with resume
    with source.cursor() as cur:
        cur.execute("SELECT id, v FROM latecomer WHERE id <= 3")
        rows = cur.fetchall()
    with sqlite3.connect(target) as t:
        t.executemany("INSERT OR REPLACE INTO latecomer (id, v) VALUES (?, ?)", rows)
    _cli(cdc.url, "changefeed", "resume", "-c", "late")
    q = wait_for(cdc, "late", lambda q: q["state"] == "normal" and not q["warnings"], "normal without warnings")
    assert q["error"] is None
    assert _metric_lines(cdc, "tidewater_data_warnings") == []
    with source.cursor() as cur:
        cur.execute("UPDATE latecomer SET v = 'after resume' WHERE id = 1")
    assert_converged(cdc, "late", source, sink, tables=[*TABLES, "public.latecomer"])
    assert cdc.changefeed("late")["state"] == "normal"


def test_a_partial_update_of_a_row_missing_downstream_is_re_read_and_shown_as_a_notice(
        cdc: CdcServer, tmp_path: Path, pg_server: PostgresServer, pg_database: str, source: Any) -> None:
    target = tmp_path / "target.db"
    sink = f"sqlite:///{target}"
    with source.cursor() as cur:
        cur.execute("CREATE TABLE toasty (id int PRIMARY KEY, small int NOT NULL, big text NOT NULL)")
    cdc.create_changefeed("miss", pg_server.uri(pg_database), sink, snapshot="none")
    with source.cursor() as cur:
        # ~9.6 kB of incompressible text per row: stored out of line, so an UPDATE of `small` sends it as
        # 'unchanged TOAST'
        cur.execute("INSERT INTO toasty SELECT g, g, (SELECT string_agg(md5(random()::text || g::text || "
                    "x::text), '') FROM generate_series(1, 300) x) FROM generate_series(1, 5) g")
    assert_converged(cdc, "miss", source, sink, tables=["public.toasty"])
    with sqlite3.connect(target) as t:
        t.execute("DELETE FROM toasty WHERE id IN (2, 4)")  # something downstream removed them
    with source.cursor() as cur:
        cur.execute("UPDATE toasty SET small = small + 100 WHERE id IN (2, 3, 4)")
    q = wait_for(cdc, "miss", lambda q: bool(q["warnings"]), "a missing-row warning")
    (w,) = q["warnings"]
    assert (w["table"], w["severity"], w["count"]) == ("public.toasty", "notice", 2), w
    assert sorted(w["keys"]) == ["2", "4"], w
    assert q["state"] == "normal" and q["error"] is None
    # the rows were completed from the upstream, never with NULLs: the target equals the source
    assert_converged(cdc, "miss", source, sink, tables=["public.toasty"])
    assert cdc.changefeed("miss")["state"] == "normal"

