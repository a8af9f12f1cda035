"""TiCDC's storage-sink layout: paths, file names, schema files (``TableDefinition``) and the ``metadata`` file.

Under the sink's root directory (``pkg/sink/cloudstorage`` in tiflow)::

    metadata                                                   {"checkpoint-ts":<changefeed checkpoint>}
    {schema}/{table}/meta/schema_{version}_{checksum}.json     one TableDefinition per table version
    {schema}/{table}/{version}/[{date}/]CDC{index}.{ext}       data files, index from 1, never reused
    {schema}/{table}/{version}/[{date}/]meta/CDC.index         the name of the last data file of that directory
    .tidewater/positions/{changefeed}/{span}.position          Tidewater: a span's publish record (exactly-once)

``{version}`` is the table version (TiCDC: the TSO at which the table got that schema; here a commit Ts: the DDL's
commit Ts plus its position in its transaction, or just below the commit Ts of the first row a sink wrote with that
schema), ``{date}`` the UTC date at which the file was begun (``date-separator``), ``{index}`` zero-padded to
``file-index-width`` digits. ``{checksum}`` is TiCDC's: CRC-32 (IEEE) of the definition without query, its columns
sorted by name, as Go's ``json.MarshalIndent`` writes it, ten digits. A schema or table name is used as it is, except
that ``%`` and ``/`` are percent-encoded and a leading ``.`` is written ``%2E`` (so that no name escapes its
directory or hides it).

A schema file is TiCDC's ``TableDefinition`` (field order and spelling, four-space indentation) whose columns are
described as canal-json describes them (``ColumnType`` the MySQL type, upper case; ``ColumnPrecision`` /
``ColumnScale`` where PostgreSQL declares them, TiDB's display widths for integers; ``ColumnNullable`` ``"false"``
for NOT NULL, ``ColumnIsPk`` ``"true"`` for key columns; no ``ColumnDefault``: PostgreSQL's default is an expression,
not a MySQL value), plus one object TiCDC's readers ignore, ``TidewaterTable``: the exact PostgreSQL table
(``cdc.events.TableSchema`` as JSON) and the commit Ts of the change that made the version, from which readers
decode values exactly, and, for an ADD COLUMN, ``Fills``: what the rows that existed hold in each new column
(``sinks.codec.fills``), which the reader (``sinks.storage.reader``) gives the rows it holds at that version.
"""

from __future__ import annotations

import json
import re
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from cdc import serde
from cdc.events import ColumnFill, TableName, TableSchema
from sinks.codec import types as T
from sinks.codec.fills import fill_doc, fill_of
from sinks.codec.text import go_html_escape

METADATA = "metadata"
POSITIONS = ".tidewater/positions"
INDEX_FILE = "meta/CDC.index"
TABLE_META = "meta"
TEMP_PREFIX = ".tw-"
EXTENSION_KEY = "TidewaterTable"
DEFINITION_VERSION = 1  # TiCDC's defaultTableDefinitionVersion
TRUNCATE_ACTION = 11  # TiDB's ActionTruncateTable
DROP_TABLE_ACTION = 4  # TiDB's ActionDropTable

_SCHEMA_FILE = re.compile(r"^schema_(\d+)_(\d{10})\.json$")
_DATE = {"none": "", "year": "%Y", "month": "%Y-%m", "day": "%Y-%m-%d"}
_DATE_DIR = re.compile(r"^\d{4}(-\d{2}(-\d{2})?)?$")


def escape_name(name: str) -> str:
    """A schema or table name as a path component (module docstring)."""
    out = name.replace("%", "%25").replace("/", "%2F")
    if out.startswith("."):
        out = "%2E" + out[1:]
    return out or "%00"


def unescape_name(component: str) -> str:
    if component == "%00":
        return ""
    return re.sub(r"%(25|2F|2E)", lambda m: {"25": "%", "2F": "/", "2E": "."}[m.group(1)], component)


def table_dir(table: TableName) -> str:
    return f"{escape_name(table.schema)}/{escape_name(table.table)}"


def data_dir(table: TableName, version: int, date: str) -> str:
    base = f"{table_dir(table)}/{version}"
    return f"{base}/{date}" if date else base


def data_file_name(index: int, extension: str, width: int) -> str:
    return f"CDC{index:0{width}d}{extension}"


def parse_data_file_name(name: str, extension: str) -> int | None:
    """The index of ``CDC{index}{extension}``, None for any other name."""
    if not (name.startswith("CDC") and name.endswith(extension)):
        return None
    digits = name[3:len(name) - len(extension)]
    if len(digits) < 6 or not digits.isdigit():
        return None
    return int(digits)


