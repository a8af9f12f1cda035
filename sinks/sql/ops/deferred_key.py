"""The initial copy into a PostgreSQL table it creates itself, with the primary key built after the load
(docs/snapshot.md, "The key after the load"): :class:`DeferredKey`, one per sink.

Loading rows into a table that already has its primary key costs PostgreSQL about 1.5x the CPU of loading them
into a heap and building the index once (docs/benchmarks.md). The key is what made a chunk copied twice harmless
(the second copy met its own rows and was upserted), so without it another proof is needed that no chunk lands
twice. It is a *marker row* per chunk in ``tidewater.tidewater_copy_chunk``, whose primary key is (changefeed,
span, table, chunk), committed in the chunk's own transaction:

- :meth:`DeferredKey.create_target` creates the table exactly as streaming would
  (``sinks.sql.dialect.typemap.plan_table``, ``create_table_sql``: same columns, types, NOT NULL key columns) but
  without its ``PRIMARY KEY``, and the marker table. The caller stores the fact "key deferred" durably (``TablePlan.key_state``) *before* calling it.
- :meth:`DeferredKey.write_marked_chunk`: ``COPY`` of the chunk's upstream text (the passthrough of
  ``sinks.sql.ops.bulk``, same conditions; an error of the upstream's side of the chunk is raised as itself,
  ``Blocks.copy_from``), then ``INSERT`` of the chunk's marker ``ON CONFLICT DO NOTHING``, then the fence, then commit. Two
  transactions writing the same chunk serialise on the marker's key: the second waits for the first and, if the
  first committed, inserts nothing and is rolled back with all its rows (``already`` is returned). So every chunk
  is in the table at most once, committed together with its marker.
- :meth:`DeferredKey.read_markers`: the markers of a table (a resumed run records in etcd the chunks whose marker
  is there and never copies them again).
- :meth:`DeferredKey.build_key`, once every chunk is done: in one transaction, ``ALTER TABLE .. ADD PRIMARY KEY (key)``
  (unnamed, as the streaming ``CREATE TABLE``: PostgreSQL picks the same constraint and index name), delete the
  table's markers, fence, commit. Idempotent: a table whose primary key exists already on exactly the key columns
  only loses its markers; one on other columns raises. A unique violation (or a NULL key) while building the key
  would mean a chunk landed twice, i.e. a broken proof: it raises :class:`cdc.errors.SinkError` (fatal: the
  changefeed fails naming the table), never continues.

Only PostgreSQL targets without an exactly-once position or DDL floors (the copy job's sinks) take this path
(:meth:`DeferredKey.refusal`); everything else keeps its key while chunks arrive.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from cdc.errors import SinkError
from cdc.events import TableSchema
from cdc.snapshot import ChunkMarker, CopyText
from sinks.sql.dialect.typemap import TargetTable, create_schema_sql, create_table_sql, plan_table
from sinks.sql.ops.bulk import Blocks, target_types, type_refusal
from sinks.sql.target.binding import K_INSERT, Binding, KnownTable
from sinks.sql.target.catalog import Catalog
from sinks.sql.target.connection import Target
from sinks.sql.target.own_table import PG_SCHEMA

log = logging.getLogger(__name__)

MARKER_TABLE = "tidewater_copy_chunk"
_M = f'"{PG_SCHEMA}"."{MARKER_TABLE}"'
CREATE_MARKERS = (
    f"CREATE TABLE IF NOT EXISTS {_M} (changefeed varchar(255) NOT NULL, span integer NOT NULL, "
    "table_name text NOT NULL, chunk integer NOT NULL, run varchar(64) NOT NULL, rows bigint NOT NULL, "
    "snapshot text NULL, commit_ts bigint NOT NULL, committed_at timestamptz NOT NULL DEFAULT now(), "
    "PRIMARY KEY (changefeed, span, table_name, chunk))")
UNIQUE_VIOLATION = "23505"
NOT_NULL_VIOLATION = "23502"


class DeferredKey:
    """The initial copy of one sink into tables whose primary key is built after the load (module docstring)."""

    def __init__(self, target: Target, catalog: Catalog) -> None:
        self._target = target
        self._catalog = catalog

    def planned(self, schema: TableSchema) -> TargetTable:
        """The table streaming creates for ``schema`` on this sink (with its key)."""
        target = self._target
        tschema, tname = target.target_parts(schema.name)
        return plan_table(schema, target.dialect, target_schema=tschema, target_name=tname)

    def _binding(self, schema: TableSchema) -> Binding:
        target = self._target
        t = self.planned(schema)
        label = target.target_name(schema.name)
        return self._catalog.new_binding(schema, KnownTable(label, t.schema, t.name, t.columns, [frozenset(t.key)],
                                                                   created=True))

    def refusal(self, schema: TableSchema, *, tracks_position: bool) -> str | None:
        """Why ``schema``'s copy cannot defer its key on this sink (None: it can, if its target does not exist)."""
        target = self._target
        if target.dialect != "postgresql":
            return f"a {target.dialect} target"
        if tracks_position:
            return "the sink tracks a stream position"
        if not (schema.has_key and schema.key):
            return "no key"
        why = type_refusal(schema)
        if why is not None:
            return why
        if self._binding(schema).plan(K_INSERT, schema.column_names, None).copy is None:
            return "its columns' values are checked one by one"
        return None

    def target_exists(self, schema: TableSchema) -> bool:
        """Whether the target table of ``schema`` exists (any relation of that name)."""
        with self._target.engine.connect() as conn:
            return self._exists(conn, schema)

    def _exists(self, conn: Any, schema: TableSchema) -> bool:
        name = self._target.statements().table(self.planned(schema)) % ()
        return conn.exec_driver_sql("SELECT to_regclass(%s) IS NOT NULL", (name,)).scalar() is True

    def create_target(self, schema: TableSchema) -> None:
        """Create the marker table and ``schema``'s target table without its primary key, if missing (autocommit,
        ``IF NOT EXISTS``: a rerun after a crash creates what is missing), and record the table as the changefeed's
        (a sink bound by ``bind_tables_had``, before any chunk of it is written); ``TargetTableDropped`` instead of
        creating a missing one the record shows (an earlier run's chunks of it were dropped behind the changefeed's
        back: :mod:`sinks.sql.target.table_record`)."""
        target = self._target
        t = self.planned(schema)
        keyless = TargetTable(t.schema, t.name, t.columns, ())
        preparer = target.engine.dialect.identifier_preparer
        record, label = self._catalog.record, target.target_name(schema.name)
        with target.engine.connect() as conn:
            conn.execution_options(isolation_level="AUTOCOMMIT")
            if record.bound and not self._exists(conn, schema) and record.had(conn, label):
                raise record.refuse(label, schema.name)
            target.run_ddl(conn, create_schema_sql(PG_SCHEMA, preparer))
            target.run_ddl(conn, CREATE_MARKERS)
            if t.schema is not None:
                target.run_ddl(conn, create_schema_sql(t.schema, preparer))
            target.run_ddl(conn, create_table_sql(keyless, target.dialect, preparer))
            self._check_columns(conn, t)
            record.note(conn, label, schema.name)
        log.info("%s: created table %s without its primary key (built after the copy)", target.where,
                 target.target_name(schema.name))

    def _check_columns(self, conn: Any, t: TargetTable) -> None:
        """The table (created now, or found: ``IF NOT EXISTS``) has exactly the planned columns and types, as the COPY
        passthrough requires, and no primary key on other columns; else ``SinkError`` (something else created it)."""
        target = self._target
        cur = conn.connection.dbapi_connection.cursor()
        try:
            name = target.statements().table(t) % ()
            actual = target_types(cur, name)
            pk = _primary_key(cur, name)
        finally:
            cur.close()
        planned = {c.name: c.ddl_type for c in t.columns}
        if actual != planned or (pk is not None and tuple(pk) != t.key):
            raise SinkError(f"table {name}: the copy was to create it without its key, but it exists as "
                            f"{actual} (primary key {pk}) instead of {planned}: it was created behind the copy; drop it "
                            "and resync the table")

    def read_markers(self, changefeed: str, span: int, table: str) -> dict[int, ChunkMarker]:
        """The committed markers of ``table`` (``schema.table`` upstream), by chunk; {} when there is no marker table."""
        target = self._target
        with target.engine.connect() as conn:
            if conn.exec_driver_sql("SELECT to_regclass(%s)", (_M,)).scalar() is None:
                return {}
            rows = conn.exec_driver_sql(
                f"SELECT chunk, run, rows, snapshot, commit_ts FROM {_M} WHERE changefeed = %s AND span = %s "
                "AND table_name = %s", (changefeed, span, table)).fetchall()
        return {int(r[0]): ChunkMarker(changefeed, span, table, int(r[0]), str(r[1]), int(r[2]), r[3], int(r[4]))
                for r in rows}

    def write_marked_chunk(self, schema: TableSchema, open_text: Callable[[], CopyText | None], marker: ChunkMarker,
                           fence: Callable[[], None] | None, *, tracks_position: bool) -> tuple[int, bool]:
        """Copy one chunk with its marker in one transaction; return (rows written, False), or (the rows its committed
        marker records, True) when the chunk is in the table already (nothing written now). Raises ``SinkError`` when
        the text cannot pass through (the table has no key to upsert by: the parsed path is not an option)."""
        target = self._target
        target.check_open()
        why = self.refusal(schema, tracks_position=tracks_position)
        label = target.target_name(schema.name)
        if why is not None:
            raise SinkError(f"table {label}: the copy deferred its key but cannot copy it as text: {why}")
        text: CopyText | None = None
        try:
            with target.transaction(label, fence=fence) as conn:
                dbapi = conn.connection.dbapi_connection
                assert dbapi is not None
                if dbapi.encoding != "UTF8":
                    raise SinkError(f"table {label}: the target connection's encoding is {dbapi.encoding}, not UTF8")
                with dbapi.cursor() as cur:
                    text = open_text()
                    if text is None or not text.pg_utf8:
                        raise SinkError(f"table {label}: the upstream gave no UTF8 COPY text for a chunk of a table "
                                        "whose key is deferred")
                    stmts = target.statements()
                    t = self.planned(schema)
                    # (an error of the upstream's side of the chunk is raised as itself: Blocks.copy_from)
                    Blocks(text.blocks).copy_from(cur, stmts.copy_in(stmts.table(t), list(schema.column_names)) % ())
                    rows = int(cur.rowcount)
                    cur.execute(f"INSERT INTO {_M} (changefeed, span, table_name, chunk, run, rows, snapshot, "
                                "commit_ts) VALUES (%s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                                (marker.changefeed, marker.span, marker.table, marker.chunk, marker.run, rows,
                                 marker.snapshot, marker.commit_ts))
                    inserted = cur.rowcount == 1
                if not inserted:  # another transaction committed this chunk: ours goes, rows and all
                    conn.rollback()
                    have = self.read_markers(marker.changefeed, marker.span, marker.table).get(marker.chunk)
                    if have is None:
                        raise SinkError(f"table {label}: chunk {marker.chunk}'s marker conflicted but is not there")
                    log.info("%s: chunk %s#%d is in %s already (run %s): not copied again", target.where,
                             marker.table, marker.chunk, label, have.run)
                    return have.rows, True
            return rows, False  # committed (after the fence)
        finally:
            if text is not None:
                text.abandon()

    def build_key(self, schema: TableSchema, changefeed: str, span: int,
                  fence: Callable[[], None] | None) -> bool:
        """Build ``schema``'s primary key on its target table as streaming creates it, and delete the table's markers,
        in one transaction (see the module docstring). Returns True when the key was built now, False when it was
        there already. Raises ``SinkError`` (fatal) on duplicate or NULL keys: a broken proof."""
        target = self._target
        target.check_open()
        t = self.planned(schema)
        label = target.target_name(schema.name)
        stmts = target.statements()
        table = stmts.table(t) % ()
        add_key = f"ALTER TABLE {stmts.table(t)} ADD PRIMARY KEY ({', '.join(stmts.q(k) for k in t.key)})" % ()
        with target.transaction(label, fence=fence) as conn:
            dbapi = conn.connection.dbapi_connection
            assert dbapi is not None
            with dbapi.cursor() as cur:
                have = _primary_key(cur, table)
                if have is not None and tuple(have) != t.key:
                    raise SinkError(f"table {label}: its primary key is ({', '.join(have)}), not "
                                    f"({', '.join(t.key)}) as the copy was to build it; the target was changed "
                                    "during the copy: drop the table and copy it again")
                if have is None:
                    # one sort in memory per table; no parallel workers (several tables' keys are built at once)
                    cur.execute("SET LOCAL maintenance_work_mem = '256MB'; "
                                "SET LOCAL max_parallel_maintenance_workers = 0")
                    try:
                        cur.execute(add_key)
                    except Exception as exc:
                        code = getattr(exc, "pgcode", None)
                        if code not in (UNIQUE_VIOLATION, NOT_NULL_VIOLATION):
                            raise
                        raise SinkError(
                            f"table {label}: building its primary key after the copy failed: "
                            f"{' '.join(str(exc).split())}. The copy's proof that no chunk landed twice is "
                            "broken (or the table was written during the copy): the target differs from the "
                            "upstream; drop the target table and resync it (cdc cli changefeed snapshot --table "
                            f"{schema.name})", cause=exc) from None
                cur.execute(f"DELETE FROM {_M} WHERE changefeed = %s AND span = %s AND table_name = %s",
                            (changefeed, span, str(schema.name)))
        log.info("%s: %s primary key of %s (%s); its copy markers are gone", target.where,
                 "built the" if have is None else "found the", label, ", ".join(t.key))
        return have is None

    def forget(self, changefeed: str) -> int:
        """Delete ``changefeed``'s markers (``remove``); 0 when there is no marker table."""
        target = self._target
        with target.transaction(f"{PG_SCHEMA}.{MARKER_TABLE}") as conn:
            if conn.exec_driver_sql("SELECT to_regclass(%s)", (_M,)).scalar() is None:
                return 0
            n = conn.exec_driver_sql(f"DELETE FROM {_M} WHERE changefeed = %s", (changefeed,)).rowcount
        return int(n or 0)


def _primary_key(cur: Any, table: str) -> list[str] | None:
    cur.execute("SELECT a.attname FROM pg_catalog.pg_index i JOIN pg_catalog.pg_attribute a "
                "ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) WHERE i.indrelid = %s::regclass "
                "AND i.indisprimary ORDER BY array_position(i.indkey::int2[], a.attnum)", (table,))
    cols = [str(r[0]) for r in cur.fetchall()]
    return cols or None
