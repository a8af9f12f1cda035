"""The downstream schema compare (playground/compare_schema.py) on real MariaDB, PostgreSQL and SQLite targets:
a table the sink creates is equal to the mapping of its upstream schema, and a hand-made table whose column
type, nullability, default, columns or primary key differ is reported with each difference, so that the DDL
tests ending with it can fail."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg2
import pytest

from cdc.config import SinkConfig
from cdc.events import OpType, RowChange, TableName
from playground.compare_schema import SchemaDiff, compare_schemas, target_columns
from sinks.factory import open_sink
from tests.sql_targets import SqlTarget, make_target
from upstream.postgres import catalog

pytestmark = pytest.mark.integration

UPSTREAM = ("CREATE TABLE s (id int PRIMARY KEY, k text NOT NULL, a varchar(20) DEFAULT 'x', n int, gone int, "
            "j jsonb, at timestamptz)")
# the downstream table by hand: n retyped, k NOT NULL, a default on a, gone missing, extra added, no key
BY_HAND = {
    "mariadb": "CREATE TABLE s (id INT NOT NULL, k LONGTEXT NOT NULL, a VARCHAR(20) DEFAULT 'x', n BIGINT, "
               "j JSON, at DATETIME(6), extra INT) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_nopad_bin",
    "postgresql": "CREATE TABLE public.s (id integer NOT NULL, k text NOT NULL, a varchar(20) DEFAULT 'x', "
                  "n bigint, j jsonb, at timestamptz, extra int)",
    "sqlite": "CREATE TABLE s (id INTEGER NOT NULL, k TEXT NOT NULL, a TEXT DEFAULT 'x', n BIGINT, j TEXT, "
              "at DATETIME, extra INTEGER)",
}


@pytest.fixture(params=["mariadb", "postgresql", "sqlite"])
def target(request: pytest.FixtureRequest, tmp_path: Any) -> SqlTarget:
    return make_target(SqlTarget, request, tmp_path)


@pytest.fixture
def source(pg_server: Any) -> Iterator[Any]:
    name = f"src_{uuid.uuid4().hex[:12]}"
    pg_server.create_database(name)
    conn = psycopg2.connect(pg_server.dsn(name))
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(UPSTREAM)
    yield conn
    conn.close()
    pg_server.drop_database(name)


def _one(source: Any, target: SqlTarget) -> SchemaDiff:
    (d,) = compare_schemas(source, ["public.s"], target.uri)
    return d


def test_a_table_the_sink_creates_is_the_mapping_of_its_upstream_schema(source: Any, target: SqlTarget) -> None:
    schema = catalog.table_schema(source, TableName("public", "s"))
    sink = open_sink(target.uri, SinkConfig())
    try:
        sink.write([RowChange(OpType.INSERT, schema, 10, values={"id": 1, "k": "k", "a": "x"})])
    finally:
        sink.close()
    d = _one(source, target)
    assert d.equal and d.target == ("public.s" if target.kind == "postgresql" else "s"), d
    assert target_columns(target.uri, "public.s") == ["id", "k", "a", "n", "gone", "j", "at"]
    # the upstream changes, the target does not: each change is a difference
    with source.cursor() as cur:
        cur.execute("ALTER TABLE s ALTER COLUMN n TYPE bigint, ADD COLUMN later int")
    want = ["columns missing downstream: ['later']"]
    if target.kind != "sqlite":  # SQLite declares int4 and int8 INTEGER: the retype changes nothing there
        want.append("column 'n': type " + {"mariadb": "'int(11)' downstream, 'bigint(20)' as mapped",
                                           "postgresql": "'integer' downstream, 'bigint' as mapped"}[target.kind])
    assert sorted(_one(source, target).problems) == sorted(want)


def test_every_kind_of_difference_is_reported(source: Any, target: SqlTarget) -> None:
    target.execute(BY_HAND[target.kind])
    problems = _one(source, target).problems
    n_type = {"mariadb": "'bigint(20)' downstream, 'int(11)' as mapped",
              "postgresql": "'bigint' downstream, 'integer' as mapped",
              "sqlite": "'BIGINT' downstream, 'INTEGER' as mapped"}[target.kind]
    assert sorted(problems) == sorted([
        "columns missing downstream: ['gone']",
        "columns only downstream: ['extra']",
        f"column 'n': type {n_type}",
        "column 'k': NOT NULL downstream, nullable as mapped",
        "column 'a': default " + repr("'x'::character varying" if target.kind == "postgresql" else "'x'")
        + " downstream (the mapping copies none)",
        "primary key [] downstream, ['id'] as mapped",
    ]), problems


def test_a_key_of_other_columns_or_order_and_a_missing_table_are_reported(source: Any, target: SqlTarget) -> None:
    with source.cursor() as cur:
        cur.execute("CREATE TABLE two (a int, b int, v text, PRIMARY KEY (a, b))")
    ddl = {"mariadb": "CREATE TABLE two (a INT NOT NULL, b INT NOT NULL, v LONGTEXT, PRIMARY KEY (b, a)) "
                      "ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_nopad_bin",
           "postgresql": "CREATE TABLE public.two (a integer NOT NULL, b integer NOT NULL, v text, PRIMARY KEY (b, a))",
           "sqlite": "CREATE TABLE two (a INTEGER NOT NULL, b INTEGER NOT NULL, v TEXT, PRIMARY KEY (b, a))"}
    target.execute(ddl[target.kind])
    two, s = compare_schemas(source, ["public.two", "public.s"], target.uri)
    assert two.problems == ["primary key ['b', 'a'] downstream, ['a', 'b'] as mapped"], two
    assert s.problems == [f"table {s.target} missing downstream"], s
    if target.kind == "mariadb":  # a collation other than the sink's binary NO PAD one is another type
        target.execute("ALTER TABLE two MODIFY v LONGTEXT COLLATE utf8mb4_general_ci, DROP PRIMARY KEY, "
                       "ADD PRIMARY KEY (a, b)")
        (two,) = compare_schemas(source, ["public.two"], target.uri)
        assert len(two.problems) == 1 and "utf8mb4_general_ci" in two.problems[0], two
