"""One SQL target: the sink URI and its parameters, the SQLAlchemy engine per dialect with its connect hooks
(session settings, the initial copy's unchecked foreign keys), the shared PyMySQL TLS context, the statement
builder of the server's flavour, the statement pipeline of the sink's connection, the routing of upstream names to
target tables, driver errors as this target's classified ``TidewaterError`` (:mod:`sinks.sql.dialect.errors`), and
the one frame of a transaction on the target (:meth:`Target.transaction`: begin, fence, commit, abandon, wrap).

Threading: one caller thread at a time (the sink's); ``close`` may be called from any thread once the caller is
done. The engine's pool keeps the connection between calls; ``close`` stops the pipeline's worker and disposes of
the engine.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine

from cdc.errors import InvalidURI, SinkError, TidewaterError
from cdc.events import TableName
from cdc.uri import ParsedURI, parse_sink_uri
from sinks.sql.dialect.errors import classify, is_db_error, wrap
from sinks.sql.dialect.statements import LOCAL_INFILE_NAME, Statements
from sinks.sql.dialect.typemap import mysql_collation
from sinks.sql.target.mysql_tls import PARAMS as MYSQL_TLS_PARAMS
from sinks.sql.target.mysql_tls import tls_connect_args
from sinks.sql.target.pipeline import Pipeline

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
CONCURRENTLY_CREATED = ("23505", "42P06", "42P07", "42710")
"""SQLSTATEs of an ``IF NOT EXISTS`` statement that met an object another session created at the same moment:
unique violation (``pg_type``), duplicate schema, table, type."""
IDLE_PING_SECONDS = 1.0
"""A pooled MySQL or PostgreSQL connection is pinged at checkout only when it sat in the pool longer than this
(:func:`ping_when_idle`)."""


class Target:
    """The target of one SQL sink (see the module docstring).

    ``dialect`` is ``mysql`` (MySQL and MariaDB), ``postgresql`` or ``sqlite``; ``engine`` the SQLAlchemy engine;
    ``where`` names the target in messages (never its password); ``pipeline`` runs the statements of a write
    (:class:`Pipeline`: a worker thread on MySQL and PostgreSQL). ``bulk_load``, set before the first connection,
    makes the connect hooks leave foreign keys unchecked where the target allows it (the initial copy).
    ``pg_temp_ok``: may this session create the TEMP staging tables of COPY upserts (PostgreSQL)? :meth:`check`
    asks the server; None (never checked) counts as yes. ``mysql_collation``: the collation of created tables,
    known once :meth:`statements` has seen the server.
    """

    def __init__(self, uri: str) -> None:
        self.uri: ParsedURI = parse_sink_uri(uri)
        if self.uri.scheme not in DIALECTS:
            raise InvalidURI(f"sink URI scheme {self.uri.scheme!r} is not an SQL sink")
        self.dialect = DIALECTS[self.uri.scheme]
        unknown = sorted(set(self.uri.params) - set(PARAMS[self.dialect]))
        if unknown:
            raise InvalidURI(f"sink URI {self.uri.redacted()!r}: unknown parameter(s) {', '.join(unknown)} "
                             f"(accepted: {', '.join(PARAMS[self.dialect])})")
        self.where = _where(self.dialect, self.uri)
        self.bulk_load = False
        self.engine: Engine = self._make_engine()
        self.mysql_collation = "utf8mb4_bin"
        self.pg_temp_ok: bool | None = None
        # statements execute in a worker thread while the next one is built (not SQLite: in-process work)
        self.pipeline = Pipeline(threaded=self.dialect != "sqlite")
        self.closed = False
        self._stmts: Statements | None = None

    # ---- naming ------------------------------------------------------------------------------------------
    def target_parts(self, table: TableName) -> tuple[str | None, str]:
        """(target schema or None, target table) of upstream ``table``."""
        if self.dialect == "postgresql":
            return table.schema, table.table
        return None, table.table

    def target_name(self, table: TableName) -> str:
        """``table`` (MySQL, SQLite: the upstream schema is dropped) or ``schema.table`` (PostgreSQL)."""
        schema, name = self.target_parts(table)
        return f"{schema}.{name}" if schema else name

    # ---- the server --------------------------------------------------------------------------------------
    def statements(self) -> Statements:
        """The statement builder of this dialect and server flavour (MariaDB or MySQL: known once connected; it
        also sets ``mysql_collation``)."""
        if self._stmts is None:
            d = self.engine.dialect
            mariadb = bool(getattr(d, "is_mariadb", False))
            if self.dialect == "mysql":
                version = tuple(getattr(d, "server_version_info", None) or (0,))
                self.mysql_collation = mysql_collation(mariadb, version)
            self._stmts = Statements(self.dialect, d.identifier_preparer, mariadb=mariadb)
        return self._stmts

    def check(self) -> None:
        """Connect once; SinkUnavailable if the server cannot be reached, SinkError (with the fix) if the
        database is missing, access is denied or a SQLite file cannot be opened for writing."""
        self.check_open()
        with self.errors(), self.engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
            self.statements()
            if self.dialect == "postgresql":
                self.pg_temp_ok = bool(conn.exec_driver_sql(
                    "SELECT has_database_privilege(current_database(), 'TEMP')").scalar())
                if not self.pg_temp_ok:
                    log.info("%s: no TEMP privilege, keyed upserts use multi-row INSERT instead of COPY",
                             self.where)

    def run_ddl(self, conn: Connection, sql: str) -> None:
        """Run one ``... IF NOT EXISTS`` statement. PostgreSQL can still report a duplicate when another
        session creates the same object concurrently (other spans of the changefeed, or the copy's tasks writing
        chunks of one new table: ``type "t" already exists``, 42710, seen in the full suite): that is success."""
        try:
            conn.exec_driver_sql(sql, ())
        except sa.exc.DBAPIError as exc:
            if getattr(exc.orig, "pgcode", None) not in CONCURRENTLY_CREATED:
                raise
            log.info("%s already created concurrently: %s", self.where, " ".join(str(exc.orig).split()))

    @contextlib.contextmanager
    def transaction(self, label: str | Callable[[], str | None] | None = None, *,
                    fence: Callable[[], None] | None = None) -> Iterator[Connection]:
        """One transaction of this (open) target on a connection of the engine's pool: yields the connection with
        the transaction begun. When the body returns, ``fence()`` runs and then the transaction commits, unless the
        body ended it itself (``conn.rollback()``: nothing of it stays; the frame then neither fences nor commits).
        When the body, the fence or the commit raises, the transaction is abandoned (rolled back, or the connection
        dropped when the error says it is broken: its server rolls back) and the error raised: a driver error as this
        target's classified ``TidewaterError`` naming ``label`` (:meth:`wrap`; a callable is asked then, for a
        table known only inside the body), anything else as it is. Raises ``SinkError`` on a closed target."""
        self.check_open()
        with self._driver_errors(label), self.engine.connect() as conn, self._frame(conn, fence):
            yield conn

    @contextlib.contextmanager
    def frame(self, conn: Connection, label: str | Callable[[], str | None] | None = None, *,
              fence: Callable[[], None] | None = None) -> Iterator[None]:
        """:meth:`transaction`'s frame on a connection the caller holds (an apply worker's own,
        ``sinks.sql.target.held``): begin, fence and commit, abandon on an error (``conn`` is then invalidated when the
        error says it is broken: :attr:`Connection.invalidated`), driver errors raised as classified errors naming
        ``label``. The caller keeps ``conn``."""
        self.check_open()
        with self._driver_errors(label), self._frame(conn, fence):
            yield

    @contextlib.contextmanager
    def _frame(self, conn: Connection, fence: Callable[[], None] | None) -> Iterator[None]:
        trans = conn.begin()
        try:
            yield
            if trans.is_active:
                if fence is not None:
                    fence()
                trans.commit()
        except BaseException as exc:
            self._abandon(conn, trans, exc)
            raise

    def _abandon(self, conn: Connection, trans: Any, exc: BaseException) -> None:
        """A transaction failed with ``exc``: drop the connection when the failure says it is broken (its server rolls
        back), and with it every connection idle in the pool (they were opened before it and most likely ended with
        it: a server restart, a failover; pooled connections are not pinged while the sink is busy,
        :func:`ping_when_idle`), else roll back (dropping it if the rollback itself fails). The caller re-raises."""
        if is_db_error(exc) and self.classify(exc)[1]:
            conn.invalidate(exc if isinstance(exc, Exception) else None)
            self.engine.dispose()  # (connections checked out elsewhere, held by apply workers, stay theirs)
            return
        try:
            trans.rollback()
        except Exception:  # the connection is gone: the server rolls back
            conn.invalidate()

    # ---- lifetime ----------------------------------------------------------------------------------------
    def check_open(self) -> None:
        if self.closed:
            raise SinkError(f"sink {self.uri.redacted()} is closed")

    def close(self) -> None:
        """Stop the pipeline's worker and dispose of the engine (the first call; later ones do nothing)."""
        if not self.closed:
            self.closed = True
            self.pipeline.close()
            self.engine.dispose()

    # ---- errors ------------------------------------------------------------------------------------------
    def classify(self, exc: BaseException) -> tuple[bool, bool, Any]:
        """(retryable, connection lost, driver exception): see :func:`sinks.sql.dialect.errors.classify`."""
        return classify(self.dialect, exc)

    def wrap(self, exc: BaseException, table: str | None) -> TidewaterError:
        """The driver error ``exc`` as this target's classified error, naming target table ``table``."""
        return wrap(self.dialect, self.uri, self.where, exc, table)

    @contextlib.contextmanager
    def errors(self) -> Iterator[None]:
        """A driver error inside is raised as this target's classified ``TidewaterError`` (:meth:`wrap`); a
        ``TidewaterError`` passes as it is."""
        try:
            yield
        except TidewaterError:
            raise
        except Exception as exc:
            raise self.wrap(exc, None) from exc

    def guarded(self, fn: Callable[[], Any], label: str | None) -> Any:
        """``fn()`` on an open target; a driver error is raised as :meth:`wrap` makes it, naming target table
        ``label``, as :meth:`transaction` does (a ``TidewaterError``, or any other exception, passes as it is)."""
        self.check_open()
        with self._driver_errors(label):
            return fn()

    @contextlib.contextmanager
    def _driver_errors(self, label: str | Callable[[], str | None] | None) -> Iterator[None]:
        """A driver error inside is raised as :meth:`wrap` makes it, naming ``label`` (a callable: asked then); a
        ``TidewaterError``, or any other exception, passes as it is."""
        try:
            yield
        except BaseException as exc:
            if isinstance(exc, TidewaterError) or not is_db_error(exc):
                raise
            raise self.wrap(exc, label() if callable(label) else label) from exc

    # ---- the engine --------------------------------------------------------------------------------------
    def _timeout(self, name: str, default: float) -> float:
        raw = self.uri.params.get(name)
        if raw is None:
            return default
        try:
            value = float(raw)
        except ValueError:
            raise InvalidURI(f"sink URI {self.uri.redacted()!r}: {name} must be a number of seconds") from None
        if value <= 0:
            raise InvalidURI(f"sink URI {self.uri.redacted()!r}: {name} must be positive")
        return value

    def _make_engine(self) -> Engine:
        u = self.uri
        target = self  # the connect hooks read its bulk_load flag at each new connection
        if self.dialect == "sqlite":
            busy = self._timeout("busy-timeout", 30.0)
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
                    cur.execute("PRAGMA foreign_keys=OFF" if target.bulk_load else "PRAGMA foreign_keys=ON")
                finally:
                    cur.close()

            @event.listens_for(engine, "begin")
            def _on_begin(conn: Connection) -> None:
                conn.exec_driver_sql("BEGIN IMMEDIATE")  # take the write lock now: no upgrade deadlock

            return engine
        timeout = int(self._timeout("connect-timeout", 10.0))
        if self.dialect == "mysql":
            tls = tls_connect_args(u.params, u.redacted())
            url = sa.URL.create("mysql+pymysql", username=u.user, password=u.password, host=u.host,
                                port=u.port or 3306, database=u.path, query={"charset": "utf8mb4"})
            init = f"SET time_zone = '+00:00', sql_mode = '{_MYSQL_SQL_MODE}'"
            # pool_reset_on_return=None: every checkout ends its own transaction (write commits or rolls
            # back, Connection.close rolls back what it began), so the pool's ROLLBACK per return was a
            # wasted round trip per write. No pool_pre_ping: ping_when_idle.
            engine = sa.create_engine(url, pool_reset_on_return=None,
                                      isolation_level="READ COMMITTED",
                                      connect_args={"connect_timeout": timeout, "init_command": init,
                                                    "local_infile": True, **tls})

            @event.listens_for(engine, "do_connect")
            def _do_connect(_dialect: Any, _record: Any, cargs: Any, cparams: Any) -> Any:
                conn = pymysql_connection_class()(*cargs, **cparams)
                if target.bulk_load:
                    with conn.cursor() as cur:
                        cur.execute("SET SESSION foreign_key_checks = 0")
                return conn

            ping_when_idle(engine)
            return engine
        ssl = {k: v for k, v in u.params.items() if k.startswith("ssl")}
        url = sa.URL.create("postgresql+psycopg2", username=u.user, password=u.password, host=u.host,
                            port=u.port or 5432, database=u.path or None)
        engine = sa.create_engine(url, pool_reset_on_return=None, connect_args={
            "connect_timeout": timeout, "application_name": f"tidewater-sink-{os.getpid()}",
            "options": "-c timezone=UTC", **ssl})

        @event.listens_for(engine, "connect")
        def _on_pg_connect(dbapi_conn: Any, _record: Any) -> None:
            if not target.bulk_load:
                return
            cur = dbapi_conn.cursor()
            try:  # foreign keys are triggers that a replica role skips; it needs a superuser (or the SET grant)
                cur.execute("SET session_replication_role = replica")
                dbapi_conn.commit()
            except Exception as exc:  # noqa: BLE001 - the copy then writes with foreign keys checked
                dbapi_conn.rollback()
                log.info("%s: foreign keys stay checked during the initial copy (%s): a child row copied before "
                         "its parent fails the chunk, naming the constraint", target.where, str(exc).strip()[:200])
            finally:
                cur.close()

        ping_when_idle(engine)
        return engine


