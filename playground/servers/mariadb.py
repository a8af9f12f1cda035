"""A MariaDB server (Debian's ``mariadbd``) with row binlogs."""

from __future__ import annotations

import logging
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Self

from playground.servers.base import (
    HOST,
    Server,
    free_port,
    port_open,
)

log = logging.getLogger(__name__)


MARIADB_DEFAULT_SETTINGS: dict[str, str] = {
    "binlog-format": "ROW",
    "binlog-row-metadata": "FULL",
    "binlog-row-image": "FULL",
    "server-id": "1",
    "innodb-flush-log-at-trx-commit": "2",  # survives a process kill, not an OS crash (tests)
    "skip-name-resolve": "ON",
}


def _find_executable(name: str, bin_dir: Path | None = None) -> str | None:
    if bin_dir is not None:
        return shutil.which(name, path=str(bin_dir))
    return shutil.which(name) or next(
        (str(p) for p in (Path("/usr/sbin") / name, Path("/usr/bin") / name) if p.exists()), None
    )


class MariaDBServer(Server):
    """A MariaDB server (Debian ``mariadb-server``) with binary logging in ROW format, user ``root``, no password.

    Data, socket, binlogs and error log live under ``base_dir/mariadb``.  ``settings`` (``--name=value``
    options) override :data:`MARIADB_DEFAULT_SETTINGS`.  ``bin_dir`` selects other MariaDB binaries (the directory
    holding ``mariadbd`` and ``mariadb-install-db``; default: ``$PATH``, ``/usr/sbin``, ``/usr/bin``).  ``stop()``
    is SIGTERM (clean shutdown); ``kill()`` is SIGKILL (crash recovery at next start).
    """

    def __init__(
        self, base_dir: Path, *, settings: dict[str, str] | None = None, bin_dir: Path | None = None,
        log_bin: bool = True,
    ) -> None:
        self.log_bin = log_bin
        self.dir = Path(base_dir) / "mariadb"
        self.data_dir = self.dir / "data"
        self.log_path = self.dir / "mariadb.log"
        self.settings = {**MARIADB_DEFAULT_SETTINGS, **(settings or {})}
        self.port = free_port()
        self.bin_dir = Path(bin_dir) if bin_dir is not None else None
        self._initialized = False

    def __repr__(self) -> str:
        return f"MariaDBServer(127.0.0.1:{self.port}, dir={self.dir})"

    @property
    def tmp_dir(self) -> Path:
        """The server's own temporary directory. In the shared /tmp, ``mariadb-install-db`` failed once with
        ``Error on delete of '/tmp/#sql-temptable-25d1-1-26.MAI'`` while another server bootstrapped at the same time
        (the name holds a pid, which need not be unique on a host shared by sandboxes)."""
        return self.dir / "tmp"

    @property
    def socket_path(self) -> Path:
        return self.dir / "mariadb.sock"

    def uri(self, db: str = "") -> str:
        return f"mysql://root@{HOST}:{self.port}/{db}"

    def start(self, timeout: float = 30) -> Self:
        """Initialize the data directory on first start, start ``mariadbd``, wait until it accepts logins."""
        if self.running:
            return self
        mariadbd = _find_executable("mariadbd", self.bin_dir)
        install_db = _find_executable("mariadb-install-db", self.bin_dir)
        if mariadbd is None or install_db is None:
            where = f" in {self.bin_dir}" if self.bin_dir is not None else ""
            raise RuntimeError(
                f"MariaDB server binaries (mariadbd, mariadb-install-db) not found{where}: "
                "run `apt-get install mariadb-server` or `make deps`"
            )
        self._mariadbd = mariadbd
        if not self._initialized:
            self.dir.mkdir(parents=True, exist_ok=True)
            self.tmp_dir.mkdir(exist_ok=True)
            if not (self.data_dir / "mysql").exists():
                with open(self.log_path, "ab") as out:
                    res = subprocess.run(
                        [install_db, "--no-defaults", "--user=root", f"--datadir={self.data_dir}",
                         f"--tmpdir={self.tmp_dir}",
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
            f"--tmpdir={self.tmp_dir}",
            *([f"--log-bin={self.dir / 'binlog' / 'mariadb-bin'}"] if self.log_bin else []),
            *(f"--{k}={v}" for k, v in self.settings.items()),
        ]
        (self.dir / "binlog").mkdir(exist_ok=True)
        return self._popen(argv, cwd=self.dir)

    def _ready(self) -> bool:
        if not port_open(self.port):
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

    def replicate_from(self, primary: MariaDBServer, timeout: float = 30) -> Self:
        """Make this (started) server a GTID replica of ``primary`` (``CHANGE MASTER ... MASTER_USE_GTID =
        slave_pos``, ``START SLAVE``) and wait until it has applied the primary's binlog up to its position now.
        Start it with ``log-slave-updates`` (and a ``server-id`` of its own) for its binlog to hold what it applies:
        :meth:`replica_of` does."""
        self.execute(f"CHANGE MASTER TO MASTER_HOST = '{HOST}', MASTER_PORT = {primary.port}, MASTER_USER = 'root', "
                     f"MASTER_PASSWORD = '', MASTER_USE_GTID = slave_pos, MASTER_CONNECT_RETRY = 1")
        self.execute("START SLAVE")
        self.catch_up(primary, timeout)
        return self

    def catch_up(self, primary: MariaDBServer, timeout: float = 30) -> None:
        """Wait until this replica has applied every transaction ``primary`` has binlogged so far."""
        [(pos,)] = primary.execute("SELECT @@gtid_binlog_pos") or [("",)]
        [(res,)] = self.execute("SELECT MASTER_GTID_WAIT(%s, %s)", params=(pos, timeout)) or [(-1,)]
        if res != 0:
            status = self.execute("SHOW SLAVE STATUS")
            raise RuntimeError(f"replica {self!r} did not reach GTID {pos} of {primary!r} in {timeout}s: {status}")

    def promote(self) -> None:
        """Stop replicating and forget the primary (``STOP SLAVE; RESET SLAVE ALL``): this server takes writes of its
        own from now on, continuing the GTID sequence with its own server_id."""
        self.execute("STOP SLAVE")
        self.execute("RESET SLAVE ALL")

    @classmethod
    def replica_of(cls, primary: MariaDBServer, base_dir: Path, *, server_id: int = 2) -> MariaDBServer:
        """A new server under ``base_dir`` with ``log-slave-updates`` and ``server-id``, started and replicating from
        ``primary`` by GTID (:meth:`replicate_from`)."""
        replica = cls(base_dir, settings={**primary.settings, "server-id": str(server_id), "log-slave-updates": "ON"},
                      bin_dir=primary.bin_dir)
        return replica.start().replicate_from(primary)

    def create_database(self, name: str) -> None:
        self.execute(f"CREATE DATABASE {_mysql_ident(name)}")

    def drop_database(self, name: str) -> None:
        """Drop ``name`` after ending every other session that uses it (as PostgreSQL's ``WITH (FORCE)``: a test that
        failed while holding a transaction open there would otherwise make the DROP wait for ever on its metadata
        lock); ``lock_wait_timeout`` bounds what is left at 60 s."""
        conn = self.connect()
        try:
            with conn.cursor() as cur:
                cur.execute("SET SESSION lock_wait_timeout = 60")
                cur.execute("SELECT id FROM information_schema.processlist WHERE db = %s AND id <> CONNECTION_ID()",
                            (name,))
                for (pid,) in cur.fetchall():
                    try:
                        cur.execute(f"KILL {int(pid)}")
                    except Exception:  # noqa: BLE001 - it ended by itself meanwhile
                        pass
                cur.execute(f"DROP DATABASE IF EXISTS {_mysql_ident(name)}")
        finally:
            conn.close()


def _mysql_ident(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"
