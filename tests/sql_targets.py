"""A SQL target of the integration tests (MariaDB, PostgreSQL or SQLite), shared by the sink test files."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Any

import pytest

KINDS = ("mariadb", "postgresql", "sqlite")


@dataclass
class SqlTarget:
    kind: str  # "mariadb", "postgresql" or "sqlite"
    server: Any
    db: str

    @property
    def uri(self) -> str:
        return f"sqlite:///{self.db}" if self.kind == "sqlite" else str(self.server.uri(self.db))

    def qualified(self, table: str) -> str:
        return {"mariadb": f"`{table}`", "postgresql": f'"public"."{table}"', "sqlite": f'"{table}"'}[self.kind]

    def tables(self) -> set[str]:
        """The target's tables (PostgreSQL: of schema ``public``)."""
        if self.kind == "sqlite":
            sql = "SELECT name FROM sqlite_master WHERE type = 'table'"
        elif self.kind == "mariadb":
            sql = "SELECT table_name FROM information_schema.tables WHERE table_schema = DATABASE()"
        else:
            sql = "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
        return {r[0] for r in self.execute(sql)}

    def execute(self, sql: str) -> list[tuple[Any, ...]]:
        if self.kind == "sqlite":
            conn = sqlite3.connect(self.db)
            try:
                rows = conn.execute(sql).fetchall()
                conn.commit()
                return rows
            finally:
                conn.close()
        return [tuple(r) for r in self.server.execute(sql, db=self.db) or []]


def make_target(cls: type[SqlTarget], request: pytest.FixtureRequest, tmp_path: Any) -> Any:
    """``cls`` for the fixture's parameter (one of :data:`KINDS`), on the session's servers."""
    if request.param == "mariadb":
        return cls("mariadb", request.getfixturevalue("mariadb_server"), request.getfixturevalue("mariadb_database"))
    if request.param == "postgresql":
        return cls("postgresql", request.getfixturevalue("pg_server"), request.getfixturevalue("pg_database"))
    return cls("sqlite", None, str(tmp_path / "target.db"))
