"""Resuming the Spark snapshot job: a job process killed with SIGKILL mid-copy, then run again with the same plan,
copies only the chunks not recorded, and the target ends equal to the snapshot; the key-less table's chunk,
even when copied twice, never duplicates a row."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pytest

from cdc.events import TableName
from cdc.meta import keys
from cdc.meta.etcd import EtcdClient
from cdc.meta.snapshot_progress import SnapshotProgressStore, read_progress
from playground.compare import compare_tables
from spark_jobs import launch
from spark_jobs.plan import SnapshotJob
from spark_jobs.snapshot import run
from tests.snapshot_helpers import at_snapshot, execute, exported_snapshot

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
TABLES = ("public.nk", "public.big")  # the key-less table's single chunk is copied first


def test_a_killed_job_resumes_with_the_remaining_chunks(pg_server: Any, pg_database: str, tmp_path: Path,
                                                        etcd_server: Any, cluster_id: str, spark: Any) -> None:
    execute(pg_server, pg_database,
            "CREATE TABLE big (id int PRIMARY KEY, v text, n numeric)",
            "INSERT INTO big SELECT i, repeat('v', i % 50), i / 3.0 FROM generate_series(1, 6000) i",
            "CREATE TABLE nk (a int, b text)", "ALTER TABLE nk REPLICA IDENTITY FULL",
            "INSERT INTO nk SELECT i % 4, 'dup' FROM generate_series(1, 200) i")
    target = f"sqlite:///{tmp_path / 'target.db'}"
    with exported_snapshot(pg_server, pg_database) as exp:
        execute(pg_server, pg_database, "UPDATE big SET v = 'after' WHERE id % 2 = 0",
                "INSERT INTO big VALUES (7000, 'after', 0)", "INSERT INTO nk VALUES (1, 'dup')")
        job = SnapshotJob(changefeed="cf-resume", upstream=pg_server.uri(pg_database), sink=target, tables=TABLES,
                          etcd=(etcd_server.url,), span=0, cluster=cluster_id, snapshot=exp.snapshot,
                          commit_ts=exp.commit_ts, chunk_rows=100, spark_master="local[1]")
        proc = launch.start(job, tmp_path / "job")
        assert oct(proc.plan_path.stat().st_mode & 0o777) == "0o600"  # it holds credentials
        client = EtcdClient([etcd_server.url])
        try:
            deadline = time.monotonic() + 90
            while True:
                p = read_progress(client, cluster_id, "cf-resume", 0)
                if p.chunks_done >= 5:
                    break
                assert proc.poll() is None, proc.output()
                assert time.monotonic() < deadline, "the job copied no chunk within 90 s"
                time.sleep(0.02)
            proc.kill()  # SIGKILL of the job's process group: driver and JVM (not Spark's daemon)
            assert proc.wait(10) == -signal.SIGKILL
            store = SnapshotProgressStore(client, cluster_id)
            # fence out whatever of the killed run still runs (Spark's Python daemon has its own process group and
            # its worker may be inside a chunk): from now on it cannot commit; then give it time to notice
            store.end_run("cf-resume", 0)
            time.sleep(1.0)
            killed = read_progress(client, cluster_id, "cf-resume", 0)
            assert killed.chunks_total == 61  # nk: 1 whole chunk, big: 60 chunks of 100 rows
            assert 5 <= killed.chunks_done < killed.chunks_total, "the kill came too late to test a resume"
            assert 0 in store.done_chunks("cf-resume", 0, TableName("public", "nk"))
            # as if the kill had come between the key-less chunk's commit and its record: it is copied again
            client.delete(keys.snapshot_chunk_key(cluster_id, "cf-resume", 0, TableName("public", "nk"), 0))
            recorded = killed.chunks_done - 1
        finally:
            proc.kill()
            client.close()

        report = run(job, spark=spark)  # same plan, second run
        assert report.chunks_skipped == recorded
        assert report.chunks_copied == 61 - recorded  # only the rest, the key-less chunk again
        assert report.rows["public.nk"] == 200
        with at_snapshot(pg_server, pg_database, exp.snapshot) as snap:
            diffs = compare_tables(snap, list(TABLES), target)
        assert all(d.equal for d in diffs), [(d.table, d.missing, d.extra, d.different, d.surplus) for d in diffs]
        assert [(d.source_rows, d.target_rows, d.surplus) for d in diffs] == [(200, 200, 0), (6000, 6000, 0)]
        with EtcdClient([etcd_server.url]) as client:
            final = read_progress(client, cluster_id, "cf-resume", 0)
            assert final.done and final.chunks_done == 61 and len(final.runs) == 1


def test_sigterm_stops_the_job_and_nothing_keeps_copying(pg_server: Any, pg_database: str, tmp_path: Path,
                                                       etcd_server: Any, cluster_id: str) -> None:
    # 600 chunks: the fence-out after SIGTERM takes a thread start and an etcd write, which under load (2 cores,
    # load average 10) took long enough for the last 57 chunks of a 60-chunk table (1.6 s of copying) to commit
    execute(pg_server, pg_database, "CREATE TABLE big (id int PRIMARY KEY, v text)",
            "INSERT INTO big SELECT i, repeat('v', i % 50) FROM generate_series(1, 60000) i")
    job = SnapshotJob(changefeed="cf-term", upstream=pg_server.uri(pg_database),
                      sink=f"sqlite:///{tmp_path / 'target.db'}", tables=("public.big",), etcd=(etcd_server.url,),
                      cluster=cluster_id, chunk_rows=100, spark_master="local[1]")
    proc = launch.start(job, tmp_path / "job")
    with EtcdClient([etcd_server.url]) as client:
        try:
            deadline = time.monotonic() + 90
            while (at_signal := read_progress(client, cluster_id, "cf-term", 0).chunks_done) < 3:
                assert proc.poll() is None and time.monotonic() < deadline, proc.output()
                time.sleep(0.02)
            rc = proc.stop(timeout=60)  # SIGTERM to the driver, as a pause or remove would send
        finally:
            proc.kill()
        err = proc.output()
        assert rc == 130, err
        assert err.rstrip().splitlines()[-1].startswith("snapshot copy interrupted") and "Traceback" not in err
        assert proc.failure() is None
        stopped = read_progress(client, cluster_id, "cf-term", 0)
        assert stopped.chunks_done < stopped.chunks_total == 600, (at_signal, err)
        assert stopped.runs == ()  # the stopping run fenced itself out: a worker still running commits nothing
        time.sleep(1.5)
        assert read_progress(client, cluster_id, "cf-term", 0).chunks_done == stopped.chunks_done
