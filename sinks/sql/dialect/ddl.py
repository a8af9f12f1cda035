"""Schema changes for the SQL sink: a :class:`cdc.events.DdlEvent` translated into the statements of one
dialect (pure functions, no I/O; :mod:`sinks.sql.ops.ddl_run` executes them). docs/ddl.md has the table of what
each DDL kind does on each target.

The rule that keeps altered tables and freshly created ones indistinguishable: every column type, the
nullability and the key come from :func:`sinks.sql.dialect.typemap.plan_table` of the event's ``after`` schema, the
same function streaming's CREATE TABLE uses. So:

- column types are ``plan_table``'s; a type change alters a column only when the planned type changes;
- non-key columns stay nullable and columns carry no default downstream (docs/type-mapping.md: every row
  arrives with all its values, and a row with unsent columns must be storable), hence SET/DROP DEFAULT and
  SET/DROP NOT NULL change nothing downstream (they are recorded as applied);
- the downstream primary key is always ``plan_table(after).key``: ADD/DROP PRIMARY KEY (and any other change
  of the upstream key) drop the old primary key, re-plan the columns whose type or nullability the key
  changes, and add the new one.

ADD COLUMN fills the rows already downstream with what they hold upstream (``DdlEvent.fill``): the one value
every row got (a constant or a STABLE default such as ``now()``, PostgreSQL's missing value) in an UPDATE; for a
VOLATILE default (each row its own value) a REREAD step reads the values back from the upstream by the downstream
rows' keys (``sinks.base.RowSource``) and updates them; later changes in the stream carry full rows and win. An
event that does not say (no event trigger, a consumer's event) falls back to the default expression: a constant is
filled, anything else leaves NULL. Where the values cannot be had (an unknown or untranslatable default, a
table without a key to re-read by, no row source), the rows keep NULL and the runner raises a
``CDC:WarnDdlDefault`` divergence warning when the table has rows.

Every step carries *guards* (catalog conditions: the table, a column or an index exists or not) that the
runner checks right before it; a step whose guard fails is skipped. This makes a replay of a partly
applied event (MariaDB, whose DDL commits at once) converge, and a DDL on a table that has no downstream
table yet (it is created at its first row from the new schema) a no-op.

SQLite cannot alter column types or keys and drops columns only in simple cases: such events are one
*rebuild* step (SQLite's documented recipe: create the new table, copy, drop, rename, recreate indexes, in
one transaction, with foreign keys off and ``foreign_key_check`` before commit).
"""

from __future__ import annotations

import datetime
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from decimal import Decimal, InvalidOperation
from typing import Any

from cdc.errors import DdlRejected
from cdc.events import ColumnSchema, DdlEvent, DdlKind, TableName, TableSchema
from sinks.sql.dialect.typemap import (
    TargetColumn,
    TargetTable,
    char_length,
    create_schema_sql,
    create_table_sql,
    numeric_precision_scale,
    plan_table,
    qualified,
    scale_to_check,
)
from sinks.sql.dialect.values import converter

Parts = tuple[str | None, str]  # (target schema or None, target table)

# step kinds
SQL, FILL, DROP_PK, REBUILD, RESCALE, EMPTY, REREAD = ("sql", "fill", "drop pk", "rebuild", "rescale", "must be empty",
                                                      "re-read")

# kinds that change nothing downstream by the type mapping's rules (see the module docstring)
NO_OP_KINDS = frozenset({DdlKind.SET_DEFAULT, DdlKind.DROP_DEFAULT, DdlKind.SET_NOT_NULL, DdlKind.DROP_NOT_NULL,
                         DdlKind.OTHER})


@dataclass(frozen=True, slots=True)
class Guard:
    """A catalog condition: ``what`` (``table``, ``column``, ``index``, ``pk``) named ``name`` on ``table``
    exists (``exists``) or not. ``pk`` with a name compares the key's columns (comma-joined)."""

    what: str
    table: Parts
    name: str | None = None
    exists: bool = True


@dataclass(frozen=True, slots=True)
class Rebuild:
    """SQLite's table rebuild: ``create`` makes ``temp``, ``copy`` fills it from the table (parameters
    ``params``), then the runner drops the table, renames ``temp`` and recreates the surviving indexes."""

    temp: str
    create: str
    copy: str
    params: tuple[Any, ...]
    columns: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Reread:
    """A volatile default's per-row values: ``select`` lists the keys of the rows downstream, ``schema`` (the key
    columns and ``column``) is what the row source reads upstream, ``update`` sets ``column`` by key (parameters:
    the value converted by ``convert``, then the key as read downstream)."""

    select: str
    update: str
    schema: TableSchema
    column: str
    convert: Callable[[Any], Any] | None


