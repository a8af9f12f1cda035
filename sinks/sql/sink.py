"""The SQL sink: MySQL/MariaDB (PyMySQL), PostgreSQL (psycopg2) and SQLite through SQLAlchemy Core.

Guarantees (on top of :class:`sinks.base.Sink`):
- One downstream transaction per ``write`` call, committed before ``write`` returns; on any error it is
  rolled back and nothing of the call is visible. The iterable is consumed lazily and applied in chunks
  of ``config.batch_rows`` rows inside that transaction, so memory stays bounded for huge transactions.
- Order is kept per target table, not across tables: within one ``write`` call each table has one pending
  multi-row statement that its changes join while they have the same (operation, column set); it is sent
  when that table's next change cannot join it, at ``batch_rows`` rows, before a TRUNCATE of the table,
  when ``max(batch_rows, txn_rows)`` rows are pending over all tables, or at the end of the call. So the
  changes of one table (and of one key) reach the target in upstream order, while statements of different
  tables may be reordered inside the call's one downstream transaction (atomic: all of it or nothing).
  Foreign keys between replicated target tables must be deferrable (docs/type-mapping.md).
- Keyed tables are idempotent: INSERT and UPDATE are upserts by key, DELETE deletes by key, an UPDATE
  that changes the key deletes the old key first. ``UNCHANGED`` columns are left out of the upsert (the
  downstream keeps its value); if such a row is missing downstream it is inserted without them and a
  warning is logged once per table.
- Tables without a key (REPLICA IDENTITY FULL) get plain inserts, and updates/deletes of one row matching
  all old values: *not* idempotent on replay (a replayed insert duplicates the row).
- Missing target tables are created from the upstream schema (docs/type-mapping.md); existing tables are
  used as they are (never altered) after checking that they have the columns and a unique key.
- TRUNCATE is ``DELETE FROM`` on MySQL/SQLite (MySQL's TRUNCATE would commit implicitly) and
  ``TRUNCATE`` on PostgreSQL.
- Errors: an unreachable or lost server, a deadlock, a lock timeout or a busy SQLite file raise
  :class:`SinkUnavailable` (retryable); anything else raises :class:`SinkError` naming the table and the
  driver's message.

How rows are sent (fastest measured per operation kind, sink alone, sbtest rows, 20k rows per write):
- MySQL/MariaDB: multi-row ``INSERT .. ON DUPLICATE KEY UPDATE`` of literal rows rendered in Python.
- PostgreSQL, groups of at least ``_COPY_MIN_ROWS`` positional rows that all carry their upstream text
  (``RowChange.row_text``, PostgreSQL's own output text, hence valid input for the same or a text target
  type): ``COPY`` (text format) of that text, straight into the table for tables without a key, else into a
  per-session TEMP staging table (one per table and column set, emptied after each use) merged by one
  ``INSERT .. SELECT .. ON CONFLICT (key) DO UPDATE`` (last row per key). Inserts 59k -> 124k rows/s and
  updates 47k -> 87k rows/s against multi-row INSERTs, client CPU 8.3 -> 2.0-2.6 us/row. Other groups
  (deletes, partial rows, small groups, rows from other sources) use multi-row statements with parameters.
- SQLite: ``executemany`` (in-process: no pipelining).

Threading: one caller thread at a time (the contract's). MySQL and PostgreSQL statements run in one worker
thread per sink (:class:`_Pipeline`), in order and one at a time, while the caller builds the next one; the
connection is never used by both threads at once, and ``close`` stops the worker. The engine's pool keeps
the connection between calls; ``close`` disposes of it.
"""

from __future__ import annotations

import collections
import io
import itertools
import logging
import os
import re
import sqlite3
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine

from cdc.config import SinkConfig
from cdc.errors import InvalidURI, SinkError, SinkUnavailable, TidewaterError
from cdc.events import UNCHANGED, ColumnSchema, OpType, RowChange, TableName, TableSchema
from cdc.uri import parse_sink_uri
from sinks.base import Sink
from sinks.sql.ddl import (
    TargetColumn,
    TargetTable,
    create_schema_sql,
    create_table_sql,
    numeric_precision_scale,
    plan_table,
)
from sinks.sql.statements import Statements
from sinks.sql.values import Converter, converter, fast_path, mysql_literal_function, text_path

log = logging.getLogger(__name__)

DIALECTS = {"mysql": "mysql", "mariadb": "mysql", "postgresql": "postgresql", "postgres": "postgresql",
            "sqlite": "sqlite"}
_PARAMS = {
    "mysql": ("connect-timeout",),
    "postgresql": ("connect-timeout", "sslmode", "sslrootcert", "sslcert", "sslkey"),
    "sqlite": ("busy-timeout",),
}
_MYSQL_SQL_MODE = ("STRICT_TRANS_TABLES,STRICT_ALL_TABLES,NO_ZERO_IN_DATE,NO_ZERO_DATE,"
                   "ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION")
# MySQL error codes that a retry can fix (server gone, lost connection, deadlock, lock wait timeout...).
_MYSQL_RETRY = frozenset({1040, 1053, 1205, 1213, 1927, 2002, 2003, 2006, 2013, 2014, 2045, 2055, 4031})
_MYSQL_DISCONNECT = frozenset({1053, 1927, 2002, 2003, 2006, 2013, 2014, 2045, 2055, 4031})
# PostgreSQL SQLSTATEs a retry can fix: serialization failure, deadlock, shutdown, too many connections...
_PG_RETRY = frozenset({"40001", "40P01", "57P01", "57P02", "57P03", "53300", "53400", "55P03"})
_PG_FATAL_CONNECT = ("does not exist", "authentication failed", "no pg_hba.conf entry", "permission denied",
                     "password is required", "too many connections for role")

_PG_NUMERIC = re.compile(r"numeric\(\d+,(-?\d+)\)")
_MAX_BINDINGS = 1024  # cached (schema version -> target) bindings before the cache is reset
_MYSQL_STATEMENT_BYTES = 1_000_000  # well below MariaDB's 16 MB max_allowed_packet (characters, not bytes)
# PostgreSQL: groups of at least this many rows that all came with their upstream text go through COPY
_COPY_MIN_ROWS = 32
# group kinds
_UPSERT, _INSERT, _DELETE, _DELETE_ONE, _UPDATE_ONE = range(5)


