"""bench.budget and the report's "Where the time goes" section: each goal ratio of issues 22 and 23 explained by the
CPU per million rows of every process of Tidewater's chain and of the reference's, fed with measurement objects."""

from __future__ import annotations

import re

import pytest

from bench.budget import SHORT_S, RatioGoal, budgets, reference_chain, tidewater_chain
from bench.consumers import Measurement
from bench.procstat import HostCpu
from bench.report import PhaseReport, Report, format_report, goals_table, ratio_goals

pytestmark = pytest.mark.unit

ROWS = 1_000_000


def _m(consumer: str, sink: str, seconds: float, **cpu: float | None) -> Measurement:
    return Measurement(consumer, sink, ROWS, seconds, **cpu)  # type: ignore[arg-type]


def _tw(sink: str, seconds: float = 10.0, **cpu: float | None) -> Measurement:
    # distinct powers of two: a total that leaves out any one process is a different number
    parts: dict[str, float | None] = {"walsender_cpu_s": 1.0, "cpu_s": 2.0, "target_cpu_s": 4.0, "meta_cpu_s": 8.0}
    parts.update(cpu)
    return _m("tidewater", sink, seconds, **parts)


def _section(text: str) -> str:
    return text.split("## Where the time goes (CPU per million rows of every process in the chain)", 1)[1]


