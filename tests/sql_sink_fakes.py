"""Fakes for SQL sink unit tests that look at what reaches the driver, without a server."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from cdc.events import TableSchema
from sinks.sql.dialect.typemap import plan_table
from sinks.sql.sink import SQLSink
from sinks.sql.target.binding import KnownTable


class FakeCursor:
    """Records what the writer sends; ``connection`` is enough of PyMySQL's for the literal renderer."""

    def __init__(self) -> None:
        import pymysql.converters

        self.calls: list[tuple[str, str, Any]] = []
        self.rowcount = 1
        self.connection = SimpleNamespace(
            server_status=0, escape=lambda v: pymysql.converters.escape_item(v, "utf8mb4"))

    def execute(self, sql: str, params: Any = None) -> None:
        self.calls.append(("execute", sql, params))

    def executemany(self, sql: str, params: Any) -> None:
        self.calls.append(("executemany", sql, list(params)))

    def fetchone(self) -> Any:
        return (1,)

    def fetchall(self) -> list[Any]:
        return []

    def close(self) -> None:
        pass


URIS = {"sqlite": "sqlite:///unused.db", "mysql": "mysql://u:p@127.0.0.1:1/db",
        "postgresql": "postgresql://u:p@127.0.0.1:1/db"}


def assume_tables(sink: SQLSink, dialect: str, *schemas: TableSchema, target_name: str | None = None) -> None:
    """Register ``schemas`` with ``sink`` as tables that already exist downstream (no catalog, no DDL)."""
    tschema = "public" if dialect == "postgresql" else None
    for s in schemas:
        name = target_name or s.name.table
        planned = plan_table(s, dialect, target_schema=tschema, target_name=name)
        # no foreign keys to read (tests add edges with sink.catalog.fk.add)
        sink.catalog.assume(KnownTable(name, planned.schema, planned.name, planned.columns,
                                       [frozenset(planned.key)] if planned.key else [], created=True))


def fake_connection(cur: Any) -> Any:
    """Enough of a SQLAlchemy connection for ``Writer``: its DB-API cursor is ``cur``."""
    return SimpleNamespace(connection=SimpleNamespace(dbapi_connection=SimpleNamespace(cursor=lambda: cur)))
