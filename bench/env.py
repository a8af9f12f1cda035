"""The servers of one benchmark run, all on 127.0.0.1 under one work directory.

* etcd (the ``cdc server``'s meta store);
* the upstream PostgreSQL 18 (``wal_level=logical``, ``synchronous_commit=on``, ``fsync=off``; autovacuum
  off so that no background writes land between the workload's last commit and the measurement;
  ``max_wal_size`` raised so that checkpoints do not interrupt the writes);
* a second PostgreSQL: the native logical-replication subscriber *and* the target of Tidewater's
  ``postgresql://`` sink (one database each per scenario);
* MariaDB (only when a ``mariadb`` sink is asked for), started with ``local_infile`` for the write ceiling;
* one ``cdc server`` (``playground.cluster.CdcServer``).

:class:`BenchEnv` is a context manager: everything it started is stopped on exit (capture first), also
when the body raises. Not thread-safe: drive it from one thread.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from bench.consumers import Around
from playground.cluster import CdcServer
from playground.servers import EtcdServer, MariaDBServer, PostgresServer

SINK_KINDS = ("blackhole", "sqlite", "mariadb", "postgresql")

UPSTREAM_SETTINGS = {
    # WAL reaches logical walsenders only once flushed: with synchronous_commit=off that waits for the WAL
    # writer (up to 3 x wal_writer_delay), which would add to every consumer's lag. fsync stays off.
    "synchronous_commit": "on",
    "autovacuum": "off",
    "max_wal_size": "16GB",
    "checkpoint_timeout": "1h",
    "shared_buffers": "512MB",
}
SUBSCRIBER_SETTINGS = {
    "autovacuum": "off",
    "max_wal_size": "16GB",
    "checkpoint_timeout": "1h",
    "shared_buffers": "512MB",
    "max_logical_replication_workers": "8",
    "max_worker_processes": "16",
}


class BenchEnv:
    """Starts the servers the asked sinks need; ``sink_uri`` / ``prepare_target`` give each scenario its
    own target database (or SQLite file)."""

    def __init__(self, work_dir: Path, sinks: list[str], server_config: str = "", native: bool = True) -> None:
        self.work = Path(work_dir)
        self.sinks = sinks
        self.server_config = server_config
        self.native = native
        self.etcd: EtcdServer | None = None
        self.upstream: PostgresServer | None = None
        self.subscriber: PostgresServer | None = None
        self.mariadb: MariaDBServer | None = None
        self.cdc: CdcServer | None = None
        self._stack = contextlib.ExitStack()

    # ---- lifecycle ----------------------------------------------------------------------------------
    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self._stack.close()

    def start(self) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        self.etcd = EtcdServer(self.work / "etcd")
        self._stack.callback(self.etcd.stop)
        self.etcd.start()
        self.upstream = PostgresServer(self.work / "pg-upstream", settings=UPSTREAM_SETTINGS)
        self._stack.callback(self.upstream.stop)
        self.upstream.start()
        if self.native or "postgresql" in self.sinks:
            self.subscriber = PostgresServer(self.work / "pg-target", settings=SUBSCRIBER_SETTINGS)
            self._stack.callback(self.subscriber.stop)
            self.subscriber.start()
        if "mariadb" in self.sinks:
            self.mariadb = MariaDBServer(self.work / "mariadb-target", settings={"local-infile": "ON"})
            self._stack.callback(self.mariadb.stop)
            self.mariadb.start()
        self.start_cdc()

    def start_cdc(self) -> None:
        """The one ``cdc server`` under test (with ``server_config`` as its config file), stopped with the rest."""
        extra: list[str] = []
        if self.server_config:
            cfg = self.work / "server.toml"
            cfg.write_text(self.server_config)
            extra = ["--config", str(cfg)]
        self.cdc = CdcServer(self.etcd.url, self.work / "cdc", cluster_id="bench", extra_args=extra)
        self._stack.callback(self.cdc.terminate)
        self.cdc.start()

    @property
    def capture_pid(self) -> int:
        assert self.cdc is not None and self.cdc.proc is not None
        return self.cdc.proc.pid

    def pids(self) -> dict[str, int]:
        out: dict[str, int] = {"cdc server": self.capture_pid}
        for name, server in (("etcd", self.etcd), ("upstream", self.upstream), ("subscriber", self.subscriber),
                             ("mariadb", self.mariadb)):
            if server is not None and server.pid is not None:
                out[name] = server.pid
        return out

    def target_server_pid(self, kind: str) -> int | None:
        """The server process of the ``kind`` target (postgresql: the subscriber's postmaster, mariadb: mariadbd);
        None for targets without a server (sqlite, blackhole) or a server not running."""
        server = {"postgresql": self.subscriber, "mariadb": self.mariadb}.get(kind)
        return server.pid if server is not None else None

    def around(self, kind: str) -> Around:
        """The servers measured around a Tidewater run into a ``kind`` target besides the capture: the target server
        (none for blackhole and sqlite) and etcd, the capture's meta store."""
        return Around(target=self.target_server_pid(kind), meta=self.etcd.pid if self.etcd is not None else None)

    # ---- targets ------------------------------------------------------------------------------------
    def target_db(self, scenario: str) -> str:
        return f"tw_{scenario}"

    def sqlite_path(self, scenario: str) -> Path:
        return self.work / "targets" / f"{scenario}.db"

    def prepare_target(self, kind: str, scenario: str) -> None:
        """Create the empty target database of ``scenario`` for a sink of ``kind``."""
        if kind == "sqlite":
            path = self.sqlite_path(scenario)
            path.parent.mkdir(parents=True, exist_ok=True)
            for suffix in ("", "-wal", "-shm", "-journal"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(f"{path}{suffix}")
        elif kind == "mariadb":
            assert self.mariadb is not None
            self.mariadb.drop_database(self.target_db(scenario))
            self.mariadb.create_database(self.target_db(scenario))
        elif kind == "postgresql":
            assert self.subscriber is not None
            self.subscriber.drop_database(self.target_db(scenario))
            self.subscriber.create_database(self.target_db(scenario))
        elif kind != "blackhole":
            raise ValueError(f"unknown sink {kind!r} (one of {', '.join(SINK_KINDS)})")

    def drop_target(self, kind: str, scenario: str) -> None:
        with contextlib.suppress(Exception):
            if kind == "sqlite":
                self.prepare_target(kind, scenario)  # removes the file
            elif kind == "mariadb" and self.mariadb is not None:
                self.mariadb.drop_database(self.target_db(scenario))
            elif kind == "postgresql" and self.subscriber is not None:
                self.subscriber.drop_database(self.target_db(scenario))

    def sink_uri(self, kind: str, scenario: str) -> str:
        if kind == "blackhole":
            return "blackhole://"
        if kind == "sqlite":
            return f"sqlite:///{self.sqlite_path(scenario)}"
        if kind == "mariadb":
            assert self.mariadb is not None
            return self.mariadb.uri(self.target_db(scenario))
        if kind == "postgresql":
            assert self.subscriber is not None
            return self.subscriber.uri(self.target_db(scenario))
        raise ValueError(f"unknown sink {kind!r}")

    def target_connection(self, kind: str, scenario: str, **kwargs: Any) -> Any:
        """A DB-API connection to the target of ``scenario`` (autocommit off for sqlite; the caller closes)."""
        if kind == "sqlite":
            import sqlite3

            return sqlite3.connect(self.sqlite_path(scenario), isolation_level=None, timeout=60)
        if kind == "mariadb":
            import pymysql

            assert self.mariadb is not None
            return pymysql.connect(host="127.0.0.1", port=self.mariadb.port, user="root",
                                   database=self.target_db(scenario), charset="utf8mb4", **kwargs)
        if kind == "postgresql":
            assert self.subscriber is not None
            return self.subscriber.connect(self.target_db(scenario))
        raise ValueError(f"no target connection for {kind!r}")