class SQLSink(Sink):
    """Writes row changes to ``mysql://``, ``mariadb://``, ``postgresql://`` or ``sqlite:///`` targets.

    Target names: MySQL and SQLite put upstream ``schema.table`` into ``table`` of the URI's database
    (the upstream schema is dropped; see :meth:`target_name`), PostgreSQL keeps ``schema.table`` and
    creates the schema when missing. URI parameters: ``connect-timeout`` (seconds, MySQL/PostgreSQL),
    ``sslmode``/``sslrootcert``/``sslcert``/``sslkey`` (PostgreSQL), ``busy-timeout`` (seconds, SQLite).
    """

    def __init__(self, uri: str, config: SinkConfig | None = None) -> None:
        self._uri = parse_sink_uri(uri)
        if self._uri.scheme not in DIALECTS:
            raise InvalidURI(f"sink URI scheme {self._uri.scheme!r} is not an SQL sink")
        self.dialect = DIALECTS[self._uri.scheme]
        unknown = sorted(set(self._uri.params) - set(_PARAMS[self.dialect]))
        if unknown:
            raise InvalidURI(f"sink URI {self._uri.redacted()!r}: unknown parameter(s) {', '.join(unknown)} "
                             f"(accepted: {', '.join(_PARAMS[self.dialect])})")
        self._config = config or SinkConfig()
        self._batch = max(1, self._config.batch_rows)
        self._engine = self._make_engine()
        self._stmts: Statements | None = None
        self._mysql_collation = "utf8mb4_bin"
        self._tables: dict[tuple[str | None, str], _Table] = {}
        # per target schema: its base tables as the catalog showed them, handed out once (see _existing_table)
        self._existing: dict[str | None, dict[str, tuple[tuple[TargetColumn, ...], list[frozenset[str]]]]] = {}
        self._bindings: dict[int, tuple[TableSchema, _Binding]] = {}  # by identity, then by value
        self._bindings_by_value: dict[TableSchema, _Binding] = {}
        self._schemas_created: set[str] = set()
        self._warned_missing: set[str] = set()
        self._stage_ids = itertools.count(1)  # names of PostgreSQL staging tables (one per plan)
        # PostgreSQL: may this session create the TEMP staging tables of COPY upserts? ``check`` asks
        # the server; None (never checked) counts as yes
        self.pg_temp_ok: bool | None = None
        # statements execute in a worker thread while the next one is built (not SQLite: in-process work)
        self._pipe = _Pipeline(threaded=self.dialect != "sqlite")
        self._closed = False

    # ---- engine --------------------------------------------------------------------------------------
    def _timeout(self, name: str, default: float) -> float:
        raw = self._uri.params.get(name)
        if raw is None:
            return default
        try:
            value = float(raw)
        except ValueError:
            raise InvalidURI(f"sink URI {self._uri.redacted()!r}: {name} must be a number of seconds") from None
        if value <= 0:
            raise InvalidURI(f"sink URI {self._uri.redacted()!r}: {name} must be positive")
        return value

    def _make_engine(self) -> Engine:
        u = self._uri
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
                finally:
                    cur.close()

            @event.listens_for(engine, "begin")
            def _on_begin(conn: Connection) -> None:
                conn.exec_driver_sql("BEGIN IMMEDIATE")  # take the write lock now: no upgrade deadlock

            return engine
        timeout = int(self._timeout("connect-timeout", 10.0))
        if self.dialect == "mysql":
            url = sa.URL.create("mysql+pymysql", username=u.user, password=u.password, host=u.host,
                                port=u.port or 3306, database=u.path, query={"charset": "utf8mb4"})
            init = f"SET time_zone = '+00:00', sql_mode = '{_MYSQL_SQL_MODE}'"
            # pool_reset_on_return=None: every checkout ends its own transaction (write commits or rolls
            # back, Connection.close rolls back what it began), so the pool's ROLLBACK per return was a
            # wasted round trip per write.
            engine = sa.create_engine(url, pool_pre_ping=True, pool_reset_on_return=None,
                                      isolation_level="READ COMMITTED",
                                      connect_args={"connect_timeout": timeout, "init_command": init})

            @event.listens_for(engine, "do_connect")
            def _do_connect(_dialect: Any, _record: Any, cargs: Any, cparams: Any) -> Any:
                return _pymysql_connection_class()(*cargs, **cparams)

            return engine
        ssl = {k: v for k, v in u.params.items() if k.startswith("ssl")}
        url = sa.URL.create("postgresql+psycopg2", username=u.user, password=u.password, host=u.host,
                            port=u.port or 5432, database=u.path or None)
        return sa.create_engine(url, pool_pre_ping=True, pool_reset_on_return=None, connect_args={
            "connect_timeout": timeout, "application_name": f"tidewater-sink-{os.getpid()}", "options": "-c timezone=UTC", **ssl})

    def _where(self) -> str:
        if self.dialect == "sqlite":
            return f"SQLite database {self._uri.path!r}"
        kind = "MySQL" if self.dialect == "mysql" else "PostgreSQL"
        port = self._uri.port or (3306 if self.dialect == "mysql" else 5432)
        return f"{kind} at {self._uri.host}:{port}"

    def _statements(self) -> Statements:
        if self._stmts is None:
            d = self._engine.dialect
            mariadb = bool(getattr(d, "is_mariadb", False))
            if self.dialect == "mysql":
                version = tuple(getattr(d, "server_version_info", None) or (0,))
                self._mysql_collation = ("utf8mb4_nopad_bin" if mariadb else
                                         "utf8mb4_0900_bin" if version >= (8, 0, 17) else "utf8mb4_bin")
            self._stmts = Statements(self.dialect, d.identifier_preparer, mariadb=mariadb)
        return self._stmts

    # ---- Sink API ------------------------------------------------------------------------------------
    def check(self) -> None:
        """Connect once; SinkUnavailable if the server cannot be reached, SinkError (with the fix) if the
        database is missing, access is denied or a SQLite file cannot be opened for writing."""
        self._check_open()
        try:
            with self._engine.connect() as conn:
                conn.exec_driver_sql("SELECT 1")
                self._statements()
                if self.dialect == "postgresql":
                    self.pg_temp_ok = bool(conn.exec_driver_sql(
                        "SELECT has_database_privilege(current_database(), 'TEMP')").scalar())
                    if not self.pg_temp_ok:
                        log.info("%s: no TEMP privilege, keyed upserts use multi-row INSERT instead of COPY",
                                 self._where())
        except Exception as exc:
            if isinstance(exc, TidewaterError):
                raise
            raise self._wrap(exc, None) from exc

    def target_name(self, table: TableName) -> str:
        """``table`` (MySQL, SQLite: the upstream schema is dropped) or ``schema.table`` (PostgreSQL)."""
        schema, name = self._target_parts(table)
        return f"{schema}.{name}" if schema else name

    def _target_parts(self, table: TableName) -> tuple[str | None, str]:
        if self.dialect == "postgresql":
            return table.schema, table.table
        return None, table.table

    def write(self, changes: Iterable[RowChange], fence: Callable[[], None] | None = None) -> int:
        self._check_open()
        writer: _Writer | None = None
        try:
            with self._engine.connect() as conn:
                trans = conn.begin()
                try:
                    stmts = self._statements()
                    writer = _Writer(self, conn, stmts)
                    count = writer.run(changes)
                    if fence is not None:
                        fence()
                    trans.commit()
                    return count
                except BaseException as exc:
                    if _is_db_error(exc) and self._classify(exc)[1]:
                        conn.invalidate(exc if isinstance(exc, Exception) else None)
                    else:
                        try:
                            trans.rollback()
                        except Exception:  # the connection is gone: the server rolls back
                            conn.invalidate()
                    raise
        except BaseException as exc:
            # Tables created inside the failed transaction (SQLite) are gone; re-reflect next time.
            self._tables.clear()
            self._existing.clear()
            self._bindings.clear()
            self._bindings_by_value.clear()
            if isinstance(exc, TidewaterError) or not _is_db_error(exc):
                raise
            raise self._wrap(exc, writer.current if writer else None) from exc

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._pipe.close()
            self._engine.dispose()

    def _check_open(self) -> None:
        if self._closed:
            raise SinkError(f"sink {self._uri.redacted()} is closed")

    # ---- tables --------------------------------------------------------------------------------------
    def _bind(self, schema: TableSchema, conn: Connection, before_io: Callable[[], None] | None = None) -> _Binding:
        """The binding of ``schema``; ``before_io`` is called before ``conn`` (or the server) is used."""
        entry = self._bindings.get(id(schema))
        if entry is not None and entry[0] is schema:
            return entry[1]
        if len(self._bindings) > _MAX_BINDINGS:  # callers that make a new schema object per change
            self._bindings.clear()
        same = self._bindings_by_value.get(schema)
        if same is not None:
            self._bindings[id(schema)] = (schema, same)
            return same
        parts = self._target_parts(schema.name)
        table = self._tables.get(parts)
        if table is None and self.dialect != "sqlite":
            if before_io is not None and parts[0] not in self._existing:
                before_io()
            table = self._existing_table(conn, *parts)
        if table is None:
            if before_io is not None:
                before_io()
            if self.dialect == "sqlite":  # one writer per file: DDL inside our (transactional) write
                table = self._prepare_table(schema, conn)
            else:  # MySQL DDL commits implicitly: never inside the write transaction
                with self._engine.connect() as ddl:
                    ddl.execution_options(isolation_level="AUTOCOMMIT")
                    table = self._prepare_table(schema, ddl)
            self._tables[parts] = table
        binding = _Binding(self, schema, table)
        if len(self._bindings_by_value) > _MAX_BINDINGS:
            self._bindings_by_value.clear()
        self._bindings[id(schema)] = (schema, binding)
        self._bindings_by_value[schema] = binding
        return binding

    def _existing_table(self, conn: Connection, tschema: str | None, tname: str) -> _Table | None:
        """The table as the catalog showed it at this sink's first look at ``tschema``, or None.

        Every base table of the schema is read in three catalog queries on the write connection (no second
        connection, no per-table round trips: binding 1,000 existing tables took 5-7 s through SQLAlchemy's
        per-table reflection on PostgreSQL, 1.6 s on MariaDB). Each table is handed out once; a table not
        seen then (created since, a view, a name the server folds) takes the per-table path."""
        existing = self._existing.get(tschema)
        if existing is None:
            existing = self._existing[tschema] = self._reflect_schema(conn, tschema)
            log.info("%s has %d existing table(s)%s; they are used as they are", self._where(), len(existing),
                     f" in schema {tschema}" if tschema else "")
        found = existing.pop(tname, None)
        if found is None:
            return None
        cols, uniques = found
        label = f"{tschema}.{tname}" if tschema else tname
        log.debug("using existing table %s in %s (%d columns)", label, self._where(), len(cols))  # 1,000s at start
        return _Table(label, tschema, tname, cols, uniques, created=False)

    def _reflect_schema(self, conn: Connection, tschema: str | None
                        ) -> dict[str, tuple[tuple[TargetColumn, ...], list[frozenset[str]]]]:
        stmts = self._statements()
        params = () if tschema is None else (tschema,)
        cur = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        try:
            cur.execute(stmts.catalog_tables(), params or None)
            base = {r[0] for r in cur.fetchall()}
            cur.execute(stmts.catalog_columns(), params or None)
            col_rows = [r for r in cur.fetchall() if r[0] in base]
            cur.execute(stmts.catalog_unique_keys(), params or None)
            key_rows = cur.fetchall()
        finally:
            cur.close()
        cols: dict[str, list[TargetColumn]] = {}
        for tname, cname, nullable, typ, scale in col_rows:
            typ = str(typ)
            if self.dialect == "postgresql":
                is_json = typ == "json"  # jsonb has '=', json does not
                m = _PG_NUMERIC.fullmatch(typ)
                scale = int(m.group(1)) if m else None
            else:
                is_json = typ == "json"
                scale = int(scale) if typ in ("decimal", "numeric") and scale is not None else None
            cols.setdefault(tname, []).append(TargetColumn(cname, None, bool(nullable), is_json, scale))
        indexes: dict[tuple[str, str], list[str | None]] = {}
        for tname, index, cname in key_rows:
            indexes.setdefault((tname, index), []).append(cname)
        uniques: dict[str, list[frozenset[str]]] = {}
        for (tname, _index), names in indexes.items():
            if all(n is not None for n in names):  # expression parts cannot serve as a key
                uniques.setdefault(tname, []).append(frozenset(n for n in names if n is not None))
        return {t: (tuple(c), uniques.get(t, [])) for t, c in cols.items()}

    def _prepare_table(self, schema: TableSchema, conn: Connection) -> _Table:
        self._statements()  # knows the server's flavour (MySQL collation) once connected
        tschema, tname = self._target_parts(schema.name)
        label = self.target_name(schema.name)
        insp = sa.inspect(conn)
        if insp.has_table(tname, schema=tschema):
            return self._reflect(conn, tschema, tname, label)
        preparer = self._engine.dialect.identifier_preparer
        if tschema is not None and tschema not in self._schemas_created:
            self._ddl(conn, create_schema_sql(tschema, preparer))
            self._schemas_created.add(tschema)
        planned = plan_table(schema, self.dialect, target_schema=tschema, target_name=tname)
        self._ddl(conn, create_table_sql(planned, self.dialect, preparer, mysql_collation=self._mysql_collation))
        log.info("created table %s in %s for upstream %s", label, self._where(), schema.name)
        return _Table(label, planned.schema, planned.name, planned.columns,
                      [frozenset(planned.key)] if planned.key else [], created=True)

    def _ddl(self, conn: Connection, sql: str) -> None:
        """Run one ``... IF NOT EXISTS`` statement. PostgreSQL can still report a duplicate when another
        session creates the same object concurrently (other spans of the changefeed): that is success."""
        try:
            conn.exec_driver_sql(sql, ())
        except sa.exc.DBAPIError as exc:
            if getattr(exc.orig, "pgcode", None) not in ("23505", "42P06", "42P07"):
                raise
            log.info("%s already created concurrently: %s", self._where(), " ".join(str(exc.orig).split()))

    def _reflect(self, conn: Connection, tschema: str | None, tname: str, label: str) -> _Table:
        insp = sa.inspect(conn)
        cols = []
        for c in insp.get_columns(tname, schema=tschema):
            typ = c["type"]
            is_json = isinstance(typ, sa.JSON)
            if self.dialect == "postgresql":
                is_json = is_json and type(typ).__name__ == "JSON"  # jsonb has '=', json does not
            scale = typ.scale if isinstance(typ, sa.Numeric) and not isinstance(typ, sa.Float) else None
            cols.append(TargetColumn(c["name"], None, bool(c.get("nullable", True)), is_json, scale))
        uniques: list[frozenset[str]] = []
        pk = insp.get_pk_constraint(tname, schema=tschema).get("constrained_columns") or []
        if pk:
            uniques.append(frozenset(pk))
        for uc in insp.get_unique_constraints(tname, schema=tschema):
            uniques.append(frozenset(uc["column_names"]))
        for ix in insp.get_indexes(tname, schema=tschema):
            if ix.get("unique") and all(n is not None for n in ix["column_names"]):
                uniques.append(frozenset(ix["column_names"]))
        log.info("using existing table %s in %s (%d columns)", label, self._where(), len(cols))
        return _Table(label, tschema, tname, tuple(cols), uniques, created=False)

    # ---- errors --------------------------------------------------------------------------------------
    def _classify(self, exc: BaseException) -> tuple[bool, bool, Any]:
        """(retryable, connection lost, driver exception)."""
        orig: Any = exc
        if isinstance(exc, sa.exc.DBAPIError):
            orig = exc.orig if exc.orig is not None else exc
            if exc.connection_invalidated:
                return True, True, orig
        if isinstance(exc, sa.exc.TimeoutError):  # pool exhausted
            return True, False, orig
        if self.dialect == "mysql":
            import pymysql

            if isinstance(orig, pymysql.err.InterfaceError):
                return True, True, orig
            code = orig.args[0] if isinstance(orig, pymysql.err.MySQLError) and orig.args else None
            if isinstance(code, int) and code in _MYSQL_RETRY:
                return True, code in _MYSQL_DISCONNECT, orig
            return False, False, orig
        if self.dialect == "postgresql":
            import psycopg2

            if isinstance(orig, psycopg2.InterfaceError):
                return True, True, orig
            if isinstance(orig, psycopg2.Error):
                code = orig.pgcode
                if code is None and isinstance(orig, psycopg2.OperationalError):
                    text = str(orig)
                    fatal = any(s in text for s in _PG_FATAL_CONNECT)
                    return not fatal, not fatal, orig
                if code is not None and (code.startswith("08") or code in _PG_RETRY):
                    return True, code.startswith("08") or code.startswith("57P"), orig
            return False, False, orig
        if isinstance(orig, sqlite3.OperationalError):
            text = str(orig).lower()
            if "locked" in text or "busy" in text or "disk is full" in text:
                return True, False, orig
        return False, False, orig

    def _wrap(self, exc: BaseException, table: str | None) -> TidewaterError:
        retryable, _lost, orig = self._classify(exc)
        msg = " ".join(str(orig).split())
        where = self._where()
        if retryable:
            return SinkUnavailable(f"{where} is unavailable: {msg}", cause=exc)
        hint = self._hint(orig, msg)
        if hint:
            return SinkError(f"{where}: {hint} ({msg})", cause=exc)
        subject = f"writing table {table}" if table else "sink"
        return SinkError(f"{where}, {subject}: {msg}", cause=exc)

    def _hint(self, orig: Any, msg: str) -> str | None:
        u = self._uri
        if self.dialect == "mysql":
            code = orig.args[0] if getattr(orig, "args", None) else None
            if code == 1049:
                return (f"database {u.path!r} does not exist: create it (CREATE DATABASE `{u.path}` "
                        "CHARACTER SET utf8mb4) or fix the sink URI")
            if code in (1044, 1045):
                return (f"access denied for user {u.user!r}: check the user and password in the sink URI and "
                        f"grant it privileges (GRANT ALL ON `{u.path}`.* TO ...)")
            if code in (1142, 1143):
                return f"user {u.user!r} lacks a privilege: GRANT ALL ON `{u.path}`.* TO it"
            return None
        if self.dialect == "postgresql":
            code = getattr(orig, "pgcode", None)
            if code == "3D000" or ("database" in msg and "does not exist" in msg):
                return f"database {u.path!r} does not exist: create it (CREATE DATABASE ...) or fix the sink URI"
            if code in ("28P01", "28000") or "authentication failed" in msg or "pg_hba.conf" in msg \
                    or ("role" in msg and "does not exist" in msg):
                return (f"access denied for user {u.user!r}: check the user and password in the sink URI and "
                        "the server's pg_hba.conf")
            if code == "42501":
                return (f"user {u.user!r} lacks a privilege: grant it CREATE on the database and its schemas, "
                        "and INSERT/UPDATE/DELETE/TRUNCATE on the target tables")
            return None
        if "unable to open database file" in msg:
            return f"cannot open {u.path!r}: create its directory and make it writable"
        if "readonly database" in msg:
            return f"{u.path!r} is read-only: make the file and its directory writable"
        return None


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


