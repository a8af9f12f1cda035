"""``python -m bench --consistency`` (issue 25 item 5): which changefeeds a run creates per mode, their TOML, and the
side-by-side table read back as the smoke test reads it."""

from __future__ import annotations

import tomllib

import pytest

from bench.cli import parse_args
from bench.consistency import consistency_table, variants, with_consistency
from bench.consumers import Measurement
from bench.lag import LagResult


def test_snapshot_variants_only_for_sql_sinks_each_with_a_target_of_its_own() -> None:
    run = variants(["blackhole", "postgresql", "sqlite"], ["default", "snapshot"])
    assert [(v.sink, v.mode, v.label) for v in run] == [
        ("blackhole", "default", "blackhole"), ("postgresql", "default", "postgresql"),
        ("postgresql", "snapshot", "postgresql snapshot"), ("sqlite", "default", "sqlite"),
        ("sqlite", "snapshot", "sqlite snapshot")]
    assert run[1].target_key("ab") == "ab" and run[2].target_key("ab") == "ab_snap"
    assert run[2].target_key("lag_postgresql_snap") == "lag_postgresql_snap"


def test_with_consistency_adds_the_table_and_refuses_a_second_one() -> None:
    cfg = tomllib.loads(with_consistency("[sink]\nworker-count = 1", 0.5))
    assert cfg == {"sink": {"worker-count": 1}, "consistency": {"mode": "snapshot", "interval": 0.5}}
    with pytest.raises(ValueError, match="consistency"):
        with_consistency('[consistency]\nmode = "default"\n', 1.0)


def test_cli_refuses_snapshot_without_a_sql_sink_and_with_a_mariadb_upstream() -> None:
    assert parse_args(["--consistency", "default,snapshot", "--sink", "postgresql"]).consistency == [
        "default", "snapshot"]
    assert parse_args([]).consistency == ["default"]
    for argv in (["--consistency", "snapshot", "--sink", "blackhole"],
                 ["--upstream", "mariadb", "--consistency", "default,snapshot"]):
        with pytest.raises(SystemExit):
            parse_args(argv)


def test_table_puts_the_modes_side_by_side_with_the_interval() -> None:
    run = variants(["postgresql"], ["default", "snapshot"])
    catch_up = {"postgresql": Measurement("tidewater", "postgresql", 1000, seconds=0.5, cpu_s=2.0, target_cpu_s=1.0),
                "postgresql snapshot": Measurement("tidewater", "postgresql", 1000, seconds=1.0, cpu_s=4.0,
                                                   target_cpu_s=3.0)}
    lag = [LagResult("tidewater", "postgresql", 5000, p50=0.1, p99=0.2, apply_p50=0.004, apply_p99=0.01),
           LagResult("tidewater", "postgresql snapshot", 5000, p50=0.1, p99=0.3, apply_p50=0.6, apply_p99=1.2)]
    lines = consistency_table(catch_up, lag, run, 1.0).splitlines()
    assert lines[2] == "| default | postgresql | - | 2000 | 2000.0 | 1000.0 | 5000 | 0.004 | 0.010 | 0.100 | 0.200 |"
    assert lines[3] == "| snapshot | postgresql | 1 | 1000 | 4000.0 | 3000.0 | 5000 | 0.600 | 1.200 | 0.100 | 0.300 |"
