"""bench.lag's apply lag (native's definition) and bench.consumers.TargetPosition on a real SQLite position table."""

import sqlite3
from pathlib import Path

import pytest

from bench.consumers import TargetPosition
from bench.lag import PacedWriter, apply_lag
from sinks.sql.target.position import DEFAULT_TABLE

pytestmark = pytest.mark.unit


def _writer(commits: list[tuple[int, float]]) -> PacedWriter:
    w = PacedWriter(None, "db", "t", 1, 1000, 1.0)  # type: ignore[arg-type] - never started
    w.commits = commits
    return w


def test_apply_lag_is_now_minus_the_commit_time_of_the_last_applied_transaction() -> None:
    w = _writer([(100, 10.0), (200, 10.5), (300, 11.0)])
    assert apply_lag(w, 250, now=12.0, caught_up_at=9.0) == pytest.approx(1.5)  # 200 is the last one at or below
    assert apply_lag(w, 300, now=12.0, caught_up_at=9.0) == pytest.approx(1.0)
    assert apply_lag(w, 99, now=12.0, caught_up_at=9.0) == pytest.approx(3.0)  # none applied: since writing began
    assert apply_lag(_writer([]), 500, now=12.0, caught_up_at=9.0) is None


def test_target_position_reads_the_lowest_span_position_once_every_span_has_one(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "t.db", isolation_level=None)
    pos = TargetPosition(conn, "sqlite", "cf", spans=2)
    assert pos() is None  # no table yet: the sink has not written
    conn.execute(f"CREATE TABLE {DEFAULT_TABLE} (changefeed TEXT, span INT, commit_ts INT)")
    conn.execute(f"INSERT INTO {DEFAULT_TABLE} VALUES ('cf', 0, 500), ('other', 0, 1)")
    assert pos() is None  # span 1 has no row yet
    conn.execute(f"INSERT INTO {DEFAULT_TABLE} VALUES ('cf', 1, 400)")
    assert pos() == 400
    conn.execute(f"UPDATE {DEFAULT_TABLE} SET commit_ts = 900 WHERE span = 1")
    assert pos() == 500
    pos.close()
