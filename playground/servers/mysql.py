"""A MySQL 8.0 server (Ubuntu jammy's ``mysqld`` unpacked by :mod:`playground.servers.mysql_dist`) with row binlogs
and GTIDs."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from pathlib import Path
from typing import Self

from playground.servers import mysql_dist
from playground.servers.base import HOST, free_port
from playground.servers.mariadb import MariaDBServer

MYSQL8_DEFAULT_SETTINGS: dict[str, str] = {
    "binlog-format": "ROW",
    "binlog-row-image": "FULL",
    "binlog-row-metadata": "FULL",
    "gtid-mode": "ON",
    "enforce-gtid-consistency": "ON",
    "server-id": "1",
    "innodb-flush-log-at-trx-commit": "2",  # survives a process kill, not an OS crash (tests)
    "sync-binlog": "0",
    "skip-name-resolve": "ON",
    "mysqlx": "OFF",  # no X protocol port (33060 is shared by every server on the host)
    "performance-schema": "OFF",  # ~400 MB less memory, a faster start
    "innodb-buffer-pool-size": "64M",
    "innodb-redo-log-capacity": "32M",
    "innodb-log-buffer-size": "4M",
}
"""``--name=value`` options of every start; ``settings`` override them."""

_INIT_OPTIONS = ("innodb-redo-log-capacity", "innodb-buffer-pool-size", "performance-schema")
"""The settings passed to ``--initialize`` too (the rest concern the running server only)."""

_ROOT_SQL = (
    "CREATE USER 'root'@'127.0.0.1' IDENTIFIED BY '';\n"
    "GRANT ALL PRIVILEGES ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION;\n"
)
"""``--initialize-insecure`` makes ``root@localhost`` only; with ``skip-name-resolve`` a TCP client from 127.0.0.1 is
not ``localhost``."""

_template_lock = threading.Lock()


def template_dir(root: Path | None = None) -> Path:
    """The initialized data directory every :class:`MySQLServer` copies (made once per install: ``--initialize``
    takes several seconds, a copy a fraction of one)."""
    return (root or mysql_dist.home()) / "template-data"


class MySQLServer(MariaDBServer):
    """A MySQL 8.0 server with binary logging in ROW format, FULL row image and metadata, ``gtid_mode=ON``, user
    ``root`` with an empty password over TCP (``caching_sha2_password``: an empty password needs neither TLS nor an
    RSA key; PyMySQL does the RSA exchange for a user with a password, with ``cryptography``).

    Data, socket, binlogs and error log live under ``base_dir/mysql8``; the data directory is a copy of a template
    initialized once per install (:func:`template_dir`), without its ``auto.cnf``, so every server has its own
    ``server_uuid`` (its GTIDs' source id). The client side (``uri``, ``connect``, ``execute``, databases) is
    :class:`MariaDBServer`'s. ``settings`` override :data:`MYSQL8_DEFAULT_SETTINGS`; ``home`` is the install
    (default :func:`playground.servers.mysql_dist.home`). ``start`` raises ``RuntimeError`` with the reason when
    MySQL 8 is not installed (:func:`playground.servers.mysql_dist.missing`).
    """

    def __init__(
        self, base_dir: Path, *, settings: dict[str, str] | None = None, home: Path | None = None,
        log_bin: bool = True,
    ) -> None:
        self.log_bin = log_bin
        self.home = Path(home) if home is not None else mysql_dist.home()
        self.dir = Path(base_dir) / "mysql8"
        self.data_dir = self.dir / "data"
        self.log_path = self.dir / "mysqld.log"
        self.settings = {**MYSQL8_DEFAULT_SETTINGS, **(settings or {})}
        self.port = free_port()
        self.bin_dir = None
        self._initialized = False

    def __repr__(self) -> str:
        return f"MySQLServer(127.0.0.1:{self.port}, dir={self.dir})"

    @property
    def socket_path(self) -> Path:
        return self.dir / "mysqld.sock"

    def _env(self) -> dict[str, str]:
        return {**os.environ, "LD_LIBRARY_PATH": mysql_dist.library_path(self.home)}

    def _common_args(self) -> list[str]:
        usr = self.home / "usr"
        return ["--no-defaults", "--user=root", f"--basedir={usr}", f"--lc-messages-dir={usr / 'share' / 'mysql'}",
                f"--character-sets-dir={usr / 'share' / 'mysql' / 'charsets'}",
                f"--plugin-dir={usr / 'lib' / 'mysql' / 'plugin'}"]

    def _make_template(self, template: Path) -> None:
        """``mysqld --initialize-insecure`` into a fresh directory beside ``template``, renamed into place when done
        (another process making it at the same time loses the rename and uses the winner's)."""
        work = template.parent / f".template-{os.getpid()}-{threading.get_ident()}"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        init_sql = work / "init.sql"
        init_sql.write_text(_ROOT_SQL)
        (work / "tmp").mkdir()
        with open(self.log_path, "ab") as out:
            res = subprocess.run(
                [str(mysql_dist.mysqld(self.home)), *self._common_args(), "--initialize-insecure",
                 f"--datadir={work / 'data'}", f"--tmpdir={work / 'tmp'}", f"--init-file={init_sql}",
                 *(f"--{k}={v}" for k, v in self.settings.items() if k in _INIT_OPTIONS)],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=self._env(), cwd=work,
            )  # fmt: skip
        if res.returncode != 0:
            shutil.rmtree(work, ignore_errors=True)
            self._fail(f"mysqld --initialize-insecure failed with code {res.returncode}")
        (work / "data" / "auto.cnf").unlink(missing_ok=True)  # (each copy makes its own server_uuid)
        try:
            (work / "data").rename(template)
        except OSError:
            if not template.is_dir():
                raise
        finally:
            shutil.rmtree(work, ignore_errors=True)

    def start(self, timeout: float = 60) -> Self:
        """Copy the template data directory on first start (making the template if needed), start ``mysqld``, wait
        until it accepts logins."""
        if self.running:
            return self
        why = mysql_dist.missing(self.home)
        if why is not None:
            raise RuntimeError(why)
        if not self._initialized:
            self.dir.mkdir(parents=True, exist_ok=True)
            self.tmp_dir.mkdir(exist_ok=True)
            if not self.data_dir.exists():
                template = template_dir(self.home)
                with _template_lock:
                    if not template.is_dir():
                        self._make_template(template)
                shutil.copytree(template, self.data_dir)
            self._initialized = True
        self._start_process(timeout)
        return self

    def _launch(self) -> subprocess.Popen[bytes]:
        argv = [
            str(mysql_dist.mysqld(self.home)),
            *self._common_args(),
            f"--datadir={self.data_dir}",
            f"--port={self.port}",
            f"--bind-address={HOST}",
            f"--socket={self.socket_path}",
            f"--pid-file={self.dir / 'mysqld.pid'}",
            f"--log-error={self.log_path}",
            f"--tmpdir={self.tmp_dir}",
            f"--secure-file-priv={self.dir / 'files'}",  # (the package's default, /var/lib/mysql-files, is absent)
            *([f"--log-bin={self.dir / 'binlog' / 'mysql-bin'}"] if self.log_bin else ["--skip-log-bin"]),
            *(f"--{k}={v}" for k, v in self.settings.items()),
        ]
        (self.dir / "binlog").mkdir(exist_ok=True)
        (self.dir / "files").mkdir(exist_ok=True)
        return self._popen(argv, cwd=self.dir, env=self._env())

    def replicate_from(self, primary: MariaDBServer, timeout: float = 30) -> Self:
        """Make this (started) server a GTID replica of ``primary`` (``SOURCE_AUTO_POSITION = 1``, ``START REPLICA``)
        and wait until it has applied the primary's executed GTID set as of now."""
        self.execute(f"CHANGE REPLICATION SOURCE TO SOURCE_HOST = '{HOST}', SOURCE_PORT = {primary.port}, "
                     f"SOURCE_USER = 'root', SOURCE_PASSWORD = '', SOURCE_AUTO_POSITION = 1, "
                     f"SOURCE_CONNECT_RETRY = 1, GET_SOURCE_PUBLIC_KEY = 1")
        self.execute("START REPLICA")
        self.catch_up(primary, timeout)
        return self

    def catch_up(self, primary: MariaDBServer, timeout: float = 30) -> None:
        """Wait until this replica has applied every transaction ``primary`` has executed so far."""
        [(gtids,)] = primary.execute("SELECT @@GLOBAL.gtid_executed") or [("",)]
        [(res,)] = self.execute("SELECT WAIT_FOR_EXECUTED_GTID_SET(%s, %s)", params=(gtids, timeout)) or [(1,)]
        if res != 0:
            status = self.execute("SHOW REPLICA STATUS")
            raise RuntimeError(f"replica {self!r} did not reach {gtids} of {primary!r} in {timeout}s: {status}")

    def promote(self) -> None:
        """Stop replicating and forget the primary (``STOP REPLICA; RESET REPLICA ALL``): this server takes writes of
        its own from now on, under its own ``server_uuid``."""
        self.execute("STOP REPLICA")
        self.execute("RESET REPLICA ALL")

    @classmethod
    def replica_of(cls, primary: MariaDBServer, base_dir: Path, *, server_id: int = 2) -> MySQLServer:
        """A new server under ``base_dir`` with ``log-replica-updates`` and its own ``server-id``, started and
        replicating from ``primary`` by GTID auto-position (:meth:`replicate_from`)."""
        home = primary.home if isinstance(primary, MySQLServer) else None
        replica = cls(base_dir, settings={**primary.settings, "server-id": str(server_id),
                                          "log-replica-updates": "ON"}, home=home)
        return replica.start().replicate_from(primary)
