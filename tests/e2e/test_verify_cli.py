"""``cdc cli changefeed verify`` end to end: the CLI asks a real `cdc server` (POST /api/v2/changefeeds/{id}/verify),
which launches the verify job; the CLI polls the run and exits 0 when equal, 1 when a table differs (naming the keys),
2 when the verification cannot run (a table the changefeed does not replicate); ``--repair`` resyncs the table that
differs and verifies it again (exit 0), ending in a row-by-row compare."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from e2e_workload import run_on_target, wait_for

from playground.cluster import CdcServer, current_lsn
from playground.compare import compare_tables
from playground.servers import PostgresServer

pytestmark = pytest.mark.e2e

SCHEMA = """
CREATE TABLE kv (id bigint PRIMARY KEY, v text, n numeric(10,3), at timestamptz);
INSERT INTO kv SELECT i, 'v' || i, i / 8.0, '2024-05-01'::timestamptz + i * interval '1 hour'
FROM generate_series(1, 900) i;
CREATE TABLE nokey (a int, b text);
ALTER TABLE nokey REPLICA IDENTITY FULL;
INSERT INTO nokey SELECT i % 7, 'x' FROM generate_series(1, 50) i;
"""


@pytest.fixture
def source_schema() -> str:
    return SCHEMA


def cli(cdc: CdcServer, *args: str) -> tuple[int, Any, str]:
    proc = subprocess.run([sys.executable, "-m", "cli", "cli", "--server", cdc.url, "changefeed", "verify", *args],
                          capture_output=True, text=True, timeout=300, cwd=os.getcwd(),
                          env={**os.environ, "PYTHONPATH": os.getcwd()})
    out: Any = None
    if proc.stdout.strip().startswith("{"):
        out = json.loads(proc.stdout)
    return proc.returncode, out if out is not None else proc.stdout, proc.stderr


def test_cli_verify_exit_codes_and_report(cdc_server: CdcServer, pg_server: PostgresServer, pg_database: str,
                                          source: Any, tmp_path: Path) -> None:
    sink = f"sqlite:///{tmp_path / 'target.db'}"
    cdc_server.create_changefeed("cf-cli", pg_server.uri(pg_database), sink)
    cdc_server.wait_checkpoint("cf-cli", current_lsn(source), timeout=180)

    code, run, err = cli(cdc_server, "-c", "cf-cli", "--chunk-rows", "200")
    assert code == 0, (run, err)
    report = run["report"]
    assert report["consistency"] == "hold" and report["ts"] > 0
    assert [(t["table"], t["source_rows"], t["target_rows"], t["chunks"]) for t in report["tables"]] == [
        ("public.kv", 900, 900, 5), ("public.nokey", 50, 50, 1)]
    q = cdc_server.changefeed("cf-cli")
    assert q["verify_hold"] is None  # released
    assert [(r["id"], r["state"], r["equal"], r["chunks_done"]) for r in q["verify_runs"]] == [
        (run["id"], "done", True, 6)]  # changefeed query shows the runs

    run_on_target(sink, "UPDATE kv SET n = 1.5 WHERE id = 42", "DELETE FROM kv WHERE id = 500",
                  "INSERT INTO kv (id, v) VALUES (1000, 'extra')")
    code, run, err = cli(cdc_server, "-c", "cf-cli", "--chunk-rows", "200", "--tables", "public.kv")
    assert code == 1, (run, err)
    (kv,) = run["report"]["tables"]
    assert cdc_server.changefeed("cf-cli")["verify_runs"][-1]["differing_tables"] == ["public.kv"]
    assert [(d["kind"], d["key"], d["columns"]) for d in kv["diffs"]] == [
        ("different", ["42"], ["n"]), ("extra", ["1000"], []), ("missing", ["500"], [])]
    assert (kv["chunks"], kv["chunks_differing"]) == (5, 3)

    code, out, err = cli(cdc_server, "-c", "cf-cli", "--tables", "public.kv", "--output", "table")
    assert code == 1 and "different" in out and "42" in out, (out, err)

    code, run, err = cli(cdc_server, "-c", "cf-cli", "--chunk-rows", "200", "--repair")
    assert code == 0, (run, err)
    assert run["repaired"] == ["public.kv"], run
    assert [t["table"] for t in run["before"]["tables"] if t["diffs"]] == ["public.kv"]
    assert [(t["table"], t["source_rows"], t["target_rows"]) for t in run["report"]["tables"]] == [
        ("public.kv", 900, 900)]
    (d,) = compare_tables(source, ["public.kv"], sink)
    assert d.equal, d

    code, out, err = cli(cdc_server, "-c", "cf-cli", "--tables", "public.nope")
    assert code == 2 and "does not replicate public.nope" in err, (out, err)


def test_a_stopped_changefeed_is_compared_at_its_checkpoint_without_a_hold(
        cdc_server: CdcServer, pg_server: PostgresServer, pg_database: str, source: Any, tmp_path: Path) -> None:
    sink = f"sqlite:///{tmp_path / 'target.db'}"
    cdc_server.create_changefeed("cf-stop", pg_server.uri(pg_database), sink)
    cdc_server.wait_checkpoint("cf-stop", current_lsn(source), timeout=180)
    cdc_server.request("POST", "/api/v2/changefeeds/cf-stop/pause")
    wait_for(cdc_server, "cf-stop", lambda q: q["state"] == "stopped" and not any(s["running"] for s in q["spans"]),
             "stopped")
    code, run, err = cli(cdc_server, "-c", "cf-stop", "--tables", "public.kv")
    assert code == 0, (run, err)
    assert run["report"]["consistency"] == "checkpoint" and run["report"]["hold_seconds"] == 0
    assert cdc_server.changefeed("cf-stop")["verify_hold"] is None  # never held
    with source.cursor() as cur:
        cur.execute("INSERT INTO kv (id, v) VALUES (5000, 'after the pause')")
    code, run, err = cli(cdc_server, "-c", "cf-stop", "--tables", "public.kv")
    assert code == 1, (run, err)
    report = run["report"]
    assert "changefeed stopped at checkpoint" in report["note"] and "not applied" in report["note"], report
    assert [(d["kind"], d["key"]) for d in report["tables"][0]["diffs"]] == [("missing", ["5000"])]
