"""sinks.sql.catalog.run_ddl: a duplicate PostgreSQL reports for an object another session created at the same moment
is success (the copy's tasks writing chunks of one new table: "type "t" already exists" failed a chunk in the full
suite); any other error is raised."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import sqlalchemy as sa

from sinks.sql.catalog import run_ddl

pytestmark = pytest.mark.unit


class _Conn:
    def __init__(self, code: str) -> None:
        self.code = code

    def exec_driver_sql(self, sql: str, params: Any) -> None:
        raise sa.exc.DBAPIError(sql, params, SimpleNamespace(pgcode=self.code), connection_invalidated=False)


_SINK: Any = SimpleNamespace(_where=lambda: "PostgreSQL at test")


@pytest.mark.parametrize("code", ["23505", "42P06", "42P07", "42710"])
def test_an_object_created_concurrently_is_success(code: str) -> None:
    run_ddl(_SINK, _Conn(code), "CREATE TABLE IF NOT EXISTS t (id int)")  # type: ignore[arg-type]


def test_any_other_error_is_raised() -> None:
    with pytest.raises(sa.exc.DBAPIError):
        run_ddl(_SINK, _Conn("42501"), "CREATE TABLE IF NOT EXISTS t (id int)")  # type: ignore[arg-type]