@dataclass(frozen=True, slots=True)
class Step:
    kind: str
    table: Parts
    sql: str = ""
    params: tuple[Any, ...] = ()
    guards: tuple[Guard, ...] = ()
    note: str = ""  # FILL without a value: why the existing rows cannot get upstream's values
    rebuild: Rebuild | None = None
    reread: Reread | None = None


@dataclass
class DdlPlan:
    steps: list[Step] = field(default_factory=list)
    touched: set[Parts] = field(default_factory=set)  # target tables whose cached shape is stale afterwards


# ---- defaults ----------------------------------------------------------------------------------------
VOLATILE = re.compile(r"\b(now|random|nextval|clock_timestamp|statement_timestamp|transaction_timestamp|timeofday|"
                      r"gen_random_uuid|uuid_generate_v\w*|txid_current|pg_current_xact_id|current_timestamp|"
                      r"current_date|current_time|localtime|localtimestamp|setseed)\b", re.I)
_CONST = re.compile(r"""^\(*(?:'((?:[^']|'')*)'|(-?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)|(true|false))\)*"""
                    r"""(?:::[A-Za-z_][\w ."]*(?:\(\d+(?:,\s*-?\d+)?\))?(?:\[\])?)*$""")
_SIMPLE_TYPES = frozenset({"int2", "int4", "int8", "numeric", "float4", "float8", "bool", "text", "varchar",
                           "bpchar", "date", "uuid"})


@dataclass(frozen=True, slots=True)
class DefaultValue:
    """An upstream default as a value for the rows already downstream: ``known`` (``value`` holds it, None
    for NULL) or not (``reason`` says why: volatile, or an expression Tidewater does not evaluate)."""

    known: bool
    value: Any = None
    reason: str = ""


def default_value(col: ColumnSchema, *, known_schema: bool = True) -> DefaultValue:
    """The Python value (as the mounter would produce it for ``col``) of ``col``'s upstream default.
    ``known_schema=False``: the schema came from the stream alone (no DDL text, no catalog), where a missing
    default may just be unknown."""
    expr = (col.default or "").strip()
    if not expr and not known_schema:
        return DefaultValue(False, reason="its default is unknown (the change was detected from the stream without "
                                          "the DDL event trigger); upstream may have given the existing rows a value")
    if not expr or re.fullmatch(r"\(*NULL\)*(::.*)?", expr, re.I):
        return DefaultValue(True, None)
    if VOLATILE.search(expr):
        return DefaultValue(False, reason=f"its default {expr} is volatile: upstream computed one value per "
                                          "existing row, which cannot be reproduced downstream")
    m = _CONST.match(expr)
    if m is None or col.is_array or col.base_type not in _SIMPLE_TYPES:
        return DefaultValue(False, reason=f"its default {expr} is not a constant Tidewater can translate")
    text = m.group(1).replace("''", "'") if m.group(1) is not None else (m.group(2) or m.group(3))
    try:
        return DefaultValue(True, _typed(col, text))
    except (ValueError, InvalidOperation):
        return DefaultValue(False, reason=f"its default {expr} is not a valid {col.type_name or col.base_type}")


def _typed(col: ColumnSchema, text: str) -> Any:
    base = col.base_type
    if base in ("int2", "int4", "int8"):
        return int(Decimal(text).to_integral_value()) if "." in text else int(text)
    if base in ("float4", "float8"):
        return float(text)
    if base == "numeric":
        d = Decimal(text)
        ps = numeric_precision_scale(col)
        return d.quantize(Decimal(1).scaleb(-ps[1])) if ps is not None and ps[1] >= 0 else d
    if base == "bool":
        low = text.strip().lower()
        if low in ("t", "true", "y", "yes", "on", "1"):
            return True
        if low in ("f", "false", "n", "no", "off", "0"):
            return False
        raise ValueError(text)
    if base == "date":
        return datetime.date.fromisoformat(text)
    if base == "uuid":
        return uuid.UUID(text)
    if base == "bpchar":
        n = char_length(col)
        return text.ljust(n) if n is not None else text
    return text


