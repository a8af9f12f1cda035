"""spark_jobs.launch.spawn: the job's process started ahead of its plan waits on its stdin; discarded, it exits 0
having read and written nothing; given a job, it runs it (its plan file mode 0600); a job of another span is
refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from spark_jobs import launch
from spark_jobs.plan import SnapshotJob

pytestmark = pytest.mark.unit


def _job(span: int = 0) -> SnapshotJob:
    # nothing listens on these ports: the job fails at once checking its sink, which is all this test needs
    return SnapshotJob(changefeed="cf", upstream="postgresql://u@127.0.0.1:1/db", sink="sqlite:///nowhere/t.db",
                       tables=("public.t",), etcd=("http://127.0.0.1:1",), span=span, snapshot="S", commit_ts=1)


def test_a_discarded_process_exits_without_doing_anything(tmp_path: Path) -> None:
    proc = launch.spawn("cf", 0, tmp_path)
    assert proc.poll() is None and proc.job is None  # waiting for its plan
    proc.discard()
    assert proc.poll() == 0
    assert not proc.plan_path.exists() and proc.failure() is None


def test_a_process_given_its_job_runs_it_and_another_spans_job_is_refused(tmp_path: Path) -> None:
    proc = launch.spawn("cf", 0, tmp_path)
    try:
        with pytest.raises(ValueError, match="span=1"):
            proc.go(_job(span=1))
        proc.go(_job())
        assert proc.plan_path.stat().st_mode & 0o777 == 0o600  # it holds credentials
        assert proc.wait(60) != 0  # it ran the job: the sink cannot be opened
        assert proc.failure() is not None
    finally:
        proc.kill()