def _is_db_error(exc: BaseException) -> bool:
    if isinstance(exc, (sa.exc.SQLAlchemyError, sqlite3.Error)):
        return True
    mod = type(exc).__module__
    return mod.startswith("pymysql") or mod.startswith("psycopg2")


class _Pipeline:
    """Runs one connection's statements in a worker thread, so that the caller builds the next statement
    while the target executes the previous one.

    Guarantees: statements run strictly in submit order, one at a time, on whatever cursor each job
    names; at most ``depth`` jobs are queued or running (``submit`` blocks beyond that: memory stays
    bounded). The caller may use the connection itself (reads, commit, rollback) only after :meth:`drain`
    or :meth:`quiesce` returned: then the worker is idle and its writes happen-before the caller's next
    steps, so a connection is never used by two threads at once. The first failing job's exception is
    kept with the table it concerned and raised by the next ``submit`` or ``drain`` (after the queue is
    empty); jobs queued after it are dropped, never executed. ``threaded=False`` (SQLite: the work is
    in-process) runs every job in the caller's thread at submit.

    Thread-safety: one caller thread at a time (the sink's); ``close`` stops the worker and may be called
    from any thread once the caller is done.
    """

    def __init__(self, *, threaded: bool = True, depth: int = 2) -> None:
        self.threaded = threaded
        self._depth = max(1, depth)
        self._cond = threading.Condition(threading.Lock())
        self._jobs: collections.deque[tuple[str | None, Callable[..., Any], tuple[Any, ...]]] = collections.deque()
        self._error: tuple[BaseException, str | None] | None = None
        self._thread: threading.Thread | None = None
        self._stop = False

    def submit(self, table: str | None, fn: Callable[..., Any], *args: Any) -> bool:
        """Run ``fn(*args)`` after every job submitted before. False (``fn`` dropped) when an earlier job
        failed: the caller then takes the error with :meth:`quiesce`."""
        if not self.threaded:
            fn(*args)
            return True
        cond = self._cond
        with cond:
            if self._error is None:
                if self._thread is None:
                    self._start()
                while len(self._jobs) >= self._depth and self._error is None:
                    cond.wait()
                if self._error is None:
                    self._jobs.append((table, fn, args))
                    cond.notify_all()
                    return True
        return False

    def drain(self) -> None:
        """Wait until every submitted job ran; raise the first error (and forget it)."""
        error = self.quiesce()
        if error is not None:
            raise error[0]

    def quiesce(self) -> tuple[BaseException, str | None] | None:
        """Wait until the worker is idle; return (and forget) the first error with its table, or None."""
        if not self.threaded:
            return None
        cond = self._cond
        with cond:
            while self._jobs:
                cond.wait()
            error, self._error = self._error, None
        return error

    def close(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=60)

    def _start(self) -> None:
        if self._stop:
            raise SinkError("sink is closed")
        self._thread = threading.Thread(target=self._work, name="sql-sink-executor", daemon=True)
        self._thread.start()

    def _work(self) -> None:
        cond = self._cond
        jobs = self._jobs
        while True:
            with cond:
                while not jobs and not self._stop:
                    cond.wait()
                if not jobs:
                    return
                table, fn, args = jobs[0]
                failed = self._error is not None
            if not failed:
                try:
                    fn(*args)
                except BaseException as exc:  # kept for the caller, never lost
                    with cond:
                        self._error = (exc, table)
            with cond:
                jobs.popleft()
                cond.notify_all()


