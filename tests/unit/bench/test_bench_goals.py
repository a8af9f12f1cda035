"""bench.report.goals_table: each measured goal of the speed issue with its figure, reference and verdict."""

import re

import pytest

from bench.consumers import Measurement
from bench.lag import LagResult
from bench.report import PhaseReport, Report, format_report, goals_table

pytestmark = pytest.mark.unit


def _m(consumer: str, sink: str, rows: int, seconds: float) -> Measurement:
    return Measurement(consumer, sink, rows, seconds)


def _rows(table: str) -> dict[str, list[str]]:
    out = {}
    for line in table.splitlines()[2:]:
        cells = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line.strip("|"))]
        out[cells[0]] = cells[1:]
    return out


def test_goals_table_computes_each_ratio_from_this_runs_figures() -> None:
    a = PhaseReport("a", "inserts", 1000, recv=_m("pg_recvlogical", "", 1000, 1.0),
                    native=_m("native", "", 1000, 2.0),
                    tidewater={"postgresql": _m("tidewater", "postgresql", 1000, 1.6),
                               "mariadb": _m("tidewater", "mariadb", 1000, 4.0),
                               "blackhole": _m("tidewater", "blackhole", 1000, 1.25)},
                    ceiling={"mariadb": _m("write ceiling", "mariadb", 1000, 1.0)})
    b = PhaseReport("b", "updates", 1000, native=_m("native", "", 1000, 2.0),
                    tidewater={"postgresql": _m("tidewater", "postgresql", 1000, 1.6)})
    lag = [LagResult("native", "postgresql", 10000, p50=0.006, p99=0.013, apply_p50=0.006, apply_p99=0.013),
           LagResult("tidewater", "postgresql", 10000, p50=0.15, p99=0.3, apply_p50=0.007, apply_p99=0.2),
           LagResult("tidewater", "postgresql", 5000, apply_p50=0.5, apply_p99=0.9)]  # not the goal's rate
    rep = Report("now", {}, {}, phases=[a, b], lag=lag)
    rows = _rows(goals_table(rep))
    assert rows["PG -> PG / native logical replication (a)"] == ["1.25", "500", ">= 1", "yes"]
    assert rows["PG -> PG / native logical replication (b)"] == ["1.25", "500", ">= 1.5", "NO"]
    assert rows["PG -> MariaDB / LOAD DATA (a)"] == ["0.25", "1000", ">= 0.5", "NO"]
    assert rows["blackhole / pg_recvlogical (a)"] == ["0.80", "1000", ">= 0.9", "NO"]
    assert rows["apply lag p50 s at 10000 rows/s -> postgresql"] == ["0.007", "0.006", "<= 0.03", "yes"]
    assert rows["apply lag p99 s at 10000 rows/s -> postgresql"] == ["0.200", "0.013", "<= 0.1", "NO"]
    assert len(rows) == 6  # nothing for what this run did not measure (5000 rows/s, memory, copy)
    assert "## Goals of the speed issue" in format_report(rep, ["postgresql", "mariadb", "blackhole"])


def test_a_failed_measurement_gives_no_goal_line() -> None:
    bad = _m("tidewater", "postgresql", 1000, 0.0)
    bad.error = "timed out"
    rep = Report("now", {}, {}, phases=[PhaseReport("a", "inserts", 1000, native=_m("native", "", 1000, 2.0),
                                                    tidewater={"postgresql": bad})])
    assert goals_table(rep) == ""
    assert "## Goals" not in format_report(rep, ["postgresql"])


def test_the_copy_goals_are_against_pg_dump_with_the_targets_own_loader_beside() -> None:
    from bench.snapshot import CopyRun, SnapshotReport

    snap = SnapshotReport(1000, 1, runs=[CopyRun("dump", "postgresql", "pg_dump | psql", 1000, 1.0),
                                         CopyRun("tidewater", "postgresql", "Tidewater -> postgresql", 1000, 1.25),
                                         CopyRun("tidewater", "mariadb", "Tidewater -> mariadb", 1000, 2.0),
                                         CopyRun("ceiling", "mariadb", "write ceiling mariadb", 1000, 0.5)])
    rows = _rows(goals_table(Report("now", {}, {}, snapshot=snap)))
    assert rows["initial copy -> postgresql / pg_dump | psql"] == ["0.80", "1000", ">= 1", "NO"]
    assert rows["initial copy -> mariadb / pg_dump | psql"] == ["0.50", "1000; LOAD DATA 2000 (0.25x)", ">= 0.7", "NO"]
