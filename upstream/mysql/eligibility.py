"""Which MySQL/MariaDB tables can be replicated without harm: the checks behind ``changefeed create``.

A table is refused (``TableNotEligible``, every table with its fix in one message) when it has no primary key and
no unique index on NOT NULL columns (the binlog's rows could not be matched downstream by key), or when a column
has a type or kind whose values are not replicated exactly yet (:func:`upstream.mysql.types.column_refusal`).
Identifiers in messages are quoted as in MySQL.
"""

from __future__ import annotations

from typing import Any

from cdc.errors import InvalidArgument, TableNotEligible
from cdc.events import TableName, TableSchema
from upstream.mysql.catalog import TableFacts, list_tables, table_facts


def quote(name: TableName) -> str:
    return ".".join("`" + p.replace("`", "``") + "`" for p in (name.schema, name.table))


def problems_of(facts: TableFacts) -> list[str]:
    """Every reason ``facts``' table cannot be replicated, each with its fix."""
    out: list[str] = []
    t = quote(facts.name)
    if not facts.key:
        out.append(
            f"{t} has no primary key and no unique index on NOT NULL columns, so its rows cannot be matched "
            f"downstream: add one (ALTER TABLE {t} ADD PRIMARY KEY (<columns>)), or exclude the table with the "
            f"filter")
    for c in facts.columns:
        why = c.refusal()
        if why:
            out.append(f"{t} column `{c.name}`: {why}; exclude the table with the filter")
    return out


def check_tables(conn: Any, where: str, tables: list[TableName]) -> tuple[list[TableSchema], list[TableFacts]]:
    """The schemas (and facts) of ``tables`` in order; ``InvalidArgument`` naming missing tables, then
    ``TableNotEligible`` listing every problem of every table."""
    missing: list[str] = []
    facts: list[TableFacts] = []
    existing: dict[str, set[str]] = {}
    for t in tables:
        names = existing.get(t.schema)
        if names is None:
            names = existing[t.schema] = {n.table for n in list_tables(conn, where, t.schema)}
        if t.table not in names:
            missing.append(quote(t))
    if missing:
        raise InvalidArgument(f"table(s) not found in MySQL {where}: {', '.join(missing)}")
    problems: list[str] = []
    for t in tables:
        f = table_facts(conn, where, t)
        facts.append(f)
        problems += problems_of(f)
    if problems:
        raise TableNotEligible("cannot replicate: " + "; ".join(problems))
    return [f.schema() for f in facts], facts
