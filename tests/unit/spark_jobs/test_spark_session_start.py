"""spark_jobs.session: a JVM that exits before its gateway is up is started once more, and only once (the
builder is faked: no JVM starts here)."""

from __future__ import annotations

from typing import Any

import pytest

from cdc.errors import SparkUnavailable
from spark_jobs import session

pytestmark = pytest.mark.unit

pyspark_sql = pytest.importorskip("pyspark.sql")


class _FakeSession:
    version = "fake"

    class sparkContext:  # noqa: N801 - the attribute name pyspark uses
        @staticmethod
        def setLogLevel(level: str) -> None:  # noqa: N802
            pass


def _builder_failing(monkeypatch: pytest.MonkeyPatch, failures: list[str]) -> list[int]:
    calls: list[int] = []

    def get_or_create(self: Any) -> Any:
        calls.append(1)
        if failures:
            raise RuntimeError(failures.pop(0))
        return _FakeSession()

    monkeypatch.setattr(session, "check_spark", lambda: None)
    monkeypatch.setattr(pyspark_sql.SparkSession.Builder, "getOrCreate", get_or_create)
    return calls


GATEWAY = "[JAVA_GATEWAY_EXITED] Java gateway process exited before sending its port number."


def test_a_gateway_that_exits_once_is_started_again(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _builder_failing(monkeypatch, [GATEWAY])
    assert isinstance(session.spark_session("local[1]"), _FakeSession)
    assert len(calls) == 2


def test_a_gateway_that_exits_every_time_is_reported_after_the_second_attempt(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _builder_failing(monkeypatch, [GATEWAY] * 5)
    with pytest.raises(SparkUnavailable, match="JAVA_GATEWAY_EXITED"):
        session.spark_session("local[1]")
    assert len(calls) == session.GATEWAY_ATTEMPTS == 2


def test_other_start_errors_are_not_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _builder_failing(monkeypatch, ["Could not parse Master URL: 'bogus'"])
    with pytest.raises(SparkUnavailable, match="check spark-master"):
        session.spark_session("bogus")
    assert len(calls) == 1


def test_the_jobs_log_drops_py4j_info_lines_but_keeps_its_warnings_and_everything_else() -> None:
    import logging
    import os

    from spark_jobs.snapshot import quiet_py4j

    def record(level: int, path: str) -> logging.LogRecord:
        return logging.LogRecord("root", level, path, 1, "Exception while sending command.", None, None)

    py4j = os.path.join("x", "site-packages", "py4j", "java_gateway.py")
    assert not quiet_py4j(record(logging.INFO, py4j))  # an abandoned JVM start: expected, not shown
    assert quiet_py4j(record(logging.WARNING, py4j)) and quiet_py4j(record(logging.ERROR, py4j))
    assert quiet_py4j(record(logging.INFO, os.path.join("x", "spark_jobs", "snapshot.py")))
