"""A ``tidewater.ddl`` message (``sql/10_ddl.sql``) -> :class:`cdc.events.DdlEvent`.

The message describes a table *after* one DDL command (the catalog facts ``catalog.build_schema`` reads, so
the schema is built by the same rules as any other) or names a dropped table. The change list comes from
comparing that schema with the one the span's stream had for the table just before the command:

- table name or schema differs -> RENAME_TABLE;
- a column gone and another new in a command on a column (``object_type = 'table column'``: PostgreSQL's
  ``RENAME COLUMN`` is a command of its own) -> RENAME_COLUMN; otherwise DROP_COLUMN / ADD_COLUMN;
- same column, other type or type modifier -> ALTER_COLUMN_TYPE; nullability -> SET/DROP NOT NULL;
- another key -> DROP_PRIMARY_KEY (if it had one), ADD_PRIMARY_KEY (if it has one).

Each ADD_COLUMN gets a :class:`cdc.events.ColumnFill` (``DdlEvent.fills``, :func:`fills`): what the rows that
existed hold upstream in the new column. The message's columns carry PostgreSQL's *missing value* (the one value a
non-volatile default gave every existing row, ``now()`` included), parsed as a streamed value of the column's type;
a column with a default (or of a domain type, whose default may apply, or an identity column) but no missing value
was filled by a table rewrite, one value per row (a volatile default): ``per_row``, read back by key downstream; a column with neither
holds NULL.

The trigger also describes the tables an ALTER TABLE names just before it runs; that description is used as
``before`` when present. Otherwise ``before`` is the span's last schema of the table; unknown (no schema of
the table in the stream yet, after a restart, and the statement did not name it plainly) for anything but a CREATE:
:class:`UnknownBefore` — the caller reports it; nothing is guessed. Pure functions; malformed content raises
``DecodeError``.
"""

from __future__ import annotations

import json
from typing import Any

from cdc.errors import DecodeError
from cdc.events import ColumnFill, DdlChange, DdlEvent, DdlKind, IndexSpec, TableName, TableSchema
from upstream.postgres import catalog
from upstream.postgres.types import parser_for

CREATE_TAGS = frozenset({"CREATE TABLE", "CREATE TABLE AS", "SELECT INTO"})


class UnknownBefore(DecodeError):
    """A schema change of a table whose previous schema the span's stream does not know."""


class Ambiguous(DecodeError):
    """A change seen only in Relation messages that could be a rename or a drop plus an add."""


class ValuesRewritten(DecodeError):
    """A type change with ``USING``: PostgreSQL rewrote the column's values and the stream carries none of it."""


def _doc(content: bytes | dict[str, Any]) -> dict[str, Any]:
    if isinstance(content, dict):
        return content
    try:
        doc = json.loads(content)
    except ValueError as e:
        raise DecodeError(f"malformed tidewater.ddl message ({e}): {bytes(content[:200])!r}") from e
    if not isinstance(doc, dict) or doc.get("v") != 1:
        raise DecodeError(f"unsupported tidewater.ddl message: {bytes(content[:200])!r}")
    return doc


def message_table(doc: dict[str, Any]) -> tuple[int, TableName] | None:
    """(oid, name) of the table a message is about, or None (an error message)."""
    t = doc.get("table") or doc.get("dropped")
    if not t:
        return None
    return int(t["oid"]), TableName(str(t["schema"]), str(t["table"]))


def table_schema(t: dict[str, Any]) -> TableSchema:
    """The schema a ``tidewater.ddl_describe`` document describes (``catalog.build_schema``'s rules)."""
    rows = [tuple(c[:5]) for c in t["columns"]]
    types = {}
    domain_fmt: dict[int, str] = {}
    for r in t["types"] or []:
        ty = catalog.type_row(r)
        types[ty.oid] = ty
        if r[8]:
            domain_fmt[ty.oid] = str(r[8])
    domains: dict[str, str] = {}
    for name, typid, *_ in rows:
        declared = types[int(typid)]
        if declared.typtype == "d" and int(typid) in domain_fmt:
            domains[name] = domain_fmt[int(typid)]
        elif declared.category == "A" and declared.elem in domain_fmt:
            domains[name] = domain_fmt[declared.elem] + "[]"
    defaults = {c[0]: c[5] for c in t["columns"] if c[5] is not None}
    return catalog.build_schema(TableName(str(t["schema"]), str(t["table"])), int(t["oid"]), str(t["replident"]),
                                rows, types, domains, tuple(t["pk"]), bool(t["pk_immediate"]), tuple(t["ident"]),
                                defaults=defaults)


