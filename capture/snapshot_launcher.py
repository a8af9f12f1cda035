"""Launches the initial copy's Spark job for a span (:func:`spark_jobs.launch.start`): the capture's
:class:`processor.snapshot.CopyLauncher`, and the up-front check of ``changefeed create`` that it can run.

The job runs as a process of its own (never in the capture's interpreter), in a session of its own, killed when
the capture dies (SIGKILL included: the parent-death signal). A stop asks it to end (SIGTERM: it fences itself
out and stops Spark), then kills its process group. Spark's Python workers may outlive it: the job's run fence
(etcd) keeps them from committing once the next run started or the copy ended. Its plan file holds credentials:
mode 0600 under ``{data_dir}/snapshot/``, deleted when the job ends; its log stays there. A failure is raised with
the job's own one-line reason (no traceback, no password).
"""

from __future__ import annotations

import logging
import os
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from cdc.config import SPARK_MASTER_FORMS, SPARK_MASTER_URL
from cdc.errors import InvalidConfig, TidewaterError, error_for_code
from processor.snapshot import CopyRequest, CopyStopped
from spark_jobs import launch
from spark_jobs.plan import SnapshotJob
from spark_jobs.probe import probe_rpc
from spark_jobs.session import check_spark

log = logging.getLogger(__name__)

class SnapshotJobFailed(TidewaterError):
    """The copy job ended with an error it reported (its one line is the message). Retried with backoff: the
    next run copies only the chunks not yet done."""

    code = "CDC:ErrSnapshotFailed"
    retryable = True


_checked: set[str] = set()  # masters found usable by this process
_spark_found = [False]  # pyspark and a Java 17 found by this process (java -version is not free)


def check_copy_possible(spark_master: str) -> None:
    """Fail ``changefeed create`` up front when the initial copy could not run: pyspark missing, no Java 17, a
    master URL Spark would refuse (``InvalidConfig``), or a ``spark://`` address where no Spark master answers
    Spark's RPC protocol (``SparkUnavailable``: nothing listening, or another server such as a database or the
    master's web UI; :func:`spark_jobs.probe.probe_rpc`). A master URL that passed is not checked again by this
    process, except a ``spark://`` one, which is probed on every create (it may have gone away)."""
    if spark_master in _checked:
        return
    if not SPARK_MASTER_URL.match(spark_master):
        raise InvalidConfig(f"snapshot.spark-master {spark_master!r} is not a Spark master URL: use "
                            f"{SPARK_MASTER_FORMS}")
    if not _spark_found[0]:
        check_spark()
        _spark_found[0] = True
    if spark_master.startswith("spark://"):
        for hostport in spark_master[len("spark://"):].split(","):
            host, _, port = hostport.rpartition(":")
            if not host or not port.isdigit():
                raise InvalidConfig(f"snapshot.spark-master {spark_master!r}: {hostport!r} is not host:port "
                                    "(e.g. spark://127.0.0.1:7077)")
            probe_rpc(host.strip("[]"), int(port))
        return
    _checked.add(spark_master)


def warm_up() -> None:
    """Look for pyspark and Java once, ahead of the first ``changefeed create`` (the capture calls this in a thread
    as it starts: ``java -version`` and importing pyspark take ~0.2 s). Raises nothing: a create reports what is
    missing itself."""
    try:
        check_spark()
        _spark_found[0] = True
    except Exception as exc:  # noqa: BLE001 - the create that needs Spark says why
        log.debug("Spark not usable yet: %s", exc)


class SparkCopyLauncher:
    """Runs the job for one :class:`CopyRequest` and waits for it (``__call__``)."""

    def __init__(self, etcd: Sequence[str], cluster_id: str, data_dir: str | os.PathLike[str], *,
                 poll: float = 0.2) -> None:
        self.etcd = tuple(etcd)
        self.cluster_id = cluster_id
        self.dir = Path(data_dir) / "snapshot"
        self.poll = poll
        self._lock = threading.Lock()
        self._ready: dict[tuple[str, int], launch.JobProcess] = {}  # started ahead of their request (prepare)

    def prepare(self, changefeed: str, span: int, sink_uri: str = "") -> None:
        """Start the span's job process now, ahead of its request (it imports its modules meanwhile, those of
        ``sink_uri``'s sink too: ~0.5 s in all); the next call for the span runs its request in it. Call from the
        thread that will make that call (the process dies with it)."""
        proc = launch.spawn(changefeed, span, self.dir, die_with_parent=True,
                            sink_scheme=sink_uri.partition(":")[0] if ":" in sink_uri else "")
        with self._lock:
            old = self._ready.pop((changefeed, span), None)
            self._ready[(changefeed, span)] = proc
        if old is not None:
            old.discard()

    def discard(self, changefeed: str, span: int) -> None:
        """End the span's prepared process if no call took it (nothing to copy after all, or the span stopped)."""
        with self._lock:
            proc = self._ready.pop((changefeed, span), None)
        if proc is not None:
            proc.discard()

    def __call__(self, request: CopyRequest, stop: threading.Event) -> None:
        job = SnapshotJob(changefeed=request.changefeed, upstream=request.upstream_uri, sink=request.sink_uri,
                          tables=tuple(str(t) for t in request.tables), etcd=self.etcd, span=request.span,
                          cluster=self.cluster_id, snapshot=request.snapshot, commit_ts=request.commit_ts,
                          commit_time=request.commit_time, chunk_rows=request.chunk_rows,
                          spark_master=request.spark_master, local=request.local,
                          sink_config=dict(request.sink_config), defer_keys=request.defer_keys,
                          origin=request.origin)
        with self._lock:
            proc = self._ready.pop((request.changefeed, request.span), None)
        if proc is None or proc.poll() is not None:
            proc = launch.start(job, self.dir, die_with_parent=True)
        else:
            try:
                proc.go(job)
            except OSError:  # it died waiting (its log says why): start a new one
                proc.kill()
                proc = launch.start(job, self.dir, die_with_parent=True)
        try:
            started = time.monotonic()
            while True:
                try:
                    rc = proc.wait(self.poll)  # returns as the job exits (a poll would add up to self.poll)
                    break
                except subprocess.TimeoutExpired:
                    pass
                if stop.is_set():
                    proc.stop(timeout=15.0)  # SIGTERM: the job fences itself out and stops Spark; then SIGKILL
                    raise CopyStopped(f"span {request.changefeed}/{request.span}: stopped during its initial "
                                      "copy; the copy job was ended (copied chunks stay done)")
        finally:
            proc.plan_path.unlink(missing_ok=True)  # it holds credentials
        if rc == 0:
            log.info("span=%s/%d snapshot job done in %.1f s", request.changefeed, request.span,
                     time.monotonic() - started)
            return
        where = f"initial copy of span {request.changefeed}/{request.span}"
        reason = proc.failure()
        if reason is None:
            raise SnapshotJobFailed(f"{where}: the snapshot job exited with code {rc} (see {proc.log_path})")
        code, _, message = reason.partition("] ")
        if code.startswith("[CDC:") and message:  # the job's error keeps its kind: a target that refuses a row
            raise error_for_code(code[1:], f"{where}: {message}")  # fails the changefeed, an outage is retried
        raise SnapshotJobFailed(f"{where}: {reason}")
