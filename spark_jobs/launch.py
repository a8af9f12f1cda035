"""Running the snapshot job as its own process, for whoever drives it (the capture, later; tests, the benchmark).

:func:`start` writes the job's plan file (mode 0600) and starts ``python -m spark_jobs.snapshot --plan FILE``
with this interpreter in a new session (its own process group), output to a log file. :func:`spawn` starts the
same process ahead of its plan (``--wait``: it imports its modules, then waits on its stdin): :meth:`JobProcess.go`
writes the plan file and lets it run, :meth:`JobProcess.discard` ends it unused; the ~0.5 s a Python process and
its imports take then overlap the caller's own work (the capture's export and planning). The returned
:class:`JobProcess` is polled (:meth:`~JobProcess.poll`), waited for, or stopped (:meth:`~JobProcess.stop`:
SIGTERM, which makes the job fence itself out and stop Spark, then SIGKILL of its process group after a timeout).
:meth:`~JobProcess.failure` is the job's one-line error. Nothing here blocks except ``wait`` and ``stop``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from spark_jobs.plan import SnapshotJob, write_job

log = logging.getLogger(__name__)

FAILED = "snapshot copy failed: "
INTERRUPTED = "snapshot copy interrupted"


@dataclass
class JobProcess:
    """A started snapshot job process (see the module docstring); ``job`` is None until :meth:`go`."""

    job: SnapshotJob | None
    popen: subprocess.Popen[bytes]
    plan_path: Path
    log_path: Path
    changefeed: str = ""
    span: int = 0

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def label(self) -> str:
        return f"changefeed={self.changefeed} span={self.span}"

    def go(self, job: SnapshotJob) -> None:
        """A process from :func:`spawn`: write ``job``'s plan file (mode 0600) and let the process run it. Raises
        ``OSError`` when the process is gone (it died waiting: see its log)."""
        if (job.changefeed, job.span) != (self.changefeed, self.span):
            raise ValueError(f"the job of {job.label} given to the process started for {self.label}")
        write_job(job, self.plan_path)
        self.job = job
        assert self.popen.stdin is not None
        try:
            self.popen.stdin.write(b"go\n")
            self.popen.stdin.flush()
        finally:
            self.popen.stdin.close()

    def discard(self, timeout: float = 5.0) -> None:
        """A process from :func:`spawn` that will get no job: end it (end of its input: it exits 0 having done
        nothing; killed after ``timeout`` s)."""
        if self.popen.stdin is not None and not self.popen.stdin.closed:
            with contextlib.suppress(OSError):
                self.popen.stdin.close()
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            self.popen.wait()

    def poll(self) -> int | None:
        """The exit code, or None while it runs (0 done, 1 fix the input, 2 retry, 3 other, 130 stopped)."""
        return self.popen.poll()

    def wait(self, timeout: float | None = None) -> int:
        return self.popen.wait(timeout)

    def stop(self, timeout: float = 30.0) -> int:
        """Ask the job to stop (SIGTERM); after ``timeout`` s SIGKILL its whole process group. Returns the exit
        code (negative: killed by that signal)."""
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.popen.send_signal(signal.SIGTERM)
            try:
                return self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                log.warning("%s: snapshot job pid %d did not stop within %.0f s: killing its process group",
                            self.label, self.popen.pid, timeout)
        self.kill()
        return self.popen.wait()

    def kill(self) -> None:
        """SIGKILL the job's process group (driver and JVM; Spark's Python daemon has its own group and ends when
        the JVM is gone, and the run fence keeps any late chunk from committing)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)

    def output(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def failure(self) -> str | None:
        """The job's one-line error (``[CODE] message``), None when it printed none."""
        lines = [ln for ln in self.output().splitlines() if ln.startswith(FAILED)]
        return lines[-1][len(FAILED):] if lines else None


# ``python -c`` entry point with ``die_with_parent``: ask the kernel to SIGKILL the job when the thread that started
# it ends (its parent died, SIGKILL included), check the parent did not die before that, then run the job.
_BOOT = ("import ctypes, os, runpy, signal, sys\n"
         "try:\n    ctypes.CDLL(None).prctl(1, signal.SIGKILL)\nexcept (OSError, AttributeError):\n    pass\n"
         "if os.getppid() != int(os.environ['TIDEWATER_PARENT_PID']):\n    os._exit(3)\n"
         "sys.argv = ['spark_jobs.snapshot', *sys.argv[1:]]\n"
         "runpy.run_module('spark_jobs.snapshot', run_name='__main__', alter_sys=True)\n")


def start(job: SnapshotJob, workdir: str | os.PathLike[str], *, log_level: str = "INFO",
          die_with_parent: bool = False) -> JobProcess:
    """Start ``job`` as its own process; its plan file and log go to ``workdir`` (created). ``die_with_parent``:
    the job is killed when the thread that started it ends (a capture that dies takes its job with it)."""
    proc = spawn(job.changefeed, job.span, workdir, log_level=log_level, die_with_parent=die_with_parent)
    try:
        proc.go(job)
    except BaseException:
        proc.kill()
        raise
    return proc


def spawn(changefeed: str, span: int, workdir: str | os.PathLike[str], *, log_level: str = "INFO",
          die_with_parent: bool = False, sink_scheme: str = "") -> JobProcess:
    """Start the job process of ``changefeed``/``span`` ahead of its plan (see the module docstring): it waits for
    :meth:`JobProcess.go` or :meth:`JobProcess.discard`. ``die_with_parent`` as for :func:`start` (the thread that
    spawns it must outlive it: call ``go`` from that thread too). ``sink_scheme``: the sink whose modules it imports
    while it waits."""
    wd = Path(workdir)
    wd.mkdir(parents=True, exist_ok=True)
    stem = f"snapshot-{changefeed}-{span}"
    plan = wd / f"{stem}.json"
    log_path = wd / f"{stem}.log"
    with open(log_path, "ab") as out:
        entry = ["-c", _BOOT] if die_with_parent else ["-m", "spark_jobs.snapshot"]
        preload = ["--preload-sink", sink_scheme] if sink_scheme else []
        popen = subprocess.Popen([sys.executable, *entry, "--plan", str(plan), "--wait", *preload,
                                  "--log-level", log_level],
                                 cwd=wd, stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT,
                                 start_new_session=True, env={**os.environ, "TIDEWATER_PARENT_PID": str(os.getpid())})
    proc = JobProcess(None, popen, plan, log_path, changefeed, span)
    log.info("%s: snapshot job started, pid %d, log %s", proc.label, popen.pid, log_path)
    return proc
