"""The SQL sink: MySQL/MariaDB (PyMySQL), PostgreSQL (psycopg2) and SQLite through SQLAlchemy Core.

Guarantees (on top of the contracts of its roles: :mod:`sinks.base`, :mod:`sinks.copy_roles`):
- One downstream transaction per ``write`` call, committed before ``write`` returns; on any error it is
  rolled back and nothing of the call is visible. The iterable is consumed lazily and applied in chunks
  of ``config.batch_rows`` rows inside that transaction, so memory stays bounded for huge transactions.
- Apply order (``sinks.sql.ops.writer``, docs/architecture.md "Apply rules"): windows of whole transactions are
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
  commit (compare-and-set, :mod:`sinks.sql.target.position`); changes at or below it are dropped unapplied.
- ``[consistency] mode = "snapshot"`` (``BarrierSink``, :mod:`sinks.sql.ops.barrier`): after ``stage_barriers`` a
  ``write`` stages its changes in ``tidewater_stage`` with the position instead of applying them; ``apply_barrier``
  applies everything staged up to a barrier in one transaction with its ``tidewater_syncpoint`` row
  (docs/consistency.md). A schema change that alters a table's shape is applied by a staging sink only once the
  target shows the barrier just before its transaction (``apply_ddl``). The default mode's write path is unchanged.
- Missing target tables are created from the upstream schema (docs/type-mapping.md); existing ones are used
  as they are (columns and a unique key checked), altered only by ``apply_ddl`` (docs/ddl.md). A missing table that
  the sink's changefeed (``open_position``) has had, dropped behind its back, is refused with ``TargetTableDropped``
  instead, never created again empty (:mod:`sinks.sql.target.table_record`).
- TRUNCATE is ``DELETE FROM`` on MySQL/SQLite (MySQL's TRUNCATE would commit implicitly) and
  ``TRUNCATE`` on PostgreSQL.
- Errors: an unreachable or lost server, a deadlock, a lock timeout or a busy SQLite file raise
  :class:`SinkUnavailable` (retryable); anything else raises :class:`SinkError` naming the table and the
  driver's message.

How rows are sent (fastest measured per operation kind, sink alone, sbtest rows, 20k rows per write):
- MySQL/MariaDB: multi-row ``INSERT .. ON DUPLICATE KEY UPDATE`` of literal rows rendered in Python (C where it
  builds); groups of upstream INSERTs that carry their upstream text by ``LOAD DATA LOCAL INFILE`` into the table
  under a savepoint, rolled back to those statements on anything it would not store exactly (``ops/fresh_load``:
  ~30 % less server CPU per new row).
- PostgreSQL, groups of at least ``COPY_MIN_ROWS`` positional rows that all carry their upstream text
  (``RowChange.row_text``, PostgreSQL's own output text, hence valid input for the same or a text target
  type): ``COPY`` (text format) of that text, straight into the table for tables without a key, else into a
  per-session TEMP staging table (one per table and column set, emptied after each use) merged by one
  ``INSERT .. SELECT .. ON CONFLICT (key) DO UPDATE`` (last row per key). Inserts 59k -> 124k rows/s and
  updates 47k -> 87k rows/s against multi-row INSERTs, client CPU 8.3 -> 2.0-2.6 us/row. Other groups
  (deletes, partial rows, small groups, rows from other sources) use multi-row statements with parameters.
- SQLite: ``executemany`` (in-process: no pipelining).

Layers (``sinks/sql/``; each imports only the ones below it, enforced by import-linter):

- this module: the facade, :class:`SQLSink`; nothing in the package imports it;
- ``ops/``: the operations, each built from the target objects: ``writer`` applies one write's changes (windows,
  net effect, order) through ``output`` (statements, COPY, literal rows; ``fresh_load``: MySQL's loads of
  upstream INSERTs); ``ddl_run`` applies a schema change once;
  ``bulk`` (COPY passthrough), ``load_copy`` (MySQL: ``LOAD DATA LOCAL INFILE`` of rows rendered in C, rolled back
  to the next on anything it would not store exactly), ``literal_copy`` (MySQL: literal rows rendered in C) and
  ``deferred_key`` (the key built after the load) load the initial copy, and
  ``copy_targets`` prepares its target tables;
- ``target/``: objects with state and public methods: ``connection.Target`` (URI, engine, statement pipeline,
  error mapping), ``catalog.Catalog`` (tables, bindings, foreign keys), ``binding`` (a schema version bound to its
  table), ``position`` (the exactly-once position), ``pipeline`` (the statement worker);
- ``dialect/``: no I/O and no state: type mapping (``typemap``), DDL translation (``ddl``), ``statements``,
  ``values``, ``errors``, ``normalize`` (a window's net effect), ``fkgraph`` (apply order).

Threading: one caller thread at a time (the contract's). MySQL and PostgreSQL statements run in one worker
thread per sink (:class:`sinks.sql.target.pipeline.Pipeline`), in order and one at a time, while the caller builds
the next one; the connection is never used by both threads at once, and ``close`` stops the worker. The engine's
pool keeps the connection between calls; ``close`` disposes of it.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence

from sqlalchemy.engine import Connection

from cdc.config import DdlConfig, SinkConfig
from cdc.errors import SinkError
from cdc.events import DdlEvent, RowChange, TableName, TableSchema
from cdc.model import DataWarning, merge_warnings
from cdc.snapshot import ChunkMarker, CopyText
from cdc.ts import Watermark
from sinks.base import (
    AtomicTxnSink,
    BarrierApplied,
    BarrierSink,
    DdlSettings,
    DdlSink,
    PositionStore,
    RowSource,
    RowSourceUser,
    TableShape,
    TableShapes,
    TextRows,
    waits_for_barrier,
)
from sinks.copy_roles import (
    BulkLoad,
    CopyTargets,
    DeferredKeyCopy,
    ExistingRows,
    RowCounts,
    TablesHad,
    TextCopy,
)
from sinks.sql.ops import copy_targets
from sinks.sql.ops.barrier import BarrierApply, Stager
from sinks.sql.ops.bulk import CopyPassthrough
from sinks.sql.ops.ddl_run import DdlRunner
from sinks.sql.ops.deferred_key import DeferredKey
from sinks.sql.ops.fresh_load import FreshLoads
from sinks.sql.ops.literal_copy import LiteralCopy
from sinks.sql.ops.load_copy import Fallback, LoadCopy
from sinks.sql.ops.parallel import ParallelApply, collector_paused
from sinks.sql.ops.writer import Writer
from sinks.sql.target.catalog import Catalog
from sinks.sql.target.connection import Target
from sinks.sql.target.position import Position, PositionSQL, Tracked, skip_done
from sinks.sql.target.position import forget as forget_position
from sinks.sql.target.staging import StageSQL
from sinks.sql.target.table_record import forget as forget_record
from sinks.sql.target.table_record import forget_tables

log = logging.getLogger(__name__)

class SQLSink(AtomicTxnSink, PositionStore, DdlSink, DdlSettings, RowSourceUser, TextRows, BarrierSink, BulkLoad,
              TextCopy, DeferredKeyCopy, CopyTargets, ExistingRows, RowCounts, TableShapes, TablesHad):
    """Writes row changes to ``mysql://``, ``mariadb://``, ``postgresql://`` or ``sqlite:///`` targets.

    Target names: MySQL and SQLite put upstream ``schema.table`` into ``table`` of the URI's database
    (the upstream schema is dropped; see :meth:`target_name`), PostgreSQL keeps ``schema.table`` and
    creates the schema when missing. URI parameters: ``connect-timeout`` (seconds, MySQL/PostgreSQL),
    ``sslmode``/``sslrootcert``/``sslcert``/``sslkey`` (PostgreSQL), ``ssl-mode``/``ssl-ca``/``ssl-cert``/
    ``ssl-key`` (MySQL, see :mod:`sinks.sql.target.mysql_tls`), ``busy-timeout`` (seconds, SQLite).

    ``target`` (:class:`Target`) and ``catalog`` (:class:`Catalog`) are the objects it is built from.
    """

    def __init__(self, uri: str, config: SinkConfig | None = None) -> None:
        self.target = Target(uri)
        self.dialect = self.target.dialect
        self._config = config or SinkConfig()
        self.catalog = Catalog(self.target)
        self._position: Position | None = None  # exactly-once: set by open_position
        self._row_source: RowSource | None = None
        self._warnings: tuple[DataWarning, ...] = ()
        self._ddl = DdlRunner(self.target, self.catalog, self._add_warning)
        self._passthrough = CopyPassthrough(self.target, self.catalog)
        self._literal_copy = LiteralCopy(self.target, self.catalog, self._config.batch_rows)
        self._load_copy = LoadCopy(self.target, self.catalog)
        # MySQL: upstream INSERTs with their text by LOAD DATA into the table (sinks.sql.ops.fresh_load)
        self._fresh_loads = FreshLoads(self.target.where) if self.dialect == "mysql" else None
        self._deferred = DeferredKey(self.target, self.catalog)
        self._warn_lock = threading.Lock()  # apply workers add warnings from their threads
        workers = self._config.worker_count if self.dialect != "sqlite" else 1
        self._parallel = ParallelApply(self.target, self.catalog, self._config, workers, self._add_warning) \
            if workers > 1 else None
        self._stager: Stager | None = None  # [consistency] mode = "snapshot": set by stage_barriers
        self._stage_origin = 0  # the changefeed's start Ts (stage_barriers): the applied barrier is read with it
        self._barriers: BarrierApply | None = None  # the coordinator's, on first apply_barrier

    # ---- the roles (sinks.base, sinks.copy_roles) ----------------------------------------------------
    def check(self) -> None:
        """Connect once; SinkUnavailable if the server cannot be reached, SinkError (with the fix) if the
        database is missing, access is denied or a SQLite file cannot be opened for writing."""
        self.target.check()

    def target_name(self, table: TableName) -> str:
        """``table`` (MySQL, SQLite: the upstream schema is dropped) or ``schema.table`` (PostgreSQL)."""
        return self.target.target_name(table)

    def take_warnings(self) -> list[DataWarning]:
        """Warnings raised since the last call (merged by code and table). A write that failed and is
        retried may count its warning twice."""
        with self._warn_lock:
            out, self._warnings = list(self._warnings), ()
        return out

    def table_shape(self, table: TableName) -> TableShape | None:
        """The target table of ``table`` as the target's catalog shows it now (``sinks.base.TableShapes``)."""
        target = self.target
        tschema, tname = target.target_parts(table)
        return target.guarded(lambda: self.catalog.shape(tschema, tname, target.target_name(table)), str(table))

    def set_row_source(self, fetch: RowSource | None) -> None:
        """Re-reads rows missing downstream, and the values a volatile default gave the rows that existed before
        an ADD COLUMN (``sinks.sql.ops.ddl_run``)."""
        self._row_source = fetch

    def _add_warning(self, w: DataWarning) -> None:
        log.warning("table %s: %s (%s; first keys %s)", w.table, w.message, w.code, ", ".join(w.keys))
        with self._warn_lock:
            self._warnings = merge_warnings(self._warnings, [w])

    def set_ddl_config(self, config: DdlConfig) -> None:
        self._ddl.config = config

    def apply_ddl(self, event: DdlEvent, fence: Callable[[], None] | None = None, *, skip: bool = False) -> bool:
        """Apply a schema change once, translated for the dialect: see :mod:`sinks.sql.ops.ddl_run`. A staging sink
        (``[consistency] mode = "snapshot"``) applies one that changes no existing row's shape
        (``sinks.base.BARRIER_FREE_DDL``: a new table, an index, a comment) at once, and any other one only once the
        target shows the barrier just before its transaction (``sinks.base.BarrierSink``; the span waits for it):
        every staged row of the old shape is then applied. It refuses one whose own transaction staged rows of its
        table(s) before it in this span (old shape, applied with that transaction's barrier, after the DDL), naming
        the table, the commit Ts and the statement (docs/consistency.md, "Schema changes")."""
        if self._stager is not None and not skip and waits_for_barrier(event):
            self._check_staged_ddl(event)
        return self._ddl.apply(event, fence, skip=skip, position=self._position, row_source=self._row_source)

    def _check_staged_ddl(self, event: DdlEvent) -> None:
        """The staging sink's conditions for applying ``event`` now (:meth:`apply_ddl`); nothing to check when the
        record shows it applied (a replay: the runner skips it)."""
        pos, stager = self._position, self._stager
        if pos is None or stager is None:
            raise SinkError("internal: a staging sink applies a schema change only after open_position()")
        target = self.target
        if target.guarded(lambda: self._ddl.state(pos.changefeed, event), str(event.table)) is not None:
            return
        what = f"the schema change of {event.table} at commit {event.commit_ts} ({event.query[:80]!r})"
        shown = self.applied_barrier(pos.changefeed, self._stage_origin)
        if shown < event.commit_ts - 1 or shown >= event.commit_ts:
            raise SinkError(f"internal: {what} is applied under [consistency] mode = \"snapshot\" only when the target "
                            f"shows barrier {event.commit_ts - 1}, the one just before its transaction; it shows "
                            f"{shown}")
        names = {str(t) for t in (event.table, event.new_table) if t is not None}
        before = target.guarded(lambda: stager.tables_staged(pos, event.commit_ts), str(event.table)) & names
        if before:
            raise SinkError(f"{what}: its transaction changed rows of {', '.join(sorted(before))} before it, and under "
                            "[consistency] mode = \"snapshot\" those rows are staged in the table's old shape and "
                            "applied with the transaction's barrier, after the schema change: not applied. Commit the "
                            "rows and the schema change in separate upstream transactions, or recreate the changefeed "
                            "with mode = \"default\" (docs/consistency.md, \"Schema changes\")")

    def set_bulk_load(self) -> None:
        self.target.bulk_load = True  # read by the connect hooks: before the first connection

    def tables_with_rows(self, tables: Sequence[TableName]) -> list[TableName]:
        return copy_targets.tables_with_rows(self.target, tables)

    def count_rows(self, tables: Sequence[TableName]) -> dict[TableName, int] | None:
        return copy_targets.count_rows(self.target, tables)

    def write_copy_text(self, schema: TableSchema, open_text: Callable[[], CopyText | None],
                        fence: Callable[[], None] | None = None, *, replace: bool = False) -> int | None:
        try:
            return self._write_copy_text(schema, open_text, fence, replace=replace)
        except BaseException as exc:  # a table the changefeed has had, dropped while this (copy) sink held it bound
            dropped = self.catalog.record.explain(exc, self.target.target_name(schema.name))
            if dropped is not None:
                raise dropped from exc
            raise

    def _write_copy_text(self, schema: TableSchema, open_text: Callable[[], CopyText | None],
                         fence: Callable[[], None] | None, *, replace: bool) -> int | None:
        if self.dialect == "mysql":  # LOAD DATA (sinks.sql.ops.load_copy), else literal rows rendered in C
            loaded = self._load_copy.write(schema, open_text, fence, replace=replace,
                                           tracks_position=self._tracks_position())
            if loaded is Fallback.PARSED:
                return None
            if loaded is not Fallback.STATEMENTS:
                return loaded
            return self._literal_copy.write(schema, open_text, fence, replace=replace,
                                            tracks_position=self._tracks_position())
        return self._passthrough.write(schema, open_text, fence, replace=replace,
                                       tracks_position=self._tracks_position())

    def truncate_targets(self, tables: Sequence[TableName], *, schemas: Sequence[TableSchema] = (),
                         at: Watermark | None = None) -> None:
        copy_targets.truncate_targets(self.target, tables)  # at once: readers of a database see its current rows

    def restart_copy_target(self, schema: TableSchema, changefeed: str, span: int, commit_ts: int,
                            commit_time: float) -> None:
        copy_targets.drop_copy_target(self.target, self.catalog, schema.name, changefeed, span)

    # ---- the initial copy with the key built after the load (sinks.sql.ops.deferred_key) --------------
    def _tracks_position(self) -> bool:
        """Whether this sink moves a stream position (exactly-once, or DDL floors): the initial copy's fast paths
        are then off."""
        return self._position is not None or bool(self._ddl.floors)

    def defer_key_refusal(self, schema: TableSchema) -> str | None:
        return self._deferred.refusal(schema, tracks_position=self._tracks_position())

    def copy_target_exists(self, schema: TableSchema) -> bool:
        target = self.target
        return target.guarded(lambda: self._deferred.target_exists(schema), target.target_name(schema.name))

    def create_deferred_target(self, schema: TableSchema) -> None:
        target = self.target
        target.guarded(lambda: self._deferred.create_target(schema), target.target_name(schema.name))

    def copy_markers(self, changefeed: str, span: int, table: TableName) -> dict[int, ChunkMarker]:
        return self.target.guarded(lambda: self._deferred.read_markers(changefeed, span, str(table)), None)

    def write_marked_chunk(self, schema: TableSchema, open_text: Callable[[], CopyText | None], marker: ChunkMarker,
                           fence: Callable[[], None] | None = None) -> tuple[int, bool]:
        return self._deferred.write_marked_chunk(schema, open_text, marker, fence,
                                                 tracks_position=self._tracks_position())

    def build_deferred_key(self, schema: TableSchema, changefeed: str, span: int,
                           fence: Callable[[], None] | None = None) -> bool:
        return self._deferred.build_key(schema, changefeed, span, fence)

    # ---- exactly-once (sinks.sql.target.position) ---------------------------------------------------
    def _position_sql(self) -> PositionSQL:
        return PositionSQL(self.dialect, self.target.engine.dialect.identifier_preparer,
                           self._config.checkpoint_table)

    def open_position(self, changefeed: str, span: int, origin: int = 0) -> int:
        """Exactly-once from now on (unless ``delivery = "at-least-once"``): see :mod:`sinks.sql.target.position`.
        Either way the sink is bound to ``changefeed`` from now on: a target table the changefeed has had that is
        missing downstream is refused, not created again (:mod:`sinks.sql.target.table_record`). Returns the highest
        commit Ts the target holds for the span: the position, or with parallel apply the last transaction a worker
        committed above it before a crash (the applied table), so that the span's ``check_target_ahead`` sees it."""
        self.target.check_open()
        self.bind_tables_had(changefeed, span, origin)
        if self._config.delivery == "at-least-once":
            return self._ddl.load_floors(changefeed)  # 0; rows from before an applied DDL are replays
        pos = Position(self.target, self._position_sql(), changefeed, span, origin,
                       parallel=self._parallel is not None)
        applied = self.target.guarded(pos.open, pos.sql.label)  # (its table's creation, then its transaction)
        if self._stager is not None:
            stager = self._stager
            self.target.guarded(lambda: stager.open(pos), None)
        self._position = pos
        return max(applied, max(pos.done, default=applied))  # parallel apply: committed above the position too

    def forget(self, changefeed: str) -> int:
        if self.dialect == "postgresql":  # markers of an initial copy that never built its keys
            self._deferred.forget(changefeed)
        stage = self._stage_sql()
        with self.target.transaction(stage.label) as conn:  # staged changes and barriers (snapshot mode)
            stage.forget(conn, changefeed)
        forget_record(self.target, self.catalog.record.sql(), changefeed)
        return forget_position(self.target, self._position_sql(), changefeed)

    def bind_tables_had(self, changefeed: str, span: int, origin: int) -> None:
        """Bound to ``changefeed``'s span from now on (``open_position`` does this too; the copy job without a position):
        see :mod:`sinks.sql.target.table_record`."""
        record = self.catalog.record
        self.target.guarded(lambda: record.open(changefeed, span, origin), None)

    def forget_tables_had(self, changefeed: str, tables: Sequence[TableName]) -> int:
        """A resync of ``tables``: their target tables may be created anew (:mod:`sinks.sql.target.table_record`)."""
        target, sql = self.target, self.catalog.record.sql()
        labels = [target.target_name(t) for t in tables]
        return int(target.guarded(lambda: forget_tables(target, sql, changefeed, labels), sql.label))

    # ---- [consistency] mode = "snapshot" (sinks.sql.ops.barrier) -------------------------------------------
    def _stage_sql(self) -> StageSQL:
        return StageSQL(self.dialect, self.target.engine.dialect.identifier_preparer)

    def stage_barriers(self, origin: int = 0) -> None:
        if self._position is not None:
            raise SinkError("internal: stage_barriers() must be called before open_position()")
        self._stager = Stager(self.target, self._stage_sql(), self._parallel)
        self._stage_origin = origin

    def apply_barrier(self, changefeed: str, origin: int, barrier_ts: int, barrier_time: float, *, history: bool,
                      fence: Callable[[], None] | None = None) -> BarrierApplied:
        self.target.check_open()
        return self._barrier_apply().apply(changefeed, origin, barrier_ts, barrier_time, history=history,
                                           fence=fence)

    def applied_barrier(self, changefeed: str, origin: int) -> int:
        self.target.check_open()
        return self._barrier_apply().applied(changefeed, origin)

    def _barrier_apply(self) -> BarrierApply:
        if self._barriers is None:
            self._barriers = BarrierApply(self.target, self._position_sql(), self._stage_sql(), self.writer)
        return self._barriers

    # ---- writes ----------------------------------------------------------------------------------------
    def writer(self, conn: Connection) -> Writer:
        """The writer of one ``write`` call on ``conn`` (inside its transaction)."""
        return Writer(conn, self.target.statements(), self.catalog, self.target.pipeline, self._config,
                      self._row_source, self._add_warning, self._fresh_loads)

    def write(self, changes: Iterable[RowChange], fence: Callable[[], None] | None = None) -> int:
        target = self.target
        target.check_open()
        pos = self._position
        if pos is not None and pos.done:
            changes = skip_done(changes, pos.done)  # applied by workers before a crash (parallel apply)
        elif pos is None and self._ddl.floors:
            changes = self._ddl.drop_replayed(changes)  # (at-least-once: no position, replays dropped by DDL floors)
        if self._stager is not None:
            if pos is None:
                raise SinkError("internal: a staging write needs open_position() first")
            return self._stager.write(pos, changes, fence)
        parallel = self._parallel
        if parallel is None or (pos is not None and pos.reopened) or not parallel.plans_next():
            return self._write_one(changes, fence)
        with collector_paused():  # while the write's changes are held in memory (each round's, for a retry)
            return parallel.stream(changes, pos, fence, self._row_source, lambda rest: self._write_one(rest, fence))

    @property
    def unplanned_writes(self) -> int:
        """Writes a parallel sink streamed on one connection without planning them, after writes whose transactions all
        conflicted (:mod:`sinks.sql.ops.parallel`); 0 with worker-count 1."""
        return self._parallel.unplanned_writes if self._parallel is not None else 0

    @property
    def parallel_writes(self) -> int:
        """Writes applied on more than one downstream connection so far (0 with worker-count 1, and on SQLite)."""
        return self._parallel.parallel_writes if self._parallel is not None else 0

    def _write_one(self, changes: Iterable[RowChange], fence: Callable[[], None] | None) -> int:
        """One downstream transaction on one connection (the only path with worker-count 1). With several workers
        (``pos.parallel``) its transactions are recorded in the applied table too, since a zombie's workers may race
        this write: the first one before any row, the rest after its rows (a zombie racing a streamed write is then refused by the position's compare-and-set or the applied
        table's key, possibly after a statement of its rows failed on what the other writer applied: rolled back
        either way)."""
        target = self.target
        writer: Writer | None = None
        pos = self._position
        tracked: Tracked | None = None
        early: list[int] = []
        late: list[int] | None = None
        if pos is not None:
            if pos.parallel:
                it = iter(changes)
                first = next(it, None)
                late = []
                changes = _note_commits(itertools.chain([first], it) if first is not None else (), late)
                early = [first.commit_ts] if first is not None and first.commit_ts > pos.skip_at() else []
            changes = tracked = Tracked(changes, pos.skip_at())
        try:
            with target.transaction(lambda: writer.current if writer else None, fence=fence) as conn:
                writer = self.writer(conn)
                if early and pos is not None:
                    pos.mark(conn, early)
                count = writer.run(changes)
                if tracked is not None and pos is not None:
                    if not tracked.done:
                        raise SinkError("internal: the writer returned before consuming its changes")
                    if tracked.skipped:
                        log.info("changefeed=%s span=%d: skipped %d change(s) already downstream (commit <= %d)",
                                 pos.changefeed, pos.span, tracked.skipped, pos.applied)
                    if tracked.last_ts:
                        writer.current = pos.sql.label
                        if late:
                            done = set(early)
                            pos.mark(conn, [ts for ts in late if ts > tracked.applied and ts not in done])
                        pos.record(conn, tracked.last_ts, tracked.last_time)
        except BaseException as exc:
            # Tables created inside the failed transaction (SQLite) are gone; re-reflect next time.
            self.catalog.forget_all()
            dropped = self.catalog.record.explain(exc, writer.current if writer is not None else None)
            if dropped is not None:  # a table the changefeed has had, dropped while this sink held it bound
                raise dropped from exc
            raise
        if tracked is not None and pos is not None and tracked.last_ts:
            pos.committed(tracked.last_ts)  # (the transaction committed, after the fence)
        return count

    def close(self) -> None:
        if self._parallel is not None:
            self._parallel.close()
        self.target.close()


def _note_commits(changes: Iterable[RowChange], out: list[int]) -> Iterator[RowChange]:
    """``changes``, appending each new commit Ts to ``out`` as it passes."""
    last = None
    for ch in changes:
        if ch.commit_ts != last:
            last = ch.commit_ts
            out.append(last)
        yield ch
