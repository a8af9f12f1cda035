"""The tests' shared SparkSession (``tests/conftest.py``'s ``spark``) starts its driver JVM with the snapshot job's
driver options (``spark_jobs.cds.DRIVER_CONF``): the client JIT and the serial GC, and the class-data archive made
for them when there is one. Without them the Spark group's JVM ran the C2 compiler's and the parallel GC's threads on
the 2-core test machine for the whole group (docs/testing.md, "Suite time")."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from cdc import procs
from spark_jobs.cds import DRIVER_JAVA_OPTIONS

pytestmark = pytest.mark.integration


def _child_command_lines() -> list[str]:
    """The command lines of this process's children (the session's JVM is one: pyspark starts it)."""
    lines = []
    for pid in procs.children(os.getpid()):
        try:
            lines.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            continue  # gone meanwhile
    return lines


def test_the_sessions_driver_jvm_runs_with_the_jobs_driver_options(spark: Any) -> None:
    wanted = DRIVER_JAVA_OPTIONS.split()
    conf = (spark.sparkContext.getConf().get("spark.driver.extraJavaOptions") or "").split()
    assert all(opt in conf for opt in wanted), conf  # (Spark adds options of its own to the setting)
    jvms = [line for line in _child_command_lines() if "java" in line.split(" ", 1)[0]
            and "spark.app.name=tidewater-tests" in line]
    assert len(jvms) == 1, jvms
    assert all(opt in jvms[0].split() for opt in wanted), jvms[0][:2000]
