"""Workload (d): one 1 GB upstream transaction.

Tidewater's figures come from ``scripts/bench_big_txn.py`` (another benchmark of this repository, reused
as is): :func:`run_tidewater` calls its ``run_benchmark()`` (fresh etcd, PostgreSQL with
``logical_decoding_work_mem=64kB``, one ``cdc server``; the transaction is streamed while it is written)
and adds the capture's CPU seconds, sampled from ``/proc`` while that run goes on. Its throughput is
*live*: rows / (INSERT start .. checkpoint covering the COMMIT); it also reports COMMIT .. checkpoint.

The references run in this benchmark's own servers on the same rows (the script's ``SCHEMA`` and
``INSERT_SQL``): :class:`BigTxnRef` is a scenario with one timed phase, measured in catch-up mode like the
other workloads.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from bench.procstat import LastCpu
from bench.workloads import CeilingSource, Phase, Scenario, WriteResult, timed_writes
from playground.servers import PostgresServer

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench_big_txn.py"
TIDEWATER_SINKS = ("sqlite", "blackhole", "mariadb")  # the targets bench_big_txn.py can start


def load_module() -> ModuleType:
    """Import ``scripts/bench_big_txn.py`` (not a package) once, as module ``bench_big_txn``."""
    if "bench_big_txn" in sys.modules:
        return sys.modules["bench_big_txn"]
    spec = importlib.util.spec_from_file_location("bench_big_txn", SCRIPT)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot load {SCRIPT}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is created
    spec.loader.exec_module(module)
    return module


@dataclass
class BigTxnResult:
    sink: str
    size_mb: float
    rows: int = 0
    insert_s: float = 0.0
    commit_to_checkpoint_s: float = 0.0
    rows_per_s_e2e: float | None = None  # rows / (insert + commit->checkpoint)
    rows_per_s_after_commit: float | None = None  # rows / (commit->checkpoint)
    cpu_s: float | None = None  # capture CPU over its whole life in that run
    hwm: int | None = None  # capture VmHWM at the end (bytes)
    anon_peak: int | None = None
    tree_rss_peak: int | None = None
    equal: bool | None = None
    error: str = ""

    @property
    def cpu_per_mrows(self) -> float | None:
        return self.cpu_s / self.rows * 1e6 if self.cpu_s is not None and self.rows else None


_PIDS = re.compile(r"pids (\{.*\})")


def run_tidewater(size_mb: float, sink: str, work_dir: Path, timeout: float, say: Callable[[str], None]
                  ) -> BigTxnResult:
    """One ``run_benchmark()`` of bench_big_txn.py for ``sink``; never raises (errors are in the result)."""
    mod = load_module()
    out = BigTxnResult(sink, size_mb)
    cpu = LastCpu(interval=0.2)
    cdc_pid: list[int] = []

    def progress(msg: str) -> None:
        m = _PIDS.search(msg)
        if m and not cdc_pid:
            pids: dict[str, Any] = json.loads(m.group(1))
            if "cdc" in pids:
                cdc_pid.append(int(pids["cdc"]))
                cpu.watch(cdc_pid[0])
        say(f"[d/{sink}] {msg.strip()}")

    try:
        r = mod.run_benchmark(size_mb, sink, work_dir, timeout, progress)
        out.rows, out.insert_s, out.commit_to_checkpoint_s = r.rows, r.insert_s, r.commit_to_checkpoint_s
        out.rows_per_s_e2e, out.rows_per_s_after_commit = r.end_to_end_rows_per_s, r.rows_per_s
        out.hwm, out.anon_peak, out.tree_rss_peak, out.equal = r.hwm, r.anon_peak, r.tree_rss_peak, r.equal
        out.cpu_s = cpu.stop() if cdc_pid else None  # the last value seen before the capture exited
    except Exception as exc:  # noqa: BLE001 - reported in the table
        out.error = f"{type(exc).__name__}: {exc}"
        cpu.stop()
    return out


class BigTxnRef(Scenario):
    """The references' copy of workload (d): bench_big_txn.py's table and its one ``INSERT ... SELECT``."""

    key = "d"
    title = "one big transaction"

    def __init__(self, size_mb: float) -> None:
        self.size_mb = size_mb
        self.mod = load_module()
        self.rows = int(self.mod.rows_for(size_mb))

    def create_schema(self, server: PostgresServer, db: str) -> None:
        server.execute(self.mod.SCHEMA, db=db)

    def phases(self) -> list[Phase]:
        table = self.mod.TABLE
        ddl = {
            "postgresql": "CREATE TABLE {name} (id bigint PRIMARY KEY, payload text NOT NULL)",
            "mariadb": "CREATE TABLE `{name}` (id bigint PRIMARY KEY, payload longtext NOT NULL) "
                       "DEFAULT CHARSET=utf8mb4",
            "sqlite": 'CREATE TABLE "{name}" (id INTEGER PRIMARY KEY, payload TEXT NOT NULL)',
        }
        return [Phase("d", True, f"(d) one transaction of {self.size_mb:g} MB ({self.rows} rows)", self._write,
                      [CeilingSource(table, ["id", "payload"], ddl=ddl)])]

    def _write(self, server: PostgresServer, db: str) -> WriteResult:
        def body(conn: Any, cur: Any) -> int:
            cur.execute(self.mod.INSERT_SQL, (self.rows,))
            conn.commit()
            return self.rows

        return timed_writes(server, db, body)
