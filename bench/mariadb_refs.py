"""The consumers measured on one MariaDB upstream's binlog (``python -m bench --upstream mariadb``): Tidewater
changefeeds (:class:`MariaDBFeed`), ``mariadb-binlog`` reading the same binlog to /dev/null (the read ceiling,
:func:`measure_binlog_read`) and MariaDB's own replication, a replica catching up on it (:class:`NativeReplica`,
:func:`measure_replica`).

Every consumer is measured in catch-up mode, as for PostgreSQL (:mod:`bench.consumers`): it was not reading while
the phase was written, and the figure is the time from starting it until it has consumed everything up to the
phase's end position (``SHOW MASTER STATUS`` after the last commit), one consumer at a time. Positions are Tidewater's
MySQL Ts (:mod:`upstream.mysql.positions`: file sequence << 32 | position), so the changefeed's ``checkpoint_ts``,
the replica's executed position and the binlog reader's stop position compare directly.

Not thread-safe: one thread drives a consumer.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from typing import Any

from bench.checkpoint_watch import CheckpointWatch
from bench.consumers import Around, Measurement, RunCpu, remove_changefeed
from playground.cluster import CdcServer
from playground.servers import HOST, MariaDBServer
from upstream.mysql.positions import split_ts, to_ts

IDLE_DB = "bench_idle"  # writes that move the binlog on without touching a measured database


def binlog_end(server: MariaDBServer) -> int:
    """The server's binlog end (the position after its last event) as a Ts."""
    [(log_file, pos, *_)] = server.execute("SHOW MASTER STATUS") or []
    return to_ts(str(log_file), int(pos))


def binlog_files(server: MariaDBServer) -> list[str]:
    return [str(r[0]) for r in server.execute("SHOW BINARY LOGS") or []]


def file_of(server: MariaDBServer, ts: int) -> tuple[str, int]:
    """The binlog file name and position of ``ts`` on ``server``."""
    seq, pos = split_ts(ts)
    for name in binlog_files(server):
        if int(name.rsplit(".", 1)[1]) == seq:
            return name, pos
    raise RuntimeError(f"binlog file #{seq} is not on {server}")


def tick(server: MariaDBServer) -> int:
    """Commit one row in :data:`IDLE_DB` (no measured changefeed carries it) and return the binlog end after it."""
    server.execute(f"CREATE DATABASE IF NOT EXISTS {IDLE_DB}")
    server.execute("CREATE TABLE IF NOT EXISTS tick (id INT PRIMARY KEY, at DATETIME(6))", db=IDLE_DB)
    server.execute("REPLACE INTO tick VALUES (1, NOW(6))", db=IDLE_DB)
    return binlog_end(server)


