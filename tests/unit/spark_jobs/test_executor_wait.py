"""A cluster master that gives the copy job no executor ends the job with a retryable error naming the fix (the
changefeed shows it as a warning), instead of a job that waits forever; a local master is not waited for."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from capture.snapshot_launcher import SparkCopyLauncher
from cdc.errors import InvalidConfig, SparkNoExecutors, error_for_code
from spark_jobs.plan import EXECUTOR_TIMEOUT, SnapshotJob
from spark_jobs.snapshot import exit_code, message, wait_for_executors

pytestmark = pytest.mark.unit

JOB = SnapshotJob(changefeed="cf", upstream="postgresql://u@127.0.0.1/db", sink="sqlite:///t.db",
                  tables=("public.t",), etcd=("http://127.0.0.1:2379",), executor_timeout=0.3)


def _spark(master: str, counts: list[int]) -> Any:
    """A SparkSession stand-in whose block managers (driver + executors) are ``counts`` one poll after another."""
    polls = iter(counts)
    last = [counts[-1]]

    def size() -> int:
        last[0] = next(polls, last[0])
        return last[0]

    status = SimpleNamespace(size=size)
    jsc = SimpleNamespace(sc=lambda: SimpleNamespace(getExecutorMemoryStatus=lambda: status))
    return SimpleNamespace(sparkContext=SimpleNamespace(master=master, _jsc=jsc))


def test_a_local_master_is_not_waited_for() -> None:
    wait_for_executors(_spark("local[2]", [1]), JOB)  # (the driver runs its tasks: no executor ever registers)


def test_the_job_goes_on_once_an_executor_registered() -> None:
    wait_for_executors(_spark("spark://127.0.0.1:7077", [1, 1, 2]), JOB, poll=0.01)


def test_a_master_without_executors_fails_the_job_with_a_retryable_reason() -> None:
    with pytest.raises(SparkNoExecutors) as failed:
        wait_for_executors(_spark("spark://127.0.0.1:7077", [1]), JOB, poll=0.01)
    exc = failed.value
    assert exc.retryable and exc.code == "CDC:ErrSparkNoExecutors"
    assert "no Spark executor registered for the copy job within 0 s on master spark://127.0.0.1:7077" in exc.message
    assert "start a worker (spark-class org.apache.spark.deploy.worker.Worker spark://127.0.0.1:7077)" in exc.message
    assert exit_code(exc) == 2  # a resource is unavailable: retry
    line = message(exc)
    # the capture turns the job's line back into the same kind of error: retried, shown as a warning
    back = error_for_code(line[1:line.index("]")], line[line.index("] ") + 2:])
    assert isinstance(back, SparkNoExecutors) and back.retryable


def test_the_launcher_raises_the_jobs_retryable_error(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    from processor.snapshot import CopyRequest
    from spark_jobs import launch

    class Proc:
        plan_path = tmp_path / "plan.json"
        log_path = tmp_path / "job.log"

        def poll(self) -> int:
            return 2

        def wait(self, timeout: float | None = None) -> int:
            return 2

        def failure(self) -> str:
            return "[CDC:ErrSparkNoExecutors] no Spark executor registered for the copy job within 120 s"

    monkeypatch.setattr(launch, "start", lambda job, workdir, die_with_parent=False: Proc())
    launcher = SparkCopyLauncher(["http://127.0.0.1:2379"], "default", tmp_path)
    from cdc.events import TableName

    request = CopyRequest("cf", 0, "postgresql://u@127.0.0.1/db", "sqlite:///t.db", (TableName("public", "t"),), "s", 1,
                          0.0, 10, "spark://127.0.0.1:7077")
    with pytest.raises(SparkNoExecutors, match="initial copy of span cf/0: no Spark executor") as failed:
        launcher(request, threading.Event())
    assert failed.value.retryable


def test_the_deadline_is_a_job_setting() -> None:
    assert SnapshotJob(**{**JOB.__dict__, "executor_timeout": EXECUTOR_TIMEOUT}).executor_timeout == 120.0
    with pytest.raises(InvalidConfig, match="executor-timeout must be > 0"):
        SnapshotJob(**{**JOB.__dict__, "executor_timeout": 0})
