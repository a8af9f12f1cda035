"""Launches the initial copy's Spark job (``python -m spark_jobs.snapshot``) for a span: the capture's
:class:`processor.snapshot.CopyLauncher`.

The job runs as a process of its own (never in the capture's interpreter), in a session of its own so that a
stop ends it with every child (``killpg``), and with the parent-death signal set so that it ends with a capture
that dies (SIGKILL included). Spark's Python workers may outlive it: the job's run fence (etcd) keeps them from
committing once the next run started or the copy ended. Its plan file holds credentials: it is written mode 0600
under the data dir and deleted afterwards. Its output goes to ``{data_dir}/snapshot/{changefeed}-{span}.log``;
a failure is raised with the job's own one-line reason (no traceback, no password).
"""

from __future__ import annotations

import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from cdc.errors import InvalidArgument, InvalidConfig, TidewaterError
from processor.snapshot import CopyRequest, CopyStopped
from spark_jobs.plan import SnapshotJob, write_job
from spark_jobs.session import check_spark

log = logging.getLogger(__name__)

# The job's entry point, run as ``python -c``: first ask the kernel to SIGKILL it when the thread that started it
# ends (the capture died), and check that the capture did not die before that; then the job itself.
_BOOT = ("import ctypes, os, runpy, signal, sys\n"
         "try:\n    ctypes.CDLL(None).prctl(1, signal.SIGKILL)\nexcept (OSError, AttributeError):\n    pass\n"
         "if os.getppid() != int(os.environ['TIDEWATER_CAPTURE_PID']):\n    os._exit(3)\n"
         "sys.argv = ['spark_jobs.snapshot', *sys.argv[1:]]\n"
         "runpy.run_module('spark_jobs.snapshot', run_name='__main__', alter_sys=True)\n")


class SnapshotJobFailed(TidewaterError):
    """The copy job ended with an error it reported (its one line is the message). Retried with backoff: the
    next run copies only the chunks not yet done."""

    code = "CDC:ErrSnapshotFailed"
    retryable = True


_MASTER = re.compile(r"^(local(\[(\*|[1-9][0-9]*)(,[1-9][0-9]*)?\])?|yarn|(spark|mesos|k8s)://\S+)$")
_checked: set[str] = set()  # masters found usable by this process (java -version is not free)


def check_copy_possible(spark_master: str) -> None:
    """Fail ``changefeed create`` up front when the initial copy could not run: pyspark missing, no Java 17, a
    master URL Spark would refuse, or a ``spark://`` master that does not answer."""
    if spark_master in _checked:
        return
    if not _MASTER.match(spark_master):
        raise InvalidConfig(f"snapshot.spark-master {spark_master!r} is not a Spark master URL: use local[*], "
                            f"local[N], spark://host:port (a standalone master), yarn or k8s://...")
    check_spark()
    if spark_master.startswith("spark://"):
        for hostport in spark_master[len("spark://"):].split(","):
            host, _, port = hostport.rpartition(":")
            try:
                socket.create_connection((host, int(port)), timeout=3.0).close()
            except (OSError, ValueError) as exc:
                raise InvalidArgument(f"the Spark master {hostport} of snapshot.spark-master does not answer "
                                      f"({exc}): start it, or use local[*]") from None
    _checked.add(spark_master)


class SparkCopyLauncher:
    """Runs the job for one :class:`CopyRequest` and waits for it (``__call__``)."""

    def __init__(self, etcd: Sequence[str], cluster_id: str, data_dir: str | os.PathLike[str], *,
                 python: str = sys.executable, poll: float = 0.2) -> None:
        self.etcd = tuple(etcd)
        self.cluster_id = cluster_id
        self.dir = Path(data_dir) / "snapshot"
        self.python = python
        self.poll = poll

    def __call__(self, request: CopyRequest, stop: threading.Event) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        name = f"{request.changefeed}-{request.span}"
        plan = self.dir / f"{name}.json"
        logfile = self.dir / f"{name}.log"
        job = SnapshotJob(changefeed=request.changefeed, upstream=request.upstream_uri, sink=request.sink_uri,
                          tables=tuple(str(t) for t in request.tables), etcd=self.etcd, span=request.span,
                          cluster=self.cluster_id, snapshot=request.snapshot, commit_ts=request.commit_ts,
                          commit_time=request.commit_time, chunk_rows=request.chunk_rows,
                          spark_master=request.spark_master, local=request.local)
        write_job(job, plan)
        try:
            with open(logfile, "ab") as out:
                proc = subprocess.Popen([self.python, "-c", _BOOT, "--plan", str(plan)],
                                        stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                        start_new_session=True, env={**os.environ,
                                                                     "TIDEWATER_CAPTURE_PID": str(os.getpid())})
                log.info("span=%s/%d snapshot job started (pid %d, log %s)", request.changefeed, request.span,
                         proc.pid, logfile)
                started = time.monotonic()
                while proc.poll() is None:
                    if stop.wait(self.poll):
                        self._end(proc)
                        raise CopyStopped(f"span {request.changefeed}/{request.span}: stopped during its initial "
                                          "copy; the copy job was ended (copied chunks stay done)")
            rc = proc.returncode
        finally:
            plan.unlink(missing_ok=True)
        if rc == 0:
            log.info("span=%s/%d snapshot job done in %.1f s", request.changefeed, request.span,
                     time.monotonic() - started)
            return
        reason = _last_failure(logfile) or f"the snapshot job exited with code {rc} (see {logfile})"
        if rc == 1:  # the job cannot work as given: the message names the fix
            raise InvalidArgument(f"initial copy of span {request.changefeed}/{request.span}: {reason}")
        raise SnapshotJobFailed(f"initial copy of span {request.changefeed}/{request.span}: {reason}")

    @staticmethod
    def _end(proc: subprocess.Popen[bytes]) -> None:
        """SIGTERM to the job's process group, SIGKILL after 10 s."""
        for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                proc.wait(wait)
                return
            except subprocess.TimeoutExpired:
                continue


def _last_failure(logfile: Path) -> str | None:
    """The job's own one-line reason (``snapshot copy failed: ...``), if it wrote one."""
    try:
        with open(logfile, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - 65536))
            tail = f.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return None
    for line in reversed(tail):
        if line.startswith("snapshot copy failed: "):
            return line[len("snapshot copy failed: "):].strip()
    return None