# ---- Tidewater ------------------------------------------------------------------------------------------
class MariaDBFeed:
    """One changefeed of the ``cdc server`` under test from a database of the MariaDB upstream to one sink
    (``--snapshot none``: the scenario's rows are all written after it exists). Implements
    :class:`bench.consumers.Feed`: :meth:`wait` sees the checkpoint reach its Ts by an etcd watch
    (:class:`bench.checkpoint_watch.CheckpointWatch`, open from :meth:`create` to :meth:`remove`), and polls the API
    only for the changefeed's state and progress."""

    def __init__(self, cdc: CdcServer, upstream: MariaDBServer, db: str, cf_id: str, sink: str, sink_uri: str,
                 config: str = "") -> None:
        self.cdc, self.upstream, self.db = cdc, upstream, db
        self.cf_id, self.sink, self.sink_uri, self.config = cf_id, sink, sink_uri, config
        self.checkpoints = CheckpointWatch(cdc.etcd_url, cdc.cluster_id, cf_id)
        self.reached_at = 0.0  # monotonic time the last wait() saw the checkpoint reach its Ts

    def create(self, timeout: float = 300) -> None:
        """Create the changefeed and wait until its pipeline is up (checkpoint at the binlog end)."""
        self.checkpoints.open()
        self.cdc.create_changefeed(self.cf_id, self.upstream.uri(self.db), self.sink_uri, self.config,
                                   snapshot="none")
        self.wait(tick(self.upstream), timeout)

    def info(self) -> dict[str, Any]:
        return self.cdc.changefeed(self.cf_id)

    def wait(self, lsn: int, timeout: float, poll: float = 0.1,
             on_poll: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
        """Wait until the changefeed checkpoint reaches Ts ``lsn`` (seen by the watch at once; the API is read every
        ``poll`` seconds for the state, and once more at the end); raise if it fails or times out."""
        deadline = time.monotonic() + timeout
        while True:
            info = self.info()
            if on_poll is not None:
                on_poll(info)
            if info["checkpoint_ts"] >= lsn:
                self.reached_at = self.checkpoints.wait(lsn, 1.0) or time.monotonic()
                return info
            if info["state"] == "failed":
                raise RuntimeError(f"changefeed {self.cf_id} failed: {info.get('error')}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"changefeed {self.cf_id} checkpoint {info['checkpoint']} did not reach "
                                   f"{lsn:X} in {timeout:.0f}s (state {info['state']}, error {info.get('error')}, "
                                   f"spans {[s.get('error') for s in info['spans']]})")
            self.checkpoints.wait(lsn, poll)

    def pause(self, timeout: float = 60) -> None:
        """Pause and wait until no span runs (its binlog connection is closed)."""
        self.cdc.request("POST", f"/api/v2/changefeeds/{self.cf_id}/pause")
        deadline = time.monotonic() + timeout
        while any(s.get("running") for s in self.info()["spans"]):
            if time.monotonic() > deadline:
                raise TimeoutError(f"changefeed {self.cf_id}: spans still running {timeout:.0f}s after pause")
            time.sleep(0.05)

    def resume(self) -> None:
        self.cdc.request("POST", f"/api/v2/changefeeds/{self.cf_id}/resume")

    def idle_resume_seconds(self, timeout: float) -> float:
        """Resume with nothing of its database to replicate until the checkpoint passes a new binlog end, pause
        again: the fixed cost included in every catch-up figure."""
        target = tick(self.upstream)
        t0 = time.monotonic()
        self.resume()
        self.wait(target, timeout, poll=0.02)
        seconds = self.reached_at - t0
        self.pause()
        return seconds

    def remove(self) -> None:
        self.checkpoints.close()
        remove_changefeed(self.cdc, self.cf_id)

    def reader_pids(self) -> list[int]:
        """None: a binlog dump is a thread of ``mariadbd``, not a process of its own (its CPU is not split out)."""
        return []


# ---- mariadb-binlog: the read ceiling ----------------------------------------------------------------------
def measure_binlog_read(upstream: MariaDBServer, start: int, end: int, rows: int, timeout: float) -> Measurement:
    """``mariadb-binlog --read-from-remote-server`` from Ts ``start`` to ``end`` (the files between, the stop
    position in the last), its text (row events as BINLOG statements) to /dev/null: the time until it exits. CPU: its
    own, and the upstream server's (its binlog dump thread, with whatever else ``mariadbd`` did meanwhile)."""
    m = Measurement("mariadb-binlog", "", rows)
    exe = shutil.which("mariadb-binlog") or shutil.which("mysqlbinlog")
    if exe is None:
        m.error = "mariadb-binlog not found (Debian mariadb-client)"
        return m
    first, start_pos = file_of(upstream, start)
    last, end_pos = file_of(upstream, end)
    files = binlog_files(upstream)
    names = files[files.index(first): files.index(last) + 1]
    argv = [exe, "--no-defaults", "--read-from-remote-server", f"--host={HOST}", f"--port={upstream.port}",
            "--user=root", f"--start-position={max(start_pos, 4)}", f"--stop-position={end_pos}", *names]
    servers = RunCpu(Around(upstream=upstream.pid))
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = t0 + timeout
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid == proc.pid:
                m.seconds = time.monotonic() - t0
                proc.returncode = os.waitstatus_to_exitcode(status)
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"mariadb-binlog did not reach {end:X} in {timeout:.0f}s")
            time.sleep(0.01)
        if proc.returncode != 0:
            err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
            raise RuntimeError(f"mariadb-binlog exited with {proc.returncode}: {err[-1000:]}")
        m.cpu_s = usage.ru_utime + usage.ru_stime
        servers.fill(m)
    except Exception as exc:  # noqa: BLE001 - reported in the table, the run goes on
        m.error = f"{type(exc).__name__}: {exc}"
        m.seconds = 0.0
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGKILL)
            proc.wait()
    finally:
        if proc.stderr is not None:
            proc.stderr.close()
    return m