class _Table:
    """What the sink knows about one downstream table (created by us or reflected)."""

    def __init__(self, label: str, schema: str | None, name: str, columns: tuple[TargetColumn, ...],
                 uniques: list[frozenset[str]], *, created: bool) -> None:
        self.label = label
        self.schema = schema
        self.name = name
        self.columns = columns
        self.uniques = uniques
        self.created = created


RowFn = Callable[[Sequence[Any]], Sequence[Any]]
TextRowFn = Callable[[Sequence[Any], Sequence[Any]], Sequence[Any]]


class _Plan:
    """A group's statement: ``sql`` for one row, ``many(n)`` for n rows in one statement (PostgreSQL),
    ``parts`` = (head, tail) around literal rows, ``%`` not doubled (MySQL's literal fast path)."""

    __slots__ = ("sql", "convert", "convert_text", "key_idx", "parts", "copy", "_build", "_many")

    def __init__(self, sql: str, convert: RowFn | None, key_idx: tuple[int, ...],
                 build: Callable[[int], str] | None = None, parts: tuple[str, str] | None = None,
                 convert_text: TextRowFn | None = None) -> None:
        self.sql = sql
        self.convert = convert
        self.convert_text = convert_text  # (row, upstream text) -> parameters; None: no column gains from it
        self.key_idx = key_idx
        self.parts = parts
        # PostgreSQL, rows with their upstream text: (COPY statement, staging table DDL, merge) or None
        self.copy: tuple[str, str | None, str | None] | None = None
        self._build = build
        self._many: dict[int, str] = {}

    def many(self, n: int) -> str:
        sql = self._many.get(n)
        if sql is None:
            assert self._build is not None
            sql = self._many[n] = self._build(n)
        return sql


