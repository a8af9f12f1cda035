"""Fakes for SQL sink unit tests that look at what reaches the driver, without a server."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any


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
