"""What one Spark task of ``changefeed verify`` does with one chunk (no Spark import: runs in an executor, or in
this process for a small verification; docs/verify.md).

:func:`checksum_task` reads the chunk's key range on both sides -- the upstream through its
:class:`~upstream.base.SnapshotReader` under the exported snapshot, the target through its driver (one read-only
transaction, at the target's exported snapshot where it has one: PostgreSQL) -- and returns the two checksums
(:class:`cdc.verify.ChunkSum`). :func:`drill_task` reads the same range again and returns the keys that differ
(:class:`cdc.verify.RowDiff`): only for chunks whose checksums differed. Memory: the checksum pass streams; the
drill-down keeps one chunk's canonical rows of both sides.

The target's range is ``lower <= key < upper`` in the target's own order: the bounds are the upstream's key text,
bound as text on PostgreSQL (the server casts it to the column's type) and parsed by :func:`bound_value` elsewhere.
A table whose key types have no such parse is planned as one range by the driver (:func:`bounds_supported`).
"""

from __future__ import annotations

import datetime as dt
import decimal
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from hashlib import blake2b
from typing import Any

from cdc import serde
from cdc.errors import InvalidArgument
from cdc.events import ColumnSchema, TableSchema
from cdc.snapshot import SnapshotChunk
from cdc.verify import DIFFERENT, EXTRA, INEXACT, MISSING, ChunkSum, RowDiff
from sinks.sql.target.connection import Target
from spark_jobs.verify_lake import lake_rows
from spark_jobs.verify_values import INEXACT as INEXACT_FORM
from spark_jobs.verify_values import PG_TEXT_SETTINGS, RowForms, add_hash, key_text, row_hash
from upstream import open_upstream

FETCH_ROWS = 2000
"""Target rows fetched per round trip."""

_INT_KEYS = frozenset({"int2", "int4", "int8", "oid", "xid", "cid"})
_TEXT_KEYS = frozenset({"text", "varchar", "bpchar", "name", "char"})
LAKE = "lake"
"""The dialect of a storage sink's lake (spark_jobs.verify_lake): Parquet read with pyarrow."""
_BOUND_TYPES = {
    "mysql": _INT_KEYS | _TEXT_KEYS | {"numeric", "date", "timestamp", "timestamptz", "uuid"},
    "sqlite": _INT_KEYS | _TEXT_KEYS,
    LAKE: _INT_KEYS | _TEXT_KEYS | {"date"},  # (numeric may be a string column there, timestamptz zoned)
}


@dataclass(frozen=True, slots=True)
class VerifyTask:
    """One chunk to compare: where both sides are, the snapshots to read them under (``target_snapshot``: a
    PostgreSQL target's exported snapshot, None: the target's current state), the table's schema (JSON) and the
    chunk (JSON). ``lake``: a storage sink's target side, the table's lake Parquet version at the point
    (spark_jobs.verify_lake; "" a table with no version yet, read as empty); None for a SQL target."""

    upstream: str
    sink: str
    snapshot: str | None
    target_snapshot: str | None
    schema_json: str
    chunk_json: str
    lake: str | None = None

    @property
    def schema(self) -> TableSchema:
        return serde.from_json(TableSchema, self.schema_json)

    @property
    def chunk(self) -> SnapshotChunk:
        return serde.from_json(SnapshotChunk, self.chunk_json)


@dataclass(frozen=True, slots=True)
class ChunkDrill:
    """The row-by-row comparison of one chunk: every differing key (not capped: at most the chunk's rows)."""

    table: str
    index: int
    diffs: tuple[RowDiff, ...]


def bounds_supported(schema: TableSchema, dialect: str) -> bool:
    """Can a ``dialect`` target read this table's key ranges (PostgreSQL: always; else per key type)?"""
    if dialect == "postgresql" or not schema.has_key:
        return True
    allowed = _BOUND_TYPES.get(dialect, frozenset())
    return all(not c.is_array and c.base_type in allowed for c in (schema.column(k) for k in schema.key))


def bound_value(col: ColumnSchema, text: str) -> Any:
    """The upstream's key text as the value a MySQL/SQLite driver compares with the stored key."""
    base = col.base_type
    if base in _INT_KEYS:
        return int(text)
    if base == "numeric":
        return decimal.Decimal(text)
    if base == "date":
        return dt.date.fromisoformat(text)
    if base in ("timestamp", "timestamptz"):
        v = dt.datetime.fromisoformat(text)
        return v.astimezone(dt.UTC).replace(tzinfo=None) if v.tzinfo is not None else v
    return text


