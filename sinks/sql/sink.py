"""The SQL sink: MySQL/MariaDB (PyMySQL), PostgreSQL (psycopg2) and SQLite through SQLAlchemy Core.

Guarantees (on top of :class:`sinks.base.Sink`):
- One downstream transaction per ``write`` call, committed before ``write`` returns; on any error it is
  rolled back and nothing of the call is visible. The iterable is consumed lazily and applied in chunks
  of ``config.batch_rows`` rows inside that transaction, so memory stays bounded for huge transactions.
- Apply order (``sinks.sql.writer``, docs/architecture.md "Apply rules"): windows of whole transactions are
  applied by their net effect per key, every delete of an old image before any insert of a new one; across
  tables in the order of the foreign keys read from the target (deletes children first, inserts parents
  first); the tables of one upstream TRUNCATE in one statement. Immediate foreign keys between replicated
  target tables work; SQLite connections enable ``PRAGMA foreign_keys``.
- Keyed tables are idempotent: INSERT and UPDATE are upserts by key, DELETE deletes by key. ``UNCHANGED``
  columns are left out of the upsert (the downstream keeps its value); such a row missing downstream is
  never completed with NULLs: it is re-read through the row source (``set_row_source``) or left out, and a
  ``DataWarning`` is returned by ``take_warnings``.
- Tables without a key (REPLICA IDENTITY FULL) get the multiset net effect of a window: deletes of one row
  matching all old values, then plain inserts: *not* idempotent on replay (a replayed insert duplicates
  the row); exactly-once (below) keeps replays from reaching them.
- Exactly-once after :meth:`open_position` (default ``delivery``): the span's applied commit Ts is moved in
  the target's position table inside each write's transaction, after its rows and before the fence and
  commit (compare-and-set, :mod:`sinks.sql.position`); changes at or below it are dropped unapplied.
- Missing target tables are created from the upstream schema (docs/type-mapping.md); existing ones are used
  as they are (columns and a unique key checked), altered only by ``apply_ddl`` (docs/ddl.md).
- TRUNCATE is ``DELETE FROM`` on MySQL/SQLite (MySQL's TRUNCATE would commit implicitly) and
  ``TRUNCATE`` on PostgreSQL.
- Errors: an unreachable or lost server, a deadlock, a lock timeout or a busy SQLite file raise
  :class:`SinkUnavailable` (retryable); anything else raises :class:`SinkError` naming the table and the
  driver's message.

How rows are sent (fastest measured per operation kind, sink alone, sbtest rows, 20k rows per write):
- MySQL/MariaDB: multi-row ``INSERT .. ON DUPLICATE KEY UPDATE`` of literal rows rendered in Python.
- PostgreSQL, groups of at least ``COPY_MIN_ROWS`` positional rows that all carry their upstream text
  (``RowChange.row_text``, PostgreSQL's own output text, hence valid input for the same or a text target
  type): ``COPY`` (text format) of that text, straight into the table for tables without a key, else into a
  per-session TEMP staging table (one per table and column set, emptied after each use) merged by one
  ``INSERT .. SELECT .. ON CONFLICT (key) DO UPDATE`` (last row per key). Inserts 59k -> 124k rows/s and
  updates 47k -> 87k rows/s against multi-row INSERTs, client CPU 8.3 -> 2.0-2.6 us/row. Other groups
  (deletes, partial rows, small groups, rows from other sources) use multi-row statements with parameters.
- SQLite: ``executemany`` (in-process: no pipelining).

Modules: this one owns the engine, the target catalog (existing and created tables) and error mapping;
``sinks.sql.writer`` applies one write's changes (windows, net effect from ``sinks.sql.normalize``, order
from ``sinks.sql.fkgraph``), ``sinks.sql.output`` sends them as statements, ``sinks.sql.binding`` binds a
schema version to its table (converters, statements), ``sinks.sql.pipeline`` runs statements in a worker
thread.

Threading: one caller thread at a time (the contract's). MySQL and PostgreSQL statements run in one worker
thread per sink (:class:`Pipeline`), in order and one at a time, while the caller builds the next one; the
connection is never used by both threads at once, and ``close`` stops the worker. The engine's pool keeps
the connection between calls; ``close`` disposes of it.
"""

from __future__ import annotations

import itertools
import logging
import os
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine

