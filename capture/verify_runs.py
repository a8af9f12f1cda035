"""``changefeed verify`` jobs launched by this capture (``POST /api/v2/changefeeds/{id}/verify``; docs/verify.md).

:meth:`VerifyRuns.start` checks the request (the changefeed exists, its target is a SQL database, the tables are
replicated by it), stores a ``VerifyRun`` in etcd (``running``), writes the job's plan (mode 0600: it holds the
URIs) and starts ``python -m spark_jobs.verify`` in a session of its own; the job stores its report in the same
``VerifyRun`` when it ends. A thread of this capture waits for the process: one that ended without a report is
stored as ``failed`` with the end of its log, so a poller never waits for a dead job. Any capture answers
:meth:`VerifyRuns.get` (etcd); only the launching one can :meth:`VerifyRuns.stop` its job (SIGTERM: the job
releases its hold, then ends).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from cdc import serde
from cdc.config import ChangefeedConfig
from cdc.crypto import is_sealed
from cdc.errors import ChangefeedNotFound, ChangefeedStateConflict, InvalidArgument, VerifyRunNotFound
from cdc.events import TableName
from cdc.meta.store import MetaStore
from cdc.model import VERIFY_FAILED, VERIFY_RUNNING, FeedState, VerifyRun
from cdc.uri import parse_sink_uri
from spark_jobs.verify import VerifyJob
from spark_jobs.verify_lake import LAKE_SCHEMES
from upstream import open_upstream

log = logging.getLogger(__name__)

SQL_SCHEMES = frozenset({"postgresql", "postgres", "mysql", "mariadb", "sqlite"})
LOG_TAIL = 2000
"""Characters of a dead job's log kept in its ``VerifyRun.error``."""


class VerifyRuns:
    """The verify jobs of this capture (module docstring). ``capture_id`` names this capture in the runs."""

    def __init__(self, store: MetaStore, etcd: Sequence[str], data_dir: str | os.PathLike[str],
                 capture_id: Callable[[], str] = lambda: "") -> None:
        self.store = store
        self.etcd = tuple(etcd)
        self.dir = Path(data_dir) / "verify"
        self.capture_id = capture_id
        self._lock = threading.Lock()
        self._procs: dict[tuple[str, str], subprocess.Popen[bytes]] = {}

    def start(self, cf: str, tables: Sequence[str] | None = None, chunk_rows: int | None = None) -> dict[str, Any]:
        entry = self.store.get_changefeed(cf)
        if entry is None:
            raise ChangefeedNotFound(f"changefeed {cf!r} does not exist")
        info = entry.value
        if info.state is FeedState.REMOVED:
            raise ChangefeedStateConflict(f"changefeed {cf!r} is being removed")
        if is_sealed(info.upstream_uri) or is_sealed(info.sink_uri):
            raise InvalidArgument(f"changefeed {cf!r}: its URIs are sealed with a key this capture does not hold")
        scheme = parse_sink_uri(info.sink_uri).scheme
        if scheme not in SQL_SCHEMES and scheme not in LAKE_SCHEMES:
            raise InvalidArgument(f"changefeed {cf!r}: verify compares SQL targets (PostgreSQL, MySQL/MariaDB, "
                                  f"SQLite) and the storage sink's lake (file://); its sink is {scheme}://")
        if chunk_rows is not None and chunk_rows < 1:
            raise InvalidArgument(f"chunk-rows must be at least 1, got {chunk_rows}")
        config = ChangefeedConfig.from_dict(info.config)
        with open_upstream(info.upstream_uri) as up:
            replicated = [str(t) for span in info.spans for t in (up.span_tables(span) or ())]
        wanted = list(dict.fromkeys(str(TableName.parse(t.strip())) for t in tables)) if tables else replicated
        missing = [t for t in wanted if t not in replicated]
        if missing:
            raise InvalidArgument(f"changefeed {cf!r} does not replicate {', '.join(missing)} (it replicates: "
                                  f"{', '.join(sorted(replicated)[:20]) or 'none'})")
        if not wanted:
            raise InvalidArgument(f"changefeed {cf!r} replicates no table: nothing to verify")
        run = VerifyRun(uuid.uuid4().hex, VERIFY_RUNNING, time.time(), tables=tuple(wanted), capture=self.capture_id())
        job = VerifyJob(upstream=info.upstream_uri, sink=info.sink_uri, tables=tuple(wanted), changefeed=cf,
                        etcd=self.etcd, cluster=self.store.cluster_id, spark_master=config.snapshot.spark_master,
                        chunk_rows=chunk_rows or config.snapshot.chunk_rows, run_id=run.id,
                        spark_min_rows=config.snapshot.spark_min_rows)
        self.store.put_verify_run(cf, run)
        self.dir.mkdir(parents=True, exist_ok=True)
        plan = self.dir / f"{run.id}.json"
        fd = os.open(plan, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(serde.to_json(job))
        log_path = self.dir / f"{run.id}.log"
        with open(log_path, "wb") as out:
            # (no --out: the report goes to etcd only; on stdout it would land in the log)
            proc = subprocess.Popen([sys.executable, "-m", "spark_jobs.verify", "--plan", str(plan), "--out", os.devnull],
                                    stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        with self._lock:
            self._procs[(cf, run.id)] = proc
        threading.Thread(target=self._watch, args=(cf, run, proc, plan, log_path), daemon=True,
                         name=f"verify-{cf}").start()
        log.info("changefeed=%s verify run %s started (pid %d): %s", cf, run.id, proc.pid, ", ".join(wanted))
        return serde.to_dict(run)

    def _watch(self, cf: str, run: VerifyRun, proc: subprocess.Popen[bytes], plan: Path, log_path: Path) -> None:
        code = proc.wait()
        with self._lock:
            self._procs.pop((cf, run.id), None)
        with contextlib.suppress(OSError):
            plan.unlink()
        try:
            stored = self.store.get_verify_run(cf, run.id)
            if stored is not None and stored.state == VERIFY_RUNNING:
                tail = log_path.read_bytes()[-LOG_TAIL:].decode("utf-8", "replace") if log_path.exists() else ""
                self.store.put_verify_run(cf, replace(stored, state=VERIFY_FAILED, finished=time.time(),
                                                      error=f"the verify job ended (exit {code}) without a report: "
                                                            f"{tail.strip()}"))
        except Exception as exc:  # noqa: BLE001 - etcd down: the run stays 'running', its log says why
            log.warning("changefeed=%s verify run %s: outcome not stored: %s", cf, run.id, exc)
        log.info("changefeed=%s verify run %s ended (exit %d)", cf, run.id, code)

    def get(self, cf: str, run: str) -> dict[str, Any]:
        try:
            found = self.store.get_verify_run(cf, run)
        except ValueError:
            found = None
        if found is None:
            raise VerifyRunNotFound(f"changefeed {cf!r} has no verify run {run!r}")
        return serde.to_dict(found)

    def stop(self, cf: str, run: str) -> dict[str, Any]:
        """SIGTERM the job (it releases its hold first); NotFound when it is not a running job of this capture."""
        with self._lock:
            proc = self._procs.get((cf, run))
        if proc is not None and self.get(cf, run).get("state") != VERIFY_RUNNING:
            proc = None  # its report is stored: it is only exiting
        if proc is None:
            raise VerifyRunNotFound(f"verify run {run!r} of changefeed {cf!r} is not running on this capture")
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGTERM)
        return self.get(cf, run)

    def close(self, timeout: float = 10.0) -> None:
        """Stop every job of this capture (capture shutdown): SIGTERM, then SIGKILL of its session."""
        with self._lock:
            procs = list(self._procs.values())
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
