"""``changefeed verify`` against a running changefeed (docs/verify.md): a real `cdc server`, etcd, PostgreSQL 18,
the target, and Spark. While an upstream writer keeps committing (>= 1k rows/s), the verifier holds the changefeed
at the exported snapshot's Ts and finds the table the writer changes equal, and a divergence injected downstream
into the other one reported with exactly its three keys; a verifier killed by SIGKILL while it holds the changefeed
stops it no longer than the hold's deadline."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from e2e_workload import BackgroundWriter, make_sink_uri, run_on_target, wait_for

from cdc.verify import DIFFERENT, EXTRA, MISSING
from playground.cluster import CdcServer, current_lsn
from playground.servers import PostgresServer
from spark_jobs.verify import VerifyJob, verify_changefeed

pytestmark = pytest.mark.e2e

SCHEMA = """
CREATE TABLE busy (id int PRIMARY KEY, v int NOT NULL, note text, at timestamptz, amount numeric(12,2));
CREATE TABLE still (id int PRIMARY KEY, label text, ok boolean);
INSERT INTO busy SELECT i, i, 'n' || i, now(), i * 0.25 FROM generate_series(1, 3000) i;
INSERT INTO still SELECT i, 'l' || i, i % 3 = 0 FROM generate_series(1, 1200) i;
"""
TABLES = ("public.busy", "public.still")


@pytest.fixture
def source_schema() -> str:
    return SCHEMA


def busy_step(conn: Any, n: int) -> int:
    """One transaction of ~100 rows: 50 new rows, 40 updated, 10 deleted (about 1k-2k rows/s in a loop)."""
    base = 10_000 + n * 50
    with conn.cursor() as cur:
        cur.execute("BEGIN")
        cur.execute("INSERT INTO busy SELECT i, i, 'w', now(), i * 0.5 FROM generate_series(%s, %s) i",
                    (base, base + 49))
        cur.execute("UPDATE busy SET v = v + 1, at = now() WHERE id %% 97 = %s AND id <= 3000", (n % 97,))
        cur.execute("DELETE FROM busy WHERE id BETWEEN %s AND %s", (base - 500, base - 491))
        cur.execute("COMMIT")
    return 1


def job(cdc: CdcServer, etcd_url: str, cluster: str, upstream: str, sink: str, **kw: Any) -> VerifyJob:
    return VerifyJob(upstream=upstream, sink=sink, tables=TABLES, changefeed="cf-verify", etcd=(etcd_url,),
                     cluster=cluster, chunk_rows=500, **kw)


@pytest.mark.parametrize("kind", ["postgresql", "mariadb", "sqlite"])
def test_verify_under_continuous_writes_finds_the_busy_table_equal_and_names_the_injected_keys(
        cdc_server: CdcServer, etcd_server: Any, cluster_id: str, pg_server: PostgresServer, pg_database: str,
        source: Any, kind: str, request: pytest.FixtureRequest, tmp_path: Path, spark: Any) -> None:
    """One verification under continuous writes: the table the writer changes all along is equal, and a divergence
    injected downstream into the other one (keys in three different chunks of 500) is named key by key. (An equal
    report's exit code 0 under writes: test_verify_lake; the exit codes: test_verify_cli.)"""
    sink = make_sink_uri(kind, request, tmp_path, pg_server)
    cdc_server.create_changefeed("cf-verify", pg_server.uri(pg_database), sink)
    cdc_server.wait_checkpoint("cf-verify", current_lsn(source), timeout=180)
    # downstream only, in a table the writer does not touch
    still = {"postgresql": '"public"."still"', "mariadb": "`still`", "sqlite": '"still"'}[kind]
    run_on_target(sink, f"UPDATE {still} SET label = 'changed' WHERE id = 5",
                  f"DELETE FROM {still} WHERE id = 700", f"INSERT INTO {still} VALUES (5000, 'extra', true)")
    with BackgroundWriter(pg_server.connect(pg_database), busy_step) as writer:
        time.sleep(1.0)
        before, began = writer.txns, time.monotonic()
        report = verify_changefeed(job(cdc_server, etcd_server.url, cluster_id, pg_server.uri(pg_database), sink),
                                   spark=spark)
        txns, took = writer.txns - before, time.monotonic() - began
        assert txns > 0  # the upstream kept writing during the verification
        # measured, not asserted (no timed assertions): ~91 rows per writer transaction
        print(f"verify {kind}: {txns * 91 / took:.0f} upstream rows/s during {took:.1f} s; hold {report.hold_seconds} s; "
              f"rows compared {sum(t.source_rows for t in report.tables)}")
        q = cdc_server.changefeed("cf-verify")
        assert q["verify_hold"] is None and q["state"] == "normal"  # released, and replication goes on
        writer.finish()
    assert report.consistency == "hold" and report.ts > 0
    assert [t.source_rows > 0 and t.chunks > 1 for t in report.tables] == [True, True]
    by = {t.table: t for t in report.tables}
    assert by["public.busy"].equal, by["public.busy"]
    assert [(d.kind, d.key, d.columns) for d in by["public.still"].diffs] == [
        (DIFFERENT, ("5",), ("label",)), (EXTRA, ("5000",), ()), (MISSING, ("700",), ())]
    assert report.exit_code == 1


def test_a_killed_verifier_holds_the_changefeed_no_longer_than_its_deadline(
        cdc_server: CdcServer, etcd_server: Any, cluster_id: str, pg_server: PostgresServer, pg_database: str,
        source: Any, tmp_path: Path) -> None:
    sink = f"sqlite:///{tmp_path / 'target.db'}"
    cdc_server.create_changefeed("cf-verify", pg_server.uri(pg_database), sink)
    cdc_server.wait_checkpoint("cf-verify", current_lsn(source), timeout=180)
    # a SQLite target keeps the hold while its chunks are read: many small chunks make that last
    plan = tmp_path / "verify.json"
    from cdc import serde

    plan.write_bytes(serde.to_json(job(cdc_server, etcd_server.url, cluster_id, pg_server.uri(pg_database), sink,
                                       hold_ttl=10.0)))  # (the checks below run well before it ends, under load too)
    plan.write_bytes(plan.read_bytes().replace(b'"chunk_rows":500', b'"chunk_rows":5'))
    proc = subprocess.Popen([sys.executable, "-m", "spark_jobs.verify", "--plan", str(plan), "--local"],
                            cwd=os.getcwd(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        q = wait_for(cdc_server, "cf-verify", lambda q: q["verify_hold"] is not None and q["verify_hold"]["ts"] > 0,
                     "a hold at a point", timeout=60)
        held = q["verify_hold"]
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        out, err = proc.communicate()
    assert proc.returncode == -signal.SIGKILL, (out, err[-2000:])
    # writes after the hold's point wait until its deadline, then replicate
    with source.cursor() as cur:
        cur.execute("INSERT INTO still VALUES (9001, 'after', false)")
    lsn = current_lsn(source)
    time.sleep(1.0)
    assert cdc_server.changefeed("cf-verify")["checkpoint_ts"] <= held["ts"]  # still held
    q = cdc_server.wait_checkpoint("cf-verify", lsn, timeout=held["deadline"] - time.time() + 30)
    assert time.time() >= held["deadline"] - 1.0  # not before the deadline (etcd and owner clocks: 1 s slack)
    assert q["verify_hold"]["active"] is False and q["state"] == "normal"
    assert json.dumps(q["verify_hold"])  # shown in changefeed query, as expired
