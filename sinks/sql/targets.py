"""What ``changefeed create`` asks of an SQL target before the initial copy: which target tables already hold
rows, and emptying them (``[snapshot] on-existing-rows``). Names follow the sink's routing
(:meth:`sinks.sql.sink.SQLSink.target_name`); a table is found as the sink finds it when it writes (exact name on
PostgreSQL, case-insensitively on MySQL/MariaDB and SQLite). Not on the hot path: one catalog read per target
schema and one ``SELECT 1 ... LIMIT 1`` per existing table.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from cdc.errors import TidewaterError
from cdc.events import TableName

if TYPE_CHECKING:
    from sinks.sql.sink import SQLSink


def _existing(sink: SQLSink, conn: Any, tables: Sequence[TableName]) -> list[tuple[TableName, str]]:
    """``(table, quoted target)`` of those ``tables`` whose target exists."""
    q = conn.dialect.identifier_preparer.quote
    names: dict[str | None, dict[str, str]] = {}
    out = []
    for t in tables:
        schema, name = sink._target_parts(t)
        if schema not in names:
            found = sa.inspect(conn).get_table_names(schema=schema)
            fold = sink.dialect != "postgresql"
            names[schema] = {(n.casefold() if fold else n): n for n in found}
        actual = names[schema].get(name.casefold() if sink.dialect != "postgresql" else name)
        if actual is not None:
            out.append((t, f"{q(schema)}.{q(actual)}" if schema else q(actual)))
    return out


def tables_with_rows(sink: SQLSink, tables: Sequence[TableName]) -> list[TableName]:
    try:
        with sink._engine.connect() as conn:
            return [t for t, target in _existing(sink, conn, tables)
                    if conn.exec_driver_sql(f"SELECT 1 FROM {target} LIMIT 1").first() is not None]
    except Exception as exc:
        if isinstance(exc, TidewaterError):
            raise
        raise sink._wrap(exc, None) from exc


def truncate_targets(sink: SQLSink, tables: Sequence[TableName]) -> None:
    try:
        with sink._engine.begin() as conn:  # one transaction
            targets = [target for _, target in _existing(sink, conn, tables)]
            if sink.dialect == "postgresql" and targets:  # one statement: foreign keys among them do not refuse it
                conn.exec_driver_sql(f"TRUNCATE {', '.join(targets)}")
            else:  # (InnoDB refuses TRUNCATE of a referenced table; SQLite has none)
                for target in targets:
                    conn.exec_driver_sql(f"DELETE FROM {target}")
    except Exception as exc:
        if isinstance(exc, TidewaterError):
            raise
        raise sink._wrap(exc, None) from exc