def _tables(text: str) -> list[list[dict[str, str]]]:
    """Every Markdown table of ``text``, as rows keyed by column."""
    out: list[list[dict[str, str]]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("| ") and i + 1 < len(lines) and lines[i + 1].startswith("|---"):
            cols = [c.strip() for c in lines[i].strip("|").split("|")]
            rows, i = [], i + 2
            while i < len(lines) and lines[i].startswith("|"):
                cells = [c.strip() for c in re.split(r"(?<!\\)\|", lines[i].strip().strip("|"))]
                rows.append(dict(zip(cols, cells, strict=True)))
                i += 1
            out.append(rows)
        i += 1
    return out


def test_tidewaters_chain_counts_every_process_once() -> None:
    chain = tidewater_chain(_tw("postgresql"), "postgresql")
    assert [p.process for p in chain.parts] == ["walsender", "capture", "postgresql server", "etcd"]
    assert chain.total_s == 15.0 and chain.total_per_mrows == 15.0
    assert chain.utilisation(2) == pytest.approx(15.0 / (10.0 * 2))
    blackhole = tidewater_chain(_tw("blackhole", target_cpu_s=None), "postgresql")
    assert [p.process for p in blackhole.parts] == ["walsender", "capture", "etcd"] and blackhole.total_s == 11.0
    # a MariaDB upstream: the upstream server's CPU is the upstream side (its dump thread lives in mariadbd)
    my = tidewater_chain(_tw("mariadb", walsender_cpu_s=None, upstream_cpu_s=16.0), "mariadb")
    assert my.part("upstream side").process == "upstream server" and my.total_s == 30.0  # type: ignore[union-attr]


def test_a_process_not_measured_leaves_the_total_open_instead_of_flattering_it() -> None:
    chain = tidewater_chain(_tw("postgresql", walsender_cpu_s=None), "postgresql")
    assert chain.total_s is None and chain.missing == ["walsender"]
    goal = RatioGoal("PG -> PG / native logical replication (a)", _tw("postgresql", walsender_cpu_s=None),
                     _m("native", "", 5.0, walsender_cpu_s=1.0, target_cpu_s=5.0), 1.0)
    [b] = budgets([goal], "postgresql", 2)
    assert b.cpu_ratio is None and b.reading() == "not explained: not measured Tidewater -> postgresql: walsender"


def test_the_references_chains() -> None:
    native = reference_chain(_m("native", "", 5.0, cpu_s=3.0, walsender_cpu_s=1.0, target_cpu_s=6.0), "postgresql")
    # the apply worker (cpu_s) is inside the subscriber server's tree: counted once, there
    assert [p.process for p in native.parts] == ["walsender", "subscriber server"] and native.total_s == 7.0
    load = reference_chain(_m("write ceiling", "mariadb", 1.0, cpu_s=0.5, target_cpu_s=3.0), "postgresql")
    assert [p.process for p in load.parts] == ["mariadb server"] and load.total_s == 3.0
    assert "replicates nothing" in load.note
    recv = reference_chain(_m("pg_recvlogical", "", 2.0, cpu_s=1.0, walsender_cpu_s=2.0), "postgresql")
    assert [p.process for p in recv.parts] == ["walsender", "pg_recvlogical"] and recv.total_s == 3.0
    binlog = reference_chain(_m("mariadb-binlog", "", 1.0, cpu_s=0.5, upstream_cpu_s=0.25), "mariadb")
    assert [p.process for p in binlog.parts] == ["upstream server", "mariadb-binlog"] and binlog.total_s == 0.75
    replica = reference_chain(_m("native", "", 4.0, cpu_s=5.0, target_cpu_s=5.0, upstream_cpu_s=0.5), "mariadb")
    assert [p.process for p in replica.parts] == ["upstream server", "replica server"] and replica.total_s == 5.5


def test_the_measured_ratio_is_the_cpu_ratio_times_the_utilisation_ratio() -> None:
    tw = _tw("postgresql", seconds=8.0, walsender_cpu_s=3.4, cpu_s=6.4, target_cpu_s=9.8, meta_cpu_s=0.1)
    native = _m("native", "", 6.0, walsender_cpu_s=4.4, target_cpu_s=4.9)
    [b] = budgets([RatioGoal("PG -> PG / native logical replication (b)", tw, native, 1.5)], "postgresql", 2)
    assert b.cpu_ratio == pytest.approx(9.3 / 19.7)
    assert b.goal.value == pytest.approx(b.cpu_ratio * b.utilisation_ratio)  # type: ignore[operator]
    # largest difference first; the capture has no counterpart in native's chain (its apply is in the server)
    diffs = dict(b.differences())
    assert list(diffs)[:2] == ["capture", "postgresql server"]
    assert diffs["capture"] == pytest.approx(6.4) and diffs["postgresql server"] == pytest.approx(4.9)
    assert diffs["walsender"] == pytest.approx(-1.0) and diffs["etcd"] == pytest.approx(0.1)


def test_the_reading_tells_a_cpu_budget_from_a_wait_and_from_contention() -> None:
    native = _m("native", "", 10.0, walsender_cpu_s=5.0, target_cpu_s=14.0, host_busy=0.95)  # utilisation 0.95
    busy = _tw("postgresql", seconds=20.0, walsender_cpu_s=4.0, cpu_s=20.0, target_cpu_s=12.0, meta_cpu_s=0.0,
               host_busy=0.95)  # 36 CPU s in 20 s on 2 cores: 0.9, CPU-bound
    [b] = budgets([RatioGoal("PG -> PG / native logical replication (a)", busy, native, 1.0)], "postgresql", 2)
    text = b.reading()
    assert text.startswith("0.50 = CPU 0.53 x utilisation 0.95; CPU budget: at equal utilisation 0.53 < 1;")
    assert "capture +20.0" in text and "wait" not in text and "does not explain" not in text

    waiting = _tw("postgresql", seconds=40.0, walsender_cpu_s=4.0, cpu_s=4.0, target_cpu_s=11.0, meta_cpu_s=0.0,
                  host_busy=0.3)  # 19 CPU s in 40 s: 0.24 of the cores, the host idle too
    [w] = budgets([RatioGoal("PG -> PG / native logical replication (a)", waiting, native, 1.0)], "postgresql", 2)
    assert "CPU budget" not in w.reading() and "wait: Tidewater's chain kept 0.24 of the cores busy (host 0.30)" in \
        w.reading() and w.reading().endswith("latency, a serial step or a timer, which the CPU ratio does not explain")

    crowded = _tw("postgresql", seconds=40.0, walsender_cpu_s=4.0, cpu_s=4.0, target_cpu_s=11.0, meta_cpu_s=0.0,
                  host_busy=0.99)
    [c] = budgets([RatioGoal("PG -> PG / native logical replication (a)", crowded, native, 1.0)], "postgresql", 2)
    assert "contention: Tidewater's chain had 0.24 of the cores while the host was 0.99 busy" in c.reading()
    assert c.cpu_ratio == 1.0 and c.reading().endswith("the CPU ratio does not explain the gap")

    met = _tw("postgresql", seconds=5.0, walsender_cpu_s=1.0, cpu_s=1.0, target_cpu_s=1.0, meta_cpu_s=0.0)
    [m] = budgets([RatioGoal("PG -> PG / native logical replication (a)", met, native, 1.0)], "postgresql", 2)
    assert m.reading().startswith("met; 2.00 = CPU")


def test_a_short_run_is_marked_and_not_explained() -> None:
    recv = _m("mariadb-binlog", "", 0.07, cpu_s=0.05, upstream_cpu_s=0.02)
    bh = _tw("blackhole", seconds=2.0, walsender_cpu_s=None, upstream_cpu_s=0.5, target_cpu_s=None)
    [b] = budgets([RatioGoal("blackhole / mariadb-binlog (a)", bh, recv, 0.8)], "mariadb", 2)
    assert b.ref.short and not b.tw.short and SHORT_S == 0.3
    assert b.reading().startswith("short run: mariadb-binlog 0.07 s (< 0.3 s)")


def _pg_report() -> Report:
    a = PhaseReport(
        "a", "inserts", ROWS,
        recv=_m("pg_recvlogical", "", 4.0, cpu_s=2.0, walsender_cpu_s=5.0, host_busy=0.9),
        native=_m("native", "", 5.0, cpu_s=3.0, walsender_cpu_s=4.0, target_cpu_s=6.0, host_busy=0.9),
        tidewater={"postgresql": _tw("postgresql", 8.0), "mariadb": _tw("mariadb", 10.0),
                   "blackhole": _tw("blackhole", 5.0, target_cpu_s=None)},
        ceiling={"mariadb": _m("write ceiling", "mariadb", 2.0, cpu_s=0.5, target_cpu_s=3.0)})
    a.ceiling["mariadb"].note = "LOAD DATA LOCAL INFILE"
    return Report("now", {}, {"cores": "2"}, phases=[a])


def test_the_report_explains_every_goal_ratio_of_the_goal_table() -> None:
    rep = _pg_report()
    text = format_report(rep, ["postgresql", "mariadb", "blackhole"])
    chains, ratios = _tables(_section(text))
    goal_names = [r["goal (issue 22)"] for r in _tables(goals_table(rep))[0]]
    assert [r["goal"] for r in ratios] == goal_names == [g.what for g in ratio_goals(rep, rep.phases[0])]
    assert [(r["goal"], r["chain"]) for r in chains] == [
        ("PG -> PG / native logical replication (a)", "Tidewater -> postgresql"),
        ("PG -> PG / native logical replication (a)", "native PG->PG"),
        ("PG -> MariaDB / LOAD DATA (a)", "Tidewater -> mariadb"),
        ("PG -> MariaDB / LOAD DATA (a)", "LOAD DATA LOCAL INFILE into mariadb"),
        ("blackhole / pg_recvlogical (a)", "Tidewater -> blackhole"),
        ("blackhole / pg_recvlogical (a)", "pg_recvlogical")]
    tw = chains[0]
    assert [tw[c] for c in ("upstream side CPU s/M rows", "consumer CPU s/M rows", "target server CPU s/M rows",
                            "etcd CPU s/M rows", "total CPU s/M rows", "utilisation")] == \
        ["1.0", "2.0", "4.0", "8.0", "15.0", "0.94"]
    assert chains[1]["consumer CPU s/M rows"] == "-" and chains[1]["total CPU s/M rows"] == "10.0"
    assert chains[3]["upstream side CPU s/M rows"] == "-" and chains[3]["total CPU s/M rows"] == "3.0"
    pg = ratios[0]
    assert [pg[c] for c in ("Tidewater CPU s/M rows", "reference CPU s/M rows", "CPU ratio (reference / Tidewater)",
                            "Tidewater utilisation", "reference utilisation", "measured ratio", "goal ratio")] == \
        ["15.0", "10.0", "0.67", "0.94", "1.00", "0.62", "1"]
    assert pg["reading"].startswith("0.62 = CPU 0.67 x utilisation 0.94; CPU budget")


def test_the_mariadb_report_explains_issue_23s_ratios() -> None:
    a = PhaseReport("a", "inserts", ROWS,
                    recv=_m("mariadb-binlog", "", 1.0, cpu_s=0.5, upstream_cpu_s=0.4),
                    native=_m("native", "", 2.0, cpu_s=3.0, target_cpu_s=3.0, upstream_cpu_s=0.5),
                    tidewater={"blackhole": _tw("blackhole", 4.0, walsender_cpu_s=None, upstream_cpu_s=1.5,
                                                target_cpu_s=None),
                               "mariadb": _tw("mariadb", 8.0, walsender_cpu_s=None, upstream_cpu_s=1.5)})
    rep = Report("now", {}, {"cores": "2"}, phases=[a], upstream="mariadb")
    chains, ratios = _tables(_section(format_report(rep, ["blackhole", "mariadb"])))
    assert [r["goal"] for r in ratios] == ["blackhole / mariadb-binlog (a)", "MariaDB -> MariaDB / native replica (a)"]
    assert [r["chain"] for r in chains] == ["Tidewater -> blackhole", "mariadb-binlog", "Tidewater -> mariadb",
                                            "native replica"]
    assert chains[0]["total CPU s/M rows"] == "11.5" and chains[1]["total CPU s/M rows"] == "0.9"
    assert chains[3]["upstream side CPU s/M rows"] == "0.5" and chains[3]["total CPU s/M rows"] == "3.5"
    assert ratios[1]["CPU ratio (reference / Tidewater)"] == "0.23"  # 3.5 / (1.5 + 2 + 4 + 8)


def test_no_section_without_a_goal_ratio() -> None:
    rep = Report("now", {}, {"cores": "2"}, phases=[PhaseReport("e", "tables", ROWS)])
    assert "Where the time goes" not in format_report(rep, ["postgresql"])


def test_the_hosts_busy_share_is_a_share() -> None:
    host = HostCpu()
    sum(i * i for i in range(2_000_000))  # some CPU, so that ticks pass
    busy = host.busy()
    assert busy is not None and 0.0 <= busy <= 1.0