def ping_when_idle(engine: Engine) -> None:
    """Ping a pooled connection at checkout only when it was checked in more than :data:`IDLE_PING_SECONDS` ago (instead of
    ``pool_pre_ping``, which pings at every checkout); a connection whose ping fails is replaced by a new one (the
    pool's ``DisconnectionError`` handling).

    Why: a write checks its connection out once, so the pre-ping was one more round trip per write, on PostgreSQL
    two (psycopg2's ping switches autocommit on and back, which makes the next ``BEGIN`` send ``SET
    default_transaction_isolation`` first), on a serial chain whose server shares the host's cores; writes of
    single-row transactions paid it per few rows. A connection that a busy stream returned a moment ago is in use
    again before a restart or an idle timeout could end it unnoticed; if one did, the write fails with a
    connection-lost error, which is retryable (``SinkUnavailable``) like any write whose connection breaks mid-way,
    and the connection is dropped (:meth:`Target._abandon`). Idle connections keep the pre-ping's guarantee."""
    dialect = engine.dialect

    @event.listens_for(engine, "checkin")
    def _on_checkin(_dbapi_conn: Any, record: Any) -> None:
        record.info["tidewater_checkin"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _on_checkout(dbapi_conn: Any, record: Any, _proxy: Any) -> None:
        since = record.info.get("tidewater_checkin")
        if since is None or time.monotonic() - since <= IDLE_PING_SECONDS:
            return  # a new connection, or one in use a moment ago
        record.info.pop("tidewater_checkin", None)  # (a replacement connection starts without it)
        try:
            dialect.do_ping(dbapi_conn)
        except Exception as exc:  # noqa: BLE001 - any failed ping: the pool connects a new one
            raise sa.exc.DisconnectionError(f"ping of an idle connection failed: {exc}") from exc


def _where(dialect: str, u: ParsedURI) -> str:
    if dialect == "sqlite":
        return f"SQLite database {u.path!r}"
    kind = "MySQL" if dialect == "mysql" else "PostgreSQL"
    port = u.port or (3306 if dialect == "mysql" else 5432)
    return f"{kind} at {u.host}:{port}"


_PYMYSQL_CONNECTION: type | None = None
_PREFERRED_TLS_LOCK = threading.Lock()
_INFILE_PACKET = 1 << 20
_INFILE_NAME = LOCAL_INFILE_NAME.encode()


def pymysql_connection_class() -> type:
    """PyMySQL's ``Connection`` with two changes.

    - One TLS context per process for its default mode (TLS when the server offers it, certificate not verified).
      PyMySQL builds that context for every connection, which loads the system CA store: ~27 ms per connection
      here, 1.3 % of a catch-up profile into MariaDB. The context is configured once and never changed
      afterwards, so sharing it is safe; connections with explicit TLS options still get their own.
    - ``load_local(cursor, sql, data)``: ``LOAD DATA LOCAL INFILE`` from memory. Whatever a server asks for (in
      answer to any statement, buffered or not), the connection never reads a file of this machine: it sends
      ``data`` only while ``load_local`` runs and only for the file name
      :data:`sinks.sql.dialect.statements.LOCAL_INFILE_NAME`, and answers every other request with no data and an
      ``OperationalError`` (2000, "refused to send LOCAL INFILE ..."). PyMySQL's own handler (``local_infile=True``)
      would open any path the server names."""
    global _PYMYSQL_CONNECTION
    if _PYMYSQL_CONNECTION is None:
        import pymysql.connections
        import pymysql.err
        import pymysql.protocol

        class _Result(pymysql.connections.MySQLResult):  # type: ignore[misc]
            def _read_load_local_packet(self, first_packet: Any) -> None:
                conn = self.connection
                wanted = pymysql.protocol.LoadLocalPacketWrapper(first_packet).filename
                data = conn.infile if wanted == _INFILE_NAME else None
                try:
                    if data is not None:
                        view = memoryview(data)
                        for i in range(0, len(view), _INFILE_PACKET):
                            conn.write_packet(view[i:i + _INFILE_PACKET])
                finally:
                    conn.write_packet(b"")  # end of data (an empty file when refused)
                    ok_packet = conn._read_packet()  # raises the server's error
                if data is None:
                    raise pymysql.err.OperationalError(2000, f"refused to send LOCAL INFILE {wanted!r}")
                if not ok_packet.is_ok_packet():
                    raise pymysql.err.OperationalError(2014, "Commands Out of Sync")
                self._read_ok_packet(ok_packet)

        class _Connection(pymysql.connections.Connection):  # type: ignore[misc]
            _preferred_tls: Any = None
            infile: bytes | None = None  # the data of the load_local() running now

            def load_local(self, cursor: Any, sql: str, data: bytes) -> int:
                """Run ``sql``, a ``LOAD DATA LOCAL INFILE`` of :data:`LOCAL_INFILE_NAME` (no parameters), sending
                ``data`` as that file; return the rows loaded (``cursor.warning_count``: its warnings). The
                connection must have been made with ``local_infile=True`` (else the server refuses the
                statement)."""
                self.infile = data
                try:
                    return int(cursor.execute(sql))
                finally:
                    self.infile = None

            def _read_query_result(self, unbuffered: bool = False) -> int:
                # PyMySQL's own, with the result class above (for unbuffered reads too)
                self._result = None
                result = _Result(self)
                if unbuffered:
                    result.init_unbuffered_query()
                else:
                    result.read()
                self._result = result
                if result.server_status is not None:
                    self.server_status = result.server_status
                return int(result.affected_rows)

            def _create_ssl_ctx(self, sslp: Any) -> Any:
                if sslp:
                    return super()._create_ssl_ctx(sslp)
                with _PREFERRED_TLS_LOCK:
                    if _Connection._preferred_tls is None:
                        _Connection._preferred_tls = super()._create_ssl_ctx(sslp)
                    return _Connection._preferred_tls

        _PYMYSQL_CONNECTION = _Connection
    return _PYMYSQL_CONNECTION