def _row_function(n: int, convs: dict[int, Converter], *, with_text: bool = False) -> Any:
    """A function converting one parameter row, generated once per statement (no per-value loop).

    A converter's fast path (``values.fast_path``: exact type ``T`` -> ``f``) is tested inline, so the
    common values of a column cost one call of ``f`` (often a builtin) instead of the converter's type tests.
    ``with_text``: the function takes ``(row, upstream text)`` and uses the converters' text paths
    (``values.text_path``), falling back to the value when ``g`` does not recognise the text; None when no
    converter has a text path.
    """
    if not convs:
        return None
    namespace: dict[str, Any] = {"type": type}
    parts = []
    texts = 0
    for i in range(n):
        if i in convs:
            namespace[f"c{i}"] = convs[i]
            expr = f"(None if r[{i}] is None else c{i}(r[{i}]))"
            fast = fast_path(convs[i])
            if fast is not None:
                namespace[f"t{i}"], namespace[f"f{i}"] = fast
                expr = f"(f{i}(r[{i}]) if type(r[{i}]) is t{i} else {expr})"
            text = text_path(convs[i]) if with_text else None
            if text is not None:
                namespace[f"u{i}"], namespace[f"g{i}"] = text
                expr = f"((g{i}(s[{i}]) if type(r[{i}]) is u{i} else None) or {expr})"
                texts += 1
            parts.append(expr)
        else:
            parts.append(f"r[{i}]")
    if with_text and not texts:
        return None
    args = "r, s" if with_text else "r"
    return eval(f"lambda {args}: (" + ", ".join(parts) + ",)", namespace)  # indices only, no data


def _convert(rows: Sequence[Sequence[Any]], fn: RowFn | None) -> list[Any]:
    return list(rows) if fn is None else [fn(r) for r in rows]


def _convert_rows(plan: _Plan, rows: list[tuple[Any, ...]], texts: list[Any] | None) -> list[Any]:
    """Parameters of ``rows``; through the plan's text paths when every row came with its upstream text."""
    fn = plan.convert_text
    if fn is not None and texts is not None and len(texts) == len(rows):
        return list(map(fn, rows, texts))
    return _convert(rows, plan.convert)


class _Binding:
    """One upstream schema version bound to its downstream table: name mapping, converters, statements."""

    def __init__(self, sink: SQLSink, schema: TableSchema, table: _Table) -> None:
        self.schema = schema
        self.label = table.label
        self.keyed = schema.has_key and bool(schema.key)
        self.key = tuple(schema.key) if self.keyed else ()
        self.ncols = len(schema.columns)
        self.names = schema.column_names  # the order of RowChange.row
        self.stmts = sink._statements()
        exact = {c.name: c for c in table.columns}
        folded = {c.name.casefold(): c for c in table.columns} if sink.dialect != "postgresql" else {}
        self.colmap: dict[str, str] = {}
        missing = []
        targets: dict[str, TargetColumn] = {}
        for c in schema.columns:
            tc = exact.get(c.name) or folded.get(c.name.casefold())
            if tc is None:
                missing.append(c.name)
                continue
            self.colmap[c.name] = tc.name
            targets[c.name] = tc
        if missing:
            raise SinkError(
                f"target table {table.label} has no column(s) {', '.join(map(repr, missing))} that upstream "
                f"{schema.name} has: add them (ALTER TABLE ... ADD COLUMN) or drop the target table so that it "
                "is created again")
        dkey = tuple(self.colmap[k] for k in self.key)
        if self.keyed and frozenset(dkey) not in table.uniques:
            raise SinkError(
                f"target table {table.label} has no primary key or unique index on ({', '.join(dkey)}), the "
                f"key of upstream {schema.name}: upserts by key need one (ALTER TABLE ... ADD PRIMARY KEY)")
        self.table = TargetTable(table.schema, table.name, table.columns, dkey)
        self.convs: dict[str, Converter | None] = {
            c.name: converter(c, sink.dialect, table=table.label, scale=_scale_to_check(c, targets[c.name]))
            for c in schema.columns}
        self._plans: dict[tuple[Any, ...], _Plan] = {}
        self._stage_ids = sink._stage_ids
        self._temp_ok = sink.pg_temp_ok is not False
        self.key_convert = _row_function(
            len(self.key), {i: c for i, k in enumerate(self.key) if (c := self.convs.get(k)) is not None})

    def plan(self, kind: int, names: tuple[str, ...], extra: tuple[tuple[str, ...], tuple[str, ...]] | None) -> _Plan:
        """The cached statement for a group; parameters of one row follow ``names`` (+ ``extra[0]``)."""
        pk = (kind, names, extra)
        p = self._plans.get(pk)
        if p is not None:
            return p
        try:
            d = [self.colmap[n] for n in names]
        except KeyError as exc:
            raise SinkError(f"table {self.label}: change carries column {exc.args[0]!r} unknown to its schema") from None
        s, t = self.stmts, self.table
        build: Callable[[int], str] | None = None
        parts: tuple[str, str] | None = None
        if kind == _UPSERT:
            sql = s.upsert(t, d)
            build = lambda n: s.upsert(t, d, n)  # noqa: E731
            parts = s.upsert_parts(t, d)
        elif kind == _INSERT:
            sql = s.insert(t, d)
            build = lambda n: s.insert(t, d, n)  # noqa: E731
            parts = s.insert_parts(t, d)
        elif kind == _DELETE:
            sql = s.delete_key(t)  # per-key form; the IN-list form is built per batch size
        elif kind == _DELETE_ONE:
            assert extra is not None
            sql = s.delete_one(t, d, [self.colmap[n] for n in extra[1]])
        else:
            assert extra is not None
            match = [self.colmap[n] for n in extra[0]]
            sql = s.update_one(t, d, match, [self.colmap[n] for n in extra[1]])
            names = names + extra[0]
        if parts is not None and s.ph == "%s":  # no parameters with literal rows: undo the %-doubling
            parts = (parts[0] % (), parts[1] % ())
        convs = {i: c for i, n in enumerate(names) if (c := self.convs.get(n)) is not None}
        key_idx = tuple(names.index(k) for k in self.key) if all(k in names for k in self.key) else ()
        # upstream text is only ever attached to positional rows (names == every column in schema order)
        text_fn = _row_function(len(names), convs, with_text=True) if names == self.names else None
        p = _Plan(sql, _row_function(len(names), convs), key_idx, build, parts, text_fn)
        if s.dialect == "postgresql" and names == self.names and kind in (_UPSERT, _INSERT):
            if kind == _INSERT:
                p.copy = (s.copy_in(s.table(t), d) % (), None, None)
            elif len(d) > len(t.key) and self._temp_ok:  # (a key-only table keeps ON CONFLICT DO NOTHING)
                stage = f"tidewater_stage_{next(self._stage_ids)}"
                p.copy = (s.copy_in(s.q(stage), d) % (), s.stage_table(t, d, stage) % (),
                          s.upsert_from(t, d, stage) % ())
        self._plans[pk] = p
        return p


