"""Clean failures of the snapshot job process (``python -m spark_jobs.snapshot``): a wrong upstream URI, a missing
table, an unreachable target and an expired snapshot each end it with a non-zero exit code and one line naming
the problem and the fix -- no traceback, no password. And a superseded run commits nothing."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from cdc.meta.etcd import EtcdClient
from cdc.meta.snapshot_progress import SnapshotProgressStore
from cdc.snapshot import SnapshotRun
from playground.servers import free_port
from spark_jobs import launch
from spark_jobs.copy import copy_chunks
from spark_jobs.plan import SnapshotJob, write_job
from spark_jobs.snapshot import plan_tasks
from tests.snapshot_helpers import execute, exported_snapshot

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SECRET = "s3cr3t-pw"


def run_job(job: SnapshotJob, tmp_path: Path) -> tuple[int, str, str]:
    plan = write_job(job, tmp_path / "job.json")
    out = subprocess.run([sys.executable, "-m", "spark_jobs.snapshot", "--plan", str(plan)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    return out.returncode, out.stdout, out.stderr


def test_a_launched_job_reports_its_failure_line(base: SnapshotJob, tmp_path: Path) -> None:
    proc = launch.start(SnapshotJob(**{**base.__dict__, "tables": ("public.nope",)}), tmp_path / "job")
    assert proc.wait(120) == 1
    failure = proc.failure()
    assert failure is not None and failure.startswith("[CDC:ErrInvalidArgument]") and "public.nope" in failure


def assert_one_clean_line(code: int, stdout: str, stderr: str, want_code: int, *fragments: str) -> str:
    assert code == want_code, stderr
    failures = [line for line in stderr.splitlines() if line.startswith("snapshot copy failed: ")]
    assert len(failures) == 1, stderr
    line = failures[0]
    assert stderr.rstrip().endswith(line)  # the last thing the job says
    assert "Traceback" not in stderr and SECRET not in stderr + stdout
    for f in fragments:
        assert f in line, line
    return line


@pytest.fixture
def base(pg_server: Any, pg_database: str, etcd_server: Any, cluster_id: str, tmp_path: Path) -> SnapshotJob:
    execute(pg_server, pg_database, "CREATE TABLE t (id int PRIMARY KEY, v text)",
            "INSERT INTO t SELECT i, 'v' FROM generate_series(1, 10) i")
    return SnapshotJob(changefeed="cf-err", upstream=pg_server.uri(pg_database),
                       sink=f"sqlite:///{tmp_path / 'target.db'}", tables=("public.t",), etcd=(etcd_server.url,),
                       cluster=cluster_id, chunk_rows=100, spark_master="local[1]")


def test_a_wrong_upstream_uri(base: SnapshotJob, pg_server: Any, tmp_path: Path) -> None:
    closed = free_port()
    job = SnapshotJob(**{**base.__dict__, "upstream": f"postgresql://postgres:{SECRET}@127.0.0.1:{closed}/db"})
    assert_one_clean_line(*run_job(job, tmp_path), 2, "[CDC:ErrUpstreamUnavailable]", "cannot connect to PostgreSQL",
                          f"127.0.0.1:{closed}", "Fix: start the upstream or correct host and port")
    job = SnapshotJob(**{**base.__dict__, "upstream": f"postgresql://postgres:{SECRET}@127.0.0.1:{pg_server.port}/nodb"})
    assert_one_clean_line(*run_job(job, tmp_path), 1, "[CDC:ErrInvalidArgument]", '"nodb" does not exist',
                          "Check the user, password, database name")
    job = SnapshotJob(**{**base.__dict__, "upstream": f"oracle://root:{SECRET}@127.0.0.1:{closed}/db"})
    assert_one_clean_line(*run_job(job, tmp_path), 1, "[CDC:ErrInvalidURI]", "'oracle'")


def test_a_missing_table(base: SnapshotJob, tmp_path: Path) -> None:
    job = SnapshotJob(**{**base.__dict__, "tables": ("public.t", "public.nope")})
    assert_one_clean_line(*run_job(job, tmp_path), 1, "[CDC:ErrInvalidArgument]", "public.nope does not exist",
                          "check the table list")


def test_an_unreachable_target(base: SnapshotJob, tmp_path: Path) -> None:
    closed = free_port()
    job = SnapshotJob(**{**base.__dict__, "sink": f"mysql://root:{SECRET}@127.0.0.1:{closed}/tgt"})
    line = assert_one_clean_line(*run_job(job, tmp_path), 2, "[CDC:ErrSinkUnavailable]", "is unavailable",
                                 "Fix: start the target or correct the sink URI")
    assert str(closed) in line


def test_an_expired_snapshot(base: SnapshotJob, pg_server: Any, pg_database: str, tmp_path: Path) -> None:
    with exported_snapshot(pg_server, pg_database) as exp:
        exp.expire()
        job = SnapshotJob(**{**base.__dict__, "snapshot": exp.snapshot})
        assert_one_clean_line(*run_job(job, tmp_path), 1, "[CDC:ErrSnapshotExpired]", exp.snapshot,
                              "no longer exists", "Fix: copy under a fresh snapshot")


def test_a_superseded_run_commits_nothing(base: SnapshotJob, etcd_server: Any, cluster_id: str,
                                          tmp_path: Path) -> None:
    with EtcdClient([etcd_server.url]) as client:
        store = SnapshotProgressStore(client, cluster_id)
        tasks, total = plan_tasks(base, store, "old-run")
        assert total == 1 and len(tasks) == 1
        store.begin_run("cf-err", 0, SnapshotRun("new-run", time.time()))
        [result] = list(copy_chunks(tasks))
        assert result.error_code == "CDC:ErrSnapshotSuperseded" and "old-run was superseded" in result.error
        assert store.done_chunks("cf-err", 0, tasks[0].chunk.table_name) == {}
        # the table was created in the rolled-back transaction (SQLite DDL is transactional): nothing is there
        conn = sqlite3.connect(tmp_path / "target.db")
        try:
            assert conn.execute("SELECT count(*) FROM sqlite_master WHERE name = 't'").fetchone()[0] == 0
        finally:
            conn.close()
        # the current run copies it
        tasks, _ = plan_tasks(base, store, "new-run")
        [result] = list(copy_chunks(tasks))
        assert result.error is None and result.rows == 10
        assert list(store.done_chunks("cf-err", 0, tasks[0].chunk.table_name)) == [0]


def test_keyless_tables_copied_without_an_exported_snapshot_are_reported(base: SnapshotJob, pg_server: Any,
                                                                         pg_database: str, spark: Any) -> None:
    from spark_jobs.snapshot import run

    execute(pg_server, pg_database, "CREATE TABLE nk (a int)", "ALTER TABLE nk REPLICA IDENTITY FULL",
            "INSERT INTO nk VALUES (1), (1)")
    report = run(SnapshotJob(**{**base.__dict__, "tables": ("public.t", "public.nk")}), spark=spark)
    assert report.rows == {"public.t": 10, "public.nk": 2} and report.unaligned_keyless == ["public.nk"]
