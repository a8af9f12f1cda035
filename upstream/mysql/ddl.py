"""The schema changes a MySQL/MariaDB span replicates, parsed from the binlog's QUERY events (issue 23 item 4,
first part).

Understood (everything else that names a replicated table is refused by the span, loudly):

- ``ALTER TABLE t ADD [COLUMN] c <type> [UNSIGNED] [CHARACTER SET x] [COLLATE x] [NULL | NOT NULL]
  [DEFAULT <number> | DEFAULT '<text>' | DEFAULT NULL] [COMMENT '...'] [FIRST | AFTER c2]`` and
  ``ALTER TABLE t DROP [COLUMN] [IF EXISTS] c``, several of them separated by commas, for the types of
  :mod:`upstream.mysql.types`. A NOT NULL column added without a DEFAULT is refused (MySQL fills the existing rows
  with an implicit value Tidewater does not reproduce yet), so is dropping a key column.
- ``DROP TABLE [IF EXISTS] t[, t2...]``.

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


def parse_alter(query: str, columns: tuple[ColumnFacts, ...], key: tuple[str, ...]
                ) -> tuple[tuple[ColumnFacts, ...], list[tuple[str, str]], list[Added]]:
    """The columns after ``ALTER TABLE ...`` (whose table has ``columns`` and ``key``), the changes in order
    (``("add column" | "drop column", column)``) and the added columns' fills. Raises :class:`Unsupported`."""
    m = ALTER.match(query)
    if m is None:
        raise Unsupported("not an ALTER TABLE statement")
    cols = list(columns)
    changes: list[tuple[str, str]] = []
    added: list[Added] = []
    for spec in _split_specs(m.group("specs")):
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
            changes.append(("drop column", name))
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
            changes.append(("add column", name))
            try:
                types.default_text(facts.data_type, facts.char_len, facts.scale, default)
            except (ValueError, ArithmeticError) as exc:
                raise Unsupported(f"column {name}: {exc}") from exc
            added.append(Added(name, default))
        else:
            raise Unsupported(f"{spec[:80]!r} is not replicated yet (only ADD COLUMN and DROP COLUMN)")
    return tuple(cols), changes, added


def dropped_tables(query: str, default_schema: str) -> list[tuple[str, str]] | None:
    """The ``(schema, table)`` names of ``DROP TABLE ...`` (None: not a DROP TABLE)."""
    m = DROP_TABLE.match(query)
    if m is None:
        return None
    names = re.sub(r"/\*.*?\*/", "", m.group("names"), flags=re.DOTALL)
    return [split_name(n, default_schema) for n in _split_specs(names)]
