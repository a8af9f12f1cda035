"""A class-data-sharing archive of the Spark driver JVM's classes: the same JVM starts with about half the CPU.

A Spark driver loads and verifies some ten thousand classes before its first task; on a 2-core machine that CPU is
taken from the databases the copy reads and writes. A JDK 17 *dynamic* CDS archive (``-XX:ArchiveClassesAtExit``,
then ``-XX:SharedArchiveFile``) maps those classes already parsed and verified. Measured here (``local[2]``, the
job's driver options, start to the end of a first Python stage): 7.4-8.0 CPU s and 10-12 s without the archive,
4.8 CPU s and 6.6 s with it (docs/benchmarks.md, "Initial snapshot").

:func:`build` makes the archive by running a tiny job in a child process whose driver JVM writes the archive when
it exits; ``make deps`` (scripts/bootstrap.sh) runs it, and so can an operator (``python -m spark_jobs.cds``). The
archive is only valid for the JVM, Spark jars and JVM options it was made with, so its file name carries a hash of
all three (:func:`archive_key`): :func:`driver_options` adds ``-XX:SharedArchiveFile`` only when an archive of this
exact setup exists; otherwise the driver starts as before (a JVM also ignores an unusable archive by itself,
silently: checked with a mismatched one). Only the driver is concerned: executors of a cluster start their own
JVMs on their own machines.

Where: the first writable of the package directory and ``$XDG_CACHE_HOME/tidewater`` (``~/.cache``), like the
snapshot reader's COPY helper; a written archive is renamed into place whole, so concurrent builds are harmless.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

log = logging.getLogger(__name__)

DRIVER_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
"""The driver JVM options of Tidewater's snapshot and verify jobs (:data:`DRIVER_CONF`), and so the ones
:func:`main` makes the archive for: the driver JVM only schedules (no row enters a JVM: tasks read and write in their
Python workers), so its client JIT and serial GC are enough, and they start it with ~35 % less CPU (measured here:
6.5 instead of 10 CPU seconds to the first stage, 0.7 s sooner), CPU that the databases need on a small machine."""

DRIVER_CONF = {"spark.driver.extraJavaOptions": DRIVER_JAVA_OPTIONS}
"""Spark settings of the snapshot and verify jobs (and the tests' shared session) unless a job's ``spark_conf`` sets
them. Not the lake's streaming job: it runs for hours, where the full JIT pays."""

_OPTION = "-XX:SharedArchiveFile="


def _dirs() -> list[Path]:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tidewater"
    return [Path(__file__).resolve().parent, cache]


def _java() -> str | None:
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    return os.path.realpath(java) if java and os.path.exists(java) else None


def archive_key(java_options: str) -> str | None:
    """A hash of what the archive depends on: the java binary and its version, the pyspark jars, the driver's JVM
    options (None: no Java or no pyspark)."""
    java = _java()
    if java is None:
        return None
    try:
        import pyspark
    except ImportError:
        return None
    jars = Path(pyspark.__file__).parent / "jars"
    try:
        st = os.stat(java)
        listing = sorted(f"{p.name}:{p.stat().st_size}" for p in jars.glob("*.jar"))
    except OSError:
        return None
    h = hashlib.sha256()
    for part in (java, str(st.st_size), str(int(st.st_mtime)), pyspark.__version__, *listing,
                 " ".join(java_options.split())):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def archive_path(java_options: str) -> Path | None:
    """The archive made for ``java_options`` on this setup, if one exists."""
    key = archive_key(java_options)
    if key is None:
        return None
    for d in _dirs():
        p = d / f"spark-driver-{key}.jsa"
        if p.is_file() and p.stat().st_size > 0:
            return p
    return None


def driver_options(java_options: str) -> str:
    """``java_options`` with ``-XX:SharedArchiveFile`` of this setup's archive added when there is one."""
    if _OPTION in java_options:
        return java_options
    path = archive_path(java_options)
    return f"{java_options} {_OPTION}{path}".strip() if path is not None else java_options


_CHILD = """
import sys
from spark_jobs.session import spark_session
s = spark_session("local[1]", {"spark.driver.extraJavaOptions": sys.argv[1]}, app_name="tidewater-cds")
s.sparkContext.parallelize(range(2), 2).map(lambda x: x).collect()
s.stop()
"""


def build(java_options: str, *, timeout: float = 300) -> Path:
    """Make the archive for ``java_options`` (or return the existing one); raises ``OSError`` saying why not."""
    existing = archive_path(java_options)
    if existing is not None:
        return existing
    key = archive_key(java_options)
    if key is None:
        raise OSError("no Java or no pyspark: nothing to archive")
    errors = []
    for d in _dirs():
        final = d / f"spark-driver-{key}.jsa"
        tmp = d / f"spark-driver-{key}.{os.getpid()}.tmp.jsa"
        try:
            d.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb"):
                pass  # writable?
            tmp.unlink()
        except OSError as exc:
            errors.append(f"{d}: {exc}")
            continue
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[1]),
                                                                         os.environ.get("PYTHONPATH")]))}
        # the driver JVM writes the archive as it exits, after the child process: wait for the file to settle
        proc = subprocess.run([sys.executable, "-c", _CHILD, f"{java_options} -XX:ArchiveClassesAtExit={tmp}"],
                              capture_output=True, text=True, timeout=timeout, env=env, check=False)
        deadline = time.monotonic() + 60
        size = -1
        while time.monotonic() < deadline:
            now = tmp.stat().st_size if tmp.exists() else -1
            if now > 0 and now == size and not _writer_alive(tmp):
                break
            size = now
            time.sleep(0.5)
        if proc.returncode != 0 or not tmp.exists() or tmp.stat().st_size == 0:
            tmp.unlink(missing_ok=True)
            tail = " ".join(proc.stderr.split())[-300:]
            errors.append(f"{d}: the archiving run failed (exit {proc.returncode}): {tail}")
            break
        os.replace(tmp, final)
        return final
    raise OSError("; ".join(errors))


def _writer_alive(path: Path) -> bool:
    """Whether some process still has ``path`` open (the exiting JVM writing its archive)."""
    target = str(path)
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                    return True
        except OSError:
            continue
    return False


def main() -> int:
    """``python -m spark_jobs.cds``: make the archive for the snapshot job's driver options, print its path."""
    try:
        print(build(DRIVER_JAVA_OPTIONS))
    except (OSError, subprocess.SubprocessError) as exc:
        print(f"Spark class-data archive not built (the driver starts without it): {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