from cdc.config import DdlConfig, SinkConfig
from cdc.errors import InvalidURI, SinkError, TidewaterError
from cdc.events import DdlEvent, RowChange, TableName, TableSchema
from cdc.model import DataWarning, merge_warnings
from cdc.snapshot import CopyText
from cdc.uri import parse_sink_uri
from sinks.base import RowSource, Sink
from sinks.sql import bulk, targets
from sinks.sql.binding import Binding, KnownTable
from sinks.sql.ddl import (
    TargetColumn,
    create_schema_sql,
    create_table_sql,
    mysql_collation,
    plan_table,
)
from sinks.sql.ddl_run import DdlState, apply_ddl, load_ddl_floors
from sinks.sql.errors import classify, is_db_error, wrap
from sinks.sql.fkgraph import FkGraph, read_foreign_keys
from sinks.sql.mysql_tls import PARAMS as MYSQL_TLS_PARAMS
from sinks.sql.mysql_tls import tls_connect_args
from sinks.sql.pipeline import Pipeline
from sinks.sql.position import Position, PositionSQL
from sinks.sql.position import forget as forget_position
from sinks.sql.statements import Statements
from sinks.sql.writer import Writer

log = logging.getLogger(__name__)

DIALECTS = {"mysql": "mysql", "mariadb": "mysql", "postgresql": "postgresql", "postgres": "postgresql",
            "sqlite": "sqlite"}
_PARAMS = {
    "mysql": ("connect-timeout", *MYSQL_TLS_PARAMS),
    "postgresql": ("connect-timeout", "sslmode", "sslrootcert", "sslcert", "sslkey"),
    "sqlite": ("busy-timeout",),
}
_MYSQL_SQL_MODE = ("STRICT_TRANS_TABLES,STRICT_ALL_TABLES,NO_ZERO_IN_DATE,NO_ZERO_DATE,"
                   "ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION")

_PG_NUMERIC = re.compile(r"numeric\(\d+,(-?\d+)\)")
_MAX_BINDINGS = 1024  # cached (schema version -> target) bindings before the cache is reset


