"""The row-by-row compare (playground/compare.py) against a real PostgreSQL source and hand-made SQLite targets:
it must find every kind of difference it claims to (exact numbers and numeric text, array bounds, duplicated
rows of tables with and without a key), so that replication tests ending with it can fail."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg2
import pytest

from playground.compare import compare_tables

pytestmark = pytest.mark.integration


@pytest.fixture
def source(pg_server: Any, pg_database: str) -> Iterator[Any]:
    conn = psycopg2.connect(pg_server.dsn(pg_database))
    conn.autocommit = True
    yield conn
    conn.close()


def target(tmp_path: Path, *statements: str) -> str:
    path = tmp_path / "t.db"
    path.unlink(missing_ok=True)
    with sqlite3.connect(path) as c:
        for s in statements:
            c.execute(s)
    return f"sqlite:///{path}"


def diff(source: Any, table: str, uri: str) -> Any:
    (d,) = compare_tables(source, [f"public.{table}"], uri)
    return d


def test_numbers_are_compared_exactly(source: Any, tmp_path: Path) -> None:
    with source.cursor() as cur:
        cur.execute("CREATE TABLE n (id int PRIMARY KEY, v numeric, f float8);"
                    "INSERT INTO n VALUES (1, 1.50, 0.1), (2, 0.0000001, -0), (3, 12345678901234567890.1234567890123, 1)")
    ddl = "CREATE TABLE n (id INTEGER PRIMARY KEY, v TEXT, f REAL)"
    good = "INSERT INTO n VALUES (1, '1.50', 0.1), (2, '0.0000001', 0.0), (3, '12345678901234567890.1234567890123', 1)"
    assert diff(source, "n", target(tmp_path, ddl, good)).equal  # -0 = 0 (documented)
    for bad, key in [("'1.5'", 1), ("'1.500'", 1), ("1.5", 1)]:  # trailing zeros / a REAL
        d = diff(source, "n", target(tmp_path, ddl, good.replace("'1.50'", bad)))
        assert d.different == [(key,)], bad
    d = diff(source, "n", target(tmp_path, ddl, good.replace("'0.0000001'", "'1E-7'")))
    assert d.different == [(2,)]
    d = diff(source, "n", target(tmp_path, ddl, good.replace("1234567890123'", "1234567890124'")))
    assert d.different == [(3,)]  # beyond 28 digits: Decimal.normalize() would have called these equal
    d = diff(source, "n", target(tmp_path, ddl, good.replace("(1, '1.50', 0.1)", "(1, '1.50', 0.1000001)")))
    assert d.different == [(1,)]  # no float tolerance


def test_a_dropped_lower_bound_is_a_difference(source: Any, tmp_path: Path) -> None:
    with source.cursor() as cur:
        cur.execute("CREATE TABLE a (id int PRIMARY KEY, x int[]);"
                    "INSERT INTO a VALUES (1, '[0:2]={1,2,3}'), (2, '{{1,2},{3,4}}')")
    d = diff(source, "a", target(tmp_path, "CREATE TABLE a (id INTEGER PRIMARY KEY, x TEXT)",
                                 "INSERT INTO a VALUES (1, '[1, 2, 3]'), (2, '[[1, 2], [3, 4]]')"))
    assert d.different == [(1,)] and not d.missing and not d.extra


def test_rows_without_a_key_compare_as_a_multiset(source: Any, tmp_path: Path) -> None:
    with source.cursor() as cur:
        cur.execute("CREATE TABLE k (a int, b text); ALTER TABLE k REPLICA IDENTITY FULL;"
                    "INSERT INTO k VALUES (1, 'x'), (1, 'x'), (2, NULL)")
    ddl = "CREATE TABLE k (a INTEGER, b TEXT)"
    assert diff(source, "k", target(tmp_path, ddl, "INSERT INTO k VALUES (2, NULL), (1, 'x'), (1, 'x')")).equal
    d = diff(source, "k", target(tmp_path, ddl, "INSERT INTO k VALUES (2, NULL), (1, 'x'), (1, 'x'), (1, 'x')"))
    assert d.extra == [((1, "x"), 3)] and not d.missing and (d.source_rows, d.target_rows) == (3, 4)
    d = diff(source, "k", target(tmp_path, ddl, "INSERT INTO k VALUES (2, NULL), (1, 'x')"))
    assert d.missing == [((1, "x"), 2)] and not d.extra


def test_a_key_held_by_two_target_rows_is_a_duplicate(source: Any, tmp_path: Path) -> None:
    with source.cursor() as cur:
        cur.execute("CREATE TABLE d (id numeric PRIMARY KEY, v int); INSERT INTO d VALUES (1.5, 1)")
    # the same key value twice in different text (what a numeric key widened upstream would leave behind)
    d = diff(source, "d", target(tmp_path, "CREATE TABLE d (id TEXT, v INTEGER)",
                                 "INSERT INTO d VALUES ('1.5', 1), ('1.50', 1)"))
    assert d.duplicates == [("1.5",)] and not d.equal and d.target_rows == 2


def test_a_table_missing_downstream_is_a_difference_even_when_empty(source: Any, tmp_path: Path) -> None:
    with source.cursor() as cur:
        cur.execute("CREATE TABLE gone_empty (id int PRIMARY KEY)")
    d = diff(source, "gone_empty", target(tmp_path, "CREATE TABLE other (id INTEGER PRIMARY KEY)"))
    assert d.absent and not d.equal and d.source_rows == 0
    present = diff(source, "gone_empty", target(tmp_path, "CREATE TABLE gone_empty (id INTEGER PRIMARY KEY)"))
    assert present.equal and not present.absent
