"""The snapshot job unchanged on a Spark standalone cluster (a master and a worker from the pyspark distribution
on 127.0.0.1), run as its own process from another working directory: nothing driver-local is needed by the
executors."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from playground.compare import compare_tables
from spark_jobs.plan import SnapshotJob, write_job
from tests.snapshot_helpers import at_snapshot, execute, exported_snapshot, pg_target, spark_standalone
from tests.sql_targets import SqlTarget

pytestmark = pytest.mark.integration  # the cluster run is in `make test` (issue 10 asks for it there)


@pytest.fixture
def target(request: pytest.FixtureRequest) -> Iterator[SqlTarget]:
    yield from pg_target(request)


def test_the_job_copies_through_a_standalone_cluster(pg_server: Any, pg_database: str, etcd_server: Any,
                                                     cluster_id: str, tmp_path: Path, target: SqlTarget) -> None:
    execute(pg_server, pg_database, "CREATE TABLE big (id int PRIMARY KEY, v text, t timestamptz)",
            "INSERT INTO big SELECT i, 'x' || i, now() FROM generate_series(1, 20000) i")
    with spark_standalone(tmp_path / "spark") as master, exported_snapshot(pg_server, pg_database) as exp:
        execute(pg_server, pg_database, "DELETE FROM big WHERE id % 2 = 0")
        job = SnapshotJob(changefeed="cf-cluster", upstream=pg_server.uri(pg_database), sink=target.uri,
                          tables=("public.big",), etcd=(etcd_server.url,), cluster=cluster_id, snapshot=exp.snapshot,
                          commit_ts=exp.commit_ts, chunk_rows=2000, spark_master=master,
                          driver_copies=False)  # every chunk through the cluster (not copied while it starts)
        plan = write_job(job, tmp_path / "job.json")
        out = subprocess.run([sys.executable, "-m", "spark_jobs.snapshot", "--plan", str(plan)], cwd="/",
                             capture_output=True, text=True, timeout=240)
        assert out.returncode == 0, out.stderr[-3000:]
        assert "10 chunk(s) copied now" in out.stdout and f"on {master}" in out.stderr
        with at_snapshot(pg_server, pg_database, exp.snapshot) as snap:
            [diff] = compare_tables(snap, ["public.big"], target.uri)
        assert diff.equal and diff.target_rows == 20000


@pytest.mark.slow  # 14 s (the job's executor deadline); the copy through a master and a worker stays in make test
def test_a_master_without_workers_ends_the_job_with_a_retryable_reason(
        pg_server: Any, pg_database: str, etcd_server: Any, cluster_id: str, tmp_path: Path, target: SqlTarget) -> None:
    """Without executors the job would wait forever: it fails after its deadline with the retryable
    CDC:ErrSparkNoExecutors (a warning of the changefeed), exit code 2, naming the fix."""
    from playground.servers import free_port
    from spark_jobs.probe import probe_rpc

    execute(pg_server, pg_database, "CREATE TABLE big (id int PRIMARY KEY, v text)",
            "INSERT INTO big SELECT i, 'x' || i FROM generate_series(1, 100) i")
    ui = free_port()
    with spark_standalone(tmp_path / "spark", workers=0, ui_port=ui) as master:
        host, port = master.removeprefix("spark://").split(":")
        probe_rpc(host, int(port))  # the master answers Spark's RPC protocol
        from cdc.errors import SparkUnavailable

        with pytest.raises(SparkUnavailable, match="is not a Spark master"):
            probe_rpc(host, ui)  # its web UI does not
        job = SnapshotJob(changefeed="cf-noworker", upstream=pg_server.uri(pg_database), sink=target.uri,
                          tables=("public.big",), etcd=(etcd_server.url,), cluster=cluster_id, chunk_rows=50,
                          spark_master=master, driver_copies=False, executor_timeout=5)
        plan = write_job(job, tmp_path / "job.json")
        out = subprocess.run([sys.executable, "-m", "spark_jobs.snapshot", "--plan", str(plan)], cwd="/",
                             capture_output=True, text=True, timeout=180)
    assert out.returncode == 2, out.stderr[-3000:]
    last = out.stderr.rstrip().splitlines()[-1]
    assert last.startswith("snapshot copy failed: [CDC:ErrSparkNoExecutors] no Spark executor registered for the "
                           f"copy job within 5 s on master {master}"), last
    assert "start a worker" in last and "Traceback" not in out.stderr