class SQLSink(Sink):
    """Writes row changes to ``mysql://``, ``mariadb://``, ``postgresql://`` or ``sqlite:///`` targets.

    Target names: MySQL and SQLite put upstream ``schema.table`` into ``table`` of the URI's database
    (the upstream schema is dropped; see :meth:`target_name`), PostgreSQL keeps ``schema.table`` and
    creates the schema when missing. URI parameters: ``connect-timeout`` (seconds, MySQL/PostgreSQL),
    ``sslmode``/``sslrootcert``/``sslcert``/``sslkey`` (PostgreSQL), ``ssl-mode``/``ssl-ca``/``ssl-cert``/
    ``ssl-key`` (MySQL, see :mod:`sinks.sql.mysql_tls`), ``busy-timeout`` (seconds, SQLite).
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
        self._bulk_load = False  # set_bulk_load: the initial copy (foreign keys not checked where allowed)
        self._engine = self._make_engine()
        self._stmts: Statements | None = None
        self._mysql_collation = "utf8mb4_bin"
        self._tables: dict[tuple[str | None, str], KnownTable] = {}
        # per target schema: its base tables as the catalog showed them, handed out once (see _existing_table)
        self._existing: dict[str | None, dict[str, tuple[tuple[TargetColumn, ...], list[frozenset[str]]]]] = {}
        self._bindings: dict[int, tuple[TableSchema, Binding]] = {}  # by identity, then by value
        self._bindings_by_value: dict[TableSchema, Binding] = {}
        self._schemas_created: set[str] = set()
        self._stage_ids = itertools.count(1)  # names of PostgreSQL staging tables (one per plan)
        # PostgreSQL: may this session create the TEMP staging tables of COPY upserts? ``check`` asks
        # the server; None (never checked) counts as yes
        self.pg_temp_ok: bool | None = None
        # statements execute in a worker thread while the next one is built (not SQLite: in-process work)
        self._pipe = Pipeline(threaded=self.dialect != "sqlite")
        self._position: Position | None = None  # exactly-once: set by open_position
        self._closed = False
        self._fk = FkGraph()  # foreign keys between target tables (see _load_foreign_keys)
        self._fk_seen: set[str] = set()  # tables whose foreign keys were read
        self._row_source: RowSource | None = None
        self._warnings: tuple[DataWarning, ...] = ()
        self._ddl_state = DdlState()  # schema changes (sinks.sql.ddl_run)

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
                    # SQLite enforces foreign keys (and runs their ON DELETE/UPDATE actions) only when asked
                    cur.execute("PRAGMA foreign_keys=OFF" if self._bulk_load else "PRAGMA foreign_keys=ON")
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
            # wasted round trip per write.
            engine = sa.create_engine(url, pool_pre_ping=True, pool_reset_on_return=None,
                                      isolation_level="READ COMMITTED",
                                      connect_args={"connect_timeout": timeout, "init_command": init, **tls})

            @event.listens_for(engine, "do_connect")
            def _do_connect(_dialect: Any, _record: Any, cargs: Any, cparams: Any) -> Any:
                conn = _pymysql_connection_class()(*cargs, **cparams)
                if self._bulk_load:
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
            if not self._bulk_load:
                return
            cur = dbapi_conn.cursor()
            try:  # foreign keys are triggers that a replica role skips; it needs a superuser (or the SET grant)
                cur.execute("SET session_replication_role = replica")
                dbapi_conn.commit()
            except Exception as exc:  # noqa: BLE001 - the copy then writes with foreign keys checked
                dbapi_conn.rollback()
                log.info("%s: foreign keys stay checked during the initial copy (%s): a child row copied before "
                         "its parent fails the chunk, naming the constraint", self._where(), str(exc).strip()[:200])
            finally:
                cur.close()

        return engine

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
                self._mysql_collation = mysql_collation(mariadb, version)
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

    def take_warnings(self) -> list[DataWarning]:
        """Warnings raised since the last call (merged by code and table). A write that failed and is
        retried may count its warning twice."""
        out, self._warnings = list(self._warnings), ()
        return out

    def set_row_source(self, fetch: RowSource | None) -> None:
        self._row_source = fetch

    def _add_warning(self, w: DataWarning) -> None:
        log.warning("table %s: %s (%s; first keys %s)", w.table, w.message, w.code, ", ".join(w.keys))
        self._warnings = merge_warnings(self._warnings, [w])

    def set_ddl_config(self, config: DdlConfig) -> None:
        self._ddl_state.config = config

    def apply_ddl(self, event: DdlEvent, fence: Callable[[], None] | None = None, *, skip: bool = False) -> bool:
        """Apply a schema change once, translated for the dialect: see :mod:`sinks.sql.ddl_run`."""
        return apply_ddl(self, event, fence, skip=skip)

    def set_bulk_load(self) -> None:
        self._bulk_load = True  # read by the connect hooks: before the first connection

    def tables_with_rows(self, tables: Sequence[TableName]) -> list[TableName]:
        return targets.tables_with_rows(self, tables)  # (sinks.sql.targets)

    def write_copy_text(self, schema: TableSchema, open_text: Callable[[], CopyText | None],
                        fence: Callable[[], None] | None = None, *, replace: bool = False) -> int | None:
        return bulk.write_copy_text(self, schema, open_text, fence, replace=replace)  # (sinks.sql.bulk)

    def truncate_targets(self, tables: Sequence[TableName]) -> None:
        targets.truncate_targets(self, tables)

    # ---- foreign keys between target tables ----------------------------------------------------------
    def _fk_parents(self, label: str) -> bool:
        return self._fk.has_parents(label)

    def _is_fk_parent(self, label: str) -> bool:
        return self._fk.is_parent(label)

    def _fk_order(self, labels: list[str]) -> list[str]:
        """``labels`` with parent tables before their children (foreign keys read from the target)."""
        return self._fk.order(labels)

    def _load_foreign_keys(self, conn: Connection, tschema: str | None, label: str) -> None:
        """Read the foreign keys between the tables of target schema ``tschema`` (once per schema, and again
        when a table not seen then is bound: created or added downstream since)."""
        cur = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        try:
            edges, seen = read_foreign_keys(cur, self._statements(), self.dialect, tschema)
        finally:
            cur.close()
        self._fk.add_all(edges)
        self._fk_seen |= seen | {label}
        if edges:
            log.info("%s: %d foreign key(s) between target tables: deletes go children first, inserts parents "
                     "first", self._where(), len(edges))

    # ---- exactly-once (sinks.sql.position) ----------------------------------------------------------
    def _position_sql(self) -> PositionSQL:
        return PositionSQL(self.dialect, self._engine.dialect.identifier_preparer, self._config.checkpoint_table)

    def open_position(self, changefeed: str, span: int, origin: int = 0) -> int:
        """Exactly-once from now on (unless ``delivery = "at-least-once"``): see :mod:`sinks.sql.position`."""
        self._check_open()
        if self._config.delivery == "at-least-once":
            return load_ddl_floors(self, changefeed)  # 0; rows from before an applied DDL are replays
        pos = Position(self, self._position_sql(), changefeed, span, origin)
        try:
            applied = pos.open()
        except Exception as exc:
            if isinstance(exc, TidewaterError) or not is_db_error(exc):
                raise
            raise self._wrap(exc, pos.sql.label) from exc
        self._position = pos
        return applied

    def forget(self, changefeed: str) -> int:
        self._check_open()
        try:
            return forget_position(self, self._position_sql(), changefeed)
        except Exception as exc:
            if isinstance(exc, TidewaterError) or not is_db_error(exc):
                raise
            raise self._wrap(exc, self._config.checkpoint_table) from exc

    def write(self, changes: Iterable[RowChange], fence: Callable[[], None] | None = None) -> int:
        self._check_open()
        writer: Writer | None = None
        pos = self._position
        tracked: _Tracked | None = None
        if pos is not None:
            changes = tracked = _Tracked(changes, pos.skip_at())
        elif self._ddl_state.floors:
            changes = self._ddl_state.drop_replayed(changes)
        try:
            with self._engine.connect() as conn:
                trans = conn.begin()
                try:
                    stmts = self._statements()
                    writer = Writer(self, conn, stmts)
                    count = writer.run(changes)
                    if tracked is not None and pos is not None:
                        if not tracked.done:
                            raise SinkError("internal: the writer returned before consuming its changes")
                        if tracked.skipped:
                            log.info("changefeed=%s span=%d: skipped %d change(s) already downstream (commit <= %d)",
                                     pos.changefeed, pos.span, tracked.skipped, pos.applied)
                        if tracked.last_ts:
                            writer.current = pos.sql.label
                            pos.record(conn, tracked.last_ts, tracked.last_time)
                    if fence is not None:
                        fence()
                    trans.commit()
                    if tracked is not None and pos is not None and tracked.last_ts:
                        pos.committed(tracked.last_ts)
                    return count
                except BaseException as exc:
                    if is_db_error(exc) and self._classify(exc)[1]:
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
            if isinstance(exc, TidewaterError) or not is_db_error(exc):
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
    def _bind(self, schema: TableSchema, conn: Connection, before_io: Callable[[], None] | None = None) -> Binding:
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
        if table.label not in self._fk_seen:
            if before_io is not None:
                before_io()
            self._load_foreign_keys(conn, parts[0], table.label)
        binding = Binding(self, schema, table)
        if len(self._bindings_by_value) > _MAX_BINDINGS:
            self._bindings_by_value.clear()
        self._bindings[id(schema)] = (schema, binding)
        self._bindings_by_value[schema] = binding
        return binding

    def _existing_table(self, conn: Connection, tschema: str | None, tname: str) -> KnownTable | None:
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
        return KnownTable(label, tschema, tname, cols, uniques, created=False)

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

    def _prepare_table(self, schema: TableSchema, conn: Connection) -> KnownTable:
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
        return KnownTable(label, planned.schema, planned.name, planned.columns,
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

    def _reflect(self, conn: Connection, tschema: str | None, tname: str, label: str) -> KnownTable:
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
        return KnownTable(label, tschema, tname, tuple(cols), uniques, created=False)

    # ---- errors --------------------------------------------------------------------------------------
    def _classify(self, exc: BaseException) -> tuple[bool, bool, Any]:
        """(retryable, connection lost, driver exception): see :func:`sinks.sql.errors.classify`."""
        return classify(self.dialect, exc)

    def _wrap(self, exc: BaseException, table: str | None) -> TidewaterError:
        return wrap(self.dialect, self._uri, self._where(), exc, table)


class _Tracked:
    """The changes of one ``write`` after the span's applied position: drops the leading changes whose
    commit Ts is at or below ``applied`` (already downstream; input is ordered by commit Ts) and notes the
    last change's commit Ts and time once exhausted. Per change it costs one generator step; the
    comparison runs only until the first change past ``applied``."""

    __slots__ = ("_it", "applied", "skipped", "last_ts", "last_time", "done")

    def __init__(self, changes: Iterable[RowChange], applied: int) -> None:
        self.applied = applied
        self.skipped = 0
        self.last_ts = 0
        self.last_time = 0.0
        self.done = False
        self._it = self._gen(iter(changes))

    def __iter__(self) -> Iterator[RowChange]:
        return self._it

    def _gen(self, it: Iterator[RowChange]) -> Iterator[RowChange]:
        applied = self.applied
        for ch in it:
            if ch.commit_ts > applied:
                break
            self.skipped += 1
        else:
            self.done = True
            return
        yield ch
        for ch in it:  # noqa: B020 - ch ends as the call's last change
            yield ch
        self.done = True
        self.last_ts, self.last_time = ch.commit_ts, ch.commit_time


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
