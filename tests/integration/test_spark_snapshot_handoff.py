"""The snapshot job copies chunks in its driver while its SparkSession starts, then hands the chunks left to Spark
but for the driver's share (``driver_share``: the driver is one worker next to Spark's tasks), which it goes on
copying alongside Spark: run as its own process (as the capture runs it), every chunk is copied exactly once, by one
or the other, and the target equals the snapshot row by row.

To make the hand-off certain (not a race against Spark's start-up), the first table's target is locked by this
test until the job logs that Spark is up (its Python workers started) and how many chunks the driver keeps: the
driver's first chunk waits on the lock, so the split is certain."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from playground.compare import compare_tables
from spark_jobs.plan import SnapshotJob, write_job
from tests.snapshot_helpers import at_snapshot, execute, exported_snapshot, pg_target
from tests.sql_targets import SqlTarget

pytestmark = pytest.mark.integration


@pytest.fixture
def target(request: pytest.FixtureRequest) -> Any:
    yield from pg_target(request)


def test_the_driver_copies_while_spark_starts_and_spark_copies_the_rest(
        pg_server: Any, pg_database: str, etcd_server: Any, cluster_id: str, tmp_path: Path, target: SqlTarget) -> None:
    execute(pg_server, pg_database,
            "CREATE TABLE first (id int PRIMARY KEY, v text)",
            "INSERT INTO first SELECT g, 'f' || g FROM generate_series(1, 1000) g",
            "CREATE TABLE rest (id bigint PRIMARY KEY, v text)",
            "INSERT INTO rest SELECT g, 'r' || g FROM generate_series(1, 3000) g")
    # the target of "first", as the sink would create it (same types: the passthrough applies), locked once the
    # slot exists (creating a slot waits for the transactions in progress)
    lock = target.server.connect(target.db)
    lock.autocommit = False
    with lock.cursor() as cur:
        cur.execute("CREATE TABLE public.first (id integer NOT NULL, v text, PRIMARY KEY (id))")
        lock.commit()
    log_path = tmp_path / "job.log"
    try:
        with exported_snapshot(pg_server, pg_database) as exp:
            with lock.cursor() as cur:
                cur.execute("LOCK TABLE public.first IN ACCESS EXCLUSIVE MODE")
            job = SnapshotJob(changefeed="cf-handoff", upstream=pg_server.uri(pg_database), sink=target.uri,
                              tables=("public.first", "public.rest"), etcd=(etcd_server.url,), cluster=cluster_id,
                              snapshot=exp.snapshot, commit_ts=exp.commit_ts, chunk_rows=1000,
                              spark_master="local[2]")  # 2 tasks at once: the driver keeps 1 of the 3 chunks left
            plan = write_job(job, tmp_path / "job.json")
            with open(log_path, "wb") as log:
                proc = subprocess.Popen([sys.executable, "-m", "spark_jobs.snapshot", "--plan", str(plan)],
                                        stdout=subprocess.PIPE, stderr=log, text=True)
            try:
                deadline = time.monotonic() + 120
                while "the driver keeps copying" not in log_path.read_text(errors="replace"):
                    assert proc.poll() is None, log_path.read_text()[-3000:]
                    assert time.monotonic() < deadline, log_path.read_text()[-3000:]
                    time.sleep(0.2)
                lock.rollback()  # the driver's chunk of "first" goes on; Spark is up and gets the chunks left
                out, _ = proc.communicate(timeout=180)
            finally:
                if proc.poll() is None:
                    proc.kill()
            text = log_path.read_text(errors="replace")
            assert proc.returncode == 0, text[-3000:]
            assert "4 chunk(s) copied now" in out, out
            assert "the driver keeps copying 1 chunk(s) of the 3 left" in text, text[-3000:]
            assert "2 chunk(s), 2000 rows copied in this process" in text, text[-3000:]
            assert "copying 2 chunk(s) of 4" in text and "on local[2]" in text, text[-3000:]
            assert "(4 as COPY text, the others parsed)" in text, text[-3000:]
            with at_snapshot(pg_server, pg_database, exp.snapshot) as snap:
                diffs = compare_tables(snap, ["public.first", "public.rest"], target.uri)
            assert [(d.equal, d.target_rows) for d in diffs] == [(True, 1000), (True, 3000)], diffs
    finally:
        lock.close()
