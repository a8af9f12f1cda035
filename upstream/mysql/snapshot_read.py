"""The initial copy's reads from a MySQL/MariaDB upstream (:class:`upstream.base.SnapshotReader`), and the binlog
position a copy run starts from (:func:`export_position`).

MySQL and MariaDB cannot share one transaction's snapshot between connections (there is no
``pg_export_snapshot``), so every reader opens its own: ``START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY``,
and reads the exact binlog position that snapshot stands at. MariaDB gives it without any lock
(``SHOW STATUS LIKE 'binlog_snapshot_%'``: ``Binlog_snapshot_file``/``Binlog_snapshot_position``, taken by the
storage engine together with the snapshot, so the snapshot holds exactly the commits before that position);
MySQL has no such status, so there the reader holds ``FLUSH TABLES WITH READ LOCK`` only for the instant in which
it starts its transaction and reads ``SHOW MASTER STATUS`` (needs RELOAD), never while it reads rows.

Guarantees:

- Every transaction of a reader sees exactly the commits with Ts <= :meth:`MySqlSnapshotReader.read_ts` (its
  binlog position as a Ts, :mod:`upstream.mysql.positions`, in the exported position's Ts epoch: after a failover
  the stream's, :meth:`upstream.mysql.upstream.MySqlUpstream.export_snapshot`), and that Ts is >= the exported position
  (``mysql-binlog:<ts>``) the reader was made for: readers of one copy run may stand at *later* positions than the
  export, one per transaction (a transaction ends with :meth:`release`, between chunks, so that no metadata lock is
  held while the application waits for it). The copy records each chunk with the Ts it was read at; its keyed
  tables then converge (docs/snapshot.md, "A chunk read at a later snapshot converges": every MySQL table
  replicated has a key, and ``binlog_row_image = FULL`` sends every value of a change).
- Values are rendered to the text the binlog stream renders (:mod:`upstream.mysql.types`, through the same
  :func:`upstream.mysql.rowfetch.column_readers` as the row fetcher) and parsed with the same parsers, so a copied
  row equals the row the mounter makes of the same data; a value the stream refuses (a zero date) raises
  ``DecodeError`` here too.
- Chunks are key ranges whose bounds are stored as that text; rows stream (an unbuffered cursor), memory stays
  bounded whatever a chunk's size.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import pymysql.cursors

from cdc.errors import DecodeError, InvalidArgument, UpstreamError
from cdc.events import SNAPSHOT, OpType, RowChange, TableName, TableSchema
from cdc.snapshot import SnapshotChunk, TablePlan, plan_from_bounds
from cdc.uri import parse_upstream_uri
from upstream.base import ExportedSnapshot, SnapshotReader
from upstream.mysql import admin, catalog, positions
from upstream.mysql import conn as my_conn
from upstream.mysql.rowfetch import bind_value, column_readers, quoted
from upstream.postgres import types as text_types

log = logging.getLogger(__name__)

NAME_PREFIX = "mysql-binlog:"


def snapshot_name(ts: int) -> str:
    """The name of the exported position ``ts`` (what :class:`MySqlSnapshotReader` is given)."""
    return f"{NAME_PREFIX}{ts}"


def name_ts(name: str) -> int:
    """The Ts a name made by :func:`snapshot_name` carries (``InvalidArgument`` for any other name)."""
    if not name.startswith(NAME_PREFIX) or not name[len(NAME_PREFIX):].isdigit():
        raise InvalidArgument(f"{name!r} is not a MySQL snapshot position (mysql-binlog:<ts>)")
    return int(name[len(NAME_PREFIX):])


def export_position(conn: Any, where: str, epoch: int = 0) -> ExportedSnapshot:
    """The position a copy run starts from: the binlog end now, as a Ts of ``epoch`` (the stream's on this server).
    Every reader opened after this returns stands at or after it, in the same epoch (it takes it from the name).
    Holds nothing on the server."""
    ts = positions.to_ts(*admin.master_position(conn, where), epoch)
    return ExportedSnapshot(snapshot_name(ts), ts, time.time())


def _table(name: TableName) -> str:
    return f"{quoted(name.schema)}.{quoted(name.table)}"


def _key_bound(key: tuple[str, ...], op: str) -> str:
    if len(key) == 1:
        return f"{quoted(key[0])} {op} %s"
    return f"({', '.join(quoted(k) for k in key)}) {op} ({', '.join(['%s'] * len(key))})"


class MySqlSnapshotReader(SnapshotReader):
    """See the module docstring. One connection; a transaction per chunk (opened on first use, ended by
    :meth:`release`); one thread at a time."""

    def __init__(self, uri: str, snapshot: str | None = None, *, label: str = "", timeout: float = 5.0) -> None:
        self.uri = uri
        self.snapshot = snapshot
        self.label = label
        self._timeout = timeout
        self._floor = name_ts(snapshot) if snapshot is not None else None
        self.where = my_conn.describe_uri(parse_upstream_uri(uri))
        self._conn: Any = None
        self._ts: int | None = None

    # ---- the transaction -------------------------------------------------------------------------------
    def _connection(self) -> Any:
        if self._conn is None:
            self._conn = my_conn.connect(self.uri, timeout=self._timeout)
        if self._ts is None:
            self._ts = self._begin(self._conn)
        return self._conn

    def _begin(self, conn: Any) -> int:
        with my_conn.mysql_errors(self.where, "starting a consistent snapshot"), conn.cursor() as cur:
            cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
            cur.execute("SHOW STATUS LIKE 'binlog_snapshot_%%'")
            status = {str(k).lower(): v for k, v in cur.fetchall()}
            log_file, pos = status.get("binlog_snapshot_file"), status.get("binlog_snapshot_position")
            if not log_file:  # MySQL: no such status; the position under a global read lock held for an instant
                cur.execute("ROLLBACK")
                cur.execute("FLUSH TABLES WITH READ LOCK")
                try:
                    cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
                    log_file, pos = admin.master_position(conn, self.where)
                finally:
                    cur.execute("UNLOCK TABLES")
        ts = positions.to_ts(str(log_file), int(pos or 0), positions.epoch_of(self._floor or 0))
        if self._floor is not None and ts < self._floor:
            raise UpstreamError(f"MySQL {self.where}: a consistent snapshot at binlog Ts {ts} is before the copy's "
                                f"exported position {self._floor} (another server behind the same address?)")
        log.debug("%s: snapshot transaction at binlog Ts %d", self.label, ts)
        return ts

    def read_ts(self) -> int:
        """The Ts the current transaction's snapshot stands at (opening one if none is open)."""
        self._connection()
        assert self._ts is not None
        return self._ts

    def release(self) -> None:
        """End the transaction (its metadata locks go); the next call opens a new one, at a position >= the export."""
        ts, self._ts = self._ts, None
        if ts is not None and self._conn is not None:
            try:
                with my_conn.mysql_errors(self.where, "ending the snapshot transaction"), self._conn.cursor() as cur:
                    cur.execute("ROLLBACK")
            except Exception:  # noqa: BLE001 - a broken connection: a new one next time
                self.close()

    def close(self) -> None:
        c, self._conn, self._ts = self._conn, None, None
        if c is not None:
            try:
                c.close()
            except Exception:  # noqa: BLE001 - closing a broken connection
                pass

    # ---- tables --------------------------------------------------------------------------------------
    def table_schema(self, table: TableName) -> TableSchema:
        facts = catalog.table_facts(self._connection(), self.where, table)
        if not facts.columns:
            raise InvalidArgument(f"MySQL {self.where}: no table {table} at the snapshot")
        try:
            return facts.schema()
        except ValueError as exc:
            raise InvalidArgument(f"MySQL {self.where}: table {table}: {exc}") from exc

    def count_rows(self, schema: TableSchema) -> int:
        conn = self._connection()
        with my_conn.mysql_errors(self.where, f"counting the rows of {schema.name}"), conn.cursor() as cur:
            cur.execute(f"SELECT COUNT(*) FROM {_table(schema.name)}")
            return int(cur.fetchone()[0])

    def plan(self, schema: TableSchema, chunk_rows: int) -> TablePlan:
        if chunk_rows < 1:
            raise InvalidArgument(f"chunk-rows must be at least 1, got {chunk_rows}")
        name = schema.name
        if not schema.has_key:  # (refused at create; a table without a key is one chunk under one snapshot)
            return plan_from_bounds(name, self.count_rows(schema), chunk_rows, None)
        conn = self._connection()
        key = tuple(schema.key)
        readers = column_readers(conn, self.where, schema)
        render = [readers.render[schema.columns.index(schema.column(k))] for k in key]
        keys = ", ".join(quoted(k) for k in key)
        query = (f"SELECT {keys} FROM (SELECT {keys}, ROW_NUMBER() OVER (ORDER BY {keys}) AS rn "
                 f"FROM {_table(name)}) AS s WHERE rn > 1 AND (rn - 1) %% %s = 0 ORDER BY rn")
        with my_conn.mysql_errors(self.where, f"planning the chunks of {name}"), conn.cursor() as cur:
            cur.execute(query, (chunk_rows,))
            bounds = [tuple(r(v) for r, v in zip(render, row, strict=True)) for row in cur.fetchall()]
            if bounds:
                cur.execute(f"SELECT COUNT(*) FROM {_table(name)} WHERE {_key_bound(key, '>=')}",
                            self._bound_params(schema, bounds[-1]))
            else:
                cur.execute(f"SELECT COUNT(*) FROM {_table(name)}")
            rows = len(bounds) * chunk_rows + int(cur.fetchone()[0])
        plan = plan_from_bounds(name, rows, chunk_rows, key, bounds)
        log.info("%s: snapshot plan %s: %d rows in %d chunk(s) of %d rows", self.label, name, rows, len(plan.chunks),
                 chunk_rows)
        return plan

    def _bound_params(self, schema: TableSchema, bound: tuple[str, ...]) -> list[Any]:
        return [bind_value(text_types.parser_for(schema.column(k).base_type, False)(t))
                for k, t in zip(schema.key, bound, strict=True)]

    def read_chunk(self, schema: TableSchema, chunk: SnapshotChunk, *, commit_ts: int = 0,
                   commit_time: float = 0.0) -> Iterator[RowChange]:
        if chunk.table_name != schema.name:
            raise InvalidArgument(f"chunk of {chunk.table_name} read with the schema of {schema.name}")
        return self._rows(schema, chunk, commit_ts, commit_time)

    def _rows(self, schema: TableSchema, chunk: SnapshotChunk, commit_ts: int,
              commit_time: float) -> Iterator[RowChange]:
        conn = self._connection()
        readers = column_readers(conn, self.where, schema)
        key = tuple(schema.key)
        where: list[str] = []
        params: list[Any] = []
        if not chunk.whole:
            if chunk.lower is not None:
                where.append(_key_bound(key, ">="))
                params += self._bound_params(schema, chunk.lower)
            if chunk.upper is not None:
                where.append(_key_bound(key, "<"))
                params += self._bound_params(schema, chunk.upper)
        cols = ", ".join(quoted(c.name) for c in schema.columns)
        query = (f"SELECT {cols} FROM {_table(schema.name)}" + (f" WHERE {' AND '.join(where)}" if where else "")
                 + (f" ORDER BY {', '.join(quoted(k) for k in key)}" if schema.has_key else ""))
        render, parse = readers.render, readers.parse
        insert = OpType.INSERT
        complete = False
        cur = conn.cursor(pymysql.cursors.SSCursor)
        try:
            with my_conn.mysql_errors(self.where, f"reading chunk {chunk.index} of {schema.name}"):
                cur.execute(query, params)
                for raw in cur.fetchall_unbuffered():
                    texts = [None if v is None else r(v) for r, v in zip(render, raw, strict=True)]
                    try:
                        row = tuple(None if t is None else p(t) for p, t in zip(parse, texts, strict=True))
                    except (ValueError, ArithmeticError) as exc:
                        raise DecodeError(f"table {schema.name}: a copied row's value: {exc}") from exc
                    yield RowChange(insert, schema, commit_ts, commit_time, None, None, {SNAPSHOT: True}, row, texts)
            complete = True
        finally:
            if not complete:  # abandoned or failed: the unbuffered result cannot be trusted; a new connection
                self.close()
            else:
                cur.close()
