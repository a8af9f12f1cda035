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

Modules: this one owns the sink's state (engine, caches, exactly-once position) and the write transaction;
``sinks.sql.engine`` builds the engine per dialect, ``sinks.sql.catalog`` finds, reads and creates target
tables (bindings, foreign keys), ``sinks.sql.errors`` maps driver errors, ``sinks.sql.writer`` applies one write's changes (windows, net effect from ``sinks.sql.normalize``, order
from ``sinks.sql.fkgraph``), ``sinks.sql.output`` sends them as statements, ``sinks.sql.bulk`` and
``sinks.sql.deferred_key`` are the initial copy's COPY passthrough and its tables with the key built after the load, ``sinks.sql.binding`` binds a
schema version to its table (converters, statements), ``sinks.sql.pipeline`` runs statements in a worker
thread.

Threading: one caller thread at a time (the contract's). MySQL and PostgreSQL statements run in one worker
thread per sink (:class:`Pipeline`), in order and one at a time, while the caller builds the next one; the
connection is never used by both threads at once, and ``close`` stops the worker. The engine's pool keeps
the connection between calls; ``close`` disposes of it.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from sqlalchemy.engine import Connection, Engine

from cdc.config import DdlConfig, SinkConfig
from cdc.errors import InvalidURI, SinkError, TidewaterError
from cdc.events import DdlEvent, RowChange, TableName, TableSchema
from cdc.model import DataWarning, merge_warnings
from cdc.snapshot import ChunkMarker, CopyText
from cdc.ts import Watermark
from cdc.uri import parse_sink_uri
from sinks.base import AtomicTxnSink, DdlSettings, DdlSink, PositionStore, RowSource, RowSourceUser
from sinks.copy_roles import BulkLoad, CopyTargets, DeferredKeyCopy, ExistingRows, RowCounts, TextCopy
from sinks.sql import bulk, catalog, deferred_key, targets
from sinks.sql.binding import Binding, KnownTable
from sinks.sql.ddl import TargetColumn, mysql_collation
from sinks.sql.ddl_run import DdlState, apply_ddl, load_ddl_floors
from sinks.sql.engine import DIALECTS, PARAMS, abandon, make_engine, where
from sinks.sql.errors import classify, is_db_error, wrap
from sinks.sql.fkgraph import FkGraph
from sinks.sql.pipeline import Pipeline
from sinks.sql.position import Position, PositionSQL, Tracked
from sinks.sql.position import forget as forget_position
from sinks.sql.statements import Statements
from sinks.sql.writer import Writer

log = logging.getLogger(__name__)


class SQLSink(AtomicTxnSink, PositionStore, DdlSink, DdlSettings, RowSourceUser, BulkLoad, TextCopy, DeferredKeyCopy,
              CopyTargets, ExistingRows, RowCounts):
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
        unknown = sorted(set(self._uri.params) - set(PARAMS[self.dialect]))
        if unknown:
            raise InvalidURI(f"sink URI {self._uri.redacted()!r}: unknown parameter(s) {', '.join(unknown)} "
                             f"(accepted: {', '.join(PARAMS[self.dialect])})")
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
        self._fk = FkGraph()  # foreign keys between target tables (see sinks.sql.catalog.load_foreign_keys)
        self._fk_seen: set[str] = set()  # tables whose foreign keys were read
        self._row_source: RowSource | None = None
        self._warnings: tuple[DataWarning, ...] = ()
        self._ddl_state = DdlState()  # schema changes (sinks.sql.ddl_run)

    # ---- engine (sinks.sql.engine) ------------------------------------------------------------------
    def _make_engine(self) -> Engine:
        return make_engine(self)

    def _where(self) -> str:
        return where(self)

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
        with self.errors(), self._engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
            self._statements()
            if self.dialect == "postgresql":
                self.pg_temp_ok = bool(conn.exec_driver_sql(
                    "SELECT has_database_privilege(current_database(), 'TEMP')").scalar())
                if not self.pg_temp_ok:
                    log.info("%s: no TEMP privilege, keyed upserts use multi-row INSERT instead of COPY",
                             self._where())

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

    @property
    def row_source(self) -> RowSource | None:
        """The row source given by ``set_row_source`` (None: none): also re-reads the values a volatile default
        gave the rows that existed before an ADD COLUMN (``sinks.sql.ddl_run``)."""
        return self._row_source

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

    def count_rows(self, tables: Sequence[TableName]) -> dict[TableName, int] | None:
        return targets.count_rows(self, tables)

    def write_copy_text(self, schema: TableSchema, open_text: Callable[[], CopyText | None],
                        fence: Callable[[], None] | None = None, *, replace: bool = False) -> int | None:
        return bulk.write_copy_text(self, schema, open_text, fence, replace=replace)  # (sinks.sql.bulk)

    def truncate_targets(self, tables: Sequence[TableName], *, schemas: Sequence[TableSchema] = (),
                         at: Watermark | None = None) -> None:
        targets.truncate_targets(self, tables)  # at once: readers of a database see its current rows

    def restart_copy_target(self, schema: TableSchema, changefeed: str, span: int, commit_ts: int,
                            commit_time: float) -> None:
        targets.drop_copy_target(self, schema.name, changefeed, span)

    # ---- the initial copy with the key built after the load (sinks.sql.deferred_key) ------------------
    def defer_key_refusal(self, schema: TableSchema) -> str | None:
        return deferred_key.deferrable(self, schema)

    def copy_target_exists(self, schema: TableSchema) -> bool:
        return self._guarded(lambda: deferred_key.target_exists(self, schema), schema)

    def create_deferred_target(self, schema: TableSchema) -> None:
        self._guarded(lambda: deferred_key.create_target(self, schema), schema)

    def copy_markers(self, changefeed: str, span: int, table: TableName) -> dict[int, ChunkMarker]:
        return self._guarded(lambda: deferred_key.read_markers(self, changefeed, span, str(table)), None)

    def write_marked_chunk(self, schema: TableSchema, open_text: Callable[[], CopyText | None], marker: ChunkMarker,
                           fence: Callable[[], None] | None = None) -> tuple[int, bool]:
        return deferred_key.write_marked_chunk(self, schema, open_text, marker, fence)

    def build_deferred_key(self, schema: TableSchema, changefeed: str, span: int,
                           fence: Callable[[], None] | None = None) -> bool:
        return deferred_key.build_key(self, schema, changefeed, span, fence)

    def _guarded(self, fn: Callable[[], Any], schema: TableSchema | None) -> Any:
        """``fn()``, a driver error wrapped as ``write`` wraps it."""
        self._check_open()
        try:
            return fn()
        except Exception as exc:
            if isinstance(exc, TidewaterError) or not is_db_error(exc):
                raise
            raise self._wrap(exc, None if schema is None else self.target_name(schema.name)) from exc

    # ---- foreign keys between target tables ----------------------------------------------------------
    def _fk_parents(self, label: str) -> bool:
        return self._fk.has_parents(label)

    def _is_fk_parent(self, label: str) -> bool:
        return self._fk.is_parent(label)

    def _fk_order(self, labels: list[str]) -> list[str]:
        """``labels`` with parent tables before their children (foreign keys read from the target)."""
        return self._fk.order(labels)

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
            if self.dialect == "postgresql":  # markers of an initial copy that never built its keys
                deferred_key.forget(self, changefeed)
            return forget_position(self, self._position_sql(), changefeed)
        except Exception as exc:
            if isinstance(exc, TidewaterError) or not is_db_error(exc):
                raise
            raise self._wrap(exc, self._config.checkpoint_table) from exc

    def write(self, changes: Iterable[RowChange], fence: Callable[[], None] | None = None) -> int:
        self._check_open()
        writer: Writer | None = None
        pos = self._position
        tracked: Tracked | None = None
        if pos is not None:
            changes = tracked = Tracked(changes, pos.skip_at())
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
                    abandon(self, conn, trans, exc)
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

    # ---- tables (sinks.sql.catalog) -----------------------------------------------------------------
    def _bind(self, schema: TableSchema, conn: Connection, before_io: Callable[[], None] | None = None) -> Binding:
        """The binding of ``schema``; ``before_io`` is called before ``conn`` (or the server) is used."""
        return catalog.bind(self, schema, conn, before_io)

    def _existing_table(self, conn: Connection, tschema: str | None, tname: str) -> KnownTable | None:
        return catalog.existing_table(self, conn, tschema, tname)

    def _ddl(self, conn: Connection, sql: str) -> None:
        catalog.run_ddl(self, conn, sql)

    def _reflect(self, conn: Connection, tschema: str | None, tname: str, label: str) -> KnownTable:
        return catalog.reflect(self, conn, tschema, tname, label)

    # ---- errors --------------------------------------------------------------------------------------
    def _classify(self, exc: BaseException) -> tuple[bool, bool, Any]:
        """(retryable, connection lost, driver exception): see :func:`sinks.sql.errors.classify`."""
        return classify(self.dialect, exc)

    def _wrap(self, exc: BaseException, table: str | None) -> TidewaterError:
        return wrap(self.dialect, self._uri, self._where(), exc, table)

    @contextlib.contextmanager
    def errors(self) -> Iterator[None]:
        """A driver error inside is raised as this sink's classified ``TidewaterError`` (``_wrap``); a
        ``TidewaterError`` passes as it is."""
        try:
            yield
        except TidewaterError:
            raise
        except Exception as exc:
            raise self._wrap(exc, None) from exc
