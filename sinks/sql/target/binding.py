"""One upstream schema version bound to its downstream table: column mapping, value converters and the
cached statements (plans) the writer sends. No I/O: :class:`sinks.sql.target.catalog.Catalog` makes and caches
bindings from what it read of the target."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from cdc.errors import SinkError
from cdc.events import TableSchema
from sinks.sql.dialect import rowtext
from sinks.sql.dialect.statements import Statements
from sinks.sql.dialect.typemap import TargetColumn, TargetTable, scale_to_check
from sinks.sql.dialect.values import Converter, checks_every_value, converter, fast_path, text_path

# group kinds: what one statement does with its rows
K_UPSERT, K_INSERT, K_DELETE, K_DELETE_ONE, K_UPDATE_ONE = range(5)


class KnownTable:
    """What the sink knows about one downstream table (created by us or reflected)."""

    def __init__(self, label: str, schema: str | None, name: str, columns: tuple[TargetColumn, ...],
                 uniques: list[frozenset[str]], *, created: bool) -> None:
        self.label = label
        self.schema = schema
        self.name = name
        self.columns = columns
        self.uniques = uniques
        self.created = created


RowFn = Callable[[Sequence[Any]], Sequence[Any]]
TextRowFn = Callable[[Sequence[Any], Sequence[Any]], Sequence[Any]]


class Plan:
    """A group's statement: ``sql`` for one row, ``many(n)`` for n rows in one statement (PostgreSQL),
    ``parts`` = (head, tail) around literal rows, ``%`` not doubled (MySQL's literal fast path)."""

    __slots__ = ("sql", "convert", "convert_text", "key_idx", "parts", "copy", "copy_direct", "_build", "_many")

    def __init__(self, sql: str, convert: RowFn | None, key_idx: tuple[int, ...],
                 build: Callable[[int], str] | None = None, parts: tuple[str, str] | None = None,
                 convert_text: TextRowFn | None = None) -> None:
        self.sql = sql
        self.convert = convert
        self.convert_text = convert_text  # (row, upstream text) -> parameters; None: no column gains from it
        self.key_idx = key_idx
        self.parts = parts
        # PostgreSQL, rows with their upstream text: (COPY statement, staging table DDL, merge) or None
        self.copy: tuple[str, str | None, str | None] | None = None
        # PostgreSQL upserts with a staging merge: COPY straight into the table, for rows whose keys the target most
        # likely lacks (``sinks.sql.ops.output.Output``: under a savepoint, the merge when a key exists)
        self.copy_direct: str | None = None
        self._build = build
        self._many: dict[int, str] = {}

    def many(self, n: int) -> str:
        sql = self._many.get(n)
        if sql is None:
            assert self._build is not None
            sql = self._many[n] = self._build(n)
        return sql


def row_function(n: int, convs: dict[int, Converter], *, with_text: bool = False) -> Any:
    """A function converting one parameter row, generated once per statement (no per-value loop).

    A converter's fast path (``values.fast_path``: exact type ``T`` -> ``f``) is tested inline, so the
    common values of a column cost one call of ``f`` (often a builtin) instead of the converter's type tests.
    ``with_text``: the function takes ``(row, upstream text)`` and uses the converters' text paths
    (``values.text_path``), falling back to the value when ``g`` does not recognise the text; None when no
    converter has a text path. Where the C row renderer builds, the function runs in C
    (:mod:`sinks.sql.dialect.rowtext`: the same results, the converters still called where C does not know them).
    """
    if not convs:
        return None
    namespace: dict[str, Any] = {"type": type}
    parts = []
    texts = 0
    for i in range(n):
        if i in convs:
            namespace[f"c{i}"] = convs[i]
            expr = f"(None if r[{i}] is None else c{i}(r[{i}]))"
            fast = fast_path(convs[i])
            if fast is not None:
                namespace[f"t{i}"], namespace[f"f{i}"] = fast
                expr = f"(f{i}(r[{i}]) if type(r[{i}]) is t{i} else {expr})"
            text = text_path(convs[i]) if with_text else None
            if text is not None:
                namespace[f"u{i}"], namespace[f"g{i}"] = text
                expr = f"((g{i}(s[{i}]) if type(r[{i}]) is u{i} else None) or {expr})"
                texts += 1
            parts.append(expr)
        else:
            parts.append(f"r[{i}]")
    if with_text and not texts:
        return None
    args = "r, s" if with_text else "r"
    fn = eval(f"lambda {args}: (" + ", ".join(parts) + ",)", namespace)  # indices only, no data
    return rowtext.best().row_converter(n, convs, with_text, fn)  # (in C where it builds: the same results)


def convert_params(rows: Sequence[Sequence[Any]], fn: RowFn | None) -> list[Any]:
    return list(rows) if fn is None else [fn(r) for r in rows]


def convert_rows(plan: Plan, rows: list[tuple[Any, ...]], texts: list[Any] | None) -> list[Any]:
    """Parameters of ``rows``; through the plan's text paths when every row came with its upstream text."""
    fn = plan.convert_text
    if fn is not None and texts is not None and len(texts) == len(rows):
        return list(map(fn, rows, texts))
    return convert_params(rows, plan.convert)


class Binding:
    """One upstream schema version bound to its downstream table: name mapping, converters, statements.

    ``stmts`` builds the target's statements; ``stage_ids`` numbers the PostgreSQL staging tables of COPY upserts
    (shared by the bindings of one sink); ``temp_ok``: the session may create them. ``SinkError`` when the table
    lacks a column of the schema or a unique key on its key."""

    def __init__(self, schema: TableSchema, table: KnownTable, stmts: Statements, stage_ids: Iterator[int], *,
                 temp_ok: bool) -> None:
        self.schema = schema
        self.label = table.label
        self.keyed = schema.has_key and bool(schema.key)
        self.key = tuple(schema.key) if self.keyed else ()
        self.ncols = len(schema.columns)
        self.names = schema.column_names  # the order of RowChange.row
        self.key_pos = tuple(self.names.index(k) for k in self.key)  # the key's places in a positional row
        self.stmts = stmts
        dialect = stmts.dialect
        exact = {c.name: c for c in table.columns}
        folded = {c.name.casefold(): c for c in table.columns} if dialect != "postgresql" else {}
        self.colmap: dict[str, str] = {}
        missing = []
        targets: dict[str, TargetColumn] = {}
        for c in schema.columns:
            tc = exact.get(c.name) or folded.get(c.name.casefold())
            if tc is None:
                missing.append(c.name)
                continue
            self.colmap[c.name] = tc.name
            targets[c.name] = tc
        if missing:
            raise SinkError(
                f"target table {table.label} has no column(s) {', '.join(map(repr, missing))} that upstream "
                f"{schema.name} has: add them (ALTER TABLE ... ADD COLUMN) or drop the target table so that it "
                "is created again")
        dkey = tuple(self.colmap[k] for k in self.key)
        if self.keyed and frozenset(dkey) not in table.uniques:
            raise SinkError(
                f"target table {table.label} has no primary key or unique index on ({', '.join(dkey)}), the "
                f"key of upstream {schema.name}: upserts by key need one (ALTER TABLE ... ADD PRIMARY KEY)")
        self.table = TargetTable(table.schema, table.name, table.columns, dkey)
        # the target's unique keys (primary key included) in upstream column names, sorted; ``unique_unmapped``:
        # one of them has a column no upstream column maps to (parallel apply then cannot key rows by it)
        upstream = {t: u for u, t in self.colmap.items()}
        uniques = set()
        self.unique_unmapped = False
        for u in table.uniques:
            if all(c in upstream for c in u):
                uniques.add(tuple(sorted(upstream[c] for c in u)))
            else:
                self.unique_unmapped = True
        self.unique_keys: tuple[tuple[str, ...], ...] = tuple(sorted(uniques))
        # the unique keys besides the key (a value of one may move between rows: sinks.sql.dialect.unique_moves)
        own = tuple(sorted(self.key))
        self.other_uniques: tuple[tuple[str, ...], ...] = tuple(u for u in self.unique_keys if u != own)
        # the target scale each upstream column's values are checked against (None: not checked)
        self.scales: dict[str, int | None] = {c.name: scale_to_check(c, targets[c.name]) for c in schema.columns}
        self.convs: dict[str, Converter | None] = {
            c.name: converter(c, dialect, table=table.label, scale=self.scales[c.name]) for c in schema.columns}
        self._plans: dict[tuple[Any, ...], Plan] = {}
        # fresh rows' direct COPYs that met an existing key (sinks.sql.ops.output): past a few, the table always merges
        self.copy_conflicts = 0
        self._stage_ids = stage_ids
        self._temp_ok = temp_ok
        self.key_convert = row_function(
            len(self.key), {i: c for i, k in enumerate(self.key) if (c := self.convs.get(k)) is not None})

    def plan(self, kind: int, names: tuple[str, ...], extra: tuple[tuple[str, ...], tuple[str, ...]] | None) -> Plan:
        """The cached statement for a group; parameters of one row follow ``names`` (+ ``extra[0]``)."""
        pk = (kind, names, extra)
        p = self._plans.get(pk)
        if p is not None:
            return p
        try:
            d = [self.colmap[n] for n in names]
        except KeyError as exc:
            raise SinkError(f"table {self.label}: change carries column {exc.args[0]!r} unknown to its schema") from None
        s, t = self.stmts, self.table
        build: Callable[[int], str] | None = None
        parts: tuple[str, str] | None = None
        if kind == K_UPSERT:
            sql = s.upsert(t, d)
            build = lambda n: s.upsert(t, d, n)  # noqa: E731
            parts = s.upsert_parts(t, d)
        elif kind == K_INSERT:
            sql = s.insert(t, d)
            build = lambda n: s.insert(t, d, n)  # noqa: E731
            parts = s.insert_parts(t, d)
        elif kind == K_DELETE:
            sql = s.delete_key(t)  # per-key form; the IN-list form is built per batch size
        elif kind == K_DELETE_ONE:
            assert extra is not None
            sql = s.delete_one(t, d, [self.colmap[n] for n in extra[1]])
        else:
            assert extra is not None
            match = [self.colmap[n] for n in extra[0]]
            sql = s.update_one(t, d, match, [self.colmap[n] for n in extra[1]])
            names = names + extra[0]
        if parts is not None and s.ph == "%s":  # no parameters with literal rows: undo the %-doubling
            parts = (parts[0] % (), parts[1] % ())
        convs = {i: c for i, n in enumerate(names) if (c := self.convs.get(n)) is not None}
        key_idx = tuple(names.index(k) for k in self.key) if all(k in names for k in self.key) else ()
        # upstream text is only ever attached to positional rows (names == every column in schema order)
        text_fn = row_function(len(names), convs, with_text=True) if names == self.names else None
        p = Plan(sql, row_function(len(names), convs), key_idx, build, parts, text_fn)
        # COPY sends the upstream text as it is: never for columns whose converter must see every value
        # (values.checks_every_value: a narrower target scale would round silently)
        if s.dialect == "postgresql" and names == self.names and kind in (K_UPSERT, K_INSERT) and not any(
                checks_every_value(c) for c in convs.values()):
            if kind == K_INSERT:
                p.copy = (s.copy_in(s.table(t), d) % (), None, None)
            elif len(d) > len(t.key) and self._temp_ok:  # (a key-only table keeps ON CONFLICT DO NOTHING)
                stage = f"tidewater_stage_{next(self._stage_ids)}"
                p.copy = (s.copy_in(s.q(stage), d) % (), s.stage_table(t, d, stage) % (),
                          s.upsert_from(t, d, stage) % ())
                p.copy_direct = s.copy_in(s.table(t), d) % ()
        self._plans[pk] = p
        return p

