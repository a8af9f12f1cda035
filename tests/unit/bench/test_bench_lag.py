"""bench.lag's per-transaction apply latency and bench.consumers.TargetPosition on a real SQLite position table."""

import sqlite3
from pathlib import Path

import pytest

from bench.consumers import TargetPosition
from bench.lag import ApplyLatencies, PacedWriter
from sinks.sql.target.position import DEFAULT_TABLE

pytestmark = pytest.mark.unit


def _writer(commits: list[tuple[int, float]]) -> PacedWriter:
    w = PacedWriter(None, "db", "t", 1, 1000, 1.0)  # type: ignore[arg-type] - never started
    w.commits = commits
    return w


def test_apply_latency_is_per_transaction_first_seen_applied_minus_its_commit_time() -> None:
    w = _writer([(100, 10.0), (200, 10.5)])
    lat = ApplyLatencies(w)
    lat.observe(None, now=10.2)  # position not known yet: nothing seen
    lat.observe(99, now=10.3)
    assert lat.values == [] and not lat.complete
    lat.observe(150, now=10.4)  # the first one is applied
    lat.observe(150, now=10.6)  # seen again: counted once
    assert lat.values == pytest.approx([0.4])
    w.commits.append((300, 11.0))  # the writer goes on
    lat.observe(300, now=11.25)  # both later ones at once, each against its own commit time
    assert lat.values == pytest.approx([0.4, 0.75, 0.25]) and lat.complete
    lat.observe(1000, now=10.9)
    assert len(lat.values) == 3
    late = ApplyLatencies(_writer([(100, 10.0)]))
    late.observe(100, now=9.9)  # a commit seen applied before the writer's clock read after COMMIT: not negative
    assert late.values == [0.0]


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
