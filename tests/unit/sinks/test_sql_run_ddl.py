"""sinks.sql.target.connection.Target.run_ddl: a duplicate PostgreSQL reports for an object another session created at the same moment
is success (the copy's tasks writing chunks of one new table: "type "t" already exists" failed a chunk in the full
suite); any other error is raised."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import sqlalchemy as sa

from sinks.sql.target.connection import Target

pytestmark = pytest.mark.unit


class _Conn:
    def __init__(self, code: str) -> None:
        self.code = code

    def exec_driver_sql(self, sql: str, params: Any) -> None:
        raise sa.exc.DBAPIError(sql, params, SimpleNamespace(pgcode=self.code), connection_invalidated=False)


@pytest.fixture
def target() -> Iterator[Target]:
    t = Target("postgresql://u:p@127.0.0.1:1/db")  # never connects: the connection is the fake below
    yield t
    t.close()


@pytest.mark.parametrize("code", ["23505", "42P06", "42P07", "42710"])
def test_an_object_created_concurrently_is_success(target: Target, code: str) -> None:
    target.run_ddl(_Conn(code), "CREATE TABLE IF NOT EXISTS t (id int)")  # type: ignore[arg-type]


def test_any_other_error_is_raised(target: Target) -> None:
    with pytest.raises(sa.exc.DBAPIError):
        target.run_ddl(_Conn("42501"), "CREATE TABLE IF NOT EXISTS t (id int)")  # type: ignore[arg-type]
