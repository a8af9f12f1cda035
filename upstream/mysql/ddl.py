"""The schema changes a MySQL/MariaDB span replicates, parsed from the binlog's QUERY events (issue 23 item 4,
first part).

Understood (everything else that names a replicated table is refused by the span, loudly):

- ``ALTER TABLE t ADD [COLUMN] c <type> [UNSIGNED] [CHARACTER SET x] [COLLATE x] [NULL | NOT NULL]
  [DEFAULT <number> | DEFAULT '<text>' | DEFAULT NULL] [COMMENT '...'] [FIRST | AFTER c2]`` and
  ``ALTER TABLE t DROP [COLUMN] [IF EXISTS] c``, several of them separated by commas, for the types of
  :mod:`upstream.mysql.types`. A NOT NULL column added without a DEFAULT is refused (MySQL fills the existing rows
  with an implicit value Tidewater does not reproduce yet), so is dropping a key column.
- ``ALTER TABLE t MODIFY [COLUMN] c <definition>``, ``CHANGE [COLUMN] old new <definition>`` and ``RENAME COLUMN
  old TO new``: a rename and/or a type change (``alter column type``, applied downstream only where it widens: the
  sinks refuse the rest, skippable, since MySQL converts the existing rows in place and those conversions are not in
  the binlog). A change of a key column's type or name keeps it in the key.
- ``ALTER TABLE t ADD [UNIQUE] {INDEX|KEY} [name] (c, ...)``, ``DROP {INDEX|KEY} name``, and the statements
  ``CREATE [UNIQUE] INDEX name ON t (c, ...)`` / ``DROP INDEX name ON t``: ``create index`` / ``drop index``
  events (replayed downstream with ``[ddl] replicate-indexes``). Refused on a table without a PRIMARY KEY (its key
  may be a unique index, which the change could replace) and for prefix or expression parts.
- ``TRUNCATE [TABLE] t``: ``truncate table`` (its removed rows are not in the binlog).
- ``DROP TABLE [IF EXISTS] t[, t2...]``.
- ``CREATE TABLE`` of a new table (also ``... LIKE other`` and ``... SELECT``): :func:`created_table` names it; the
  span reads its columns from the catalog.

:func:`parse_alter` returns the table's columns after the statement (``catalog.ColumnFacts``) and what changed;
the span turns them into a new schema version and a :class:`cdc.events.DdlEvent`. Pure functions, no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from upstream.mysql import types
from upstream.mysql.catalog import ColumnFacts

_IDENT = r"(?:`(?:[^`]|``)+`|[A-Za-z0-9_$]+)"
_NAME = rf"(?P<name>{_IDENT}(?:\s*\.\s*{_IDENT})?)"
ALTER = re.compile(rf"^\s*ALTER\s+(?:ONLINE\s+|IGNORE\s+)*TABLE\s+{_NAME}\s+(?P<specs>.+?)\s*;?\s*$",
                   re.IGNORECASE | re.DOTALL)
DROP_TABLE = re.compile(r"^\s*DROP\s+(?:TEMPORARY\s+)?TABLE\s+(?:IF\s+EXISTS\s+)?(?P<names>.+?)\s*"
                        r"(?:RESTRICT|CASCADE)?\s*(?:/\*.*\*/)?\s*;?\s*$", re.IGNORECASE | re.DOTALL)
_TYPE = re.compile(r"^(?P<t>[A-Za-z]+)\s*(?:\((?P<args>[^)]*)\))?", re.IGNORECASE)
_ADD = re.compile(rf"^ADD\s+(?:COLUMN\s+)?(?:IF\s+NOT\s+EXISTS\s+)?(?P<col>{_IDENT})\s+(?P<def>.+)$",
                  re.IGNORECASE | re.DOTALL)
_DROP = re.compile(rf"^DROP\s+(?:COLUMN\s+)?(?:IF\s+EXISTS\s+)?(?P<col>{_IDENT})$", re.IGNORECASE)
_MODIFY = re.compile(rf"^MODIFY\s+(?:COLUMN\s+)?(?P<col>{_IDENT})\s+(?P<def>.+)$", re.IGNORECASE | re.DOTALL)
_CHANGE = re.compile(rf"^CHANGE\s+(?:COLUMN\s+)?(?P<old>{_IDENT})\s+(?P<col>{_IDENT})\s+(?P<def>.+)$",
                     re.IGNORECASE | re.DOTALL)
_RENAME_COLUMN = re.compile(rf"^RENAME\s+COLUMN\s+(?P<old>{_IDENT})\s+TO\s+(?P<col>{_IDENT})$", re.IGNORECASE)
_ADD_INDEX = re.compile(rf"^ADD\s+(?P<unique>UNIQUE\s+)?(?:(?:INDEX|KEY)\s+)?(?!PRIMARY\b)(?P<name>{_IDENT})?\s*"
                        rf"\((?P<cols>[^)]*)\)\s*(?:USING\s+\w+\s*)?$", re.IGNORECASE)
_DROP_INDEX = re.compile(rf"^DROP\s+(?:INDEX|KEY)\s+(?:IF\s+EXISTS\s+)?(?P<name>{_IDENT})$", re.IGNORECASE)
TRUNCATE = re.compile(rf"^\s*TRUNCATE\s+(?:TABLE\s+)?{_NAME}\s*;?\s*$", re.IGNORECASE)
CREATE_INDEX = re.compile(rf"^\s*CREATE\s+(?:OR\s+REPLACE\s+)?(?P<unique>UNIQUE\s+)?INDEX\s+(?:IF\s+NOT\s+EXISTS\s+)?"
                          rf"(?P<index>{_IDENT})\s+ON\s+{_NAME}\s*\((?P<cols>[^)]*)\)\s*;?\s*$",
                          re.IGNORECASE)
DROP_INDEX = re.compile(rf"^\s*DROP\s+INDEX\s+(?:IF\s+EXISTS\s+)?(?P<index>{_IDENT})\s+ON\s+{_NAME}\s*;?\s*$",
                        re.IGNORECASE)
CREATE_TABLE = re.compile(rf"^\s*CREATE\s+(?P<replace>OR\s+REPLACE\s+)?(?P<temporary>TEMPORARY\s+)?TABLE\s+"
                          rf"(?:IF\s+NOT\s+EXISTS\s+)?{_NAME}(?P<rest>.*)$", re.IGNORECASE | re.DOTALL)
_LIKE = re.compile(r"^\s*\(?\s*LIKE\b", re.IGNORECASE)
_SELECT = re.compile(r"\bSELECT\b", re.IGNORECASE)
_DEFAULT = re.compile(r"DEFAULT\s+(?P<v>NULL|'(?:[^'\\]|\\.|'')*'|-?[0-9]+(?:\.[0-9]+)?)", re.IGNORECASE)
_POSITION = re.compile(rf"\b(?:FIRST|AFTER\s+(?P<after>{_IDENT}))\s*$", re.IGNORECASE)
_ALLOWED_WORDS = re.compile(
    rf"\s*(?:UNSIGNED|SIGNED|ZEROFILL|NULL|NOT\s+NULL|CHARACTER\s+SET\s+\w+|CHARSET\s+\w+|COLLATE\s+\w+|"
    rf"COMMENT\s+'(?:[^'\\]|\\.|'')*'|FIRST|AFTER\s+{_IDENT})\s*", re.IGNORECASE)


class Unsupported(ValueError):
    """A statement naming a replicated table that this module cannot turn into an exact schema change."""


def unquote(part: str) -> str:
    part = part.strip()
    return part[1:-1].replace("``", "`") if part.startswith("`") else part


def split_name(text: str, default_schema: str) -> tuple[str, str]:
    parts = re.findall(_IDENT, text)
    if len(parts) == 2:
        return unquote(parts[0]), unquote(parts[1])
    return default_schema, unquote(parts[0])


def _split_specs(text: str) -> list[str]:
    """Split on commas outside parentheses and quotes."""
    out, depth, quote, cur = [], 0, "", []
    for ch in text:
        if quote:
            cur.append(ch)
            if ch == quote:
                quote = ""
            continue
        if ch in "'`\"":
            quote = ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append("".join(cur).strip())
            cur = []
            continue
        cur.append(ch)
    out.append("".join(cur).strip())
    return [s for s in out if s]


@dataclass(frozen=True, slots=True)
class Change:
    """One elementary change of a statement (``cdc.events.DdlChange``'s fields): ``kind`` a ``DdlKind`` value,
    ``new_name`` of a column rename, ``index`` = (name, columns, unique) of an index change."""

    kind: str
    column: str | None = None
    new_name: str | None = None
    index: tuple[str, tuple[str, ...], bool] | None = None


def index_columns(text: str) -> tuple[str, ...]:
    """The plain columns of an index's ``(c1, c2 DESC)`` list; Unsupported for prefix or expression parts."""
    cols = []
    for part in _split_specs(text):
        m = re.fullmatch(rf"(?P<c>{_IDENT})(?:\s+(?:ASC|DESC))?", part.strip(), re.IGNORECASE)
        if m is None:
            raise Unsupported(f"index part {part!r} is not a plain column (prefix and expression parts are not "
                              f"replicated)")
        cols.append(unquote(m.group("c")))
    return tuple(cols)


def _same_type(a: ColumnFacts, b: ColumnFacts) -> bool:
    def described(c: ColumnFacts) -> tuple[object, ...]:
        s = types.column_schema(c.name, c.data_type, c.column_type, nullable=True, is_key=False, char_len=c.char_len,
                                precision=c.precision, scale=c.scale, fsp=c.fsp)
        return s.base_type, s.type_name, s.type_modifier
    return described(a) == described(b)


@dataclass(frozen=True, slots=True)
class Added:
    column: str
    fill: str | None  # the text of the value the existing rows got (None: NULL), in the column's text form


def _literal(text: str) -> str | None:
    if text.upper() == "NULL":
        return None
    if text.startswith("'"):
        return text[1:-1].replace("''", "'").replace("\\'", "'")
    return text


def _column(name: str, definition: str) -> tuple[ColumnFacts, str | None, str | None, bool]:
    """(facts, default text or None, AFTER column or '' for FIRST or None, has a DEFAULT) of ``ADD COLUMN``."""
    m = _TYPE.match(definition)
    if m is None:
        raise Unsupported(f"column {name}: cannot read its type in {definition!r}")
    dt = m.group("t").lower()
    dt = {"integer": "int", "numeric": "decimal", "dec": "decimal", "real": "double", "bool": "tinyint",
          "boolean": "tinyint"}.get(dt, dt)
    args = [a.strip() for a in (m.group("args") or "").split(",") if a.strip()]
    rest = definition[m.end():]
    default: str | None = None
    has_default = False
    dm = _DEFAULT.search(rest)
    if dm is not None:
        has_default = True
        default = _literal(dm.group("v"))
        rest = rest[:dm.start()] + " " + rest[dm.end():]
    after: str | None = None
    pm = _POSITION.search(rest.strip())
    if pm is not None:
        after = unquote(pm.group("after")) if pm.group("after") else ""
    leftover = _ALLOWED_WORDS.sub(" ", rest).strip()
    if leftover:
        raise Unsupported(f"column {name}: {leftover!r} in its definition is not understood")
    unsigned = bool(re.search(r"\bUNSIGNED\b", rest, re.IGNORECASE))
    not_null = bool(re.search(r"\bNOT\s+NULL\b", rest, re.IGNORECASE))
    char_len = precision = scale = fsp = None
    if dt in ("char", "varchar", "binary", "varbinary"):
        char_len = int(args[0]) if args else 1
    elif dt == "decimal":
        precision = int(args[0]) if args else 10
        scale = int(args[1]) if len(args) > 1 else 0
    elif dt in ("datetime", "timestamp", "time"):
        fsp = int(args[0]) if args else 0
    column_type = dt + (f"({','.join(args)})" if args else "") + (" unsigned" if unsigned else "")
    facts = ColumnFacts(name, dt, column_type, not not_null, "", char_len, precision, scale, fsp)
    why = facts.refusal()
    if why:
        raise Unsupported(f"column {name}: {why}")
    if dt == "timestamp" and not has_default:
        raise Unsupported(f"column {name}: a TIMESTAMP column added without DEFAULT gets server-dependent values")
    return facts, default, after, has_default


def parse_alter(query: str, columns: tuple[ColumnFacts, ...], key: tuple[str, ...], *, has_primary: bool = True
                ) -> tuple[tuple[ColumnFacts, ...], list[Change], list[Added]]:
    """The columns after ``ALTER TABLE ...`` (whose table has ``columns`` and ``key``; ``has_primary``: its key is
    a PRIMARY KEY), the changes in order and the added columns' fills. Raises :class:`Unsupported`."""
    m = ALTER.match(query)
    if m is None:
        raise Unsupported("not an ALTER TABLE statement")
    cols = list(columns)
    changes: list[Change] = []
    added: list[Added] = []
    for spec in _split_specs(m.group("specs")):
        xm = _ADD_INDEX.match(spec) or _DROP_INDEX.match(spec)
        if xm is not None:
            changes.append(index_change(spec, xm, has_primary, [c.name for c in cols]))
            continue
        if re.match(r"^(?:MODIFY|CHANGE|RENAME\s+COLUMN)\s", spec, re.IGNORECASE):
            cols = _modify(spec, cols, changes)
            continue
        am, dm = _ADD.match(spec), _DROP.match(spec)
        if dm is not None:
            name = unquote(dm.group("col"))
            if name in key:
                raise Unsupported(f"dropping key column {name}")
            if not any(c.name == name for c in cols):
                if re.search(r"\bIF\s+EXISTS\b", spec, re.IGNORECASE):
                    continue
                raise Unsupported(f"column {name} to drop is not in the table")
            cols = [c for c in cols if c.name != name]
            changes.append(Change("drop column", name))
        elif am is not None:
            name = unquote(am.group("col"))
            if any(c.name == name for c in cols):
                if re.search(r"\bIF\s+NOT\s+EXISTS\b", spec, re.IGNORECASE):
                    continue
                raise Unsupported(f"column {name} to add is in the table already")
            facts, default, after, has_default = _column(name, am.group("def"))
            if not facts.nullable and not has_default:
                raise Unsupported(f"column {name} is NOT NULL without a DEFAULT (the existing rows get an implicit "
                                  f"value)")
            if not facts.nullable and default is None and has_default:
                raise Unsupported(f"column {name} is NOT NULL with DEFAULT NULL")
            if after is None:
                cols.append(facts)
            elif after == "":
                cols.insert(0, facts)
            else:
                idx = [c.name for c in cols].index(after) if any(c.name == after for c in cols) else -1
                if idx < 0:
                    raise Unsupported(f"AFTER {after}: no such column")
                cols.insert(idx + 1, facts)
            changes.append(Change("add column", name))
            try:
                types.default_text(facts.data_type, facts.char_len, facts.scale, default)
            except (ValueError, ArithmeticError) as exc:
                raise Unsupported(f"column {name}: {exc}") from exc
            added.append(Added(name, default))
        else:
            raise Unsupported(f"{spec[:80]!r} is not replicated yet (only ADD/DROP/MODIFY/CHANGE/RENAME COLUMN and "
                              f"ADD/DROP INDEX)")
    # renames first: MySQL resolves every clause against the old names, and a sink applies type changes by the new
    # names (the SQL sinks reshape every changed column at the event's first type change)
    changes.sort(key=lambda c: c.kind != "rename column")
    return tuple(cols), changes, added


def index_change(spec: str, m: re.Match[str], has_primary: bool, columns: list[str]) -> Change:
    """The ``create index`` / ``drop index`` change of an index clause or statement ``m``."""
    if not has_primary:
        raise Unsupported("an index change of a table without a PRIMARY KEY (its key is a unique index the change "
                          "may replace)")
    if "cols" not in m.groupdict() or m.group("cols") is None:
        name = unquote(m.group("index") if "index" in m.groupdict() else m.group("name"))
        return Change("drop index", index=(name, (), False))
    cols = index_columns(m.group("cols"))
    missing = [c for c in cols if c not in columns]
    if missing:
        raise Unsupported(f"index on unknown columns {missing}")
    raw = m.group("index") if "index" in m.groupdict() else m.group("name")
    name = unquote(raw) if raw else cols[0]  # MySQL names an unnamed index after its first column
    return Change("create index", index=(name, cols, bool(m.group("unique"))))


def _modify(spec: str, cols: list[ColumnFacts], changes: list[Change]) -> list[ColumnFacts]:
    """MODIFY / CHANGE / RENAME COLUMN: the columns after it (changes appended: rename, then type)."""
    rm = _RENAME_COLUMN.match(spec)
    mm = _MODIFY.match(spec) if rm is None else None
    cm = _CHANGE.match(spec) if rm is None and mm is None else None
    m = rm or mm or cm
    if m is None:
        raise Unsupported(f"{spec[:80]!r} is not understood")
    new_name = unquote(m.group("col"))
    old_name = unquote(m.group("old")) if rm is not None or cm is not None else new_name
    idx = next((i for i, c in enumerate(cols) if c.name == old_name), -1)
    if idx < 0:
        raise Unsupported(f"column {old_name} is not in the table")
    old = cols[idx]
    if new_name != old_name and any(c.name == new_name for c in cols):
        raise Unsupported(f"column {new_name} is in the table already")
    if rm is not None:
        new = ColumnFacts(new_name, old.data_type, old.column_type, old.nullable, old.extra, old.char_len,
                          old.precision, old.scale, old.fsp)
        after: str | None = None
    else:
        new, default, after, has_default = _column(new_name, m.group("def"))
        if "GENERATED" in old.extra.upper():
            raise Unsupported(f"column {old_name} is a generated column (its new expression is not parsed)")
    out = list(cols)
    out[idx] = new
    if after is not None:
        out.pop(idx)
        if after == "":
            out.insert(0, new)
        else:
            pos = next((i for i, c in enumerate(out) if c.name == after), -1)
            if pos < 0:
                raise Unsupported(f"AFTER {after}: no such column")
            out.insert(pos + 1, new)
    if new_name != old_name:
        changes.append(Change("rename column", old_name, new_name))
    if not _same_type(old, new):
        changes.append(Change("alter column type", new_name))
    return out


def truncated_table(query: str, default_schema: str) -> tuple[str, str] | None:
    """The ``(schema, table)`` of ``TRUNCATE [TABLE] t`` (None: not one)."""
    m = TRUNCATE.match(query)
    return None if m is None else split_name(m.group("name"), default_schema)


def index_statement(query: str, default_schema: str, has_primary: bool, columns: list[str] | None = None
                    ) -> tuple[tuple[str, str], Change] | None:
    """The table and change of ``CREATE [UNIQUE] INDEX ... ON t (...)`` / ``DROP INDEX ... ON t`` (None: neither)."""
    m = CREATE_INDEX.match(query) or DROP_INDEX.match(query)
    if m is None:
        return None
    return split_name(m.group("name"), default_schema), index_change(query, m, has_primary, columns or [])


def index_target(query: str, default_schema: str) -> tuple[str, str] | None:
    """The table of an index statement (None: not one)."""
    m = CREATE_INDEX.match(query) or DROP_INDEX.match(query)
    return None if m is None else split_name(m.group("name"), default_schema)


@dataclass(frozen=True, slots=True)
class Created:
    """A ``CREATE TABLE`` statement: the table, how its columns are given (``"columns"``: a definition list,
    ``"like"``: ``LIKE other``, ``"select"``: ``... SELECT``, whose rows follow as row events) and whether it is
    ``CREATE OR REPLACE`` (which drops a table of that name first)."""

    schema: str
    table: str
    how: str
    replace: bool


def created_table(query: str, default_schema: str) -> Created | None:
    """The table a ``CREATE [OR REPLACE] TABLE [IF NOT EXISTS]`` statement creates; None for another statement and
    for ``CREATE TEMPORARY TABLE`` (a session's own table, never in the row binlog)."""
    m = CREATE_TABLE.match(query)
    if m is None or m.group("temporary"):
        return None
    schema, table = split_name(m.group("name"), default_schema)
    rest = m.group("rest")
    how = "like" if _LIKE.match(rest) else "select" if _SELECT.search(rest) else "columns"
    return Created(schema, table, how, bool(m.group("replace")))


def dropped_tables(query: str, default_schema: str) -> list[tuple[str, str]] | None:
    """The ``(schema, table)`` names of ``DROP TABLE ...`` (None: not a DROP TABLE)."""
    m = DROP_TABLE.match(query)
    if m is None:
        return None
    names = re.sub(r"/\*.*?\*/", "", m.group("names"), flags=re.DOTALL)
    return [split_name(n, default_schema) for n in _split_specs(names)]


_RENAME_TABLE = re.compile(r"^\s*RENAME\s+TABLES?\s+(?P<pairs>.+?)\s*;?\s*$", re.IGNORECASE | re.DOTALL)
_RENAME_PAIR = re.compile(rf"^(?P<old>{_IDENT}(?:\s*\.\s*{_IDENT})?)\s+(?:WAIT\s+\d+\s+|NOWAIT\s+)?TO\s+"
                          rf"(?P<new>{_IDENT}(?:\s*\.\s*{_IDENT})?)$", re.IGNORECASE)
_ALTER_RENAME = re.compile(rf"^RENAME\s+(?:TO\s+|AS\s+)?(?P<new>{_IDENT}(?:\s*\.\s*{_IDENT})?)$", re.IGNORECASE)


def renamed_tables(query: str, default_schema: str) -> list[tuple[tuple[str, str], tuple[str, str]]]:
    """``(old, new)`` of each table ``RENAME TABLE a TO b[, c TO d]`` or ``ALTER TABLE a ... RENAME [TO|AS] b``
    renames, in statement order (empty: the statement renames no table)."""
    m = _RENAME_TABLE.match(query)
    if m is not None:
        out = []
        for pair in _split_specs(m.group("pairs")):
            p = _RENAME_PAIR.match(pair)
            if p is not None:
                out.append((split_name(p.group("old"), default_schema), split_name(p.group("new"), default_schema)))
        return out
    m = ALTER.match(query)
    if m is None:
        return []
    for spec in _split_specs(m.group("specs")):
        r = _ALTER_RENAME.match(spec)
        if r is not None and not re.match(r"^RENAME\s+(?:COLUMN|INDEX|KEY)\s", spec, re.IGNORECASE):
            return [(split_name(m.group("name"), default_schema), split_name(r.group("new"), default_schema))]
    return []