# ---- type changes ------------------------------------------------------------------------------------
_INT_RANK = {"int2": 1, "int4": 2, "int8": 3}
_TEXTS = ("varchar", "text")


def widening_refusal(old: ColumnSchema, new: ColumnSchema) -> str | None:
    """None when ``old`` -> ``new`` only widens (every old value is a valid new value, unchanged), else why
    the change is refused: int2 -> int4 -> int8, float4 -> float8, varchar(n) -> varchar(m >= n) / varchar /
    text, numeric(p, s) -> numeric(p2, s2) with s2 >= s and p2 - s2 >= p - s, or to unbounded numeric."""
    if old.is_array != new.is_array:
        return "array <-> scalar changes are not supported"
    a, b = old.base_type, new.base_type
    if (a, old.type_name, old.type_modifier) == (b, new.type_name, new.type_modifier):
        return None
    if a in _INT_RANK and b in _INT_RANK:
        return None if _INT_RANK[b] >= _INT_RANK[a] else f"narrowing {old.type_name or a} to {new.type_name or b}"
    if a in ("float4", "float8") and b in ("float4", "float8"):
        return None if b == "float8" or a == b else f"narrowing {a} to {b}"
    if a in _TEXTS and b in _TEXTS:
        n, m = char_length(old), char_length(new)
        if b == "text" or m is None or (n is not None and m >= n):
            return None
        return f"narrowing {old.type_name or a} to {new.type_name or b}"
    if a == "numeric" and b == "numeric":
        po, pn = numeric_precision_scale(old), numeric_precision_scale(new)
        if pn is None:
            return None
        if po is not None and pn[1] >= po[1] and pn[0] - pn[1] >= po[0] - po[1]:
            return None
        return f"narrowing {old.type_name or a} to {new.type_name or b}"
    return (f"changing {old.type_name or a} to {new.type_name or b} is not a widening Tidewater applies "
            "(int -> bigint, float4 -> float8, varchar(n) -> varchar(m >= n) / text, numeric precision)")