def decode(content: bytes | dict[str, Any], before: TableSchema | None, *, commit_ts: int, commit_time: float,
           seq: int) -> list[DdlEvent]:
    """The DDL events of one message; empty when the command changes nothing a sink replicates."""
    try:
        doc = _doc(content)
        query = str(doc.get("query") or "")
        if doc.get("dropped"):
            oid, name = message_table(doc) or (0, TableName("", ""))
            return [DdlEvent(commit_ts, commit_time, name, (DdlChange(DdlKind.DROP_TABLE),), before, None, query, seq)]
        t = doc["table"]
        if t["relkind"] not in ("r", "p") or t["persistence"] == "t" or t["is_partition"]:
            return []
        after = table_schema(t)
        tag = str(doc.get("tag", ""))
        if doc.get("before"):  # described by the trigger just before the command: exact, defaults included
            before = table_schema(doc["before"])
        index = index_change(doc)
        if doc.get("index") is not None:  # CREATE / DROP INDEX: the table itself is unchanged
            if index is None:
                return []
            return [DdlEvent(commit_ts, commit_time, after.name, (index,), before or after, after, query, seq)]
        if before is None:
            if tag in CREATE_TAGS:
                return [DdlEvent(commit_ts, commit_time, after.name, (DdlChange(DdlKind.CREATE_TABLE),), None, after,
                                 query, seq)]
            raise UnknownBefore(f"schema change of {after.name} at commit {commit_ts} ({query[:200]!r}): the span's "
                                f"stream has no earlier schema of the table to compare with")
        changes = diff(before, after, column_command=doc.get("object_type") == "table column")
        if not changes:
            return []
        if any(c.kind is DdlKind.ALTER_COLUMN_TYPE for c in changes) and " using " in f" {query.lower()} ":
            raise ValuesRewritten(f"a type change with USING rewrote the values of {after.name} upstream; the "
                                  f"stream carries none of the rewritten rows, so the target would keep the old values")
        new_table = after.name if after.name != before.name else None
        added = [c.column for c in changes if c.kind is DdlKind.ADD_COLUMN and c.column]
        return [DdlEvent(commit_ts, commit_time, before.name, tuple(changes), before, after, query, seq, new_table,
                         fills(t, after, added))]
    except DecodeError:
        raise
    except (KeyError, TypeError, ValueError, IndexError) as e:
        raise DecodeError(f"malformed tidewater.ddl message ({e!r})") from e


def fills(t: dict[str, Any], after: TableSchema, added: list[str]) -> tuple[ColumnFill, ...]:
    """The fill of each ``added`` column of the described table ``t`` (module docstring). A missing value that does
    not parse as the column's type raises ``DecodeError`` (the message is then malformed, never guessed)."""
    if not added:
        return ()
    described = {str(c[0]): c for c in t["columns"]}
    domains = {int(r[0]) for r in t["types"] or [] if r[2] == "d"}
    out = []
    for name in added:
        c = described[name]
        col = after.column(name)
        missing = c[6] if len(c) > 6 else None
        if missing is not None:
            try:
                out.append(ColumnFill(name, parser_for(col.base_type, col.is_array)(str(missing))))
            except (ValueError, ArithmeticError) as e:
                raise DecodeError(f"the value existing rows of {after.name} got in new column {name!r} "
                                  f"({str(missing)[:60]!r}) is not a valid {col.type_name or col.base_type}: {e}") from e
        elif c[5] is not None or int(c[1]) in domains or (len(c) > 7 and c[7]):  # (identity: a sequence's values)
            out.append(ColumnFill(name, per_row=True))
        else:
            out.append(ColumnFill(name, None))
    return tuple(out)