def schema_file_name(version: int, checksum: int) -> str:
    return f"schema_{version}_{checksum:010d}.json"


def parse_schema_file_name(name: str) -> tuple[int, int] | None:
    m = _SCHEMA_FILE.match(name)
    return (int(m.group(1)), int(m.group(2))) if m else None


def date_text(separator: str, now: float | None = None) -> str:
    """The ``{date}`` directory for ``now`` (UTC), empty for ``none``."""
    fmt = _DATE[separator]
    return time.strftime(fmt, time.gmtime(time.time() if now is None else now)) if fmt else ""


def is_date_dir(name: str) -> bool:
    """``name`` is a ``{date}`` directory of any ``date-separator`` (``2026``, ``2026-11``, ``2026-11-21``)."""
    return _DATE_DIR.match(name) is not None


# ---- TableDefinition ----------------------------------------------------------------------------------------
_INT_WIDTH = {"tinyint": 4, "smallint": 6, "int": 11, "bigint": 20}
_TIME_TYPES = ("time", "datetime", "timestamp")


def _column(col: Any, schema: TableSchema) -> dict[str, Any]:
    """TiCDC's ``TableCol`` of one column (module docstring), omitempty fields left out."""
    mt = T.mysql_type(col)
    out: dict[str, Any] = {"ColumnName": col.name, "ColumnType": mt.mysql_type.upper() + (" UNSIGNED" if mt.unsigned
                                                                                        else "")}
    tm = col.type_modifier
    if mt.mysql_type in _TIME_TYPES:
        fsp = T.fraction_digits(col)
        if fsp:
            out["ColumnScale"] = str(fsp)
    elif mt.mysql_type == "decimal":
        ps = T.numeric_precision_scale(col)
        p, s = ps if ps is not None else (65, 30)
        out["ColumnPrecision"], out["ColumnScale"] = str(p), str(s)
    elif mt.mysql_type in _INT_WIDTH:
        out["ColumnPrecision"] = str(_INT_WIDTH[mt.mysql_type])
    elif mt.mysql_type == "float":
        out["ColumnPrecision"] = "12"
    elif mt.mysql_type == "double":
        out["ColumnPrecision"] = "22"
    elif mt.mysql_type in ("varchar", "char") and not col.is_array:
        if col.base_type == "uuid":
            out["ColumnPrecision"] = "36"
        elif col.base_type in ("varchar", "bpchar") and tm >= 4:
            out["ColumnPrecision"] = str(tm - 4)
        elif col.base_type == "char":
            out["ColumnPrecision"] = "1"
    elif mt.mysql_type in ("longtext", "longblob"):
        out["ColumnPrecision"] = "4294967295"
    if not col.nullable:
        out["ColumnNullable"] = "false"
    if schema.has_key and col.name in schema.key:
        out["ColumnIsPk"] = "true"
    return out


def go_indent_json(obj: Any) -> bytes:
    """``obj`` as Go's ``json.MarshalIndent(obj, "", "    ")`` writes it (keys in the given order)."""
    return go_html_escape(json.dumps(obj, indent=4, ensure_ascii=False)).encode()


def definition_checksum(definition: dict[str, Any]) -> int:
    """TiCDC's ``TableDefinition.Sum32``: CRC-32 of the definition without Query, Type and TableVersion (and with
    ``Version`` 0, as TiCDC's ``tableDefWithoutQuery`` leaves it), its columns sorted by name."""
    cols = sorted(definition["TableColumns"] or [], key=lambda c: c["ColumnName"])
    plain = {"Table": definition["Table"], "Schema": definition["Schema"], "Version": 0, "TableColumns": cols,
             "TableColumnsTotal": definition["TableColumnsTotal"]}
    return zlib.crc32(go_indent_json(plain)) & 0xFFFFFFFF


def table_definition(schema: TableSchema, version: int, *, query: str = "", action: int = 0, commit_ts: int = 0,
                     seq: int = 0, fills: Sequence[ColumnFill] = (), ddl: bool = False) -> dict[str, Any]:
    """The schema file's content (module docstring) for ``schema`` at table version ``version``; ``fills``: what the
    rows that existed before an ADD COLUMN hold in the new columns (``Fills``, ``sinks.codec.fills``' form);
    ``ddl``: the version is the DDL at ``(commit_ts, seq)`` (``Ddl``: how a replay of that DDL finds it)."""
    cols = [_column(c, schema) for c in schema.columns]
    ext: dict[str, Any] = {"CommitTs": commit_ts, "Seq": seq, "Schema": serde.to_dict(schema)}
    if ddl:
        ext["Ddl"] = True
    if fills:
        ext["Fills"] = {f.column: fill_doc(schema.column(f.column), f) for f in fills}
    return {"Table": schema.name.table, "Schema": schema.name.schema, "Version": DEFINITION_VERSION,
            "TableVersion": version, "Query": query, "Type": action, "TableColumns": cols or None,
            "TableColumnsTotal": len(cols), EXTENSION_KEY: ext}


