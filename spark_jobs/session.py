"""The SparkSession of Tidewater's jobs.

:func:`spark_session` builds (or gets) a session for a master URL (``local[*]`` by default; any Spark master
works). Before the JVM starts it points ``PYSPARK_PYTHON`` (and the driver's) at the running interpreter, so
executors run our code with our packages, and sets ``SPARK_LOCAL_IP=127.0.0.1`` unless already set. The UI is
off and Spark's own log level is ``WARN`` (progress is logged by the job, not by Spark). Driver JVM options given in
``spark.driver.extraJavaOptions`` get this setup's class-data archive (:mod:`spark_jobs.cds`) when one was made for
them.

Errors: :class:`cdc.errors.SparkUnavailable` naming the cause and the fix (no Java or Java < 17, pyspark not
installed, a master URL Spark refuses or cannot reach).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

from cdc.errors import SparkUnavailable
from spark_jobs import cds

log = logging.getLogger(__name__)

MIN_JAVA = 17
GATEWAY_ATTEMPTS = 2
"""A JVM that exits before its gateway is up (``JAVA_GATEWAY_EXITED``) is started once more before Spark is
reported unavailable: seen once in ~50 runs here while the job's copy thread was busy, never twice in a row; a
missing Java or a bad master fails the same way both times."""


def java_version() -> int | None:
    """The major version of the ``java`` Spark would start (``JAVA_HOME`` first), None when there is none."""
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    if not java or not os.path.exists(java):
        return None
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if m is None:
        return None
    major = int(m.group(1))
    return int(m.group(2) or 0) if major == 1 else major  # "1.8.0" is Java 8


def check_spark() -> None:
    """Raise :class:`SparkUnavailable` unless pyspark imports and a Java >= 17 is present."""
    try:
        import pyspark  # noqa: F401
    except ImportError:
        raise SparkUnavailable("pyspark is not installed: run scripts/bootstrap.sh (or pip install "
                               "'tidewater[spark]')") from None
    v = java_version()
    home = os.environ.get("JAVA_HOME")
    if v is None and home and not os.path.exists(os.path.join(home, "bin", "java")):
        raise SparkUnavailable(f"JAVA_HOME={home} has no bin/java, and Spark starts only that one: point JAVA_HOME at "
                               "a Java 17 or newer (e.g. /usr/lib/jvm/java-17-openjdk-amd64) or unset it, or install "
                               "one (apt-get install openjdk-17-jre-headless)")
    if v is None:
        raise SparkUnavailable("no Java found for Spark (no java on PATH, JAVA_HOME not set): install Java 17 "
                               "(apt-get install openjdk-17-jre-headless) or set JAVA_HOME")
    if v < MIN_JAVA:
        raise SparkUnavailable(f"Spark needs Java {MIN_JAVA} or newer, found Java {v}: install "
                               "openjdk-17-jre-headless or point JAVA_HOME at a newer Java")


def spark_session(master: str = "local[*]", conf: Mapping[str, str] | None = None, *,
                  app_name: str = "tidewater") -> Any:
    """A ``pyspark.sql.SparkSession`` on ``master`` with ``conf`` (see the module docstring)."""
    check_spark()
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder.master(master).appName(app_name)
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.driver.host", os.environ["SPARK_LOCAL_IP"])
               .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable))
    settings = dict(conf or {})
    if "spark.driver.extraJavaOptions" in settings:  # a class-data archive made for these options, if there is one
        settings["spark.driver.extraJavaOptions"] = cds.driver_options(settings["spark.driver.extraJavaOptions"])
    for k, v in settings.items():
        builder = builder.config(k, v)
    for attempt in range(1, GATEWAY_ATTEMPTS + 1):
        try:
            session = builder.getOrCreate()
            break
        except Exception as exc:  # noqa: BLE001 - py4j/JVM errors of any kind become one message
            text = " ".join(str(exc).split())[:300]
            if "JAVA_GATEWAY_EXITED" in text and attempt < GATEWAY_ATTEMPTS:
                log.warning("the Spark JVM exited before it was up (attempt %d): starting it again", attempt)
                continue
            raise SparkUnavailable(f"Spark could not start with master {master!r}: {text}. Fix: check spark-master "
                                   "(local[*] or spark://host:port of a running master) and Java") from None
    session.sparkContext.setLogLevel("WARN")
    log.info("spark session up: master=%s version=%s", master, session.version)
    return session