def lake_range(schema: TableSchema, chunk: SnapshotChunk) -> tuple[tuple[str, ...], list[Any] | None,
                                                                   list[Any] | None]:
    """``chunk``'s key range for :func:`spark_jobs.verify_lake.lake_rows`: (key columns, lower, upper) with the
    bounds parsed as :func:`bound_value` parses them (no key: the whole table)."""
    if chunk.whole or (chunk.lower is None and chunk.upper is None):
        return (), None, None
    cols = [schema.column(k) for k in chunk.key]

    def parse(bound: Any) -> list[Any] | None:
        return None if bound is None else [bound_value(c, t) for c, t in zip(cols, bound, strict=True)]
    return tuple(chunk.key), parse(chunk.lower), parse(chunk.upper)


def _quote(target: Target, name: str) -> str:
    quoted = target.engine.dialect.identifier_preparer.quote(name)
    return quoted if target.dialect == "sqlite" else quoted.replace("%", "%%")


def table_ref(target: Target, schema: TableSchema) -> str:
    """The quoted name of ``schema``'s table in the target."""
    tschema, tname = target.target_parts(schema.name)
    return (f"{_quote(target, tschema)}." if tschema else "") + _quote(target, tname)


def _pg_text(quoted: str, col: ColumnSchema) -> str:
    """A PostgreSQL target column as its type's output text (``boolout``'s ``t``, ``bpchar`` with its padding),
    which ``::text`` is not for ``bool`` and ``bpchar`` (the cast gives ``true`` and strips the padding)."""
    if not col.is_array and col.base_type in ("bool", "bpchar"):
        return f"CASE WHEN {quoted} IS NULL THEN NULL ELSE format('%%s', {quoted}) END"
    return f"{quoted}::text"


def range_query(target: Target, schema: TableSchema, chunk: SnapshotChunk) -> tuple[str, list[Any]]:
    """``SELECT`` of ``chunk``'s range in the target (columns in upstream order; PostgreSQL: as text), with its
    parameters."""
    mark = "?" if target.dialect == "sqlite" else "%s"
    cols = ", ".join(_pg_text(_quote(target, c.name), c) if target.dialect == "postgresql" else _quote(target, c.name)
                     for c in schema.columns)
    sql = f"SELECT {cols} FROM {table_ref(target, schema)}"
    params: list[Any] = []
    if not chunk.whole and (chunk.lower is not None or chunk.upper is not None):
        keys = ", ".join(_quote(target, k) for k in chunk.key)
        marks = ", ".join(mark for _ in chunk.key)
        conds = []
        key_cols = [schema.column(k) for k in chunk.key]
        for bound, op in ((chunk.lower, ">="), (chunk.upper, "<")):
            if bound is None:
                continue
            conds.append(f"({keys}) {op} ({marks})")
            params.extend(bound if target.dialect == "postgresql"
                          else [bound_value(c, t) for c, t in zip(key_cols, bound, strict=True)])
        sql += " WHERE " + " AND ".join(conds)
    return sql, params


def open_read(target: Target, target_snapshot: str | None) -> Any:
    """A DBAPI connection of ``target`` in one read-only transaction (PostgreSQL: repeatable read, at
    ``target_snapshot`` when given, with :data:`PG_TEXT_SETTINGS`; MySQL: a consistent snapshot; SQLite: a deferred
    read transaction). The caller closes it (which ends the transaction)."""
    raw = target.engine.raw_connection()
    cur = raw.cursor()
    try:
        if target.dialect == "postgresql":
            raw.rollback()
            raw.dbapi_connection.set_session(isolation_level="REPEATABLE READ", readonly=True)
            if target_snapshot:
                cur.execute("SET TRANSACTION SNAPSHOT %s", (target_snapshot,))
            for k, v in PG_TEXT_SETTINGS.items():
                cur.execute("SELECT set_config(%s, %s, true)", (k, v))
        elif target.dialect == "mysql":
            cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
        else:
            cur.execute("BEGIN")
    except BaseException:
        cur.close()
        raw.invalidate()
        raise
    cur.close()
    return raw