def schema_identity(schema: TableSchema) -> str:
    """What makes two schemas one table version: every column and the key (not the upstream's relation id or its
    own schema version counter, which change without the table changing)."""
    d = serde.to_dict(schema)
    d.pop("relation_id", None)
    d.pop("version", None)
    return json.dumps(d, sort_keys=True)


@dataclass(frozen=True)
class SchemaFile:
    """A parsed schema file: the table version, its definition, the exact schema, and what made it."""

    table: TableName
    version: int
    checksum: int
    schema: TableSchema
    query: str
    action: int
    commit_ts: int
    seq: int
    fills: tuple[ColumnFill, ...] = ()  # what the rows before an ADD COLUMN of this version hold in the new columns
    ddl: bool = False  # made by the DDL at (commit_ts, seq) (files written before this flag: see ``made_by_ddl``)

    @property
    def identity(self) -> str:
        return schema_identity(self.schema)

    @property
    def is_truncate(self) -> bool:
        return self.action == TRUNCATE_ACTION

    def made_by_ddl(self, commit_ts: int, seq: int) -> bool:
        """This version is the one the DDL at ``(commit_ts, seq)`` made (so a replay of it writes nothing). Files
        written before the ``Ddl`` flag existed are recognised by the old rule, version ``commit_ts + seq``."""
        if (self.commit_ts, self.seq) != (commit_ts, seq) or self.is_truncate:
            return False
        return self.ddl or self.version == commit_ts + seq

    @property
    def is_drop(self) -> bool:
        return self.action == DROP_TABLE_ACTION


def parse_definition(table: TableName, version: int, checksum: int, raw: bytes) -> SchemaFile:
    """A schema file's bytes -> :class:`SchemaFile`; ValueError when it is not one of Tidewater's."""
    d = json.loads(raw)
    ext = d.get(EXTENSION_KEY)
    if not isinstance(ext, dict) or "Schema" not in ext:
        raise ValueError("a schema file without the TidewaterTable object (not written by Tidewater)")
    schema = serde.from_dict(TableSchema, ext["Schema"])
    try:
        fills = tuple(fill_of(schema.column(name), doc) for name, doc in (ext.get("Fills") or {}).items())
    except (KeyError, TypeError, AttributeError, ArithmeticError) as exc:
        raise ValueError(f"malformed Fills ({exc!r})") from exc
    return SchemaFile(table, version, checksum, schema, d.get("Query") or "", int(d.get("Type") or 0),
                      int(ext.get("CommitTs") or 0), int(ext.get("Seq") or 0), fills, bool(ext.get("Ddl")))


def checkpoint_document(ts: int) -> bytes:
    """The ``metadata`` file: TiCDC's ``{"checkpoint-ts":<ts>}``."""
    return json.dumps({"checkpoint-ts": ts}, separators=(",", ":")).encode()


def parse_checkpoint(raw: bytes) -> int:
    value = json.loads(raw).get("checkpoint-ts")
    if not isinstance(value, int):
        raise ValueError("no checkpoint-ts")
    return value


class _Listing(Protocol):
    def listdir(self, rel: str) -> list[str]: ...

    def read(self, rel: str) -> bytes | None: ...


def load_schema_files(fs: _Listing, table: TableName, cache: dict[int, SchemaFile],
                      on_bad: Callable[[str, Exception], None]) -> dict[int, SchemaFile]:
    """Add to ``cache`` (version -> schema file) the table's schema files on ``fs`` not in it yet; return it. A file
    named like a schema file that is not one of ours goes to ``on_bad(path, error)`` (raise there, or skip it)."""
    folder = f"{table_dir(table)}/{TABLE_META}"
    for name in fs.listdir(folder):
        parsed = parse_schema_file_name(name)
        if parsed is None or parsed[0] in cache:
            continue
        raw = fs.read(f"{folder}/{name}")
        if raw is None:
            continue
        try:
            cache[parsed[0]] = parse_definition(table, parsed[0], parsed[1], raw)
        except (ValueError, KeyError, TypeError) as exc:
            on_bad(f"{folder}/{name}", exc)
    return cache
