"""The SQL sink's connection to its target: URI parameters, the SQLAlchemy engine per dialect and its
connect hooks (session settings, the initial copy's unchecked foreign keys), and the shared PyMySQL TLS
context. Functions of :class:`sinks.sql.sink.SQLSink` (they read its URI, dialect and bulk-load flag).
"""

from __future__ import annotations

import logging
import os
import threading
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine

from cdc.errors import InvalidURI
from sinks.sql.errors import is_db_error
from sinks.sql.mysql_tls import PARAMS as MYSQL_TLS_PARAMS
from sinks.sql.mysql_tls import tls_connect_args

if TYPE_CHECKING:
    from sinks.sql.sink import SQLSink

log = logging.getLogger(__name__)

DIALECTS = {"mysql": "mysql", "mariadb": "mysql", "postgresql": "postgresql", "postgres": "postgresql",
            "sqlite": "sqlite"}
PARAMS = {
    "mysql": ("connect-timeout", *MYSQL_TLS_PARAMS),
    "postgresql": ("connect-timeout", "sslmode", "sslrootcert", "sslcert", "sslkey"),
    "sqlite": ("busy-timeout",),
}
_MYSQL_SQL_MODE = ("STRICT_TRANS_TABLES,STRICT_ALL_TABLES,NO_ZERO_IN_DATE,NO_ZERO_DATE,"
                   "ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION")


def _timeout(sink: SQLSink, name: str, default: float) -> float:
    raw = sink._uri.params.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise InvalidURI(f"sink URI {sink._uri.redacted()!r}: {name} must be a number of seconds") from None
    if value <= 0:
        raise InvalidURI(f"sink URI {sink._uri.redacted()!r}: {name} must be positive")
    return value


def make_engine(sink: SQLSink) -> Engine:
    u = sink._uri
    if sink.dialect == "sqlite":
        busy = _timeout(sink, "busy-timeout", 30.0)
        engine = sa.create_engine(sa.URL.create("sqlite", database=u.path), pool_pre_ping=True,
                                  connect_args={"timeout": busy})

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn: Any, _record: Any) -> None:
            dbapi_conn.isolation_level = None  # we emit BEGIN ourselves (transactional DDL, IMMEDIATE)
            cur = dbapi_conn.cursor()
            try:
                cur.execute("PRAGMA journal_mode=WAL")
                cur.execute(f"PRAGMA busy_timeout={int(busy * 1000)}")
                # SQLite enforces foreign keys (and runs their ON DELETE/UPDATE actions) only when asked
                cur.execute("PRAGMA foreign_keys=OFF" if sink._bulk_load else "PRAGMA foreign_keys=ON")
            finally:
                cur.close()

        @event.listens_for(engine, "begin")
        def _on_begin(conn: Connection) -> None:
            conn.exec_driver_sql("BEGIN IMMEDIATE")  # take the write lock now: no upgrade deadlock

        return engine
    timeout = int(_timeout(sink, "connect-timeout", 10.0))
    if sink.dialect == "mysql":
        tls = tls_connect_args(u.params, u.redacted())
        url = sa.URL.create("mysql+pymysql", username=u.user, password=u.password, host=u.host,
                            port=u.port or 3306, database=u.path, query={"charset": "utf8mb4"})
        init = f"SET time_zone = '+00:00', sql_mode = '{_MYSQL_SQL_MODE}'"
        # pool_reset_on_return=None: every checkout ends its own transaction (write commits or rolls
        # back, Connection.close rolls back what it began), so the pool's ROLLBACK per return was a
        # wasted round trip per write.
        engine = sa.create_engine(url, pool_pre_ping=True, pool_reset_on_return=None,
                                  isolation_level="READ COMMITTED",
                                  connect_args={"connect_timeout": timeout, "init_command": init, **tls})

        @event.listens_for(engine, "do_connect")
        def _do_connect(_dialect: Any, _record: Any, cargs: Any, cparams: Any) -> Any:
            conn = _pymysql_connection_class()(*cargs, **cparams)
            if sink._bulk_load:
                with conn.cursor() as cur:
                    cur.execute("SET SESSION foreign_key_checks = 0")
            return conn

        return engine
    ssl = {k: v for k, v in u.params.items() if k.startswith("ssl")}
    url = sa.URL.create("postgresql+psycopg2", username=u.user, password=u.password, host=u.host,
                        port=u.port or 5432, database=u.path or None)
    engine = sa.create_engine(url, pool_pre_ping=True, pool_reset_on_return=None, connect_args={
        "connect_timeout": timeout, "application_name": f"tidewater-sink-{os.getpid()}", "options": "-c timezone=UTC", **ssl})

    @event.listens_for(engine, "connect")
    def _on_pg_connect(dbapi_conn: Any, _record: Any) -> None:
        if not sink._bulk_load:
            return
        cur = dbapi_conn.cursor()
        try:  # foreign keys are triggers that a replica role skips; it needs a superuser (or the SET grant)
            cur.execute("SET session_replication_role = replica")
            dbapi_conn.commit()
        except Exception as exc:  # noqa: BLE001 - the copy then writes with foreign keys checked
            dbapi_conn.rollback()
            log.info("%s: foreign keys stay checked during the initial copy (%s): a child row copied before "
                     "its parent fails the chunk, naming the constraint", sink._where(), str(exc).strip()[:200])
        finally:
            cur.close()

    return engine


def where(sink: SQLSink) -> str:
    if sink.dialect == "sqlite":
        return f"SQLite database {sink._uri.path!r}"
    kind = "MySQL" if sink.dialect == "mysql" else "PostgreSQL"
    port = sink._uri.port or (3306 if sink.dialect == "mysql" else 5432)
    return f"{kind} at {sink._uri.host}:{port}"


_PYMYSQL_CONNECTION: type | None = None
_PREFERRED_TLS_LOCK = threading.Lock()


def _pymysql_connection_class() -> type:
    """PyMySQL's ``Connection`` sharing one TLS context per process for its default mode (TLS when the
    server offers it, certificate not verified). PyMySQL builds that context for every connection, which
    loads the system CA store: ~27 ms per connection here, 1.3 % of a catch-up profile into MariaDB. The
    context is configured once and never changed afterwards, so sharing it is safe; connections with
    explicit TLS options still get their own."""
    global _PYMYSQL_CONNECTION
    if _PYMYSQL_CONNECTION is None:
        import pymysql.connections

        class _Connection(pymysql.connections.Connection):  # type: ignore[misc]
            _preferred_tls: Any = None

            def _create_ssl_ctx(self, sslp: Any) -> Any:
                if sslp:
                    return super()._create_ssl_ctx(sslp)
                with _PREFERRED_TLS_LOCK:
                    if _Connection._preferred_tls is None:
                        _Connection._preferred_tls = super()._create_ssl_ctx(sslp)
                    return _Connection._preferred_tls

        _PYMYSQL_CONNECTION = _Connection
    return _PYMYSQL_CONNECTION


def abandon(sink: SQLSink, conn: Connection, trans: Any, exc: BaseException) -> None:
    """A downstream transaction failed with ``exc``: drop the connection when the failure says it is broken (its
    server rolls back), else roll back (dropping it if the rollback itself fails). The caller re-raises."""
    if is_db_error(exc) and sink._classify(exc)[1]:
        conn.invalidate(exc if isinstance(exc, Exception) else None)
        return
    try:
        trans.rollback()
    except Exception:  # the connection is gone: the server rolls back
        conn.invalidate()