# ---- translation -------------------------------------------------------------------------------------
class Translator:
    """Translates DDL events for one target dialect. ``target_parts`` maps an upstream table name to its
    downstream (schema, table), as the sink routes rows."""

    def __init__(self, dialect: str, preparer: Any, target_parts: Callable[[TableName], Parts], *,
                 mysql_collation: str = "utf8mb4_bin", replicate_indexes: bool = False) -> None:
        self.dialect = dialect
        self.preparer = preparer
        self.q = preparer.quote_identifier
        self.target_parts = target_parts
        self.mysql_collation = mysql_collation
        self.replicate_indexes = replicate_indexes
        self.ph = "?" if dialect == "sqlite" else "%s"

    def plan(self, schema: TableSchema, parts: Parts) -> TargetTable:
        return plan_table(schema, self.dialect, target_schema=parts[0], target_name=parts[1])

    def name(self, parts: Parts) -> str:
        return qualified(self.preparer, TargetTable(parts[0], parts[1], (), ()))

    def translate(self, ev: DdlEvent) -> DdlPlan:
        """The steps of ``ev`` on this dialect; DdlRejected when a change cannot be translated."""
        parts = self.target_parts(ev.table)
        out = DdlPlan(touched={parts})
        kinds = set(ev.kinds)
        if self.dialect == "sqlite" and self._needs_rebuild(ev):
            out.steps += self._rebuild(ev, parts)
            kinds -= {DdlKind.DROP_COLUMN, DdlKind.ALTER_COLUMN_TYPE, DdlKind.ADD_PRIMARY_KEY,
                      DdlKind.DROP_PRIMARY_KEY, DdlKind.ADD_COLUMN, DdlKind.RENAME_COLUMN}
        reshaped = False
        for ch in ev.changes:
            if ch.kind not in kinds or ch.kind in NO_OP_KINDS:
                continue
            k = ch.kind
            if k == DdlKind.CREATE_TABLE:
                out.steps += self._create(ev, parts)
            elif k == DdlKind.DROP_TABLE:
                out.steps.append(Step(SQL, parts, f"DROP TABLE IF EXISTS {self.name(parts)}"))
            elif k == DdlKind.RENAME_TABLE:
                new = ev.new_table or (TableName.parse(ch.new_name) if ch.new_name else None)
                if new is None:
                    raise DdlRejected(ev.query, str(ev.table), "RENAME TABLE without the new name", commit_ts=ev.commit_ts)
                new_parts = self.target_parts(new)
                out.touched.add(new_parts)
                out.steps += self._rename_table(parts, new_parts)
            elif k == DdlKind.TRUNCATE_TABLE:
                verb = "TRUNCATE TABLE" if self.dialect == "postgresql" else "DELETE FROM"
                out.steps.append(Step(SQL, parts, f"{verb} {self.name(parts)}", guards=(Guard("table", parts),)))
            elif k == DdlKind.ADD_COLUMN:
                out.steps += self._add_column(ev, parts, self._col(ev, ev.after, ch.column))
            elif k == DdlKind.DROP_COLUMN:
                self._named(ev, ch.column)
                assert ch.column is not None
                out.steps.append(Step(SQL, parts, f"ALTER TABLE {self.name(parts)} DROP COLUMN {self.q(ch.column)}",
                                      guards=(Guard("table", parts), Guard("column", parts, ch.column))))
            elif k == DdlKind.RENAME_COLUMN:
                self._named(ev, ch.column, ch.new_name)
                assert ch.column is not None and ch.new_name is not None
                out.steps.append(Step(
                    SQL, parts, f"ALTER TABLE {self.name(parts)} RENAME COLUMN {self.q(ch.column)} TO {self.q(ch.new_name)}",
                    guards=(Guard("table", parts), Guard("column", parts, ch.column),
                            Guard("column", parts, ch.new_name, exists=False))))
            elif k in (DdlKind.ALTER_COLUMN_TYPE, DdlKind.ADD_PRIMARY_KEY, DdlKind.DROP_PRIMARY_KEY):
                if k == DdlKind.ALTER_COLUMN_TYPE:
                    self._check_widening(ev, ch.column)
                if not reshaped:  # one pass covers every type and key change of the event
                    out.steps += self._reshape(ev, parts)
                    reshaped = True
            elif k in (DdlKind.CREATE_INDEX, DdlKind.DROP_INDEX):
                if self.replicate_indexes and ch.index is not None:
                    out.steps += self._index(ev, parts, k, ch.index)
            else:
                raise DdlRejected(ev.query, str(ev.table), f"unknown DDL kind {k}", commit_ts=ev.commit_ts)
        if self.dialect == "sqlite":
            out.steps += self._rescale(ev, parts)
        return out

    def _rescale(self, ev: DdlEvent, parts: Parts) -> list[Step]:
        """SQLite keeps numeric as its exact text: a larger scale upstream rewrites every value (1.50 ->
        1.500), so the stored text is rewritten too (step RESCALE: ``sql`` reads, ``params`` = (scale,))."""
        steps = []
        for ch in ev.changes:
            if ch.kind != DdlKind.ALTER_COLUMN_TYPE:
                continue
            new = self._col(ev, ev.after, ch.column)
            old = self._col(ev, ev.before, self._old_name(ev, new.name))
            po, pn = numeric_precision_scale(old), numeric_precision_scale(new)
            if po is not None and pn is not None and pn[1] > po[1] and not new.is_array:
                c = self.q(new.name)
                steps.append(Step(RESCALE, parts, f"SELECT rowid, {c} FROM {self.name(parts)} WHERE {c} IS NOT NULL",
                                  (pn[1], f"UPDATE {self.name(parts)} SET {c} = ? WHERE rowid = ?"),
                                  guards=(Guard("table", parts), Guard("column", parts, new.name))))
        return steps

    # -- helpers --
    @staticmethod
    def _named(ev: DdlEvent, *names: str | None) -> None:
        if not all(names):
            raise DdlRejected(ev.query, str(ev.table), "the change does not name its column(s)", commit_ts=ev.commit_ts)

    @staticmethod
    def _need(ev: DdlEvent, schema: TableSchema | None) -> TableSchema:
        if schema is None:
            raise DdlRejected(ev.query, str(ev.table), "the event lacks the table's schema before or after the change",
                              commit_ts=ev.commit_ts)
        return schema

    def _col(self, ev: DdlEvent, schema: TableSchema | None, name: str | None) -> ColumnSchema:
        if schema is None or name is None:
            raise DdlRejected(ev.query, str(ev.table), "the event lacks the table's schema or the column name",
                              commit_ts=ev.commit_ts)
        try:
            return schema.column(name)
        except KeyError:
            raise DdlRejected(ev.query, str(ev.table), f"column {name!r} is not in the table's schema",
                              commit_ts=ev.commit_ts) from None

    def _check_widening(self, ev: DdlEvent, name: str | None) -> None:
        new = self._col(ev, ev.after, name)
        old = self._col(ev, ev.before, self._old_name(ev, new.name))
        why = widening_refusal(old, new)
        if why is not None:
            raise DdlRejected(ev.query, str(ev.table), why, commit_ts=ev.commit_ts)

    @staticmethod
    def _old_name(ev: DdlEvent, new_name: str) -> str:
        for ch in ev.changes:
            if ch.kind == DdlKind.RENAME_COLUMN and ch.new_name == new_name and ch.column:
                return ch.column
        return new_name

    def _needs_rebuild(self, ev: DdlEvent) -> bool:
        kinds = set(ev.kinds)
        if kinds & {DdlKind.DROP_COLUMN, DdlKind.ADD_PRIMARY_KEY, DdlKind.DROP_PRIMARY_KEY}:
            return True
        if DdlKind.ALTER_COLUMN_TYPE in kinds:
            for ch in ev.changes:
                if ch.kind == DdlKind.ALTER_COLUMN_TYPE:
                    self._check_widening(ev, ch.column)
            return self._type_changes(ev) or self._key_changes(ev)
        return False

    def _key_changes(self, ev: DdlEvent) -> bool:
        if ev.before is None or ev.after is None:
            return False
        p = self.target_parts(ev.table)
        return self.plan(ev.before, p).key != tuple(self._old_name(ev, k) for k in self.plan(ev.after, p).key)

    def _type_changes(self, ev: DdlEvent) -> bool:
        return bool(self._changed_columns(ev))

    def _changed_columns(self, ev: DdlEvent) -> list[tuple[TargetColumn, TargetColumn]]:
        """(old, new) planned columns whose type or nullability differ, for columns in both versions."""
        if ev.before is None or ev.after is None:
            return []
        p = self.target_parts(ev.table)
        old = {c.name: c for c in self.plan(ev.before, p).columns}
        out = []
        for c in self.plan(ev.after, p).columns:
            o = old.get(self._old_name(ev, c.name))
            if o is not None and (o.ddl_type, o.nullable) != (c.ddl_type, c.nullable):
                out.append((o, c))
        return out

    def _create(self, ev: DdlEvent, parts: Parts) -> list[Step]:
        if ev.after is None:
            raise DdlRejected(ev.query, str(ev.table), "CREATE TABLE without the table's schema", commit_ts=ev.commit_ts)
        # a table already there (created by this DDL before a crash: empty) is used; one with rows is another
        # incarnation or someone else's data, never mixed with the new table's rows
        steps = [Step(EMPTY, parts, f"SELECT 1 FROM {self.name(parts)} LIMIT 1", guards=(Guard("table", parts),))]
        if parts[0] is not None:
            steps.append(Step(SQL, parts, create_schema_sql(parts[0], self.preparer)))
        sql = create_table_sql(self.plan(ev.after, parts), self.dialect, self.preparer,
                               mysql_collation=self.mysql_collation)
        steps.append(Step(SQL, parts, sql, guards=(Guard("table", parts, exists=False),)))
        return steps

    def _rename_table(self, old: Parts, new: Parts) -> list[Step]:
        if old == new:
            return []
        guards = (Guard("table", old), Guard("table", new, exists=False))
        if self.dialect == "mysql":
            return [Step(SQL, old, f"RENAME TABLE {self.name(old)} TO {self.name(new)}", guards=guards)]
        if self.dialect == "sqlite" or old[0] == new[0]:
            return [Step(SQL, old, f"ALTER TABLE {self.name(old)} RENAME TO {self.q(new[1])}", guards=guards)]
        assert new[0] is not None
        steps = [Step(SQL, new, create_schema_sql(new[0], self.preparer)),
                 Step(SQL, old, f"ALTER TABLE {self.name(old)} SET SCHEMA {self.q(new[0])}", guards=guards)]
        if old[1] != new[1]:
            moved = (new[0], old[1])
            steps.append(Step(SQL, moved, f"ALTER TABLE {self.name(moved)} RENAME TO {self.q(new[1])}",
                              guards=(Guard("table", moved), Guard("table", new, exists=False))))
        return steps

    def _add_column(self, ev: DdlEvent, parts: Parts, col: ColumnSchema) -> list[Step]:
        tc = self.plan(self._need(ev, ev.after), parts).column(col.name)
        steps = [Step(SQL, parts, f"ALTER TABLE {self.name(parts)} ADD COLUMN {self.q(col.name)} {tc.ddl_type}",
                      guards=(Guard("table", parts), Guard("column", parts, col.name, exists=False)))]
        dv = default_value(col, known_schema=bool(ev.query))
        guards = (Guard("table", parts), Guard("column", parts, col.name))
        fill = f"UPDATE {self.name(parts)} SET {self.q(col.name)} = {self.ph}"
        told = ev.fill(col.name)
        if told is not None and told.per_row:
            steps.append(self._reread(ev, parts, col, guards))
        elif told is not None:
            if told.value is not None:
                steps.append(Step(FILL, parts, fill, (self._param(col, told.value, parts, ev.after),), guards=guards))
        elif not dv.known:
            steps.append(Step(FILL, parts, f"SELECT 1 FROM {self.name(parts)} LIMIT 1", guards=guards, note=dv.reason))
        elif dv.value is not None:
            steps.append(Step(FILL, parts, fill, (self._param(col, dv.value, parts),), guards=guards))
        return steps

    def _reread(self, ev: DdlEvent, parts: Parts, col: ColumnSchema, guards: tuple[Guard, ...]) -> Step:
        """The REREAD step of an added column whose rows each got their own value upstream; a FILL with the reason
        (a warning when the table has rows) when there is no key to read them by."""
        after = self._need(ev, ev.after)
        key = self.plan(after, parts).key
        if not after.has_key or not key:
            return Step(FILL, parts, f"SELECT 1 FROM {self.name(parts)} LIMIT 1", guards=guards,
                        note=f"its default {col.default} gave each upstream row its own value, and the table has no "
                             "key to read them back by")
        t, q = self.name(parts), self.q
        schema = replace(after, columns=tuple(after.column(k) for k in key) + (col,))
        where = " AND ".join(f"{q(k)} = {self.ph}" for k in key)
        return Step(REREAD, parts, guards=guards, note=f"its default {col.default} gave each upstream row its own value",
                    reread=Reread(f"SELECT {', '.join(q(k) for k in key)} FROM {t}",
                                  f"UPDATE {t} SET {q(col.name)} = {self.ph} WHERE {where}", schema, col.name,
                                  self._converter(col, parts, after)))

    def _converter(self, col: ColumnSchema, parts: Parts, after: TableSchema | None) -> Callable[[Any], Any] | None:
        """The converter rows of ``col`` get (a DECIMAL scale the values may exceed is checked, as binding does:
        a fill is never rounded by the target)."""
        scale = None
        if after is not None and col.name in after.column_names:
            scale = scale_to_check(col, self.plan(after, parts).column(col.name))
        return converter(col, self.dialect, table=self.name(parts), scale=scale)

    def _param(self, col: ColumnSchema, value: Any, parts: Parts, after: TableSchema | None = None) -> Any:
        conv = self._converter(col, parts, after)
        return value if conv is None else conv(value)

    def _reshape(self, ev: DdlEvent, parts: Parts) -> list[Step]:
        """Type and key changes: drop the old key, alter the columns whose planned type or nullability
        changed, add the new key."""
        old_key = self.plan(self._need(ev, ev.before), parts).key
        new_key = self.plan(self._need(ev, ev.after), parts).key
        key_changes = old_key != tuple(self._old_name(ev, k) for k in new_key)
        t, q = self.name(parts), self.q
        steps = []
        on = (Guard("table", parts),)
        if key_changes and old_key:
            steps.append(Step(DROP_PK, parts, "", guards=(*on, Guard("pk", parts, ",".join(old_key)))))
        for _old, c in self._changed_columns(ev):
            on_col = (*on, Guard("column", parts, c.name))
            if self.dialect == "mysql":
                steps.append(Step(SQL, parts, f"ALTER TABLE {t} MODIFY COLUMN {q(c.name)} {c.ddl_type}"
                                              f"{'' if c.nullable else ' NOT NULL'}", guards=on_col))
                continue
            if _old.ddl_type != c.ddl_type:
                steps.append(Step(SQL, parts, f"ALTER TABLE {t} ALTER COLUMN {q(c.name)} TYPE {c.ddl_type}",
                                  guards=on_col))
            if _old.nullable != c.nullable:
                verb = "DROP NOT NULL" if c.nullable else "SET NOT NULL"
                steps.append(Step(SQL, parts, f"ALTER TABLE {t} ALTER COLUMN {q(c.name)} {verb}", guards=on_col))
        if key_changes and new_key:
            steps.append(Step(SQL, parts, f"ALTER TABLE {t} ADD PRIMARY KEY ({', '.join(q(k) for k in new_key)})",
                              guards=(*on, Guard("pk", parts, exists=False))))
        return steps

    def _rebuild(self, ev: DdlEvent, parts: Parts) -> list[Step]:
        before, after = self._need(ev, ev.before), self._need(ev, ev.after)
        new = self.plan(after, parts)
        temp = f"_tidewater_rebuild_{parts[1]}"
        created = create_table_sql(TargetTable(None, temp, new.columns, new.key), self.dialect, self.preparer)
        before_names = set(before.column_names)
        added = {ch.column for ch in ev.changes if ch.kind == DdlKind.ADD_COLUMN}
        exprs, params, warn = [], [], []
        rereads: list[ColumnSchema] = []
        for c in after.columns:
            src = self._old_name(ev, c.name)
            if src in before_names and c.name not in added:
                exprs.append(self.q(src))
                continue
            told = ev.fill(c.name)
            if told is not None:
                if told.per_row:
                    rereads.append(c)
                exprs.append("NULL" if told.per_row or told.value is None else "?")
                if not told.per_row and told.value is not None:
                    params.append(self._param(c, told.value, parts, after))
                continue
            dv = default_value(c, known_schema=bool(ev.query))
            if dv.known and dv.value is not None:
                exprs.append("?")
                params.append(self._param(c, dv.value, parts))
            else:
                exprs.append("NULL")
                if not dv.known:
                    warn.append(f"column {c.name}: {dv.reason}")
        cols = tuple(c.name for c in new.columns)
        copy = (f"INSERT INTO {self.q(temp)} ({', '.join(self.q(c) for c in cols)}) "
                f"SELECT {', '.join(exprs)} FROM {self.name(parts)}")
        guards = (Guard("table", parts),)
        return [Step(REBUILD, parts, guards=guards, note="; ".join(warn),
                     rebuild=Rebuild(temp, created, copy, tuple(params), cols)),
                *(self._reread(ev, parts, c, (*guards, Guard("column", parts, c.name))) for c in rereads)]

    def _index(self, ev: DdlEvent, parts: Parts, kind: DdlKind, ix: Any) -> list[Step]:
        q, t = self.q, self.name(parts)
        if kind == DdlKind.DROP_INDEX:
            if self.dialect == "mysql":
                return [Step(SQL, parts, f"DROP INDEX {q(ix.name)} ON {t}", guards=(Guard("index", parts, ix.name),))]
            name = f"{q(parts[0])}.{q(ix.name)}" if parts[0] else q(ix.name)
            return [Step(SQL, parts, f"DROP INDEX IF EXISTS {name}")]
        cols = []
        planned = {c.name: c for c in self.plan(ev.after, parts).columns} if ev.after is not None else {}
        for c in ix.columns:
            tc = planned.get(c)
            if self.dialect == "mysql" and tc is not None and (tc.ddl_type or "").endswith(("TEXT", "BLOB")):
                if ix.unique:
                    raise DdlRejected(ev.query, str(ev.table), f"a unique index on {tc.ddl_type} column {c} needs a "
                                      "prefix on MySQL, which would change what is unique", commit_ts=ev.commit_ts)
                cols.append(f"{q(c)}(255)")
            else:
                cols.append(q(c))
        unique = "UNIQUE " if ix.unique else ""
        if self.dialect == "mysql":
            return [Step(SQL, parts, f"CREATE {unique}INDEX {q(ix.name)} ON {t} ({', '.join(cols)})",
                         guards=(Guard("table", parts), Guard("index", parts, ix.name, exists=False)))]
        return [Step(SQL, parts, f"CREATE {unique}INDEX IF NOT EXISTS {q(ix.name)} ON {t} ({', '.join(cols)})",
                     guards=(Guard("table", parts),))]