def end_read(raw: Any) -> None:
    """End :func:`open_read`'s transaction and give the connection back (its pool never sees it in a transaction)."""
    try:
        raw.rollback()
        cur = raw.cursor()
        try:
            cur.execute("ROLLBACK")  # SQLite without the driver's transaction handling; a no-op elsewhere
        except Exception:  # noqa: BLE001 - nothing was open
            pass
        finally:
            cur.close()
    except Exception:  # noqa: BLE001 - a broken connection: the server ends its transaction
        raw.invalidate()
    finally:
        raw.close()


def target_rows(raw: Any, target: Target, schema: TableSchema, chunk: SnapshotChunk) -> Iterator[tuple[Any, ...]]:
    """The chunk's rows in the target, driver values (PostgreSQL: text), any order."""
    sql, params = range_query(target, schema, chunk)
    cur = raw.cursor()
    try:
        cur.execute(sql, params)
        while True:
            batch = cur.fetchmany(FETCH_ROWS)
            if not batch:
                return
            yield from (tuple(r) for r in batch)
    finally:
        cur.close()


class _Sides:
    """Both sides of one task: the upstream reader and the target's read transaction (closed by :meth:`close`)."""

    def __init__(self, task: VerifyTask) -> None:
        self.schema = task.schema
        self.chunk = task.chunk
        self.lake = task.lake
        self.up = open_upstream(task.upstream)
        self.target: Target | None = None
        self.raw: Any = None
        try:
            self.reader = self.up.snapshot_reader(task.snapshot, label="verify")
            if task.snapshot is not None and self.reader.read_ts() is not None:
                raise InvalidArgument(
                    "cdc verify cannot compare this upstream yet: its readers cannot share one exported snapshot "
                    "(MySQL/MariaDB: each takes its own, at a later binlog position than the held one), so rows "
                    "changed meanwhile would show as differences")
            if self.lake is not None:
                self.forms = RowForms(self.schema, LAKE)
            else:
                self.target = Target(task.sink)
                self.forms = RowForms(self.schema, self.target.dialect)
                self.raw = open_read(self.target, task.target_snapshot)
        except BaseException:
            self.close()
            raise

    def upstream(self) -> Iterator[tuple[Any, ...]]:
        for change in self.reader.read_chunk(self.schema, self.chunk):
            yield self.forms.upstream(change.row or (), change.row_text or ())

    def downstream(self) -> Iterator[tuple[Any, ...]]:
        if self.lake is not None:
            rows: Iterator[tuple[Any, ...]] = lake_rows(self.lake, self.schema, *lake_range(self.schema, self.chunk))
        else:
            assert self.target is not None
            rows = target_rows(self.raw, self.target, self.schema, self.chunk)
        for r in rows:
            yield self.forms.target(r)

    def close(self) -> None:
        if self.raw is not None:
            try:
                end_read(self.raw)
            finally:
                self.raw = None
        if self.target is not None:
            self.target.close()
        self.up.close()


class LineSums:
    """The row count and multiset hash sum of COPY text lines given in pieces of any size (``write``: bytes or str,
    UTF-8); each line hashed as :func:`~spark_jobs.verify_values.row_hash` hashes a row, over its bytes."""

    def __init__(self) -> None:
        self.rows = 0
        self.sum = 0
        self._rest = b""

    def write(self, data: bytes | str) -> int:
        piece = data.encode() if isinstance(data, str) else bytes(data)
        lines = (self._rest + piece).split(b"\n")
        self._rest = lines.pop()
        for line in lines:
            self.rows += 1
            self.sum = add_hash(self.sum, int.from_bytes(blake2b(line, digest_size=8).digest(), "big"))
        return len(data)

    def close(self) -> None:
        if self._rest:  # COPY ends every row with a newline: a rest is a row cut short
            raise ValueError(f"COPY text ended inside a row ({len(self._rest)} bytes)")