def index_change(doc: dict[str, Any]) -> DdlChange | None:
    """CREATE_INDEX / DROP_INDEX of a message about an index, when a sink can replay it: an index on plain
    columns, not partial, not the primary key (which is the table's key, see :func:`diff`). None otherwise
    (expression and partial indexes are not replayed downstream: docs/ddl.md)."""
    ix = doc.get("index")
    if not ix or ix.get("primary") or ix.get("partial") or not ix.get("columns"):
        return None
    spec = IndexSpec(str(ix["name"]), tuple(str(c) for c in ix["columns"]), bool(ix.get("unique")))
    return DdlChange(DdlKind.DROP_INDEX if doc.get("index_dropped") else DdlKind.CREATE_INDEX, index=spec)


def diff(before: TableSchema, after: TableSchema, *, column_command: bool = False) -> list[DdlChange]:
    """The elementary changes from ``before`` to ``after`` (order: rename table, columns, key)."""
    out: list[DdlChange] = []
    if after.name != before.name:
        out.append(DdlChange(DdlKind.RENAME_TABLE, new_name=f"{after.name.schema}.{after.name.table}"))
    old = {c.name: c for c in before.columns}
    new = {c.name: c for c in after.columns}
    gone = [c.name for c in before.columns if c.name not in new]
    added = [c.name for c in after.columns if c.name not in old]
    if column_command and len(gone) == 1 and len(added) == 1:
        out.append(DdlChange(DdlKind.RENAME_COLUMN, gone[0], added[0]))
        old[added[0]] = old.pop(gone[0])
        gone, added = [], []
    out += [DdlChange(DdlKind.DROP_COLUMN, n) for n in gone]
    out += [DdlChange(DdlKind.ADD_COLUMN, n) for n in added]
    for c in after.columns:
        o = old.get(c.name)
        if o is None or c.name in added:
            continue
        if (o.type_oid, o.type_modifier) != (c.type_oid, c.type_modifier):
            out.append(DdlChange(DdlKind.ALTER_COLUMN_TYPE, c.name))
        if o.nullable != c.nullable and not c.is_key:
            out.append(DdlChange(DdlKind.DROP_NOT_NULL if c.nullable else DdlKind.SET_NOT_NULL, c.name))
    if (before.key, before.has_key) != (after.key, after.has_key):
        if before.has_key and before.key:
            out.append(DdlChange(DdlKind.DROP_PRIMARY_KEY))
        if after.has_key and after.key:
            out.append(DdlChange(DdlKind.ADD_PRIMARY_KEY))
    return out


def from_relations(before: TableSchema, after: TableSchema, *, commit_ts: int, commit_time: float,
                   seq: int) -> list[DdlEvent]:
    """The fallback without the DDL trigger: a schema change seen only as a new Relation message (its column
    list; key, nullability and types enriched from the catalog when the span read it). Added, dropped and
    retyped columns are derived; a column gone while another appeared may be a rename or a drop plus an add,
    and guessing wrong loses the column's values downstream: :class:`Ambiguous`. What the rows that existed got in
    an added column is unknown here (no missing value, and the default may be volatile), but the upstream holds it:
    every added column is a ``per_row`` fill, read back by key (a table without a key: the sink warns)."""
    changes = diff(before, after)
    kinds = {c.kind for c in changes}
    if DdlKind.DROP_COLUMN in kinds and DdlKind.ADD_COLUMN in kinds:
        raise Ambiguous(f"columns of {after.name} were dropped and added in one change seen without the DDL "
                        f"trigger: a RENAME COLUMN cannot be told from a drop plus an add")
    if not changes:
        return []
    query = f"(seen in the replication stream only) {', '.join(c.kind.value + ' ' + (c.column or '') for c in changes)}"
    fills = tuple(ColumnFill(c.column, per_row=True) for c in changes if c.kind is DdlKind.ADD_COLUMN and c.column)
    return [DdlEvent(commit_ts, commit_time, before.name, tuple(changes), before, after, query, seq, fills=fills)]
