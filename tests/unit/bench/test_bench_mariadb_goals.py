"""`python -m bench --upstream mariadb`: issue 23's goals computed from the run's own figures, the references named
as MariaDB's, and the command line's workload rules."""

import re

import pytest

from bench.cli import parse_args
from bench.consumers import Measurement
from bench.report import PhaseReport, Report, format_report, goals_table

pytestmark = pytest.mark.unit


def _m(consumer: str, sink: str, rows: int, seconds: float) -> Measurement:
    return Measurement(consumer, sink, rows, seconds)


def _rows(table: str) -> dict[str, list[str]]:
    out = {}
    for line in table.splitlines()[2:]:
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip("|"))]
        out[cells[0]] = cells[1:]
    return out


def _report() -> Report:
    a = PhaseReport("a", "inserts", 100_000, recv=_m("mariadb-binlog", "", 100_000, 1.0),
                    native=_m("native", "", 100_000, 2.0),
                    tidewater={"blackhole": _m("tidewater", "blackhole", 100_000, 1.25),
                               "mariadb": _m("tidewater", "mariadb", 100_000, 2.5)})
    o = PhaseReport("o", "single-row", 100_000, recv=_m("mariadb-binlog", "", 100_000, 0.5),
                    native=_m("native", "", 100_000, 4.0),
                    tidewater={"blackhole": _m("tidewater", "blackhole", 100_000, 1.6),
                               "mariadb": _m("tidewater", "mariadb", 100_000, 2.0)})
    return Report("now", {}, {}, phases=[a, o], upstream="mariadb")


def test_the_mariadb_goals_are_the_ratios_of_this_runs_figures() -> None:
    rows = _rows(goals_table(_report()))
    assert rows["blackhole / mariadb-binlog (a)"] == ["0.80", "100000", ">= 0.8", "yes"]
    assert rows["MariaDB -> MariaDB / native replica (a)"] == ["0.80", "50000", ">= 1", "NO"]
    assert rows["blackhole / mariadb-binlog (o)"] == ["0.31", "200000", ">= 0.8", "NO"]
    assert rows["MariaDB -> MariaDB / native replica (o)"] == ["2.00", "25000", ">= 1", "yes"]
    assert rows["single-row transactions -> blackhole, rows/s (o)"] == ["62500", "-", ">= 50000", "yes"]
    assert not [k for k in rows if "PG" in k or "pg_" in k], rows  # no PostgreSQL goal from MariaDB's figures
    assert "| goal (issue 23) |" in goals_table(_report())


def test_the_details_name_mariadbs_references() -> None:
    text = format_report(_report(), ["blackhole", "mariadb"])
    assert "mariadb-binlog to /dev/null (read ceiling)" in text and "native MariaDB replica (catch-up)" in text
    assert "pg_recvlogical (read ceiling)" not in text


def test_workloads_per_upstream() -> None:
    assert parse_args(["--upstream", "mariadb"]).workload == ["a", "b", "o"]
    assert parse_args(["--upstream", "mariadb"]).lag_rates == []
    assert parse_args([]).workload == ["a", "b", "c", "e"]
    with pytest.raises(SystemExit):
        parse_args(["--upstream", "mariadb", "--workload", "c"])
    with pytest.raises(SystemExit):
        parse_args(["--workload", "o"])
