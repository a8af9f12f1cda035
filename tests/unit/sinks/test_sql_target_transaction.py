"""sinks.sql.target.connection.Target.transaction, the one frame of the SQL sink's transactions, on a real SQLite
file: the fence runs before the commit and a failing fence commits nothing; a body that rolls back is neither fenced
nor committed; a driver error is the target's classified error naming the label (asked when the error happens), and
the connection is usable again afterwards; any other error passes as it is; a closed target refuses."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from cdc.errors import SinkError
from sinks.sql.target.connection import Target

pytestmark = pytest.mark.unit


@pytest.fixture
def target(tmp_path: Path) -> Iterator[Target]:
    t = Target(f"sqlite:///{tmp_path / 'db.sqlite'}")
    with t.engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE t (id INTEGER PRIMARY KEY)")
    yield t
    t.close()


def _ids(target: Target) -> list[int]:
    with target.engine.connect() as conn:
        return [int(r[0]) for r in conn.exec_driver_sql("SELECT id FROM t ORDER BY id")]


def test_the_fence_runs_inside_the_transaction_right_before_its_commit(target: Target) -> None:
    seen: list[bool] = []
    with target.transaction("t", fence=lambda: seen.append(conn.in_transaction())) as conn:
        conn.exec_driver_sql("INSERT INTO t VALUES (1)")
        assert seen == []
    assert seen == [True]  # fenced once, with the transaction still open
    assert not conn.in_transaction()
    assert _ids(target) == [1]


def test_a_failing_fence_commits_nothing(target: Target) -> None:
    def fence() -> None:
        raise SinkError("fenced")

    with pytest.raises(SinkError, match="fenced"), target.transaction("t", fence=fence) as conn:
        conn.exec_driver_sql("INSERT INTO t VALUES (1)")
    assert _ids(target) == []


def test_a_body_that_rolls_back_is_neither_fenced_nor_committed(target: Target) -> None:
    fenced: list[bool] = []
    with target.transaction("t", fence=lambda: fenced.append(True)) as conn:
        conn.exec_driver_sql("INSERT INTO t VALUES (1)")
        conn.rollback()
    assert fenced == []
    assert _ids(target) == []


def test_a_driver_error_names_the_label_known_when_it_happens_and_rolls_back(target: Target) -> None:
    label = ["before"]
    with pytest.raises(SinkError) as err, target.transaction(lambda: label[0]) as conn:
        conn.exec_driver_sql("INSERT INTO t VALUES (1)")
        label[0] = "main.t"
        conn.exec_driver_sql("INSERT INTO t VALUES (1)")  # duplicate key
    assert "writing table main.t" in err.value.message and "UNIQUE" in err.value.message, err.value
    assert err.value.__cause__ is not None
    assert _ids(target) == []
    with target.transaction("t") as conn:  # the pool's connection works again
        conn.exec_driver_sql("INSERT INTO t VALUES (2)")
    assert _ids(target) == [2]


def test_other_errors_pass_as_they_are_and_roll_back(target: Target) -> None:
    with pytest.raises(KeyError), target.transaction("t") as conn:
        conn.exec_driver_sql("INSERT INTO t VALUES (1)")
        raise KeyError("x")
    assert _ids(target) == []


def test_a_closed_target_refuses(target: Target) -> None:
    target.close()
    with pytest.raises(SinkError, match="closed"), target.transaction("t"):
        pass
