"""Reading PostgreSQL tables at one snapshot, in primary-key chunks (:class:`upstream.base.SnapshotReader`).

Session: one autocommit connection from :func:`upstream.postgres.conn.connect` (so the output settings every
upstream session gets -- ``TimeZone=UTC``, ``DateStyle=ISO``, ``extra_float_digits=3``, ``bytea_output=hex``
... -- are the ones the walsender renders pgoutput values with), then ``BEGIN ISOLATION LEVEL REPEATABLE READ,
READ ONLY`` and, when a snapshot name is given, ``SET TRANSACTION SNAPSHOT '<name>'`` before any query: every
catalog and data query of the reader sees that snapshot. A name that no longer exists (the exporting
replication connection ended or ran another command) raises :class:`cdc.errors.SnapshotExpired`.

Planning (:meth:`PgSnapshotReader.plan`): ``count(*)`` at the snapshot, then, when the table holds more than
``chunk_rows`` rows, one ordered pass over the key (``row_number() OVER (ORDER BY key)``, an index-only scan
of the primary key when the visibility map allows) that returns the key of every ``chunk_rows``-th row:
those keys are the chunk bounds, exact at the snapshot (no sampling error: every chunk but the last holds
exactly ``chunk_rows`` rows of the snapshot). Bounds are kept as ``key::text`` and cast back with the column's
declared type, so they survive JSON exactly for every key type. A table without a key is one ``whole``
chunk: no key means no range to resume from, and the whole chunk is written as a replacement of the table's
rows (docs/snapshot.md), which ctid ranges could not give (a ctid is not stored downstream).

Reading (:meth:`PgSnapshotReader.read_chunk`): ``COPY (SELECT <columns> FROM t WHERE (k...) >= (lower) AND
(k...) < (upper) ORDER BY k...) TO STDOUT`` in text format, run by a helper thread into a bounded queue of ~1 MB
blocks (memory is bounded whatever the chunk's size, and the server's COPY overlaps parsing and writing; an
abandoned read stops the COPY and closes the connection): the values are the types' output text -- the same
text pgoutput sends for the same row -- with COPY's backslash escapes, which are undone
(:func:`upstream.postgres.rowfetch.copy_unescape`; a line without a backslash has neither escapes nor NULLs
and is split as it is). Each row is parsed by the row parser of :func:`upstream.postgres.rowcodec.best` (C where it
builds, else :func:`upstream.postgres.types.row_parser`: the same values) over the columns'
:func:`~upstream.postgres.types.parser_for` parsers -- the very functions the mounter uses through
:class:`upstream.postgres.source.PgChangeDecoder` -- and becomes an INSERT :class:`cdc.events.RowChange` with
``row`` and ``row_text`` set, as the mounter builds it. No per-row I/O or logging.

Naming the table (:meth:`PgSnapshotReader._locked_name`): PostgreSQL resolves a query's table *name* against the
current catalog, not the snapshot's, so a table renamed (``ALTER TABLE .. RENAME``, ``SET SCHEMA``) after the snapshot
could no longer be read under its name at the snapshot. A schema that carries its relation oid (every schema the
reader or the catalog gives) is read by that oid instead: its current name is looked up by oid in the relation cache
(``pg_identify_object_as_address``, which reads the current catalog), the table is locked under it (``ACCESS SHARE``:
no rename, drop or rewrite can commit until the transaction ends) and looked up again, and the queries name it so.
The rows are still the snapshot's (the heap is the same relation), so a copy planned under a snapshot keeps being
read as of that snapshot, under the name the table had then downstream, however it is called now
(docs/snapshot.md, "A table renamed while it is copied"). A table dropped since has no current name: the retryable
:class:`cdc.errors.SnapshotTableAltered`, as before.

Reading as text (:meth:`PgSnapshotReader.read_chunk_text`): the same COPY's bytes, unparsed, for a sink that stores
them itself (:class:`cdc.snapshot.CopyText`, the initial copy's passthrough into PostgreSQL, ``sinks.sql.ops.bulk``),
drained from libpq in 1 MiB blocks by :mod:`upstream.postgres.copy_out` (C, no Python call per row); where that helper
cannot be built, through an OS pipe that psycopg2's ``copy_expert`` writes each row into.

Planning (:meth:`PgSnapshotReader.plan`) of a large table (:data:`DENSE_MIN_ROWS`) whose key is one integer column of
dense values (:data:`DENSE_SPREAD`) takes equal key ranges from ``count(*)`` and the key's ends instead of the
ordered pass: chunks of at most twice ``chunk_rows`` rows, planned for a seventh of the upstream's CPU.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import logging
import os
import queue
import threading
from collections.abc import Iterator
from typing import Any

import psycopg2
from psycopg2 import sql

from cdc.errors import (
    DecodeError,
    InvalidArgument,
    SnapshotExpired,
    SnapshotTableAltered,
    SnapshotTableRewritten,
    UpstreamError,
)
from cdc.events import SNAPSHOT, OpType, RowChange, TableName, TableSchema
from cdc.snapshot import PG_COPY_TEXT, CopyText, SnapshotChunk, TablePlan, plan_from_bounds
from upstream.base import SnapshotReader
from upstream.postgres import catalog, copy_out, rowcodec
from upstream.postgres import conn as pg_conn
from upstream.postgres.rowfetch import cast_type, copy_unescape
from upstream.postgres.types import parser_for

log = logging.getLogger(__name__)

_INVALID_SNAPSHOT = "invalid snapshot identifier"  # malformed name; a well-formed unknown one "does not exist"
TEXT_BLOCK = 1 << 20  # bytes per block of read_chunk_text
_INTEGER_KEYS = frozenset({"int2", "int4", "int8"})
_ALTERED = {"42703": "a column the copy reads was dropped or renamed in", "42P01": "it was renamed or dropped: table"}
DENSE_SPREAD = 2
"""A single integer key spanning at most this many times the table's rows is planned in equal key ranges (each
chunk then holds at most this many times ``chunk-rows`` rows); a sparser one by the exact ordered pass."""
DENSE_MIN_ROWS = 1_000_000
"""Tables with fewer rows keep the exact ordered pass (it costs them under 0.4 CPU s, and their chunks stay exactly
``chunk-rows`` rows each); the equal ranges pay off for large tables."""


class PgSnapshotReader(SnapshotReader):
    """``PostgresUpstream.snapshot_reader(name)``: see the module docstring and :class:`SnapshotReader`."""

    reads_text = True

    def __init__(self, uri: str, snapshot: str | None = None, *, label: str = "", timeout: float = 5.0) -> None:
        self._uri = uri
        self.snapshot = snapshot
        self._label = label
        self._timeout = timeout
        self._conn: Any = None
        self._in_txn = False  # a transaction at the snapshot is open on _conn

    # ---- session ---------------------------------------------------------------------------------------
    @property
    def backend_pid(self) -> int | None:
        """The PID of the upstream session the reader holds (None: it holds none, e.g. after an abandoned read)."""
        return None if self._conn is None else self._conn.get_backend_pid()

    def release(self) -> None:
        """End the transaction (its table locks); the next read begins another at the same exported snapshot. With
        no snapshot name each transaction would see its own snapshot: then the transaction is kept."""
        if self._conn is not None and self.snapshot is not None:
            try:
                with self._conn.cursor() as cur:  # (an autocommit session: the transaction is our explicit BEGIN)
                    cur.execute("ROLLBACK")
            except Exception:  # noqa: BLE001 - broken: drop it, the next read reconnects
                self.close()
                return
            self._in_txn = False

    def _connection(self) -> Any:
        if self._conn is not None and self._in_txn:
            return self._conn
        conn = self._conn or pg_conn.connect(self._uri, timeout=self._timeout, application_name="tidewater-snapshot")
        self._conn = None  # ours again only once the transaction is open (a failure below closes it)
        try:
            with conn.cursor() as cur:
                cur.execute("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                if self.snapshot is not None:
                    cur.execute("SET TRANSACTION SNAPSHOT %s", (self.snapshot,))
        except psycopg2.Error as exc:
            where = pg_conn.describe_conn(conn)
            conn.close()
            text = str(exc)
            if _INVALID_SNAPSHOT in text:
                raise InvalidArgument(f"PostgreSQL {where}: {self.snapshot!r} is not a snapshot name. Fix: pass the "
                                      "name CREATE_REPLICATION_SLOT ... (SNAPSHOT 'export') returned") from None
            if getattr(exc, "pgcode", None) in ("42704", "22023") and "does not exist" in text:
                raise SnapshotExpired(
                    f"PostgreSQL {where}: the exported snapshot {self.snapshot!r} no longer exists (the replication "
                    "connection that exported it ended or ran another command). Fix: copy under a fresh snapshot "
                    "(a new slot's export, or none) -- chunks already recorded stay done; key-less tables are "
                    "copied again as a whole") from None
            raise pg_conn.classify_error(exc, where, "opening the snapshot transaction") from exc
        except BaseException:
            conn.close()
            raise
        log.debug("snapshot reader %s: transaction open at snapshot %s", self._label, self.snapshot or "(own)")
        self._conn = conn
        self._in_txn = True
        return conn

    def close(self) -> None:
        self._in_txn = False
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()  # ends the read-only transaction
            except Exception:  # noqa: BLE001 - closing a broken connection
                pass

    # ---- catalog ---------------------------------------------------------------------------------------
    def table_schema(self, table: TableName) -> TableSchema:
        conn = self._connection()
        try:
            return catalog.table_schema(conn, table)
        except InvalidArgument as exc:
            raise InvalidArgument(f"{exc.message} (at the snapshot{self._at()}): check the table list of the "
                                  "snapshot copy") from None

    def relation_schema(self, oid: int) -> TableSchema | None:
        conn = self._connection()
        try:
            return catalog.table_schema(conn, oid)  # (the snapshot's catalog: the name it had then)
        except InvalidArgument:
            return None

    def _at(self) -> str:
        return f" {self.snapshot!r}" if self.snapshot else ""

    def _locked_name(self, conn: Any, schema: TableSchema) -> TableName:
        """The name ``schema``'s table is to be queried under in this transaction: at an exported snapshot, when the
        schema carries its relation oid, the table's *current* name (module doc, "Naming the table"), with the table
        locked (``ACCESS SHARE``, held until :meth:`release`) under it, so it cannot be renamed, dropped or rewritten
        before the transaction ends; else ``schema.name`` as it is. Raises the retryable
        :class:`cdc.errors.SnapshotTableAltered` when the relation no longer exists, or keeps being renamed."""
        name, oid = schema.name, schema.relation_id
        if self.snapshot is None or not oid:
            return name
        for _ in range(5):
            try:
                with self._read_errors(conn, name, f"looking up the current name of {name} (relation oid {oid})"), \
                        conn.cursor() as cur:
                    now = _current_name(cur, oid)
                    if now is None:
                        break
                    cur.execute(sql.SQL("LOCK TABLE {} IN ACCESS SHARE MODE").format(
                        sql.Identifier(now.schema, now.table)))
                    if _current_name(cur, oid) == now:  # (locked: it stays so until the transaction ends)
                        if now != name:
                            log.info("snapshot reader %s: %s (relation oid %d) is called %s now: read under that "
                                     "name at snapshot %s", self._label, name, oid, now, self.snapshot)
                        return now
            except SnapshotTableAltered:  # renamed between the look-up and the lock: look again
                self.close()
                conn = self._connection()
                continue
            except BaseException:
                self.close()  # the transaction is aborted: the next read opens another at the snapshot
                raise
            self.release()  # renamed in between: the lock is on another table (or none), start again
            conn = self._connection()
        self.close()
        raise SnapshotTableAltered(
            f"table {name} (relation oid {oid}) was dropped, or keeps being renamed, after the snapshot "
            f"{self.snapshot!r} was taken: its rows cannot be read at this snapshot. The copy goes on under a fresh "
            "snapshot (a table dropped is not copied)")

    def _check_not_rewritten(self, conn: Any, name: TableName) -> None:
        """Before the table is read at an exported snapshot: lock it (``ACCESS SHARE``, held until :meth:`release`:
        no rewrite can commit while it is read) and check that its storage is the one the snapshot knows.
        ``name``: the table's current name (:meth:`_locked_name`).
        A table-rewriting ``ALTER TABLE`` (a column's type, a volatile default) is not MVCC-safe: once committed, the
        table reads *empty* under a snapshot taken before it, so a chunk read then would be recorded as copied with
        none of its rows, and the stream does not carry rewritten rows. The snapshot's ``pg_class`` row (read under
        the snapshot) names the relfilenode it knew, ``pg_relation_filenode`` the current one (the relation cache,
        after the lock; for a partitioned table, those of its leaf partitions, which hold its rows). When they
        differ, the table's columns (names and types, the snapshot's ``pg_attribute`` against the current one, read
        on a connection of its own) tell which kind of statement it was:

        - the same columns: ``TRUNCATE`` (the table reads empty at the snapshot, and the stream replays the TRUNCATE
          after it: the copy ends exactly as the upstream), or ``VACUUM FULL``, ``CLUSTER``, ``SET TABLESPACE``
          (MVCC-safe: the rows stay visible to the snapshot). The table is read as the snapshot shows it;
        - other columns (or no row: the table was replaced): a rewrite. The retryable
          :class:`cdc.errors.SnapshotTableRewritten`: the next run reads under a fresh snapshot (and plans the table
          again from the start, its definition having changed).

        Without an exported snapshot the transaction is never released between reads, so nothing can rewrite the
        table in between: no check."""
        if self.snapshot is None:
            return
        table = sql.Identifier(name.schema, name.table)
        regclass = table.as_string(conn)
        try:
            with self._read_errors(conn, name, f"checking the storage of {name} at the snapshot"), \
                    conn.cursor() as cur:
                cur.execute(sql.SQL("LOCK TABLE {} IN ACCESS SHARE MODE").format(table))  # (its partitions too)
                cur.execute("SELECT c.relkind, c.relfilenode = pg_relation_filenode(c.oid) FROM pg_class c "
                            "WHERE c.oid = %s::regclass", (regclass,))
                row = cur.fetchone()
                if row is not None and row[0] == "p":  # a partitioned root has no storage: its leaves hold the rows
                    cur.execute("SELECT coalesce(bool_and(c.relfilenode = pg_relation_filenode(c.oid)), true) "
                                "FROM pg_partition_tree(%s::regclass) t JOIN pg_class c ON c.oid = t.relid "
                                "WHERE t.isleaf", (regclass,))
                    row = ("p", cur.fetchone()[0])
                then = _columns(cur, regclass) if row is not None and not row[1] else None
        except BaseException:
            self.close()  # the transaction is aborted: the next read opens another at the snapshot
            raise
        if row is not None and row[1]:
            return
        if then is not None and then == self._current_columns(regclass):
            log.debug("snapshot reader %s: %s has new storage but its columns at snapshot %s (TRUNCATE, VACUUM FULL, "
                      "CLUSTER): read as the snapshot shows it", self._label, name, self.snapshot)
            return
        raise SnapshotTableRewritten(
            f"table {name} was rewritten (an ALTER TABLE that rewrites it: a column's type, a volatile default) after "
            f"the snapshot {self.snapshot!r} was taken: PostgreSQL shows a rewritten table empty to older snapshots, "
            "so its rows cannot be read at this one. The copy goes on under a fresh snapshot (chunks recorded stay "
            "done; a table whose columns or key changed is copied again from the start)")

    def _current_columns(self, regclass: str) -> list[tuple[str, int]] | None:
        """The table's columns as committed now (a connection of its own, outside the snapshot)."""
        conn = pg_conn.connect(self._uri, timeout=self._timeout, application_name="tidewater-snapshot")
        try:
            conn.autocommit = True
            with pg_conn.pg_errors(conn, f"reading the current columns of {regclass}"), conn.cursor() as cur:
                return _columns(cur, regclass)
        finally:
            conn.close()

    @contextlib.contextmanager
    def _read_errors(self, conn: Any, name: TableName, what: str) -> Iterator[None]:
        """``pg_errors`` for reading ``name`` at the snapshot, where an object the query names no longer exists by
        that name (a column dropped or renamed, the table renamed or dropped after the snapshot: PostgreSQL resolves
        names against the current catalog) is the retryable :class:`cdc.errors.SnapshotTableAltered`."""
        try:
            with pg_conn.pg_errors(conn, what):
                yield
        except UpstreamError as exc:
            code = getattr(exc.__cause__, "pgcode", None)
            if code not in _ALTERED:
                raise
            since = f"after the snapshot {self.snapshot!r} was taken" if self.snapshot else "since its schema was read"
            raise SnapshotTableAltered(
                f"{exc.message}: {_ALTERED[code]} {name} {since}. The copy goes on "
                "under a fresh snapshot (chunks recorded stay done; a table whose columns or key changed is copied "
                "again from the start, a table dropped is not copied)", cause=exc.__cause__) from None

    def count_rows(self, schema: TableSchema) -> int:
        name = schema.name
        conn = self._connection()
        now = self._locked_name(conn, schema)
        with self._read_errors(conn, name, f"counting the rows of {name}"), conn.cursor() as cur:
            cur.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(now.schema, now.table)))
            return int(cur.fetchone()[0])

    # ---- planning --------------------------------------------------------------------------------------
    def plan(self, schema: TableSchema, chunk_rows: int) -> TablePlan:
        if chunk_rows < 1:
            raise InvalidArgument(f"chunk-rows must be at least 1, got {chunk_rows}")
        name = schema.name
        conn = self._connection()
        now = self._locked_name(conn, schema)  # (the plan keeps the snapshot's name: the target's)
        table = sql.Identifier(now.schema, now.table)
        self._check_not_rewritten(conn, now)
        count = sql.SQL("SELECT count(*) FROM {}").format(table)
        if not schema.has_key:
            with pg_conn.pg_errors(conn, f"counting the rows of {name}"), conn.cursor() as cur:
                cur.execute(count)
                return plan_from_bounds(name, int(cur.fetchone()[0]), chunk_rows, None)
        key = tuple(schema.key)
        dense = self._dense_integer_plan(schema, chunk_rows, now)
        if dense is not None:
            return dense
        # one ordered pass over the key (an index-only scan) gives the key of every chunk_rows-th row; the rows
        # then are chunk_rows per bound before the last bound plus those from the last bound on (a range count of
        # at most chunk_rows rows): no separate count(*) scan of the whole table
        keys = sql.SQL(", ").join(sql.Identifier(k) for k in key)
        texts = sql.SQL(", ").join(sql.SQL("{}::text").format(sql.Identifier(k)) for k in key)
        query = sql.SQL("SELECT {texts} FROM (SELECT {keys}, row_number() OVER (ORDER BY {keys}) AS rn "
                        "FROM {table}) AS s WHERE rn > 1 AND (rn - 1) %% %s = 0 ORDER BY rn").format(
            texts=texts, keys=keys, table=table)
        with pg_conn.pg_errors(conn, f"planning the chunks of {name}"), conn.cursor() as cur:
            cur.execute(query, (chunk_rows,))
            bounds: list[tuple[str, ...]] = [tuple(r) for r in cur.fetchall()]
            if bounds:
                bound = sql.SQL(", ").join(sql.SQL("%s::{}").format(cast_type(schema.column(k))) for k in key)
                cur.execute(sql.SQL("SELECT count(*) FROM {} WHERE ({}) >= ({})").format(table, keys, bound),
                            bounds[-1])
            else:
                cur.execute(count)
            rows = len(bounds) * chunk_rows + int(cur.fetchone()[0])
        plan = plan_from_bounds(name, rows, chunk_rows, key, bounds)
        log.info("snapshot plan %s: %s rows in %d chunk(s) of %d rows", name, rows, len(plan.chunks), chunk_rows)
        return plan

    def _dense_integer_plan(self, schema: TableSchema, chunk_rows: int, now: TableName) -> TablePlan | None:
        """Equal-width key ranges for a single integer key whose values are dense (``max - min + 1`` at most
        :data:`DENSE_SPREAD` times the rows) in a table of at least :data:`DENSE_MIN_ROWS` rows. The rows are
        PostgreSQL's estimate (``pg_class.reltuples``) when it says so, else the exact ``count(*)`` (an index-only
        scan, ~7x cheaper than the ordered pass with ``row_number()``, measured); with the key's ends (two index
        probes) that is all it costs. ``n = ceil(rows / chunk_rows)`` ranges of width ``ceil(span / n)``: each holds
        at most ``width`` rows (the keys are distinct integers), about ``DENSE_SPREAD x chunk_rows`` at most, and
        together they cover every key, so an estimate off the mark only makes chunks larger or smaller (the plan's
        ``rows``, shown as the rows planned, is then that estimate). None: not such a key, or sparse (the caller
        plans exact bounds). ``now``: the name the table is queried under (:meth:`_locked_name`)."""
        if len(schema.key) != 1:
            return None
        col = schema.column(schema.key[0])
        if col.is_array or col.base_type not in _INTEGER_KEYS:
            return None
        name = schema.name
        table = sql.Identifier(now.schema, now.table)
        k = sql.Identifier(col.name)
        conn = self._connection()
        with pg_conn.pg_errors(conn, f"planning the chunks of {name}"), conn.cursor() as cur:
            cur.execute(sql.SQL("SELECT min({k}), max({k}) FROM {t}").format(k=k, t=table))
            low, high = cur.fetchone()
            if low is None:
                return None  # empty at the snapshot: the exact pass says so (0 rows)
            span = int(high) - int(low) + 1
            # PostgreSQL's own row estimate (ANALYZE, VACUUM, CREATE INDEX keep it) saves the count(*), a scan of the
            # whole key (~0.1 s per million rows, before the first chunk can start): equal ranges need no exact
            # count, each holds at most ``width`` keys whatever the rows. Without a usable estimate: count
            cur.execute("SELECT reltuples FROM pg_class WHERE oid = %s::regclass", (table.as_string(conn),))
            estimate = float(cur.fetchone()[0])
            estimated = estimate >= DENSE_MIN_ROWS and span <= DENSE_SPREAD * estimate
            if estimated:
                rows = int(estimate)
            else:
                cur.execute(sql.SQL("SELECT count(*) FROM {}").format(table))
                rows = int(cur.fetchone()[0])
        if not estimated and (rows < DENSE_MIN_ROWS or span > DENSE_SPREAD * rows):
            return None
        low, high = int(low), int(high)
        n = -(-rows // chunk_rows)
        width = -(-span // n)
        bounds = [(str(low + i * width),) for i in range(1, n) if low + i * width <= high]
        plan = plan_from_bounds(name, rows, chunk_rows, (col.name,), bounds)
        log.info("snapshot plan %s: %s%s rows in %d equal key range(s) of %d keys (%s..%s)", name,
                 "about " if estimated else "", rows, len(plan.chunks), width, low, high)
        return plan

    # ---- reading ---------------------------------------------------------------------------------------
    @staticmethod
    def chunk_query(schema: TableSchema, chunk: SnapshotChunk, now: TableName | None = None) -> sql.Composed:
        """``COPY (SELECT ... WHERE <key range> ORDER BY <key>) TO STDOUT`` of ``chunk`` (parameters: the lower
        bound's values, then the upper bound's); ``now``: the table's current name, when it is not ``schema``'s."""
        cols = sql.SQL(", ").join(sql.Identifier(c.name) for c in schema.columns)
        at = now or schema.name
        table = sql.Identifier(at.schema, at.table)
        if chunk.whole:
            return sql.SQL("COPY (SELECT {} FROM {}) TO STDOUT").format(cols, table)
        if tuple(schema.key) != chunk.key:
            raise InvalidArgument(f"{schema.name}: chunk {chunk.index} was planned on key {list(chunk.key)}, the "
                                  f"table's key is now {list(schema.key)}: the table must be planned again from "
                                  "the start (the span's next copy run does so)")
        key_cols = [schema.column(k) for k in chunk.key]
        keys = sql.SQL(", ").join(sql.Identifier(k) for k in chunk.key)
        bound = sql.SQL(", ").join(sql.SQL("%s::{}").format(cast_type(c)) for c in key_cols)
        conds = []
        if chunk.lower is not None:
            conds.append(sql.SQL("({}) >= ({})").format(keys, bound))
        if chunk.upper is not None:
            conds.append(sql.SQL("({}) < ({})").format(keys, bound))
        where = sql.SQL(" WHERE ") + sql.SQL(" AND ").join(conds) if conds else sql.SQL("")
        return sql.SQL("COPY (SELECT {cols} FROM {table}{where} ORDER BY {keys}) TO STDOUT").format(
            cols=cols, table=table, where=where, keys=keys)

    def read_chunk(self, schema: TableSchema, chunk: SnapshotChunk, *, commit_ts: int = 0,
                   commit_time: float = 0.0) -> Iterator[RowChange]:
        if chunk.table_name != schema.name:
            raise InvalidArgument(f"chunk of {chunk.table_name} read with the schema of {schema.name}")
        query = self.chunk_query(schema, chunk)
        params = [*(chunk.lower or ()), *(chunk.upper or ())]
        return self._rows(schema, chunk, query, params, commit_ts, commit_time)

    def _rows(self, schema: TableSchema, chunk: SnapshotChunk, query: sql.Composed, params: list[str],
              commit_ts: int, commit_time: float) -> Iterator[RowChange]:
        conn = self._connection()
        now = self._locked_name(conn, schema)
        self._check_not_rewritten(conn, now)
        if now != schema.name:
            query = self.chunk_query(schema, chunk, now)
        with conn.cursor() as cur:
            text_query = cur.mogrify(query, params)
        pipe = _CopyPipe()
        what = f"reading chunk {chunk.index} of {schema.name}"

        def produce() -> None:
            try:
                with self._read_errors(conn, schema.name, what), conn.cursor() as cur:
                    cur.copy_expert(text_query, pipe)
                pipe.finish()
            except BaseException as exc:  # noqa: BLE001 - handed to the consumer, which raises it
                pipe.fail(exc)

        producer = threading.Thread(target=produce, name=f"copy-{schema.name}#{chunk.index}", daemon=True)
        producer.start()
        parsers = tuple(parser_for(c.base_type, c.is_array) for c in schema.columns)
        parse_row = rowcodec.best().row_parser(parsers)
        ncols = len(parsers)
        insert = OpType.INSERT
        complete = False
        try:
            for block in pipe.blocks():
                lines = block.split("\n")  # whole rows, each ended by a newline
                if not lines[-1]:
                    lines.pop()
                for line in lines:  # (an empty line is a row: one column holding the empty string)
                    if "\\" in line:
                        texts: list[str | None] = [copy_unescape(f) for f in line.split("\t")]
                    else:
                        texts = line.split("\t")  # type: ignore[assignment]
                    if len(texts) != ncols:
                        raise DecodeError(f"{schema.name}: a copied row has {len(texts)} columns, the schema {ncols}")
                    try:
                        row = parse_row(texts)
                    except (ValueError, ArithmeticError) as exc:
                        raise _bad_value(schema, parsers, texts, exc) from exc
                    yield RowChange(insert, schema, commit_ts, commit_time, None, None, {SNAPSHOT: True}, row, texts)
            complete = True
        finally:
            if not complete:  # abandoned or failed: stop the COPY; the connection cannot be trusted any more
                pipe.abandon()
            producer.join(30)
            if not complete:
                self.close()


    def read_chunk_text(self, schema: TableSchema, chunk: SnapshotChunk) -> CopyText | None:
        """The chunk as COPY text (:data:`cdc.snapshot.PG_COPY_TEXT`), the bytes of the same ``COPY (SELECT ...)
        TO STDOUT`` as :meth:`read_chunk`, unparsed; None when the session's client encoding is not UTF8 (the
        bytes would need converting). The connection (and the transaction at the snapshot) is opened now, the
        COPY runs once ``blocks`` is advanced, in blocks of about 1 MB (:meth:`_text_blocks`)."""
        if chunk.table_name != schema.name:
            raise InvalidArgument(f"chunk of {chunk.table_name} read with the schema of {schema.name}")
        query = self.chunk_query(schema, chunk)
        params = [*(chunk.lower or ()), *(chunk.upper or ())]
        conn = self._connection()
        if conn.encoding != "UTF8":
            return None
        return CopyText(PG_COPY_TEXT, "UTF8", self._text_blocks(schema, chunk, query, params))

    def _text_blocks(self, schema: TableSchema, chunk: SnapshotChunk, query: sql.Composed, params: list[str]
                     ) -> Iterator[bytes]:
        """The COPY's bytes in blocks of :data:`TEXT_BLOCK` bytes: drained from libpq in C (:meth:`_helper_blocks`),
        or, where that helper is not available, through an OS pipe that psycopg2's ``copy_expert`` writes each row
        into on a helper thread. A failed COPY
        raises after the last block (never a silently short chunk); closing the generator early closes the
        pipe, which stops the COPY (and the connection, which cannot be trusted any more)."""
        conn = self._connection()
        now = self._locked_name(conn, schema)
        self._check_not_rewritten(conn, now)
        if now != schema.name:
            query = self.chunk_query(schema, chunk, now)
        with conn.cursor() as cur:
            text_query = cur.mogrify(query, params)
        if copy_out.available():
            yield from self._helper_blocks(conn, text_query, schema.name, f"reading chunk {chunk.index} of {schema.name}")
            return
        rfd, wfd = os.pipe()
        with contextlib.suppress(OSError):  # fewer wake-ups; the default 64 KiB works too
            fcntl.fcntl(wfd, getattr(fcntl, "F_SETPIPE_SZ", 1031), TEXT_BLOCK)
        failure: list[BaseException] = []
        what = f"reading chunk {chunk.index} of {schema.name}"

        def produce() -> None:
            try:
                with open(wfd, "wb", buffering=1 << 16) as out, self._read_errors(conn, schema.name, what), \
                        conn.cursor() as cur:
                    cur.copy_expert(text_query, out)
            except BaseException as exc:  # noqa: BLE001 - handed to the consumer, which raises it
                failure.append(exc)

        producer = threading.Thread(target=produce, name=f"copy-{schema.name}#{chunk.index}", daemon=True)
        producer.start()
        complete = False
        inp = open(rfd, "rb", buffering=TEXT_BLOCK)  # noqa: SIM115 - closed below, also when abandoned
        try:
            while True:
                block = inp.read(TEXT_BLOCK)
                if not block:
                    break
                yield block
            producer.join()
            if failure:
                raise failure[0]
            complete = True
        finally:
            inp.close()  # abandoned: the producer's next write fails (EPIPE) and ends the COPY
            producer.join(30)
            if not complete:
                self.close()


    def _helper_blocks(self, conn: Any, text_query: bytes, name: TableName, what: str) -> Iterator[bytes]:
        """:meth:`_text_blocks` through :class:`upstream.postgres.copy_out.CopyOut` (libpq drained in C, no Python
        call per row), on the caller's thread: the blocks the target's ``COPY FROM`` takes are read from the
        upstream's socket as it asks for them (the two servers still overlap through the sockets' buffers)."""
        out = copy_out.CopyOut(conn, text_query)
        complete = False
        try:
            with self._read_errors(conn, name, what):
                out.start()
            while True:
                with self._read_errors(conn, name, what):
                    block = out.read(TEXT_BLOCK)
                if not block:
                    break
                yield block
            complete = True
        finally:
            out.close()
            if not complete:  # failed or abandoned mid-COPY: the connection cannot be trusted any more
                self.close()


def _current_name(cur: Any, oid: int) -> TableName | None:
    """The name relation ``oid`` has in the current catalog (the relation cache, not the transaction's snapshot:
    ``pg_identify_object_as_address``), None when it no longer exists."""
    cur.execute("SELECT object_names FROM pg_catalog.pg_identify_object_as_address('pg_catalog.pg_class'::regclass, "
                "%s, 0)", (oid,))
    row = cur.fetchone()
    names = row[0] if row is not None else None
    if not names or len(names) != 2 or names[1] is None:
        return None
    return TableName(names[0], names[1])


def _columns(cur: Any, regclass: str) -> list[tuple[str, int]]:
    """Names and type oids of the table's columns, in order, as the cursor's transaction sees the catalog."""
    cur.execute("SELECT attname, atttypid FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 "
                "AND NOT attisdropped ORDER BY attnum", (regclass,))
    return [(str(n), int(t)) for n, t in cur.fetchall()]


class _Abandoned(Exception):
    """Raised inside ``copy_expert`` when the consumer of the rows went away."""


class _CopyPipe(io.TextIOBase):
    """Where ``copy_expert`` writes a chunk's COPY text (psycopg2 calls :meth:`write` once per row, with ``str``
    because this is a text stream); the consumer takes it in blocks of about :data:`BLOCK_CHARS` characters,
    always ending at a row boundary. At most :data:`QUEUE_BLOCKS` blocks wait: memory is bounded whatever the
    chunk's size (a key-less table is one chunk), and reading overlaps parsing and writing."""

    BLOCK_CHARS = 1 << 20
    QUEUE_BLOCKS = 4
    _END = object()

    def __init__(self) -> None:
        super().__init__()
        self._q: queue.Queue[Any] = queue.Queue(self.QUEUE_BLOCKS)
        self._parts: list[str] = []
        self._size = 0
        self._abandoned = threading.Event()

    def writable(self) -> bool:
        return True

    def write(self, data: str) -> int:  # type: ignore[override]
        self._parts.append(data)
        self._size += len(data)
        if self._size >= self.BLOCK_CHARS:
            self._put("".join(self._parts))
            self._parts, self._size = [], 0
        return len(data)

    def _put(self, item: Any) -> None:
        while True:
            if self._abandoned.is_set():
                raise _Abandoned()
            try:
                self._q.put(item, timeout=0.2)
                return
            except queue.Full:
                continue

    def finish(self) -> None:
        if self._parts:
            self._put("".join(self._parts))
            self._parts, self._size = [], 0
        self._put(self._END)

    def fail(self, exc: BaseException) -> None:
        if not self._abandoned.is_set():
            try:
                self._put(exc)
            except _Abandoned:
                pass

    def abandon(self) -> None:
        self._abandoned.set()

    def blocks(self) -> Iterator[str]:
        while True:
            item = self._q.get()
            if item is self._END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item


def _bad_value(schema: TableSchema, parsers: tuple[Any, ...], texts: list[str | None],
               exc: BaseException) -> DecodeError:
    """The DecodeError naming the first column whose text its parser refuses."""
    for col, parse, text in zip(schema.columns, parsers, texts, strict=True):
        if text is None:
            continue
        try:
            parse(text)
        except (ValueError, ArithmeticError):
            return DecodeError(f"{schema.name}: column {col.name!r}: cannot parse copied value {text[:60]!r}: {exc}",
                               cause=exc)
    return DecodeError(f"{schema.name}: cannot parse a copied row: {exc}", cause=exc)
