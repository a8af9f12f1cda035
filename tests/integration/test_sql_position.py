"""Exactly-once delivery (sinks.sql.target.position) against SQLite, MariaDB and PostgreSQL: the applied position
commits with the rows, a replay skips what the target holds (no duplicates in a table without a key), a
second writer of the same span is refused, remove forgets, and at-least-once stores nothing."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from cdc.config import SinkConfig
from cdc.errors import LeaseLost, SinkUnavailable
from cdc.events import ColumnSchema, OpType, RowChange, TableName, TableSchema
from playground.compare import sqlalchemy_url
from sinks.factory import open_sink
from sinks.sql.sink import SQLSink

pytestmark = pytest.mark.integration

LOG = TableSchema(TableName("public", "log"),
                  (ColumnSchema("a", 0, "int4", nullable=True), ColumnSchema("b", 0, "text", nullable=True)),
                  ("a", "b"), has_key=False)


def txn(ts: int, *rows: tuple[int, str], deletes: tuple[tuple[int, str], ...] = ()) -> list[RowChange]:
    out = [RowChange(OpType.INSERT, LOG, ts, float(ts), values={"a": a, "b": b}) for a, b in rows]
    out += [RowChange(OpType.DELETE, LOG, ts, float(ts), old_values={"a": a, "b": b}) for a, b in deletes]
    return out


@dataclass
class Target:
    kind: str
    uri: str

    def sink(self, **config: Any) -> SQLSink:
        s = open_sink(self.uri, SinkConfig(**config))
        assert isinstance(s, SQLSink)
        s.check()
        return s

    def query(self, sql: str) -> list[tuple[Any, ...]]:
        engine = sa.create_engine(sqlalchemy_url(self.uri))
        try:
            with engine.connect() as conn:
                return [tuple(r) for r in conn.exec_driver_sql(sql)]
        finally:
            engine.dispose()

    @property
    def checkpoint_table(self) -> str:
        return "tidewater.tidewater_checkpoint" if self.kind == "postgresql" else "tidewater_checkpoint"

    @property
    def log_table(self) -> str:
        return "public.log" if self.kind == "postgresql" else "log"

    def rows(self) -> list[tuple[Any, ...]]:
        return sorted(self.query(f"SELECT a, b FROM {self.log_table}"))

    def positions(self) -> list[tuple[Any, ...]]:
        return sorted(self.query(f"SELECT changefeed, span, commit_ts, origin_ts FROM {self.checkpoint_table}"))


@pytest.fixture(params=["sqlite", "mariadb", "postgresql"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Target]:
    if request.param == "sqlite":
        yield Target("sqlite", f"sqlite:///{tmp_path / 'target.db'}")
    elif request.param == "mariadb":
        server = request.getfixturevalue("mariadb_server")
        yield Target("mariadb", server.uri(request.getfixturevalue("mariadb_database")))
    else:
        server = request.getfixturevalue("pg_server")
        db = request.getfixturevalue("pg_database")
        yield Target("postgresql", server.uri(db))
        server.execute("DROP SCHEMA IF EXISTS tidewater CASCADE", db=db)


def test_replay_skips_what_the_target_holds(target: Target) -> None:
    sink = target.sink()
    assert sink.open_position("cf", 0, origin=5) == 0
    assert sink.write(txn(10, (1, "x"), (1, "x")) + txn(20, (2, "y"))) == 3
    assert sink.write(txn(30, (3, "z"), deletes=((1, "x"),))) == 2
    sink.close()
    assert target.positions() == [("cf", 0, 30, 5)]
    # a restarted span replays from an older checkpoint (crash between the commit and the etcd write)
    sink = target.sink()
    assert sink.open_position("cf", 0, origin=5) == 30
    assert sink.write(txn(10, (1, "x"), (1, "x")) + txn(20, (2, "y"))) == 0
    assert sink.write(txn(30, (3, "z"), deletes=((1, "x"),)) + txn(40, (4, "w"))) == 1
    sink.close()
    assert target.rows() == [(1, "x"), (2, "y"), (3, "z"), (4, "w")]
    assert target.positions() == [("cf", 0, 40, 5)]


def test_position_commits_with_the_rows(target: Target) -> None:
    sink = target.sink()
    sink.open_position("cf", 1, origin=5)
    sink.write(txn(10, (1, "x")))

    def refuse() -> None:
        raise LeaseLost("fenced")

    with pytest.raises(LeaseLost):
        sink.write(txn(20, (2, "y")), refuse)
    assert target.positions() == [("cf", 1, 10, 5)]
    assert target.rows() == [(1, "x")]
    sink.write(txn(20, (2, "y")))
    sink.close()
    assert target.rows() == [(1, "x"), (2, "y")]
    assert target.positions() == [("cf", 1, 20, 5)]


def test_second_writer_of_a_span_is_refused(target: Target) -> None:
    old, new = target.sink(), target.sink()
    old.open_position("cf", 0, origin=5)
    new.open_position("cf", 0, origin=5)
    new.write(txn(10, (1, "x")))
    with pytest.raises(SinkUnavailable, match="another writer advanced this span"):
        old.write(txn(10, (1, "x")))  # a frozen capture that woke up after its successor wrote
    old.close()
    new.close()
    assert target.rows() == [(1, "x")]


def test_earlier_changefeed_with_the_same_id_is_not_trusted(target: Target) -> None:
    sink = target.sink()
    sink.open_position("cf", 0, origin=5)
    sink.write(txn(100, (1, "x")))
    sink.close()
    sink = target.sink()
    assert sink.open_position("cf", 0, origin=7) == 0  # recreated: a new slot, a new origin
    assert sink.write(txn(50, (2, "y"))) == 1
    sink.close()
    assert target.positions() == [("cf", 0, 50, 7)]


def test_forget_and_at_least_once(target: Target) -> None:
    sink = target.sink()
    assert sink.forget("cf") == 0  # no table yet
    sink.open_position("cf", 0)
    sink.open_position("cf", 1)
    sink.open_position("other", 0)
    assert sink.forget("cf") == 2
    sink.close()
    assert [p[0] for p in target.positions()] == ["other"]
    sink = target.sink(delivery="at-least-once")
    assert sink.open_position("again", 0) == 0
    sink.write(txn(10, (9, "q")))
    sink.write(txn(10, (9, "q")))  # at-least-once: a replay duplicates rows of a key-less table
    sink.close()
    assert [p[0] for p in target.positions()] == ["other"]
    assert target.rows() == [(9, "q"), (9, "q")]


def test_configured_table_name(target: Target) -> None:
    sink = target.sink(checkpoint_table="cdc_positions")
    sink.open_position("cf", 3, origin=1)
    sink.write(txn(10, (1, "x")))
    sink.close()
    table = "tidewater.cdc_positions" if target.kind == "postgresql" else "cdc_positions"
    assert target.query(f"SELECT changefeed, span, commit_ts FROM {table}") == [("cf", 3, 10)]
