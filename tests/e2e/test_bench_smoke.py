"""Smoke test of the benchmark command (issue 4): `python -m bench --quick` runs end to end on a tiny
workload, prints its result tables with a figure for Tidewater and for every reference, and stops every
server it started. Benchmark *values* are not asserted (they are not test material); only that each
figure exists and is positive.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]


def _table(text: str, header_start: str) -> list[dict[str, str]]:
    """The Markdown table whose header line starts with ``header_start``, as dicts keyed by column."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    cols = [c.strip() for c in lines[start].strip("|").split("|")]
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append(dict(zip(cols, (c.strip() for c in line.strip("|").split("|")), strict=True)))
    return rows


def _number(row: dict[str, str], *cols: str) -> None:
    for col in cols:
        value = row[col]
        assert re.fullmatch(r"\d+(\.\d+)?", value), f"{col} of {row} is not a number: {value!r}"


def _positive(row: dict[str, str], *cols: str) -> None:
    _number(row, *cols)
    for col in cols:
        assert float(row[col]) > 0, f"{col} of {row} is not positive"


def _alive(pid: int) -> bool:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return raw[raw.rindex(")") + 2] not in "ZX"


@pytest.mark.slow  # 28 s; the quick snapshot and sink benchmarks below stay in make test
def test_quick_benchmark_prints_tidewater_and_reference_figures(tmp_path: Path) -> None:
    out_json = tmp_path / "bench.json"
    res = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--workload", "a", "--sink", "blackhole,sqlite",
         "--json", str(out_json)],
        cwd=REPO, capture_output=True, text=True, timeout=240,
    )
    assert res.returncode == 0, f"exit {res.returncode}\nstdout:\n{res.stdout}\nstderr:\n{res.stderr[-4000:]}"

    main = _table(res.stdout, "| workload | sink |")
    assert [(r["workload"], r["sink"]) for r in main] == [("a", "blackhole"), ("a", "sqlite")], res.stdout
    for row in main:
        _positive(row, "rows", "Tidewater rows/s", "capture CPU s/M rows", "capture peak RSS MB", "tree peak RSS MB",
                  "read ceiling rows/s", "TW/read", "native rows/s", "TW/native")
    sqlite = main[1]
    _positive(sqlite, "write ceiling rows/s", "TW/write")
    assert main[0]["write ceiling rows/s"] == "-", "blackhole has no write ceiling"

    lag = _table(res.stdout, "| offered rows/s | consumer |")
    assert {r["consumer"] for r in lag} == {"native PG->PG", "Tidewater -> blackhole", "Tidewater -> sqlite"}
    for row in lag:
        _positive(row, "achieved rows/s", "samples (native: txns; Tidewater: API)")
        if row["consumer"] != "Tidewater -> blackhole":  # apply lag: native's and the SQL target's position
            _positive(row, "apply p50 s", "apply p99 s")
        if row["consumer"] != "native PG->PG":  # checkpoint lag: what the API shows
            _positive(row, "checkpoint max s")

    # the JSON holds the same measurements
    report = json.loads(out_json.read_text())
    phase = report["phases"][0]
    assert phase["workload"] == "a" and phase["recv"]["rows_per_s"] > 0 and phase["native"]["rows_per_s"] > 0
    assert set(phase["tidewater"]) == {"blackhole", "sqlite"}
    assert all(m["replicated_rows"] == phase["rows"] for m in phase["tidewater"].values())

    # every server the benchmark started is gone
    started = json.loads(re.search(r"servers up: (\{.*\})", res.stderr).group(1))  # type: ignore[union-attr]
    assert {"cdc server", "etcd", "upstream", "subscriber"} <= set(started)
    deadline = time.monotonic() + 15
    while any(_alive(p) for p in started.values()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [name for name, p in started.items() if _alive(p)], "servers left running"


def test_quick_snapshot_benchmark_copies_verifies_and_prints_its_references(tmp_path: Path) -> None:
    out_json = tmp_path / "bench.json"
    res = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--workload", "snapshot", "--sink", "postgresql,sqlite",
         "--json", str(out_json)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert res.returncode == 0, f"exit {res.returncode}\nstdout:\n{res.stdout}\nstderr:\n{res.stderr[-4000:]}"

    main = _table(res.stdout, "| sink | rows | tables |")
    assert [r["sink"] for r in main] == ["postgresql", "sqlite"], res.stdout
    for row in main:
        _positive(row, "rows", "Tidewater rows/s", "seconds", "tree peak RSS MB", "capture tree CPU s/M rows",
                  "dump data-only rows/s", "TW/dump data-only", "dump+restore rows/s", "TW/dump+restore",
                  "write ceiling rows/s", "TW/write")
        assert row["rows"] == "2000" and row["verified"] == "row by row", row

    report = json.loads(out_json.read_text())
    runs = report["snapshot"]["runs"]
    assert {(r["kind"], r["sink"]) for r in runs} == {
        ("dump_data", "postgresql"), ("dump", "postgresql"), ("tidewater", "postgresql"), ("ceiling", "postgresql"),
        ("tidewater", "sqlite"), ("ceiling", "sqlite")}
    assert all(r["rows_per_s"] > 0 and not r["error"] for r in runs)

    started = json.loads(re.search(r"servers up: (\{.*\})", res.stderr).group(1))  # type: ignore[union-attr]
    deadline = time.monotonic() + 15
    while any(_alive(p) for p in started.values()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [name for name, p in started.items() if _alive(p)], "servers left running"


@pytest.mark.slow  # 32 s: benchmark runs are behind their own command (docs/testing.md)
def test_quick_consistency_benchmark_prints_snapshot_mode_beside_the_default(tmp_path: Path) -> None:
    """`--consistency default,snapshot` (issue 25 item 5): workload (a)'s catch-up and the lag run of a snapshot-mode
    changefeed beside a default one into the same PostgreSQL target server, in one run: rows/s, capture and target
    CPU per M rows, the lag readers see (snapshot: the barrier's tidewater_syncpoint row) and the barrier interval."""
    out_json = tmp_path / "bench.json"
    res = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--workload", "a", "--sink", "postgresql", "--no-native",
         "--consistency", "default,snapshot", "--barrier-interval", "0.5", "--json", str(out_json)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert res.returncode == 0, f"exit {res.returncode}\nstdout:\n{res.stdout}\nstderr:\n{res.stderr[-4000:]}"

    table = _table(res.stdout, "| mode | sink | barrier interval s |")
    assert [(r["mode"], r["sink"]) for r in table] == [("default", "postgresql"), ("snapshot", "postgresql")], \
        res.stdout
    for row in table:
        _positive(row, "catch-up rows/s", "capture CPU s/M rows", "offered rows/s", "visible lag p99 s",
                  "checkpoint lag p99 s")
        # (the target server's CPU for 2,000 rows can be below /proc's 10 ms tick: measured, possibly 0.0)
        _number(row, "target CPU s/M rows")
    assert [r["barrier interval s"] for r in table] == ["-", "0.5"], table
    main = _table(res.stdout, "| workload | sink |")
    assert [r["sink"] for r in main] == ["postgresql", "postgresql snapshot"], res.stdout

    report = json.loads(out_json.read_text())
    assert [(v["sink"], v["mode"]) for v in report["consistency"]] == [("postgresql", "default"),
                                                                       ("postgresql", "snapshot")]
    assert report["barrier_interval"] == 0.5
    lag = {r["sink"]: r for r in report["lag"]}
    assert set(lag) == {"postgresql", "postgresql snapshot"} and all(not r["error"] for r in lag.values()), lag

    started = json.loads(re.search(r"servers up: (\{.*\})", res.stderr).group(1))  # type: ignore[union-attr]
    deadline = time.monotonic() + 15
    while any(_alive(p) for p in started.values()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [name for name, p in started.items() if _alive(p)], "servers left running"


def test_the_kafka_and_file_sink_benchmarks_print_a_figure_per_protocol_and_their_ceilings() -> None:
    proc = subprocess.run([sys.executable, "-m", "bench", "--sink", "file,kafka", "--quick"], capture_output=True,
                          text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    for protocol in ("csv", "canal-json", "parquet"):
        assert re.search(rf"^{protocol}\s+[\d,]+ rows/s wall", out, re.M), out
    assert re.search(r"^ceiling\s+[\d,]+ rows/s wall", out, re.M), out
    for protocol in ("canal-json", "open-protocol", "debezium"):
        assert re.search(rf"^{protocol}: KafkaSink.write, acked\s+[\d,]+ rows/s", out, re.M), out
        assert re.search(rf"^{protocol}: kafka-python producer .* [\d,]+ msg/s", out, re.M), out
    assert not any(float(n.replace(",", "")) <= 0 for n in re.findall(r"([\d,]+) (?:rows|msg)/s", out))


@pytest.mark.slow  # 42 s: benchmark runs are behind their own command (docs/testing.md)
def test_quick_mariadb_upstream_benchmark_prints_its_references_goals_and_compares(tmp_path: Path) -> None:
    """`--upstream mariadb` (issue 23 item 7): workloads a, b and o from a MariaDB upstream into blackhole and
    MariaDB, each next to mariadb-binlog and a native replica measured in the same run, the goal table, and every
    target (the replica too) compared with the upstream row by row."""
    out_json = tmp_path / "bench.json"
    res = subprocess.run(
        [sys.executable, "-m", "bench", "--upstream", "mariadb", "--quick", "--sink", "blackhole,mariadb",
         "--json", str(out_json)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert res.returncode == 0, f"exit {res.returncode}\nstdout:\n{res.stdout}\nstderr:\n{res.stderr[-4000:]}"

    main = _table(res.stdout, "| workload | sink |")
    assert [(r["workload"], r["sink"]) for r in main] == [
        (w, s) for w in ("a", "b", "o") for s in ("blackhole", "mariadb")], res.stdout
    for row in main:
        _positive(row, "rows", "Tidewater rows/s", "capture CPU s/M rows", "read ceiling rows/s", "TW/read",
                  "native rows/s", "TW/native")
    details = _table(res.stdout, "| workload | what |")
    whats = {r["what"] for r in details}
    assert {"mariadb-binlog to /dev/null (read ceiling)", "native MariaDB replica (catch-up)"} <= whats, whats

    goals = _table(res.stdout, "| goal (issue 23) |")
    names = [g["goal (issue 23)"] for g in goals]
    for w in ("a", "b", "o"):
        assert f"blackhole / mariadb-binlog ({w})" in names and f"MariaDB -> MariaDB / native replica ({w})" in names
    assert "single-row transactions -> blackhole, rows/s (o)" in names, names
    for g in goals:
        _positive(g, "measured")
        assert g["met"] in ("yes", "NO"), g

    for key in ("ab", "o"):  # every SQL target and the replica, row by row
        for who in ("mariadb", "native replica"):
            assert re.search(rf"- \[{key}\] {who}: 2\d\d\d rows, equal to the upstream row by row", res.stdout), \
                res.stdout

    report = json.loads(out_json.read_text())
    assert report["upstream"] == "mariadb"
    assert [p["workload"] for p in report["phases"]] == ["a", "b", "o"]
    for phase in report["phases"]:
        assert phase["recv"]["rows_per_s"] > 0 and phase["native"]["rows_per_s"] > 0
        assert all(m["replicated_rows"] == phase["rows"] for m in phase["tidewater"].values()), phase

    started = json.loads(re.search(r"servers up: (\{.*\})", res.stderr).group(1))  # type: ignore[union-attr]
    assert {"cdc server", "etcd", "upstream", "replica"} <= set(started)
    deadline = time.monotonic() + 15
    while any(_alive(p) for p in started.values()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [name for name, p in started.items() if _alive(p)], "servers left running"


@pytest.mark.slow  # 51 s: benchmark runs are behind their own command (docs/testing.md)
def test_quick_verify_benchmark_prints_rows_per_s_next_to_the_read_ceiling_with_hold_and_lag(tmp_path: Path) -> None:
    """`--workload verify` (issue 24 item 7): changefeed verify of the preloaded rows under a writer, into PostgreSQL
    and MariaDB, next to the count(*) + md5 scan of both sides measured in the same run; the hold and the lag."""
    out_json = tmp_path / "bench.json"
    res = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--workload", "verify", "--sink", "postgresql,mariadb",
         "--no-native", "--json", str(out_json)],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )
    assert res.returncode == 0, f"exit {res.returncode}\nstdout:\n{res.stdout}\nstderr:\n{res.stderr[-4000:]}"

    table = _table(res.stdout, "| sink | rows compared |")
    assert [r["sink"] for r in table] == ["postgresql", "mariadb"], res.stdout
    for row in table:
        _positive(row, "chunks", "verify s (request -> report)", "job s", "verify rows/s", "hold s",
                  "checkpoint lag max during s", "writer rows/s")
        assert re.fullmatch(r"\d+\.\d+(e-\d+)?", row["verify/ceiling"]), row
        assert int(row["rows compared"]) >= 2000 and row["verdict"] == "equal", row  # (and the writer's rows)
        assert re.fullmatch(r"\d+ \(\d+\.\d \+ \d+\.\d\)", row["read ceiling rows/s (upstream s + target s)"]), row

    report = json.loads(out_json.read_text())
    runs = report["verify"]["runs"]
    assert [r["sink"] for r in runs] == ["postgresql", "mariadb"]
    assert all(r["rows_per_s"] > 0 and r["ceiling"]["rows_per_s"] > 0 and not r["error"] for r in runs), runs

    started = json.loads(re.search(r"servers up: (\{.*\})", res.stderr).group(1))  # type: ignore[union-attr]
    deadline = time.monotonic() + 15
    while any(_alive(p) for p in started.values()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [name for name, p in started.items() if _alive(p)], "servers left running"