class _Group:
    """The pending rows of one downstream table: what one statement will carry (same binding, kind, columns)."""

    __slots__ = ("b", "kind", "names", "extra", "rows", "texts", "seq")

    def __init__(self, b: _Binding, kind: int, names: tuple[str, ...],
                 extra: tuple[tuple[str, ...], tuple[str, ...]] | None) -> None:
        self.b = b
        self.kind = kind
        self.names = names
        self.extra = extra
        self.rows: list[tuple[Any, ...]] = []
        self.texts: list[Any] | None = []  # RowChange.row_text of each row, while every row of the group has one
        self.seq = 0  # when its first pending row came, among the write's groups: the order of the final flush


class _Writer:
    """Applies one ``write`` call on one connection.

    Keeps one pending group per downstream table and flushes a table's group only when that table's next
    change cannot join it (another kind, column set or schema version), when it reaches ``batch_rows``,
    before a TRUNCATE or key move of that table, when the rows pending over all tables reach
    ``max(batch_rows, txn_rows)`` (memory bound), or at the end. Each table's changes therefore reach the
    target in their order; statements of different tables may be reordered (all inside the one downstream
    transaction of the call).
    """

    def __init__(self, sink: SQLSink, conn: Connection, stmts: Statements) -> None:
        self.sink = sink
        self.conn = conn
        self.dialect = sink.dialect
        self.stmts = stmts
        self.batch = sink._batch
        self.cur = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        self.pipe = sink._pipe  # statements run there, in order; reads and the caller's commit drain it first
        self.current: str | None = None  # table being written (or whose statement failed), for error messages
        self._groups: dict[str, _Group] = {}  # by downstream table (label); kept, emptied, when flushed
        self._last: _Group | None = None  # the group the previous change joined (fast path)
        self._pending = 0  # rows pending over all groups
        self._max_pending = max(self.batch, sink._config.txn_rows)
        self._seq = 0
        self._delete_sql: dict[tuple[int, int], str] = {}
        self._staged: set[str] = set()  # staging tables made sure of in this write (PostgreSQL)
        # made now, while the connection is idle (it reads the connection's status)
        self._literal: Callable[[Any], str] | None = (
            mysql_literal_function(self.cur.connection) if self.dialect == "mysql" else None)
        if self.dialect == "postgresql":
            import psycopg2.extras

            self._execute_batch: Callable[..., Any] = psycopg2.extras.execute_batch

    # ---- intake --------------------------------------------------------------------------------------
    def run(self, changes: Iterable[RowChange]) -> int:
        """Apply ``changes``; returns their count once every statement has executed (the caller commits).
        On any error the pipeline is idle when this raises, and a failed statement's error wins over a
        later error of the caller's thread (it came first), with ``current`` naming its table."""
        try:
            count = self._run(changes)
            self._sync()
            return count
        except BaseException as exc:
            error = self.pipe.quiesce()  # nothing runs on the connection when the caller rolls back
            if error is not None and isinstance(exc, Exception):
                self.current = error[1]
                raise error[0]  # noqa: B904 - the earlier failure; the caller's error stays as its context
            raise
        finally:
            try:
                self.cur.close()
            except Exception:  # a lost connection: the caller maps the original error
                pass

    def _sync(self) -> None:
        """Wait until every submitted statement ran; raise the first failure, naming its table."""
        error = self.pipe.quiesce()
        if error is not None:
            self.current = error[1]
            raise error[0]

    def _submit(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the connection after the statements before it (for table ``current``)."""
        if not self.pipe.submit(self.current, fn, *args):
            self._sync()

    def _run(self, changes: Iterable[RowChange]) -> int:
        count = 0
        last_schema: TableSchema | None = None
        b: _Binding | None = None
        insert_kind = _UPSERT
        push = self._push
        batch = self.batch
        INSERT, UPDATE, DELETE, TRUNCATE = OpType.INSERT, OpType.UPDATE, OpType.DELETE, OpType.TRUNCATE
        for ch in changes:
            count += 1
            schema = ch.schema
            if schema is not last_schema:
                self.current = str(schema.name)
                b = self.sink._bind(schema, self.conn, self._sync)
                insert_kind = _UPSERT if b.keyed else _INSERT
                last_schema = schema
            assert b is not None
            op = ch.op
            if op == INSERT:
                row = ch.row
                if row is not None:  # positional: every column, in schema order (see RowChange.row)
                    names = b.names
                    text = ch.row_text
                else:
                    vals = ch.values
                    assert vals is not None
                    names = tuple(vals)
                    row = tuple(vals.values())
                    text = None
                g = self._last
                # fast path: the same group as the previous change, not emptied since
                if g is not None and g.b is b and g.kind == insert_kind and g.extra is None and g.rows and (
                        g.names is names or g.names == names):
                    rows = g.rows
                    rows.append(row)
                    texts = g.texts
                    if texts is not None:
                        if text is None:
                            g.texts = None
                        else:
                            texts.append(text)
                    self._pending += 1
                    if len(rows) >= batch:
                        self._flush_group(g)
                    elif self._pending >= self._max_pending:
                        self.flush()
                else:
                    push(b, insert_kind, names, row, None, text)
            elif op == UPDATE:
                self._update(b, ch)
            elif op == DELETE:
                self._delete(b, ch)
            elif op == TRUNCATE:
                self._flush_table(b)
                self.current = b.label
                self._submit(self.cur.execute, self.stmts.truncate(b.table), ())
            else:
                raise SinkError(f"table {b.label}: unknown operation {op!r}")
        self.flush()
        return count

    def _update(self, b: _Binding, ch: RowChange) -> None:
        row = ch.row
        if row is not None and ch.old_values is None and b.keyed:  # positional, nothing UNCHANGED
            self._push(b, _UPSERT, b.names, row, None, ch.row_text)
            return
        vals = ch.values
        if vals is None:
            raise SinkError(f"table {b.label}: UPDATE without new values")
        names, row = tuple(vals), tuple(vals.values())
        partial = UNCHANGED in row
        if partial:
            names = tuple(k for k, v in vals.items() if v is not UNCHANGED)
            row = tuple(v for v in row if v is not UNCHANGED)
        old = ch.old_values
        if not b.keyed:
            if old is None:
                raise SinkError(f"table {b.label} has no key and an UPDATE came without its old row "
                                "(set REPLICA IDENTITY FULL upstream)")
            match, nulls, mrow = _match_parts(old)
            self._push(b, _UPDATE_ONE, names, row + mrow, (match, nulls))
            return
        if old is not None:
            old_key = []
            new_key = []
            for k in b.key:
                ov = old.get(k, UNCHANGED)
                nv = vals.get(k, UNCHANGED)
                if ov is UNCHANGED or nv is UNCHANGED:
                    break
                old_key.append(ov)
                new_key.append(nv)
            else:
                if old_key != new_key:
                    if partial:
                        self._move(b, names, row, tuple(old_key))
                    else:
                        self._push(b, _DELETE, b.key, tuple(old_key), None)
                        self._push(b, _UPSERT, names, row, None)
                    return
        self._push(b, _UPSERT, names, row, None)

    def _delete(self, b: _Binding, ch: RowChange) -> None:
        old = ch.old_values if ch.old_values is not None else ch.values
        if old is None:
            raise SinkError(f"table {b.label}: DELETE without old values")
        if b.keyed:
            try:
                key = tuple(old[k] for k in b.key)
            except KeyError as exc:
                raise SinkError(f"table {b.label}: DELETE without key column {exc.args[0]!r}") from None
            if UNCHANGED in key:
                raise SinkError(f"table {b.label}: DELETE whose key value was not sent")
            self._push(b, _DELETE, b.key, key, None)
        else:
            match, nulls, mrow = _match_parts(old)
            self._push(b, _DELETE_ONE, match, mrow, ((), nulls))

    def _push(self, b: _Binding, kind: int, names: tuple[str, ...], row: tuple[Any, ...],
              extra: tuple[tuple[str, ...], tuple[str, ...]] | None, text: Any = None) -> None:
        g = self._groups.get(b.label)
        if g is None:
            g = self._groups[b.label] = _Group(b, kind, names, extra)
        elif g.b is not b or g.kind != kind or g.extra != extra or (g.names is not names and g.names != names):
            if g.rows:
                self._flush_group(g)
            g.b, g.kind, g.names, g.extra = b, kind, names, extra
        rows = g.rows
        if not rows:
            g.seq = self._seq
            self._seq += 1
        rows.append(row)
        texts = g.texts
        if texts is not None:
            if text is None:
                g.texts = None
            else:
                texts.append(text)
        self._last = g
        self._pending += 1
        if len(rows) >= self.batch:
            self._flush_group(g)
        elif self._pending >= self._max_pending:
            self.flush()

    # ---- output --------------------------------------------------------------------------------------
    def flush(self) -> None:
        """Flush every pending group, in the order their first pending rows came."""
        pending = [g for g in self._groups.values() if g.rows]
        if len(pending) > 1:
            pending.sort(key=_group_seq)
        for g in pending:
            self._flush_group(g)

    def _flush_table(self, b: _Binding) -> None:
        g = self._groups.get(b.label)
        if g is not None and g.rows:
            self._flush_group(g)

    def _flush_group(self, g: _Group) -> None:
        rows = g.rows
        if not rows:
            return
        b, kind, names, extra = g.b, g.kind, g.names, g.extra
        texts = g.texts
        g.rows = []
        g.texts = []
        self._pending -= len(rows)
        self.current = b.label
        plan = b.plan(kind, names, extra)
        copy = plan.copy
        if copy is not None and texts is not None and len(texts) == len(rows) >= _COPY_MIN_ROWS:
            if kind == _UPSERT:
                texts = _last_per_key_texts(rows, texts, plan.key_idx)  # ON CONFLICT touches a row once
            self._copy_rows(copy, texts)
            return
        if kind == _UPSERT:
            if self.dialect == "sqlite":
                _check_keys_not_null(rows, plan.key_idx, b.label)
            partial = len(names) < b.ncols
            if self.dialect == "postgresql" or partial:
                rows = _last_per_key(rows, plan.key_idx)  # ON CONFLICT cannot touch a row twice
            if partial and b.label not in self.sink._warned_missing:
                self._warn_missing(b, [tuple(r[i] for i in plan.key_idx) for r in rows])
            self._insert_rows(plan, _convert_rows(plan, rows, texts))  # texts ignored if rows were dropped
        elif kind == _INSERT:
            self._insert_rows(plan, _convert_rows(plan, rows, texts))
        elif kind == _DELETE:
            self._delete_keys(b, _convert(_distinct(rows), plan.convert))
        else:
            params = _convert(rows, plan.convert)
            if self.dialect == "postgresql":
                self._submit(self._execute_batch, self.cur, plan.sql, params, len(params))  # page_size
            else:
                self._submit(self.cur.executemany, plan.sql, params)

    def _copy_rows(self, copy: tuple[str, str | None, str | None], texts: list[Any]) -> None:
        """PostgreSQL: the rows' upstream texts through COPY, into the table (plain inserts) or into the
        session's staging table, merged into the table by one INSERT .. SELECT .. ON CONFLICT."""
        copy_sql, stage_sql, merge_sql = copy
        data = _copy_text(texts)
        if stage_sql is not None and stage_sql not in self._staged:  # once per write: a rollback drops it
            self._staged.add(stage_sql)
            self._submit(self.cur.execute, stage_sql)
        self._submit(self._copy_in, copy_sql, data)
        if merge_sql is not None:
            self._submit(self.cur.execute, merge_sql)

    def _copy_in(self, sql: str, data: str) -> None:
        self.cur.copy_expert(sql, io.StringIO(data), max(1, len(data)))  # encoded in the client encoding

    def _insert_rows(self, plan: _Plan, params: list[Any]) -> None:
        if self.dialect == "postgresql":  # one multi-row statement, formatted by psycopg2 in one call
            self._submit(self.cur.execute, plan.many(len(params)), [v for r in params for v in r])
        elif self.dialect == "mysql":
            self._mysql_insert(plan, params)
        else:  # sqlite3 loops in C
            self._submit(self.cur.executemany, plan.sql, params)

    def _mysql_insert(self, plan: _Plan, params: list[Any]) -> None:
        """Multi-row INSERTs of literal rows, at most ``_MYSQL_STATEMENT_BYTES`` each (like PyMySQL's
        executemany, with a faster literal renderer)."""
        assert plan.parts is not None
        head, tail = plan.parts
        lit = self._literal
        assert lit is not None
        if not params:
            return
        # one renderer generated for the group's value types: the same text as joining literal() of each value
        render = lit.rows(tuple(map(type, params[0])))  # type: ignore[attr-defined]
        rows: list[str] = []
        size = len(head) + len(tail)
        for r in params:
            text = render(r)
            if rows and size + len(text) > _MYSQL_STATEMENT_BYTES:
                self._submit(self.cur.execute, head + ",".join(rows) + tail)
                rows, size = [], len(head) + len(tail)
            rows.append(text)
            size += len(text) + 1
        if rows:
            self._submit(self.cur.execute, head + ",".join(rows) + tail)

    def _delete_keys(self, b: _Binding, keys: list[Any]) -> None:
        if self.dialect == "sqlite":
            self._submit(self.cur.executemany, self.stmts.delete_key(b.table), keys)
            return
        n = len(keys)
        sql = self._delete_sql.get((id(b), n))
        if sql is None:
            sql = self.stmts.delete_keys(b.table, n)
            self._delete_sql[(id(b), n)] = sql
        self._submit(self.cur.execute, sql, [v for k in keys for v in k])

    def _count_existing(self, b: _Binding, keys: list[Any]) -> int:
        self._sync()  # reads results: the statements before it first, then this one in this thread
        self.current = b.label
        if self.dialect == "sqlite":
            sql = self.stmts.exists_key(b.table)
            found = 0
            for k in keys:
                self.cur.execute(sql, k)
                found += self.cur.fetchone() is not None
            return found
        self.cur.execute(self.stmts.select_keys(b.table, len(keys)), [v for k in keys for v in k])
        return len(self.cur.fetchall())

    def _key_params(self, b: _Binding, key: tuple[Any, ...]) -> list[Any]:
        return list(b.key_convert(key) if b.key_convert else key)

    def _warn_missing(self, b: _Binding, raw_keys: list[tuple[Any, ...]]) -> None:
        keys = [self._key_params(b, k) for k in raw_keys]
        missing = len(keys) - self._count_existing(b, keys)
        if missing > 0:
            self.sink._warned_missing.add(b.label)
            log.warning("table %s: %d updated row(s) were missing downstream and are inserted without their "
                        "unsent (UNCHANGED) columns, which stay NULL; a previous loss? (warned once per table)",
                        b.label, missing)

    def _move(self, b: _Binding, names: tuple[str, ...], row: tuple[Any, ...], old_key: tuple[Any, ...]) -> None:
        """Key change with UNCHANGED columns: move the old row (keeping the unsent values) when possible."""
        self._flush_table(b)
        self._sync()  # reads results (existence, rowcount): run synchronously from here
        self.current = b.label
        new_key = tuple(row[names.index(k)] for k in b.key)
        new_params = self._key_params(b, new_key)
        old_params = self._key_params(b, old_key)
        plan = b.plan(_UPSERT, names, None)
        values = plan.convert(row) if plan.convert else row
        if not self._count_existing(b, [new_params]):
            sets = [b.colmap[n] for n in names]
            self.cur.execute(self.stmts.update_key(b.table, sets), list(values) + list(old_params))
            if self.cur.rowcount:
                return
            if b.label not in self.sink._warned_missing:
                self.sink._warned_missing.add(b.label)
                log.warning("table %s: a row whose key changed was missing downstream and is inserted without "
                            "its unsent (UNCHANGED) columns; a previous loss? (warned once per table)", b.label)
        else:
            self.cur.execute(self.stmts.delete_key(b.table), old_params)
        self._insert_rows(plan, [values])


def _group_seq(g: _Group) -> int:
    return g.seq


def _match_parts(old: dict[str, Any]) -> tuple[tuple[str, ...], tuple[str, ...], tuple[Any, ...]]:
    """Split an old row into (non-NULL column names, NULL column names, non-NULL values); skips UNCHANGED."""
    names, nulls, values = [], [], []
    for k, v in old.items():
        if v is UNCHANGED:
            continue
        if v is None:
            nulls.append(k)
        else:
            names.append(k)
            values.append(v)
    return tuple(names), tuple(nulls), tuple(values)


def _scale_to_check(col: ColumnSchema, target: TargetColumn) -> int | None:
    """The target DECIMAL scale when upstream values may have more fractional digits, else None."""
    if target.scale is None or col.base_type != "numeric" or col.is_array:
        return None
    ps = numeric_precision_scale(col)
    return target.scale if ps is None or ps[1] > target.scale else None


def _check_keys_not_null(rows: list[tuple[Any, ...]], key_idx: tuple[int, ...], label: str) -> None:
    """SQLite turns a NULL INTEGER PRIMARY KEY into a new rowid instead of refusing it: refuse it here."""
    for i in key_idx:
        for r in rows:
            if r[i] is None:
                raise SinkError(f"table {label}: key column value is NULL")


def _hashable(v: Any) -> Any:
    return tuple(_hashable(x) for x in v) if isinstance(v, list) else v


def _last_per_key(rows: list[tuple[Any, ...]], key_idx: tuple[int, ...]) -> list[tuple[Any, ...]]:
    """Keep the last row per key (upserts with the same columns: the last one wins anyway)."""
    if not key_idx:
        return rows
    try:
        if len(key_idx) == 1:
            i = key_idx[0]
            last = {r[i]: r for r in rows}
        else:
            last = {tuple(r[j] for j in key_idx): r for r in rows}
    except TypeError:  # array keys
        last = {tuple(_hashable(r[j]) for j in key_idx): r for r in rows}
    return rows if len(last) == len(rows) else list(last.values())


def _copy_value(v: str | None) -> str:
    """One value in COPY's text format: NULL as ``\\N``; backslash, tab, newline and CR escaped."""
    if v is None:
        return "\\N"
    return v.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")


def _copy_text(texts: Sequence[Sequence[str | None]]) -> str:
    """Rows of upstream text as COPY text-format data (one line per row, tab-separated, NULL as ``\\N``)."""
    lines = []
    append = lines.append
    for t in texts:
        if None not in t:
            line = "\t".join(t)
            # nothing to escape: no backslash, newline, CR, and no tab other than the separators
            if "\\" not in line and "\n" not in line and "\r" not in line and line.count("\t") == len(t) - 1:
                append(line)
                continue
        append("\t".join(map(_copy_value, t)))
    lines.append("")
    return "\n".join(lines)


def _last_per_key_texts(rows: list[tuple[Any, ...]], texts: list[Any], key_idx: tuple[int, ...]) -> list[Any]:
    """``texts`` of the last row per key (as :func:`_last_per_key`, for texts parallel to ``rows``)."""
    if not key_idx:
        return texts
    try:
        if len(key_idx) == 1:
            i = key_idx[0]
            last = {r[i]: j for j, r in enumerate(rows)}
        else:
            last = {tuple(r[k] for k in key_idx): j for j, r in enumerate(rows)}
    except TypeError:  # array keys
        last = {tuple(_hashable(r[k]) for k in key_idx): j for j, r in enumerate(rows)}
    if len(last) == len(rows):
        return texts
    return [texts[j] for j in sorted(last.values())]


def _distinct(keys: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    try:
        return list(dict.fromkeys(keys))
    except TypeError:  # array keys
        return list({_hashable(list(k)): k for k in keys}.values())
