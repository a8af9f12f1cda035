"""``file:///dir?protocol=csv|canal-json|parquet``: the storage sink, TiCDC's layout on a local directory.

Layout and file formats: :mod:`sinks.storage.layout` (paths, schema files, ``metadata``), the codec layer (CSV,
canal-json one message per line) and :mod:`sinks.storage.parquet`; options: :mod:`sinks.storage.config`; how to read
it back: :mod:`sinks.storage.reader`; docs/sinks.md, "Storage sink".

Guarantees (in the terms of ``sinks.base``):

- **Buffering.** ``flush_interval`` is the URI's ``flush-interval``. ``write`` encodes its changes into one hidden
  temporary file per table (and table version) and returns; nothing is visible or durable until ``flush``, which
  fsyncs the files and publishes them under their final names ``CDC{index}.{ext}``. The caller moves its checkpoint
  only after ``flush`` returned; a crash loses only what was not flushed, and the caller replays it.
- **Atomic visibility.** A data file, a schema file, ``metadata`` and ``CDC.index`` appear whole or not at all
  (temporary name, fsync, link or rename, directory fsync: :mod:`sinks.storage.fs`): a reader never sees a partial
  file. A published file is never overwritten or removed by the sink: indexes continue after the highest file in
  the directory (also after a restart, also with several writers: publishing links without replacing).
- **Whole transactions.** A table's changes of one transaction are in one file (``file-size`` closes a file only at
  a write boundary, and ``write`` receives whole transactions); the one exception is a transaction the caller splits
  around a DDL, whose rows before and after the DDL go to the files (and table versions) of either side.
- **Exactly-once publication** (``open_position``). Per (changefeed, span) the sink keeps a publish record
  ``.tidewater/positions/{changefeed}/{span}.position``: the commit Ts of the last change it published and how many
  changes of that commit Ts, and the files of the flush in progress. A flush writes its temporary files, then the
  record, then links the files (the record is the commit point; a flush interrupted after it is completed by the
  next ``open_position``, one interrupted before it leaves only hidden temporary files). ``write`` drops the changes
  the record covers, so a replay after a crash publishes nothing twice, for tables with and without a key. The
  initial copy (``set_bulk_load``: several processes write chunks at once) has no record: a chunk copied again is
  published again (harmless: every chunk of a keyed table upserts by key; a key-less table's single chunk begins
  with a TRUNCATE, which starts a new table version each time).
- **Table versions.** A DDL (``apply_ddl``) writes the schema file of a new table version ``{commit Ts + its position
  in the transaction}`` (raised above every version of an earlier commit: versions follow commit order also after
  a transaction of hundreds of DDLs) with TiCDC's ``Query`` and ``Type``; rows after it go to that version's
  directory. It takes effect at most once: when a schema file records that DDL (its ``CommitTs``, ``Seq`` and
  ``Ddl``) it returns False. An ADD COLUMN's one-value fills
  (``DdlEvent.fills``) go into the schema file (``sinks.storage.layout``: ``Fills``, applied by the reader); per-row
  values (a volatile default) are not written: ``CDC:WarnDdlDefault`` (``take_warnings``) when the table has rows. A TRUNCATE (which CSV and TiCDC's
  storage format cannot carry as a row) is recorded the way TiCDC records a ``TRUNCATE TABLE`` DDL: a new table
  version whose schema file's ``Query`` is ``TRUNCATE TABLE "s"."t"`` and ``Type`` 11; the rows after it go there.
  A schema the sink meets without a DDL (the first rows of a table, a change of shape the upstream did not report
  as DDL) reuses the latest version with the same schema below the row's commit Ts, else gets a new version just
  below it.
- **Updates.** With ``protocol=csv`` (without ``csv-output-old-value``) and ``parquet``, an UPDATE that changes the
  row's key, and every UPDATE of a table without a key, is written as a delete of the old row followed by an insert
  of the new one (TiCDC splits key-changing updates the same way); canal-json carries the old row in ``old``.
- **Errors.** A full disk, an unwritable directory or an I/O error is :class:`cdc.errors.SinkUnavailable` naming
  the path (the changefeed shows ``warning``, the span retries from its checkpoint); nothing of a failed flush is
  acknowledged. A value the protocol cannot carry is ``sinks.codec.EncodeError``. After an exception the sink is
  discarded (``close`` removes its unpublished temporary files).
- **Fencing.** ``fence`` is called right before the publish record (or, without one, before the first link).
- **Checkpoint.** ``publish_checkpoint`` (called by the owner, on a sink of its own) writes ``metadata``
  atomically, never moving it backwards.
- Threading: one caller thread at a time, as the contract says; one changefeed per directory.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO

from cdc.config import SinkConfig
from cdc.errors import SinkError, TidewaterError
from cdc.events import DdlEvent, OpType, RowChange, TableName, TableSchema
from cdc.model import DataWarning
from cdc.ts import Watermark
from sinks.base import BufferedSink, CheckpointSink, DdlSink, PositionStore, TxnSink
from sinks.codec import encoder_for
from sinks.codec.base import quoted_name
from sinks.codec.open_protocol import ddl_action
from sinks.copy_roles import BulkLoad, CopyTargets, ExistingRows
from sinks.storage import layout as L
from sinks.storage.config import StorageConfig
from sinks.storage.fs import LocalFS, storage_error
from sinks.storage.parquet import SPLIT_UPDATE, ParquetRows, write_change

log = logging.getLogger(__name__)

DRAIN_ROWS = 4096  # changes buffered per write() before they are encoded into the files
WARN_DEFAULT = "CDC:WarnDdlDefault"  # the SQL sinks' code for rows an ADD COLUMN leaves without upstream's values
CANAL_TERMINATOR = b"\r\n"  # TiCDC's default terminator between canal-json messages in a file
PARQUET_ROW_BYTES = 64  # estimate of an unwritten Parquet row, for file-size


@dataclass
class _Table:
    version: int
    identity: str


@dataclass
class _File:
    """A data file being written: its table version, directory and temporary name."""

    table: TableName
    schema: TableSchema
    identity: str
    version: int
    dir: str
    temp: str
    f: BinaryIO | None
    parquet: ParquetRows | None = None
    size: int = 0
    rows: int = 0
    final: str = ""


def position_path(changefeed: str, span: int) -> str:
    return f"{L.POSITIONS}/{changefeed}/{span}.position"


class StorageSink(TxnSink, BufferedSink, PositionStore, DdlSink, CheckpointSink, BulkLoad, CopyTargets, ExistingRows):
    """See the module docstring."""

    def __init__(self, uri: str, config: SinkConfig | None = None, *, fs: LocalFS | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.cfg = StorageConfig.from_uri(uri)
        self.flush_interval = self.cfg.flush_interval
        self.fs = fs if fs is not None else LocalFS(self.cfg.root)
        self._clock = clock
        self._parquet = self.cfg.protocol == "parquet"
        self._encoder = None if self._parquet else encoder_for(self.cfg.protocol, self.cfg.encoder)
        enc = self.cfg.encoder
        self._split_updates = self._parquet or (self.cfg.protocol == "csv" and not enc.csv_output_old_value)
        self._tables: dict[TableName, _Table] = {}
        self._schema_files: dict[TableName, dict[int, L.SchemaFile]] = {}
        self._identities: dict[TableSchema, str] = {}
        self._claimed: set[tuple[TableName, int]] = set()
        self._open: dict[TableName, _File] = {}
        self._sealed: list[_File] = []
        self._pending_schemas: dict[str, bytes] = {}
        self._committed_temps: set[str] = set()
        self._next_index: dict[str, int] = {}
        self._cleaned_dirs: set[str] = set()
        self._bulk = False
        self._tag = "w"
        self._position: tuple[str, int, int] | None = None
        self._warnings: list[DataWarning] = []
        self._skipping = False
        self._pos_ts = self._pos_count = self._skip_seen = 0
        self._w_ts = self._w_count = 0  # the last change written, and how many changes of its commit Ts
        self._flushed = (0, 0)
        self._closed = False

    # ---- the roles (sinks.base, sinks.copy_roles) ---------------------------------------------------------
    def check(self) -> None:
        self.fs.check_writable()

    def target_name(self, table: TableName) -> str:
        return f"{self.cfg.root}/{L.table_dir(table)}"

    def set_bulk_load(self) -> None:
        self._bulk = True
        self._tag = "copy"

    def open_position(self, changefeed: str, span: int, origin: int = 0) -> int:
        self._position = (changefeed, span, origin)
        self._tag = "p" + hashlib.sha1(f"{changefeed}/{span}".encode()).hexdigest()[:12]
        raw = self.fs.read(position_path(changefeed, span))
        ts = count = 0
        if raw is not None:
            try:
                rec = json.loads(raw)
                publish = [(str(a), str(b)) for a, b in rec.get("publish", [])]
                if rec.get("origin") == origin:
                    ts, count = int(rec["commit_ts"]), int(rec["count"])
            except (ValueError, KeyError, TypeError) as exc:
                raise SinkError(f"storage sink: the publish record {self.fs.abs(position_path(changefeed, span))} "
                                f"is damaged ({exc}): remove it to replay from the changefeed's checkpoint "
                                f"(rows may then be published twice)") from exc
            self._redo(publish)
        self._pos_ts, self._pos_count, self._skip_seen = ts, count, 0
        self._skipping = ts > 0
        self._w_ts, self._w_count = ts, count
        self._flushed = (ts, count)
        return ts

    def forget(self, changefeed: str) -> int:
        n = 0
        folder = f"{L.POSITIONS}/{changefeed}"
        for name in self.fs.listdir(folder):
            if name.endswith(".position"):
                self.fs.remove(f"{folder}/{name}")
                n += 1
        return n

    def write(self, changes: Iterable[RowChange], fence: Callable[[], None] | None = None) -> int:
        if self._closed:
            raise SinkError("storage sink is closed")
        n = 0
        buf: dict[TableName, list[RowChange]] = {}
        pending = 0
        split = self._split_updates
        for ch in changes:
            if self._skipping and self._skip(ch):
                continue
            ts = ch.commit_ts
            if ts == self._w_ts:
                self._w_count += 1
            else:
                self._w_ts, self._w_count = ts, 1
            n += 1
            if ch.op is OpType.TRUNCATE:
                earlier = buf.pop(ch.schema.name, None)
                if earlier:
                    self._append(ch.schema.name, earlier)
                self._truncate(ch)
                continue
            lst = buf.get(ch.schema.name)
            if lst is None:
                lst = buf[ch.schema.name] = []
            if split and ch.op is OpType.UPDATE and self._needs_split(ch):
                lst.extend(self._split(ch))
            else:
                lst.append(ch)
            pending += 1
            if pending >= DRAIN_ROWS:
                for table, rows in buf.items():
                    self._append(table, rows)
                buf, pending = {}, 0
        for table, rows in buf.items():
            self._append(table, rows)
        for table, f in list(self._open.items()):  # a write boundary: whole transactions so far
            if self._size(f) >= self.cfg.file_size:
                self._seal(table)
        return n

    def flush(self, fence: Callable[[], None] | None = None) -> None:
        if self._closed:
            raise SinkError("storage sink is closed")
        for table in list(self._open):
            self._seal(table)
        if not self._sealed and not self._pending_schemas and (self._w_ts, self._w_count) == self._flushed:
            return
        sealed = self._sealed
        for f in sealed:
            f.final = f"{f.dir}/{L.data_file_name(self._allocate(f.dir), self.cfg.extension, self.cfg.file_index_width)}"
        if fence is not None:
            fence()
        for rel, data in self._pending_schemas.items():
            self.fs.write_atomic(rel, data, replace=False)
        self._pending_schemas = {}
        if self._position is not None:
            cf, span, origin = self._position
            rec = {"changefeed": cf, "span": span, "origin": origin, "commit_ts": self._w_ts, "count": self._w_count,
                   "publish": [[f.temp, f.final] for f in sealed]}
            self.fs.write_atomic(position_path(cf, span), json.dumps(rec).encode())
            self._committed_temps.update(f.temp for f in sealed)
        published = self._publish([(f.temp, f.final) for f in sealed])
        self._sealed = []
        self._flushed = (self._w_ts, self._w_count)
        self._write_indexes(published)

    def apply_ddl(self, event: DdlEvent, fence: Callable[[], None] | None = None, *, skip: bool = False) -> bool:
        if skip:
            return False
        if self._open or self._sealed or self._pending_schemas:
            self.flush(fence)  # the caller flushes before a DDL; never let rows follow their DDL
        schema = event.after if event.after is not None else event.before
        if schema is None:
            return True
        name = schema.name
        files = self._files_of(name)
        ident = self._identity(schema)
        if event.before is not None and event.before.name != name:
            self._tables.pop(event.before.name, None)
        done = [v for v, sf in files.items() if sf.made_by_ddl(event.commit_ts, event.seq)]
        if done:  # a replay
            self._tables[name] = _Table(max(done), ident)
            return False
        version = self._ddl_version(name, event, files)
        fills = tuple(f for f in event.fills if not f.per_row)
        definition = L.table_definition(schema, version, query=event.query, action=ddl_action(event),
                                        commit_ts=event.commit_ts, seq=event.seq, fills=fills, ddl=True)
        if fence is not None:
            fence()
        self._write_schema(name, version, schema, definition, queue=False)
        self._tables[name] = _Table(version, ident)
        per_row = [f.column for f in event.fills if f.per_row]
        if per_row and self._has_data(name):
            self._warnings.append(DataWarning(
                WARN_DEFAULT, str(name), f"{event.query or ', '.join(event.kinds)}: the rows written before it get no "
                f"value in new column(s) {', '.join(per_row)}: upstream gave each row its own value (a volatile "
                "default), which the storage sink does not write; later changes of a row carry its values"))
        return True

    def take_warnings(self) -> list[DataWarning]:
        out, self._warnings = self._warnings, []
        return out

    def tables_with_rows(self, tables: Sequence[TableName]) -> list[TableName]:
        return [t for t in tables if self._has_data(t)]

    def truncate_targets(self, tables: Sequence[TableName], *, schemas: Sequence[TableSchema] = (),
                         at: Watermark | None = None) -> None:
        """A new table version per table that has one, recorded like a ``TRUNCATE TABLE`` (module docstring): at the
        version after its highest, or, for a table copy (``at``: its snapshot, whose Ts its copied rows carry), at
        ``at.ts - 1`` when that is higher (just before the copied rows, which go into that version): readers empty
        the table there."""
        for t in tables:
            files = self._files_of(t)
            if not files:
                continue
            version = max(max(files) + 1, at.ts - 1 if at is not None else 0)
            latest = files[max(files)].schema
            definition = L.table_definition(latest, version, query=f"TRUNCATE TABLE {quoted_name(t)}",
                                            action=L.TRUNCATE_ACTION, commit_ts=version)
            self._write_schema(t, version, latest, definition, queue=False)
            self._tables.pop(t, None)

    def publish_checkpoint(self, ts: int, commit_time: float = 0.0) -> None:
        current = self.fs.read(L.METADATA)
        if current is not None:
            try:
                if L.parse_checkpoint(current) >= ts:
                    return
            except ValueError:
                pass
        self.fs.makedirs("")
        self.fs.write_atomic(L.METADATA, L.checkpoint_document(ts))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for f in [*self._open.values(), *self._sealed]:
            if f.parquet is not None and f.f is not None:
                f.parquet.abandon()
            if f.f is not None:
                try:
                    f.f.close()
                except OSError:
                    pass
            if f.temp not in self._committed_temps:
                self.fs.remove(f.temp)
        self._open.clear()
        self._sealed = []

    # ---- replays ------------------------------------------------------------------------------------------
    def _skip(self, ch: RowChange) -> bool:
        """True for a change the publish record covers (already published); its TRUNCATE still claims its table
        version, so that the versions of what follows are the same as in the first run."""
        ts = ch.commit_ts
        if ts < self._pos_ts or (ts == self._pos_ts and self._skip_seen < self._pos_count):
            if ts == self._pos_ts:
                self._skip_seen += 1
            if ch.op is OpType.TRUNCATE:
                self._truncate(ch, claim_only=True)
            return True
        self._skipping = False
        return False

    def _redo(self, publish: list[tuple[str, str]]) -> None:
        """Complete the links of a flush whose record was written (module docstring)."""
        done = self._publish(publish, redo=True)
        self._write_indexes(done)

    # ---- table versions -----------------------------------------------------------------------------------
    def _identity(self, schema: TableSchema) -> str:
        ident = self._identities.get(schema)
        if ident is None:
            ident = self._identities[schema] = L.schema_identity(schema)
        return ident

    def _ddl_version(self, name: TableName, event: DdlEvent, files: dict[int, L.SchemaFile]) -> int:
        """The table version of a DDL applied for the first time: ``commit_ts + seq`` (``seq`` counts the DDLs of
        its transaction changefeed-wide, so two spans' DDLs of one transaction on one table name never meet),
        raised above every version made by an earlier commit (a transaction of many DDLs can push its last
        ones' versions past a later commit's Ts: the later DDL must still be the later, higher version, or readers
        would take the older schema as the table's current one), and past any version taken already."""
        earlier = max((v for v, sf in files.items() if sf.commit_ts < event.commit_ts), default=-1)
        version = max(event.commit_ts + event.seq, earlier + 1)
        while version in files:
            version += 1
        return self._claim(name, version)

    def _claim(self, table: TableName, version: int) -> int:
        while (table, version) in self._claimed:
            version += 1
        self._claimed.add((table, version))
        return version

    def _files_of(self, table: TableName) -> dict[int, L.SchemaFile]:
        """The table's schema files by version (those on disk, read once, and those queued for the next flush)."""
        # a file that is not one of ours (a TiCDC schema file) never matches a schema of ours: skipped
        return L.load_schema_files(self.fs, table, self._schema_files.setdefault(table, {}), lambda path, exc: None)

    def _write_schema(self, table: TableName, version: int, schema: TableSchema, definition: dict[str, Any],
                      *, queue: bool) -> None:
        checksum = L.definition_checksum(definition)
        rel = f"{L.table_dir(table)}/{L.TABLE_META}/{L.schema_file_name(version, checksum)}"
        data = L.go_indent_json(definition)
        if queue:
            self._pending_schemas[rel] = data
        else:
            self.fs.write_atomic(rel, data, replace=False)
        ext = definition[L.EXTENSION_KEY]
        self._files_of(table)[version] = L.SchemaFile(table, version, checksum, schema, definition["Query"],
                                                      definition["Type"], ext["CommitTs"], ext["Seq"],
                                                      ddl=bool(ext.get("Ddl")))

    def _version_for(self, schema: TableSchema, ts: int) -> int:
        """The table version of rows with ``schema`` committed at ``ts`` (module docstring)."""
        name = schema.name
        ident = self._identity(schema)
        current = self._tables.get(name)
        if current is not None and current.identity == ident:
            return current.version
        files = self._files_of(name)
        floor = current.version if current is not None else -1
        same = [v for v, sf in files.items() if floor <= v < ts and sf.identity == ident]
        if same:
            version = max(same)
        else:
            version = max(ts - 1, floor + 1)
            if version in files or (name, version) in self._claimed:
                raise SinkError(f"storage sink: table {name}: version {version} is taken by another schema; the "
                                f"directory {self.fs.abs(L.table_dir(name))} holds files this changefeed did not "
                                f"write (use one directory per changefeed)")
            self._write_schema(name, version, schema, L.table_definition(schema, version, commit_ts=ts), queue=True)
        self._tables[name] = _Table(version, ident)
        return version

    def _truncate(self, ch: RowChange, *, claim_only: bool = False) -> None:
        name = ch.schema.name
        if not claim_only:
            self._seal(name)
        files = self._files_of(name)
        version = ch.commit_ts
        while (name, version) in self._claimed or (self._bulk and version in files):
            version += 1
        self._claimed.add((name, version))
        if version not in files and not claim_only:
            definition = L.table_definition(ch.schema, version, query=f"TRUNCATE TABLE {quoted_name(name)}",
                                            action=L.TRUNCATE_ACTION, commit_ts=ch.commit_ts)
            self._write_schema(name, version, ch.schema, definition, queue=True)
        self._tables[name] = _Table(version, self._identity(ch.schema))

    # ---- files --------------------------------------------------------------------------------------------
    @staticmethod
    def _needs_split(ch: RowChange) -> bool:
        if ch.old_values is None:
            return False
        if not ch.schema.has_key:
            return True
        new = ch.values or {}
        return any(ch.old_values.get(k) != new.get(k) for k in ch.schema.key if k in ch.old_values)

    @staticmethod
    def _split(ch: RowChange) -> list[RowChange]:
        extra = dict(ch.extra)
        extra[SPLIT_UPDATE] = True
        return [RowChange(OpType.DELETE, ch.schema, ch.commit_ts, ch.commit_time, None, dict(ch.old_values or {}),
                          extra),
                RowChange(OpType.INSERT, ch.schema, ch.commit_ts, ch.commit_time, dict(ch.values or {}), None, extra)]

    def _append(self, table: TableName, changes: list[RowChange]) -> None:
        """Encode ``changes`` (one table, in order) into the table's open file(s)."""
        i, n = 0, len(changes)
        while i < n:
            schema = changes[i].schema
            j = i + 1
            while j < n and changes[j].schema is schema:
                j += 1
            f = self._file_for(schema, changes[i].commit_ts)
            self._encode(f, changes[i:j])
            i = j

    def _file_for(self, schema: TableSchema, ts: int) -> _File:
        name = schema.name
        version = self._version_for(schema, ts)
        ident = self._identity(schema)
        f = self._open.get(name)
        if f is not None and f.version == version and f.identity == ident:
            return f
        if f is not None:
            self._seal(name)
        folder = L.data_dir(name, version, L.date_text(self.cfg.date_separator, self._clock()))
        self._clean_temps(folder)
        temp = self.fs.temp_path(folder, self._tag)
        handle = self.fs.create(temp)
        f = _File(name, schema, ident, version, folder, temp, handle)
        self._open[name] = f
        if self._parquet:
            try:
                f.parquet = ParquetRows(handle, schema)
            except OSError as exc:
                raise storage_error(exc, self.fs.abs(temp), "writing") from exc
        return f

    def _encode(self, f: _File, changes: list[RowChange]) -> None:
        if f.parquet is not None:
            try:
                for ch in changes:
                    write_change(f.parquet, ch)
            except OSError as exc:
                raise storage_error(exc, self.fs.abs(f.temp), "writing") from exc
            f.rows += len(changes)
            return
        enc = self._encoder
        assert enc is not None
        enc.append_rows(changes)
        msgs = enc.build()
        if self.cfg.protocol == "csv":
            data = b"".join(m.value or b"" for m in msgs)
            if f.size == 0 and msgs and msgs[0].key:
                data = msgs[0].key + data
        else:
            data = b"".join((m.value or b"") + CANAL_TERMINATOR for m in msgs)
        assert f.f is not None
        try:
            f.f.write(data)
        except OSError as exc:
            raise storage_error(exc, self.fs.abs(f.temp), "writing") from exc
        f.size += len(data)
        f.rows += len(changes)

    def _size(self, f: _File) -> int:
        if f.parquet is None:
            return f.size
        assert f.f is not None
        return f.f.tell() + f.parquet.pending * PARQUET_ROW_BYTES

    def _seal(self, table: TableName) -> None:
        """Finish the table's open file (footer, fsync, close); it is published at the next flush."""
        f = self._open.pop(table, None)
        if f is None:
            return
        assert f.f is not None
        try:
            if f.parquet is not None:
                try:
                    f.parquet.close()
                except OSError as exc:
                    raise storage_error(exc, self.fs.abs(f.temp), "writing") from exc
            self.fs.sync(f.f, f.temp)
        except TidewaterError:
            self._sealed.append(f)  # so that close() removes it
            raise
        f.f = None
        if f.rows:
            self._sealed.append(f)
        else:
            self.fs.remove(f.temp)

    def _clean_temps(self, folder: str) -> None:
        """Remove this span's temporary files left in ``folder`` by an earlier run (not published, not
        referenced by the publish record: ``open_position`` completed those)."""
        if folder in self._cleaned_dirs:
            return
        self._cleaned_dirs.add(folder)
        if self._tag in ("w", "copy"):
            return
        prefix = f"{L.TEMP_PREFIX}{self._tag}-"
        for name in self.fs.listdir(folder):
            if name.startswith(prefix) and name.endswith(".tmp"):
                self.fs.remove(f"{folder}/{name}")

    def _max_index(self, folder: str) -> int:
        ext = self.cfg.extension
        return max((i for i in (L.parse_data_file_name(n, ext) for n in self.fs.listdir(folder)) if i is not None),
                   default=0)

    def _allocate(self, folder: str) -> int:
        nxt = self._next_index.get(folder)
        if nxt is None:
            nxt = self._max_index(folder) + 1
        self._next_index[folder] = nxt + 1
        return nxt

    def _publish(self, pairs: list[tuple[str, str]], *, redo: bool = False) -> dict[str, str]:
        """Link each temporary file to its final name (another free index if the name was taken meanwhile), sync
        the directories, remove the temporary names. Returns the last published name per directory."""
        last: dict[str, str] = {}
        dirs: list[str] = []
        width, ext = self.cfg.file_index_width, self.cfg.extension
        for temp, final in pairs:
            folder, name = os.path.split(final)
            if redo and not self.fs.exists(temp):
                if not self.fs.exists(final):  # published, then removed by someone (a consumer's cleanup)
                    log.warning("storage sink: %s, published by an earlier flush, is no longer there",
                                self.fs.abs(final))
                    continue
            elif not self.fs.same_file(temp, final) and not (redo and self.fs.links(temp) > 1):
                # (else linked before a crash: under its name, or under another free index)
                if not self.fs.exists(temp):
                    raise SinkError(f"storage sink: {self.fs.abs(final)} was to be published from "
                                    f"{self.fs.abs(temp)}, which is gone: rows of commit Ts up to the publish "
                                    f"record's are missing from {self.fs.abs(folder)}")
                while not self.fs.publish(temp, final):
                    self._next_index[folder] = self._max_index(folder) + 1
                    name = L.data_file_name(self._allocate(folder), ext, width)
                    final = f"{folder}/{name}"
            if folder not in dirs:
                dirs.append(folder)
            if name > last.get(folder, ""):
                last[folder] = name
        for folder in dirs:
            self.fs.sync_dir(folder)
        for temp, _ in pairs:
            self.fs.remove(temp)
            self._committed_temps.discard(temp)
        return last

    def _write_indexes(self, last: dict[str, str]) -> None:
        """``meta/CDC.index`` of each directory: the name of its last data file (never moved backwards)."""
        for folder, name in last.items():
            rel = f"{folder}/{L.INDEX_FILE}"
            current = (self.fs.read(rel) or b"").decode(errors="replace").strip()
            if current and len(current) == len(name) and current >= name:
                continue
            self.fs.write_atomic(rel, (name + "\n").encode())

    def _has_data(self, table: TableName) -> bool:
        ext = self.cfg.extension
        base = L.table_dir(table)
        for version in self.fs.listdir(base):
            if not version.isdigit():
                continue
            for entry in self.fs.listdir(f"{base}/{version}"):
                if L.parse_data_file_name(entry, ext) is not None:
                    return True
                if L.is_date_dir(entry) and any(
                        L.parse_data_file_name(n, ext) is not None for n in self.fs.listdir(f"{base}/{version}/{entry}")):
                    return True
        return False

