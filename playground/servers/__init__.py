"""Launchers for real etcd, PostgreSQL, MariaDB, MySQL 8, Kafka-compatible (tansu) and Prometheus servers on 127.0.0.1,
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

from playground.servers.base import HOST, PG_USER, ServerStartError, free_port
from playground.servers.etcd import EtcdServer
from playground.servers.kafka import KafkaServer
from playground.servers.mariadb import MARIADB_DEFAULT_SETTINGS, MariaDBServer
from playground.servers.mysql import MYSQL8_DEFAULT_SETTINGS, MySQLServer
from playground.servers.postgres import PG_DEFAULT_SETTINGS, PostgresServer
from playground.servers.prometheus import PrometheusServer

__all__ = [
    "HOST",
    "PG_USER",
    "EtcdServer",
    "KafkaServer",
    "MARIADB_DEFAULT_SETTINGS",
    "MariaDBServer",
    "MYSQL8_DEFAULT_SETTINGS",
    "MySQLServer",
    "PG_DEFAULT_SETTINGS",
    "PostgresServer",
    "PrometheusServer",
    "ServerStartError",
    "free_port",
]
