"""Reading the storage sink back: tables rebuilt from the files up to the published ``metadata`` checkpoint.

A consumer of a storage sink directory must not trust a file just because it is there: files are published at
each span's flush, while ``metadata`` holds the changefeed checkpoint, below which *every* span has published
everything. So a consistent state is "every change with ``commit Ts <= checkpoint``". This module reads exactly
that, incrementally:

- :class:`LakeOffset` is a position of a consumer: the checkpoint it has applied, and per data directory the index
  through which every file is fully applied (``done``) and the highest index it has seen (``seen``), plus the table
  versions (schema files) it has seen. Offsets are JSON (Structured Streaming keeps them in its checkpoint).
- :meth:`StorageReader.latest_offset` reads ``metadata`` and lists the directories: the next offset.
- :meth:`StorageReader.changes` returns, per table, the changes between two offsets in apply order: from a file
  seen before, its rows with ``start.checkpoint < commit Ts <= end.checkpoint``; from a file new since ``start``,
  all its rows up to ``end.checkpoint`` (a file published late - a table copy - still counts); files done at
  ``start`` are not read again. The apply order is ``(commit Ts, table version, date, file index, line)``, so
  rows of one transaction stay in file order, a TRUNCATE or DROP TABLE (a schema file with TiCDC's ``Type``) falls
  between the rows before and after it, and a change replayed into a later file (only the initial copy does that)
  applies after its first copy, harmlessly.
- :class:`TableState` applies changes: upsert by key, delete by key, updates merged into the existing row (values
  the upstream did not send keep the existing value), key changes moved, a DELETE immediately followed by an INSERT
  of the same commit Ts with unsent values taken as one update (the sink's split of key-changing and key-less
  updates), TRUNCATE and DROP TABLE empty the table; tables without a key are multisets of rows (a delete removes
  one equal row). A change that cannot be applied exactly (an update of a row the state does not have, with values
  the upstream did not send) is counted in :attr:`TableState.problems`, never guessed silently.
- :func:`rebuild` does all of it at once (tests, small directories).

An ADD COLUMN version whose schema file carries ``Fills`` (``sinks.storage.layout``) is an event too: the rows
held at that point get the values the upstream gave the rows that existed (a constant or a STABLE default such as
``now()``). The same code runs in the Spark lake job (``spark_jobs.lake``). Limits: the Spark lake job does not
apply fills yet (it stops, naming the table and the columns); a column added with a VOLATILE default is NULL in
rows written before it (the storage sink raises ``CDC:WarnDdlDefault``); a renamed table's rows
stay under its old name, as TiCDC's consumer leaves them; files must carry the commit Ts (CSV
``csv-include-commit-ts``, canal-json ``enable-tidb-extension``, both on by default).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from cdc.errors import InvalidArgument
from cdc.events import UNCHANGED, OpType, TableName, TableSchema
from sinks.codec import decoder_for
from sinks.codec.base import MessageDecodeError, MessageKind
from sinks.storage import layout as L
from sinks.storage.config import StorageConfig
from sinks.storage.fs import LocalFS


@dataclass(frozen=True, order=True)
class DataFile:
    """One published data file of a table version (``dir`` and ``path`` relative to the root)."""

    table: TableName
    version: int
    date: str
    index: int
    dir: str = field(compare=False)
    path: str = field(compare=False)


@dataclass(slots=True)
class LakeChange:
    """One change in apply order. ``op``: INSERT/UPDATE/DELETE, or TRUNCATE for a TRUNCATE or DROP TABLE version.
    ``values``: the new row (INSERT, UPDATE), ``old``: the old row or key (UPDATE, DELETE); a value the upstream did
    not send is ``UNCHANGED``. ``order``: ``(commit Ts, version, date, index, line)``."""

    op: OpType
    commit_ts: int
    order: tuple[int, int, str, int, int]
    values: dict[str, Any] | None = None
    old: dict[str, Any] | None = None
    key: tuple[Any, ...] | None = None
    fill: bool = False
    """An ADD COLUMN version's fills (op UPDATE, ``values`` the new columns' values): every row held at this point
    gets them (the rows written before the DDL lack those columns)."""


@dataclass(frozen=True)
class Slice:
    """A unit of reading (one Spark partition): the rows of ``file`` with ``low < commit Ts <= high``, or (``file``
    None) the TRUNCATE / DROP TABLE versions ``events`` (``(commit Ts, version)``) of ``table``."""

    table: TableName
    file: DataFile | None
    low: int
    high: int
    events: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class LakeOffset:
    """A consumer's position (module docstring). ``files``: data directory -> ``(done, seen)``; ``versions``:
    table directory -> the table versions seen."""

    checkpoint: int = 0
    files: dict[str, tuple[int, int]] = field(default_factory=dict)
    versions: dict[str, tuple[int, ...]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"checkpoint": self.checkpoint, "files": {k: list(v) for k, v in sorted(self.files.items())},
                "versions": {k: list(v) for k, v in sorted(self.versions.items())}}

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> LakeOffset:
        if not d:
            return cls()
        return cls(int(d.get("checkpoint", 0)), {k: (int(v[0]), int(v[1])) for k, v in d.get("files", {}).items()},
                   {k: tuple(int(x) for x in v) for k, v in d.get("versions", {}).items()})

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | None) -> LakeOffset:
        return cls.from_dict(json.loads(text) if text else None)


class StorageReader:
    """Reads one storage sink directory (``uri``: the sink URI, for the protocol and its options). Keeps a cache of
    each file's highest commit Ts (a file never changes once published). Not thread-safe."""

    def __init__(self, uri: str, *, fs: LocalFS | None = None) -> None:
        self.cfg = StorageConfig.from_uri(uri)
        self.fs = fs if fs is not None else LocalFS(self.cfg.root)
        self._schemas: dict[TableName, dict[int, L.SchemaFile]] = {}
        self._max_ts: dict[str, int] = {}
        if self.cfg.protocol == "csv" and not self.cfg.encoder.csv_include_commit_ts:
            raise InvalidArgument("the files carry no commit Ts (csv-include-commit-ts=false): they cannot be cut at "
                                  "the checkpoint; write them with csv-include-commit-ts=true")
        if self.cfg.protocol == "canal-json" and not self.cfg.encoder.enable_tidb_extension:
            raise InvalidArgument("the files carry no commit Ts (enable-tidb-extension=false): they cannot be cut at "
                                  "the checkpoint; write them with enable-tidb-extension=true")

    # ---- listing ------------------------------------------------------------------------------------------
    def checkpoint(self) -> int | None:
        """The published changefeed checkpoint (``metadata``), None before the first."""
        raw = self.fs.read(L.METADATA)
        return L.parse_checkpoint(raw) if raw is not None else None

    def tables(self) -> list[TableName]:
        """Tables with at least one schema file."""
        out = []
        for s in self.fs.listdir(""):
            if s.startswith(".") or s == L.METADATA:
                continue
            for t in self.fs.listdir(s):
                if any(L.parse_schema_file_name(n) for n in self.fs.listdir(f"{s}/{t}/{L.TABLE_META}")):
                    out.append(TableName(L.unescape_name(s), L.unescape_name(t)))
        return sorted(out)

    def schema_files(self, table: TableName) -> dict[int, L.SchemaFile]:
        """The table's versions (schema files), by version."""
        def bad(path: str, exc: Exception) -> None:
            raise MessageDecodeError(f"{self.fs.abs(path)}: not a Tidewater schema file: {exc}") from exc

        return L.load_schema_files(self.fs, table, self._schemas.setdefault(table, {}), bad)

    def latest_schema(self, table: TableName) -> TableSchema | None:
        files = self.schema_files(table)
        live = [sf for sf in files.values() if not sf.is_drop]
        return max(live, key=lambda sf: sf.version).schema if live else None

    def data_files(self, table: TableName) -> list[DataFile]:
        """The table's published data files, in (version, date, index) order."""
        ext = self.cfg.extension
        base = L.table_dir(table)
        out = []
        for version in self.fs.listdir(base):
            if not version.isdigit():
                continue
            folder = f"{base}/{version}"
            for entry in self.fs.listdir(folder):
                idx = L.parse_data_file_name(entry, ext)
                if idx is not None:
                    out.append(DataFile(table, int(version), "", idx, folder, f"{folder}/{entry}"))
                elif L.is_date_dir(entry):
                    sub = f"{folder}/{entry}"
                    for name in self.fs.listdir(sub):
                        idx = L.parse_data_file_name(name, ext)
                        if idx is not None:
                            out.append(DataFile(table, int(version), entry, idx, sub, f"{sub}/{name}"))
        return sorted(out)

    # ---- one file -----------------------------------------------------------------------------------------
    def read_file(self, df: DataFile) -> list[LakeChange]:
        """Every change in ``df``, in file order."""
        sf = self.schema_files(df.table).get(df.version)
        if sf is None:
            raise MessageDecodeError(f"{self.fs.abs(df.path)}: no schema file for table version {df.version}")
        schema = sf.schema
        raw = self.fs.read(df.path)
        if raw is None:
            raise MessageDecodeError(f"{self.fs.abs(df.path)} disappeared (published files are never removed by "
                                     f"the sink)")
        proto = self.cfg.protocol
        try:
            if proto == "parquet":
                out = self._parquet_changes(df, schema)
            else:
                decoder = decoder_for(proto, self.cfg.encoder, schemas=lambda _t: schema)
                if proto == "csv":
                    events = decoder.decode(None, raw)
                else:
                    events = [e for line in raw.split(b"\r\n") if line.strip() for e in decoder.decode(None, line)]
                out = []
                for i, e in enumerate(events):
                    if e.kind is not MessageKind.ROW or e.op is None:
                        continue
                    if e.commit_ts is None:
                        raise MessageDecodeError(f"{self.fs.abs(df.path)}: a row without commit Ts")
                    old = e.old
                    if e.op is OpType.DELETE and old is None:
                        old = e.values
                    key = tuple(e.key[k] for k in schema.key) if e.key and schema.has_key else None
                    out.append(LakeChange(e.op, e.commit_ts, (e.commit_ts, df.version, df.date, df.index, i),
                                          e.values if e.op is not OpType.DELETE else None, old, key))
        except MessageDecodeError as exc:
            raise MessageDecodeError(f"{self.fs.abs(df.path)}: {exc.message}") from exc
        if out:
            self._max_ts[df.path] = max(c.commit_ts for c in out)
        return out

    def _parquet_changes(self, df: DataFile, schema: TableSchema) -> list[LakeChange]:
        from sinks.storage import parquet as P

        ops = {"I": OpType.INSERT, "U": OpType.UPDATE, "D": OpType.DELETE}
        names = schema.column_names
        out = []
        for i, r in enumerate(P.read_rows(self.fs.abs(df.path), schema)):
            op = ops[r[P.OPERATION]]
            ts = int(r[P.COMMIT_TS])
            values = {n: r[n] for n in names}
            key = tuple(values[k] for k in schema.key) if schema.has_key else None
            order = (ts, df.version, df.date, df.index, i)
            if op is OpType.DELETE:
                out.append(LakeChange(op, ts, order, None, values, key))
            else:
                out.append(LakeChange(op, ts, order, values, None, key))
        return out

    def max_commit_ts(self, df: DataFile) -> int:
        """The highest commit Ts in ``df`` (cached)."""
        ts = self._max_ts.get(df.path)
        if ts is None:
            changes = self.read_file(df)
            ts = self._max_ts[df.path] = max((c.commit_ts for c in changes), default=0)
        return ts

    # ---- offsets ------------------------------------------------------------------------------------------
    def latest_offset(self, previous: LakeOffset | None = None,
                      tables: Iterable[TableName] | None = None, until: int | None = None) -> LakeOffset:
        """The offset at the published checkpoint now (module docstring), of every table or of ``tables``;
        ``previous`` saves re-reading files done before. ``until``: cut at this Ts instead when the published
        checkpoint is past it (exact: every change at or below a published checkpoint is in the files listed now,
        so the cut holds the whole transactions up to ``until`` and nothing after it; once ``previous`` is at the
        cut, it is returned as it is, so a stream cut there ends instead of planning empty batches of later files)."""
        previous = previous or LakeOffset()
        ckpt = self.checkpoint() or 0
        if until is not None:
            ckpt = min(ckpt, until)
            if previous.checkpoint >= ckpt:
                return previous  # cut reached: the files published since hold only later changes (no new offset)
        files: dict[str, tuple[int, int]] = {}
        versions: dict[str, tuple[int, ...]] = {}
        wanted = set(tables) if tables is not None else None
        for table in self.tables():
            if wanted is not None and table not in wanted:
                continue
            versions[L.table_dir(table)] = tuple(sorted(self.schema_files(table)))
            by_dir: dict[str, list[DataFile]] = {}
            for df in self.data_files(table):
                by_dir.setdefault(df.dir, []).append(df)
            for folder, dfs in by_dir.items():
                done = previous.files.get(folder, (0, 0))[0]
                for df in dfs:  # ascending index
                    if df.index <= done:
                        continue
                    if df.index == done + 1 and self.max_commit_ts(df) <= ckpt:
                        done = df.index
                    else:
                        break
                files[folder] = (done, dfs[-1].index)
        return LakeOffset(ckpt, files, versions)

    def plan(self, start: LakeOffset, end: LakeOffset, tables: Iterable[TableName] | None = None) -> list[Slice]:
        """What to read between ``start`` and ``end`` (module docstring): per file, the commit Ts range of its rows
        that count; per table, its TRUNCATE / DROP TABLE versions in the range. Cheap (no data file is read)."""
        out: list[Slice] = []
        wanted = set(tables) if tables is not None else None
        for table in self.tables():
            if wanted is not None and table not in wanted:
                continue
            tdir = L.table_dir(table)
            seen_versions = set(start.versions.get(tdir, ()))
            events = []
            for version in end.versions.get(tdir, ()):
                sf = self.schema_files(table).get(version)
                if sf is None or not (sf.is_truncate or sf.is_drop or sf.fills):
                    continue
                new = version not in seen_versions
                if sf.commit_ts <= end.checkpoint and (new or sf.commit_ts > start.checkpoint):
                    events.append((sf.commit_ts, version))
            if events:
                out.append(Slice(table, None, -1, end.checkpoint, tuple(sorted(events))))
            for df in self.data_files(table):
                done, seen = start.files.get(df.dir, (0, 0))
                end_seen = end.files.get(df.dir, (0, 0))[1]
                if df.index <= done or df.index > end_seen:
                    continue
                out.append(Slice(table, df, -1 if df.index > seen else start.checkpoint, end.checkpoint))
        return out

    def read_slice(self, s: Slice) -> list[LakeChange]:
        """The changes of one :class:`Slice`, in file order."""
        if s.file is None:
            files = self.schema_files(s.table)
            return [LakeChange(OpType.TRUNCATE, ts, (ts, version, "", -1, 0)) if not files[version].fills else
                    LakeChange(OpType.UPDATE, ts, (ts, version, "", -1, 0),
                               {f.column: f.value for f in files[version].fills}, fill=True)
                    for ts, version in s.events]
        return [c for c in self.read_file(s.file) if s.low < c.commit_ts <= s.high]

    def changes(self, start: LakeOffset, end: LakeOffset,
                tables: Iterable[TableName] | None = None) -> dict[TableName, list[LakeChange]]:
        """Per table, the changes after ``start`` up to ``end``, in apply order (module docstring)."""
        wanted = set(tables) if tables is not None else None
        out: dict[TableName, list[LakeChange]] = {t: [] for t in self.tables() if wanted is None or t in wanted}
        for s in self.plan(start, end, out):
            out[s.table].extend(self.read_slice(s))
        for changes in out.values():
            changes.sort(key=lambda c: c.order)
        return out


