"""Shared test data of the storage sink tests: tables, changes, a reference model of a table, a file system that
fails on purpose."""

from __future__ import annotations

import errno
from collections import Counter
from collections.abc import Iterable
from typing import Any, BinaryIO

from cdc.events import UNCHANGED, ColumnSchema, OpType, RowChange, TableName, TableSchema
from sinks.storage.fs import LocalFS
from sinks.storage.sink import StorageSink

PROTOCOLS = ("csv", "canal-json", "parquet")
CLOCK = 1_795_000_000.0  # 2026-11-18 UTC


def col(name: str, oid: int, base: str, *, key: bool = False, typmod: int = -1) -> ColumnSchema:
    return ColumnSchema(name, oid, base, False, base, typmod, not key, key)


KV = TableSchema(TableName("app", "kv"), (col("id", 20, "int8", key=True), col("body", 25, "text"),
                                          col("n", 23, "int4")), ("id",), relation_id=1, version=1)
KV2 = TableSchema(KV.name, (*KV.columns, col("note", 1043, "varchar", typmod=36)), ("id",), relation_id=1, version=2)
BAG = TableSchema(TableName("app", "bag"), (col("a", 23, "int4"), col("b", 25, "text")), ("a", "b"),
                  replica_identity="f", relation_id=2, version=1, has_key=False)


def ins(schema: TableSchema, ts: int, **values: Any) -> RowChange:
    return RowChange(OpType.INSERT, schema, ts, ts / 1000, values)


def upd(schema: TableSchema, ts: int, old: dict[str, Any] | None = None, **values: Any) -> RowChange:
    return RowChange(OpType.UPDATE, schema, ts, ts / 1000, values, old)


def dele(schema: TableSchema, ts: int, **old: Any) -> RowChange:
    return RowChange(OpType.DELETE, schema, ts, ts / 1000, None, old)


def trunc(schema: TableSchema, ts: int) -> RowChange:
    return RowChange(OpType.TRUNCATE, schema, ts, ts / 1000)


def uri(root: Any, protocol: str, **params: Any) -> str:
    q = "&".join([f"protocol={protocol}", *(f"{k.replace('_', '-')}={v}" for k, v in params.items())])
    return f"file://{root}?{q}"


def sink(root: Any, protocol: str, *, fs: LocalFS | None = None, position: bool = True, **params: Any
         ) -> StorageSink:
    params.setdefault("date_separator", "none")
    s = StorageSink(uri(root, protocol, **params), fs=fs, clock=lambda: CLOCK)
    s.check()
    if position:
        s.open_position("cf", 0, 1)
    return s


class Model:
    """The reference: what a table holds after ``changes`` (by key; a multiset of rows without a key)."""

    def __init__(self, schema: TableSchema) -> None:
        self.schema = schema
        self.rows: dict[tuple[Any, ...], dict[str, Any]] = {}
        self.bag: Counter[tuple[Any, ...]] = Counter()

    def apply(self, changes: Iterable[RowChange]) -> Model:
        names = self.schema.column_names
        for c in changes:
            if c.schema.name != self.schema.name:
                continue
            if c.op is OpType.TRUNCATE:
                self.rows.clear()
                self.bag.clear()
            elif not self.schema.has_key:
                if c.op in (OpType.UPDATE, OpType.DELETE):
                    self.bag[tuple((c.old_values or {})[n] for n in names)] -= 1
                if c.op in (OpType.INSERT, OpType.UPDATE):
                    old = c.old_values or {}
                    self.bag[tuple(old[n] if (c.values or {})[n] is UNCHANGED else (c.values or {})[n]
                                   for n in names)] += 1
                self.bag = +self.bag
            else:
                key = self.schema.key
                if c.op is OpType.DELETE:
                    self.rows.pop(tuple((c.old_values or {})[k] for k in key), None)
                    continue
                values = dict(c.values or {})
                old_key = tuple((c.old_values or values)[k] for k in key)
                base = self.rows.pop(old_key, None) or {}
                self.rows[tuple(values[k] for k in key)] = {n: base.get(n) if values.get(n, UNCHANGED) is UNCHANGED
                                                            else values[n] for n in names}
        return self

    def result(self) -> list[dict[str, Any]]:
        if self.schema.has_key:
            return sorted(self.rows.values(), key=lambda r: tuple(r[k] for k in self.schema.key))
        names = self.schema.column_names
        return sorted((dict(zip(names, t, strict=True)) for t, n in self.bag.items() for _ in range(n)),
                      key=lambda r: tuple(str(r[n]) for n in names))


def sorted_rows(schema: TableSchema, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if schema.has_key:
        return sorted(rows, key=lambda r: tuple(r[k] for k in schema.key))
    return sorted(rows, key=lambda r: tuple(str(r[n]) for n in schema.column_names))


class FailingFS(LocalFS):
    """A LocalFS whose primitives fail with ``errno`` on the ``after``-th call (0: the first) of ``op`` (``write``,
    ``fsync``, ``link``, ``rename``, ``create``, ``dirsync``), optionally only for paths containing ``path_part``."""

    def __init__(self, root: str, op: str = "", err: int = errno.ENOSPC, *, after: int = 0, times: int = 1,
                 path_part: str = "") -> None:
        super().__init__(root)
        self.op, self.err, self.after, self.times, self.path_part = op, err, after, times, path_part
        self.calls: Counter[str] = Counter()

    def _maybe_fail(self, op: str, path: str) -> None:
        if op != self.op or self.path_part not in path:
            return
        n = self.calls[op]
        self.calls[op] += 1
        if self.after <= n < self.after + self.times:
            raise OSError(self.err, f"injected {errno.errorcode.get(self.err, self.err)}", path)

    def _open_new(self, path: str) -> BinaryIO:
        self._maybe_fail("create", path)
        f = super()._open_new(path)
        fs = self

        class Failing:
            def __init__(self) -> None:
                self.name = path

            def write(self, data: bytes) -> int:
                fs._maybe_fail("write", path)
                return f.write(data)

            def __getattr__(self, name: str) -> Any:
                return getattr(f, name)

        return Failing()  # type: ignore[return-value]

    def _fsync(self, f: BinaryIO) -> None:
        self._maybe_fail("fsync", getattr(f, "name", ""))
        super()._fsync(f)

    def _link(self, src: str, dst: str) -> None:
        self._maybe_fail("link", dst)
        super()._link(src, dst)

    def _fsync_dir(self, path: str) -> None:
        self._maybe_fail("dirsync", path + "/")
        super()._fsync_dir(path)

    def _rename(self, src: str, dst: str) -> None:
        self._maybe_fail("rename", dst)
        super()._rename(src, dst)