# ---- MariaDB's own replication ----------------------------------------------------------------------------
class NativeReplica:
    """``replica`` replicating from ``primary`` with MariaDB's defaults (one SQL thread, file/position), started and
    stopped by the bench: between measurements it is stopped, so the binlog of a phase waits for it as for every
    other consumer."""

    def __init__(self, primary: MariaDBServer, replica: MariaDBServer) -> None:
        self.primary, self.replica = primary, replica

    def _status(self, conn: Any = None) -> dict[str, Any]:
        """``SHOW SLAVE STATUS`` over ``conn`` (a new connection when None)."""
        import pymysql.cursors

        own = conn is None
        conn = self.replica.connect() if own else conn
        try:
            with conn.cursor(pymysql.cursors.DictCursor) as cur:
                cur.execute("SHOW SLAVE STATUS")
                row = cur.fetchone()
        finally:
            if own:
                conn.close()
        if row is None:
            raise RuntimeError(f"{self.replica} is not a replica")
        return dict(row)

    def point_at(self, ts: int) -> None:
        """Replicate from binlog Ts ``ts`` of the primary on (stopped)."""
        name, pos = file_of(self.primary, ts)
        self.replica.execute("STOP SLAVE")
        self.replica.execute(
            "CHANGE MASTER TO MASTER_HOST=%s, MASTER_PORT=%s, MASTER_USER='root', MASTER_PASSWORD='', "
            "MASTER_LOG_FILE=%s, MASTER_LOG_POS=%s, MASTER_USE_GTID=no", params=(HOST, self.primary.port, name, pos))

    def applied(self, conn: Any = None) -> int:
        """The primary's binlog Ts the replica has executed up to (asked over ``conn``, else a new connection);
        raises on a replication error."""
        s = self._status(conn)
        for what in ("Last_SQL_Error", "Last_IO_Error"):
            if s.get(what):
                raise RuntimeError(f"replica {what}: {s[what]}")
        return to_ts(str(s["Relay_Master_Log_File"]), int(s["Exec_Master_Log_Pos"]))

    def start(self) -> None:
        self.replica.execute("START SLAVE")

    def stop(self) -> None:
        self.replica.execute("STOP SLAVE")

    def wait(self, ts: int, timeout: float, poll: float = 0.02) -> None:
        """Until the replica has executed up to Ts ``ts``, polled over one connection (a connection per poll, 50 a
        second, cost the replica's threads CPU that the bench counted as the native replica's)."""
        deadline = time.monotonic() + timeout
        conn = self.replica.connect()
        try:
            while self.applied(conn) < ts:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"replica executed up to {self.applied(conn):X}, not {ts:X}, after "
                                       f"{timeout:.0f}s")
                time.sleep(poll)
        finally:
            conn.close()

    def catch_up(self, ts: int, timeout: float) -> None:
        """Start, wait until Ts ``ts`` is executed, stop (untimed)."""
        self.start()
        try:
            self.wait(ts, timeout)
        finally:
            self.stop()


def measure_replica(native: NativeReplica, target: int, rows: int, timeout: float) -> Measurement:
    """``START SLAVE`` on the (stopped) replica, time it until it has executed everything up to Ts ``target``,
    stop it. CPU: the replica server's whole process tree (its I/O and SQL threads and InnoDB's) and the upstream
    server's (the binlog dump thread serving the replica, with whatever else ``mariadbd`` did meanwhile)."""
    m = Measurement("native", "", rows)
    servers = RunCpu(Around(target=native.replica.pid, upstream=native.primary.pid))
    try:
        t0 = time.monotonic()
        native.start()
        native.wait(target, timeout)
        m.seconds = time.monotonic() - t0
        servers.fill(m)
        m.cpu_s = m.target_cpu_s
    except Exception as exc:  # noqa: BLE001
        m.error = f"{type(exc).__name__}: {exc}"
    finally:
        try:
            native.stop()
        except Exception as exc:  # noqa: BLE001
            m.error = m.error or f"STOP SLAVE failed: {exc}"
    return m