class TableState:
    """A table rebuilt from changes (module docstring). ``rows()`` gives the rows, by column name."""

    def __init__(self, schema: TableSchema) -> None:
        self.schema = schema
        self.keyed = schema.has_key
        self._rows: dict[tuple[Any, ...], dict[str, Any]] = {}
        self._bag: Counter[tuple[Any, ...]] = Counter()
        self._last_deleted: tuple[int, dict[str, Any]] | None = None
        self.problems: list[str] = []

    def _key(self, values: dict[str, Any]) -> tuple[Any, ...]:
        return tuple(values.get(k) for k in self.schema.key)

    def _whole(self, values: dict[str, Any]) -> tuple[Any, ...]:
        return tuple(values.get(c) for c in self.schema.column_names)

    def _complete(self, values: dict[str, Any], base: dict[str, Any] | None, c: LakeChange) -> dict[str, Any]:
        if not any(v is UNCHANGED for v in values.values()):
            return dict(values)
        if base is None:
            self.problems.append(f"commit {c.commit_ts}: a row with unsent values and no earlier image "
                                 f"({self._key(values) if self.keyed else values})")
            return {k: (None if v is UNCHANGED else v) for k, v in values.items()}
        return {k: (base.get(k) if v is UNCHANGED else v) for k, v in values.items()}

    def apply(self, changes: Sequence[LakeChange]) -> None:
        for c in changes:
            op = c.op
            if c.fill:
                self._fill(c.values or {})
                continue
            if op is OpType.TRUNCATE:
                self._rows.clear()
                self._bag.clear()
                self._last_deleted = None
                continue
            if op is OpType.DELETE:
                old = c.old or {}
                removed = self._remove(old)
                self._last_deleted = (c.commit_ts, removed if removed is not None else old)
                continue
            values = c.values or {}
            if op is OpType.INSERT:
                base = None
                if self._last_deleted is not None and self._last_deleted[0] == c.commit_ts:
                    base = self._last_deleted[1]
                self._add(self._complete(values, base, c))
            else:  # UPDATE
                old = c.old
                if self.keyed:
                    old_key = self._key(old) if old and all(k in old for k in self.schema.key) else self._key(values)
                    base = self._rows.pop(old_key, None)
                    if base is None:
                        base = self._rows.get(self._key(values))
                    self._add(self._complete(values, base, c))
                elif not old:  # no old image: which of the equal rows changed is unknown
                    self.problems.append(f"commit {c.commit_ts}: an update of a key-less table without its old "
                                         f"image ({values}): set REPLICA IDENTITY FULL upstream")
                else:
                    removed = self._remove(old)
                    self._add(self._complete(values, removed if removed is not None else old, c))
            self._last_deleted = None

    def _fill(self, values: dict[str, Any]) -> None:
        """An ADD COLUMN's fills: the rows held now existed before it and get the values upstream gave them."""
        if self.keyed:
            for row in self._rows.values():
                for name, v in values.items():
                    row.setdefault(name, v)
            return
        index = {n: i for i, n in enumerate(self.schema.column_names)}
        filled: Counter[tuple[Any, ...]] = Counter()
        for whole, n in self._bag.items():
            row = list(whole)
            for name, v in values.items():
                if name in index and row[index[name]] is None:
                    row[index[name]] = v
            filled[tuple(row)] += n
        self._bag = filled

    def _add(self, row: dict[str, Any]) -> None:
        if self.keyed:
            self._rows[self._key(row)] = row
        else:
            self._bag[self._whole(row)] += 1

    def _remove(self, old: dict[str, Any]) -> dict[str, Any] | None:
        if self.keyed:
            return self._rows.pop(self._key(old), None)
        whole = self._whole(old)
        if self._bag.get(whole, 0) > 0:
            self._bag[whole] -= 1
            if not self._bag[whole]:
                del self._bag[whole]
            return dict(zip(self.schema.column_names, whole, strict=True))
        self.problems.append(f"a delete of a row the table does not hold: {old}")
        return None

    def seed(self, rows: Iterable[dict[str, Any]]) -> None:
        """Start from ``rows`` (complete rows, e.g. those of a consumer's table that the next changes touch)."""
        for row in rows:
            self._add(dict(row))

    def rows(self) -> list[dict[str, Any]]:
        """The rows, each with every column of the schema (a column a row lacks is None)."""
        names = self.schema.column_names
        if self.keyed:
            return [{n: r.get(n) for n in names} for r in self._rows.values()]
        return [dict(zip(names, whole, strict=True)) for whole, n in self._bag.items() for _ in range(n)]


def rebuild(uri: str, tables: Iterable[TableName] | None = None
            ) -> tuple[int | None, dict[TableName, TableState]]:
    """Every table (or ``tables``) rebuilt from the files up to the published checkpoint: ``(checkpoint,
    {table: state})``."""
    reader = StorageReader(uri)
    end = reader.latest_offset()
    states: dict[TableName, TableState] = {}
    for table, changes in reader.changes(LakeOffset(), end, tables).items():
        schema = reader.latest_schema(table)
        if schema is None:
            continue
        state = states[table] = TableState(schema)
        state.apply(changes)
    return (end.checkpoint if reader.checkpoint() is not None else None), states
