"""Apply order against real MariaDB and PostgreSQL targets: key swaps and rotations, key changes mixed with
inserts and deletes of the same keys, tables without a key (tests/sql_apply_scenarios.py), foreign keys
between target tables, multi-table TRUNCATE, ON UPDATE CASCADE, and rows missing downstream. Every test
ends comparing the target's rows with the expected rows."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from cdc.config import SinkConfig
from cdc.events import OpType, RowChange
from sinks.factory import open_sink
from sinks.sql.sink import SQLSink
from tests.sql_apply_scenarios import SCENARIOS, Scenario

pytestmark = pytest.mark.integration


@dataclass
class Target:
    kind: str  # "mariadb", "postgresql" or "sqlite"
    server: Any
    db: str

    @property
    def uri(self) -> str:
        if self.kind == "sqlite":
            return f"sqlite:///{self.db}"
        return str(self.server.uri(self.db))

    def sink(self, batch_rows: int = 1000, txn_rows: int = 20000) -> SQLSink:
        s = open_sink(self.uri, SinkConfig(batch_rows=batch_rows, txn_rows=txn_rows))
        assert isinstance(s, SQLSink)
        return s

    def qualified(self, name: str) -> str:
        if self.kind == "postgresql":
            return f'"public"."{name}"'
        return f"`{name}`" if self.kind == "mariadb" else f'"{name}"'

    def execute(self, sql: str) -> list[tuple[Any, ...]]:
        if self.kind == "sqlite":
            import sqlite3

            conn = sqlite3.connect(self.db)
            try:
                rows = conn.execute(sql).fetchall()
                conn.commit()
                return rows
            finally:
                conn.close()
        return [tuple(r) for r in self.server.execute(sql, db=self.db) or []]

    def rows(self, name: str, cols: str = "*") -> list[tuple[Any, ...]]:
        return sorted(self.execute(f"SELECT {cols} FROM {self.qualified(name)}"))


@pytest.fixture(params=["mariadb", "postgresql", "sqlite"])
def target(request: pytest.FixtureRequest, tmp_path: Any) -> Target:
    if request.param == "mariadb":
        return Target("mariadb", request.getfixturevalue("mariadb_server"), request.getfixturevalue("mariadb_database"))
    if request.param == "postgresql":
        return Target("postgresql", request.getfixturevalue("pg_server"), request.getfixturevalue("pg_database"))
    return Target("sqlite", None, str(tmp_path / "target.db"))


@pytest.fixture
def sink(target: Target) -> Iterator[SQLSink]:
    s = target.sink()
    s.check()
    yield s
    s.close()


@pytest.mark.parametrize("sc", SCENARIOS, ids=lambda s: s.name)
def test_scenario_in_one_write(target: Target, sink: SQLSink, sc: Scenario) -> None:
    sink.write([RowChange(OpType.INSERT, sc.table, 1, values=dict(r)) for r in sc.before])
    sink.write(sc.changes)
    assert target.rows(sc.table.name.table, "id, v, big") == sc.after
    assert sink.take_warnings() == []