def _text_sums(sides: _Sides) -> ChunkSum | None:
    """The checksums from COPY text on both sides (a PostgreSQL target: the upstream's text against the target's
    output text, line for line, no value parsed); None when either side cannot give UTF-8 COPY text."""
    target = sides.target
    if target is None or target.dialect != "postgresql" or sides.raw.dbapi_connection.encoding != "UTF8":
        return None
    text = sides.reader.read_chunk_text(sides.schema, sides.chunk)
    if text is None:
        return None
    try:
        if not text.pg_utf8:
            return None
        up = LineSums()
        for block in text.blocks:
            up.write(block)
        up.close()
    finally:
        text.abandon()  # (declined or failed part-way: the upstream's COPY is not left open)
    sql, params = range_query(target, sides.schema, sides.chunk)
    cur = sides.raw.cursor()
    try:
        query = cur.mogrify(sql, params).decode()
        down = LineSums()
        cur.copy_expert(f"COPY ({query}) TO STDOUT", down)
        down.close()
    finally:
        cur.close()
    return ChunkSum(str(sides.schema.name), sides.chunk.index, up.rows, up.sum, down.rows, down.sum)


def checksum_chunk(task: VerifyTask) -> ChunkSum:
    """The two checksums of ``task``'s chunk (see the module docstring). A PostgreSQL target is compared by COPY text
    lines (:func:`_text_sums`): equal lines are equal tuples of output texts, the canonical form of that mode."""
    sides = _Sides(task)
    try:
        fast = _text_sums(sides)
        if fast is not None:
            return fast
        up_rows = up_sum = inexact = 0
        for canon in sides.upstream():
            up_rows += 1
            up_sum = add_hash(up_sum, row_hash(canon))
            if INEXACT_FORM in canon:
                inexact += 1
        down_rows = down_sum = 0
        for canon in sides.downstream():
            down_rows += 1
            down_sum = add_hash(down_sum, row_hash(canon))
        return ChunkSum(str(sides.schema.name), sides.chunk.index, up_rows, up_sum, down_rows, down_sum, inexact)
    finally:
        sides.close()


def drill_chunk(task: VerifyTask) -> ChunkDrill:
    """Every key of ``task``'s chunk that differs (see :class:`cdc.verify.RowDiff`); a key-less table as a multiset
    (a row twice downstream and once upstream is one ``extra``)."""
    sides = _Sides(task)
    try:
        names = [c.name for c in sides.schema.columns]
        forms = sides.forms
        diffs: list[RowDiff] = []
        if forms.key_index:
            source = {forms.key(c): c for c in sides.upstream()}
            target: dict[tuple[Any, ...], tuple[Any, ...]] = {}
            for c in sides.downstream():
                k = forms.key(c)
                if k in target:  # a key twice downstream: one of them is extra
                    diffs.append(RowDiff(EXTRA, key_text(k), (), row_hash(c)))
                target[k] = c
            for k, s in source.items():
                t = target.get(k)
                if t is None:
                    diffs.append(RowDiff(MISSING, key_text(k), (), row_hash(s)))
                    continue
                inexact = tuple(n for n, a in zip(names, s, strict=True) if a == INEXACT_FORM)
                if inexact:
                    diffs.append(RowDiff(INEXACT, key_text(k), inexact))
                elif s != t:
                    cols = tuple(n for n, a, b in zip(names, s, t, strict=True) if a != b)
                    diffs.append(RowDiff(DIFFERENT, key_text(k), cols, row_hash(s)))
            diffs.extend(RowDiff(EXTRA, key_text(k), (), row_hash(t)) for k, t in target.items() if k not in source)
        else:
            src = Counter(sides.upstream())
            dst = Counter(sides.downstream())
            for row, n in (src - dst).items():
                kind = INEXACT if INEXACT_FORM in row else MISSING
                diffs.extend(RowDiff(kind, key_text(row), (), row_hash(row)) for _ in range(n))
            for row, n in (dst - src).items():
                diffs.extend(RowDiff(EXTRA, key_text(row), (), row_hash(row)) for _ in range(n))
        return ChunkDrill(str(sides.schema.name), sides.chunk.index, tuple(diffs))
    finally:
        sides.close()


def checksum_task(payload: bytes) -> bytes:
    """:func:`checksum_chunk` of a :class:`VerifyTask` given as JSON, its result as JSON (what a Spark task runs)."""
    return serde.to_json(checksum_chunk(serde.from_json(VerifyTask, payload)))


def drill_task(payload: bytes) -> bytes:
    """:func:`drill_chunk` of a :class:`VerifyTask` given as JSON, its result as JSON (what a Spark task runs)."""
    return serde.to_json(drill_chunk(serde.from_json(VerifyTask, payload)))
