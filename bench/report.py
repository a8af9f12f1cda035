"""Result records of a benchmark run and their Markdown tables.

Every number cell is a plain decimal number (no thousands separators) or ``-`` when there is no figure,
so that the tables can be read back by tools (tests/e2e/test_bench_smoke.py does).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

from bench.bigtxn import BigTxnResult
from bench.budget import RatioGoal, format_budget
from bench.consistency import Variant, consistency_table
from bench.consumers import Measurement
from bench.lag import LagResult
from bench.snapshot import CopyRun, SnapshotReport, format_snapshot
from bench.verify import ScanRun, VerifyReport, VerifyRunResult, format_verify
from bench.workloads import WriteResult

MiB = 1 << 20
MAIN_COLUMNS = ("workload", "sink", "rows", "Tidewater rows/s", "capture CPU s/M rows", "capture peak RSS MB",
                "tree peak RSS MB", "read ceiling rows/s", "TW/read", "native rows/s", "TW/native",
                "write ceiling rows/s", "TW/write")


@dataclass
class PhaseReport:
    workload: str
    label: str
    rows: int
    write: WriteResult | None = None
    recv: Measurement | None = None
    native: Measurement | None = None
    tidewater: dict[str, Measurement] = field(default_factory=dict)
    ceiling: dict[str, Measurement] = field(default_factory=dict)


@dataclass
class Report:
    started: str
    options: dict[str, Any]
    machine: dict[str, str]
    phases: list[PhaseReport] = field(default_factory=list)
    lag: list[LagResult] = field(default_factory=list)
    big: list[BigTxnResult] = field(default_factory=list)
    snapshot: SnapshotReport | None = None
    verify: VerifyReport | None = None
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    upstream: str = "postgresql"  # postgresql | mariadb: which references the phases' recv and native are
    # --consistency with snapshot: the variants measured side by side and the snapshot-mode barrier interval
    consistency: list[Variant] = field(default_factory=list)
    barrier_interval: float = 1.0

    def to_dict(self) -> dict[str, Any]:
        def conv(o: Any) -> Any:
            if dataclasses.is_dataclass(o) and not isinstance(o, type):
                d = {f.name: conv(getattr(o, f.name)) for f in dataclasses.fields(o)}
                if isinstance(o, Measurement | CopyRun | ScanRun | VerifyRunResult):
                    d["rows_per_s"] = o.rows_per_s
                return d
            if isinstance(o, dict):
                return {k: conv(v) for k, v in o.items()}
            if isinstance(o, list):
                return [conv(v) for v in o]
            return o

        return conv(self)  # type: ignore[no-any-return]


def num(x: float | None, digits: int = 0) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def ratio(a: float | None, b: float | None) -> str:
    """a / b with two decimals (three significant digits below 0.1, so that a small ratio is never 0)."""
    if a is None or not b:
        return "-"
    r = a / b
    return f"{r:.2f}" if r >= 0.1 or r == 0 else f"{r:.2e}" if r < 1e-4 else f"{r:.3g}"


def mb(b: int | None) -> str:
    return "-" if not b else f"{b / MiB:.0f}"


def _table(columns: tuple[str, ...] | list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def main_table(phases: list[PhaseReport], sinks: list[str]) -> str:
    """One line per (timed workload, sink): Tidewater's catch-up throughput, CPU and memory, and each
    reference with the ratio Tidewater / reference."""
    rows = []
    for p in phases:
        read = p.recv.rows_per_s if p.recv else None
        native = p.native.rows_per_s if p.native else None
        for sink in sinks:
            tw = p.tidewater.get(sink)
            if tw is None:
                continue
            rate = tw.rows_per_s
            ceil = p.ceiling.get(sink.split(" ")[0])  # (a variant label "postgresql snapshot": its sink's ceiling)
            write = ceil.rows_per_s if ceil else None
            rows.append([p.workload, sink, str(p.rows), num(rate), num(tw.per_mrows(tw.cpu_s), 1),
                         mb(tw.rss_peak) if tw.ok else "-", mb(tw.tree_rss_peak) if tw.ok else "-",
                         num(read), ratio(rate, read), num(native), ratio(rate, native), num(write),
                         ratio(rate, write)])
    return _table(MAIN_COLUMNS, rows)


# the references' names per upstream: (read ceiling, native replication)
REFERENCES = {"postgresql": ("pg_recvlogical (read ceiling)", "native PG->PG subscription"),
              "mariadb": ("mariadb-binlog to /dev/null (read ceiling)", "native MariaDB replica (catch-up)")}


def detail_table(phases: list[PhaseReport], sinks: list[str], upstream: str = "postgresql") -> str:
    """Every measurement: seconds, rows/s, CPU per million rows of the consumer, of its walsender and of the target
    server (native: the subscriber's whole tree, its apply worker included; Tidewater and the bulk loads: the
    target server's tree, i.e. the statements' server side)."""
    cols = ("workload", "what", "rows", "seconds", "rows/s", "own CPU s/M rows", "walsender CPU s/M rows",
            "target server CPU s/M rows", "note")
    rows: list[list[str]] = []
    for p in phases:
        if p.write is not None:
            w = p.write
            rows.append([p.workload, "upstream writes (nothing reading)", str(w.rows), num(w.seconds, 2),
                         num(w.rows / w.seconds if w.seconds else None), "-", "-", "-", w.detail or p.label])
        read_name, native_name = REFERENCES[upstream]
        ms: list[tuple[str, Measurement | None]] = [(read_name, p.recv), (native_name, p.native)]
        ms += [(f"Tidewater -> {s}", p.tidewater.get(s)) for s in sinks]
        ms += [(f"write ceiling {s}", p.ceiling.get(s)) for s in sinks]
        for what, m in ms:
            if m is None:
                continue
            note = m.error or m.note
            if m.replicated_rows is not None and m.replicated_rows != m.rows:
                note = (note + "; " if note else "") + f"changefeed reports {m.replicated_rows} rows"
            if what.startswith("write ceiling"):
                rows.append([p.workload, f"{what} ({m.note or '-'})", str(m.rows), num(m.seconds, 2),
                             num(m.rows_per_s), "-", "-", num(m.per_mrows(m.target_cpu_s), 1), m.error])
                continue
            rows.append([p.workload, what, str(m.rows), num(m.seconds, 2), num(m.rows_per_s),
                         num(m.per_mrows(m.cpu_s), 1), num(m.per_mrows(m.walsender_cpu_s), 1),
                         num(m.per_mrows(m.target_cpu_s), 1), note])
    return _table(cols, rows)


def lag_table(results: list[LagResult]) -> str:
    """Apply latency per transaction (first seen applied minus its upstream commit; the same for native and
    Tidewater) next to native's, and Tidewater's checkpoint lag (what its API and alerts show; bench.lag)."""
    cols = ("offered rows/s", "consumer", "achieved rows/s", "samples (native: txns; Tidewater: API)", "apply p50 s",
            "apply p99 s",
            "apply p99 / native p99", "checkpoint p50 s", "checkpoint p99 s", "checkpoint max s", "capture CPU %")
    native = {r.offered: r.p99 for r in results if r.consumer == "native" and not r.error}
    rows = []
    for r in results:
        who = "native PG->PG" if r.consumer == "native" else f"Tidewater -> {r.sink}"
        if r.error:
            rows.append([str(r.offered), who] + ["-"] * (len(cols) - 3) + [r.error])
            continue
        tw = r.consumer != "native"
        rows.append([str(r.offered), who, num(r.achieved), str(r.samples), num(r.apply_p50, 3), num(r.apply_p99, 3),
                     ratio(r.apply_p99, native.get(r.offered)) if tw else "-",
                     num(r.p50, 3) if tw else "-", num(r.p99, 3) if tw else "-", num(r.max, 3) if tw else "-",
                     num(r.cpu_pct)])
    return _table(cols, rows)


def big_table(results: list[BigTxnResult], refs: PhaseReport | None) -> str:
    cols = ("sink", "MB", "rows", "TW rows/s (INSERT start->ckpt)", "TW rows/s (COMMIT->ckpt)",
            "capture CPU s/M rows", "capture VmHWM MB", "capture anon peak MB", "tree RSS peak MB",
            "target = source", "read ceiling rows/s", "native rows/s", "write ceiling rows/s", "TW/read",
            "TW/native", "TW/write")
    read = refs.recv.rows_per_s if refs and refs.recv else None
    native = refs.native.rows_per_s if refs and refs.native else None
    rows = []
    for r in results:
        ceil = refs.ceiling.get(r.sink) if refs else None
        write = ceil.rows_per_s if ceil else None
        if r.error:
            rows.append([r.sink, f"{r.size_mb:g}", "-", r.error] + ["-"] * (len(cols) - 4))
            continue
        rows.append([r.sink, f"{r.size_mb:g}", str(r.rows), num(r.rows_per_s_e2e), num(r.rows_per_s_after_commit),
                     num(r.cpu_per_mrows, 1), mb(r.hwm), mb(r.anon_peak), mb(r.tree_rss_peak),
                     {True: "yes", False: "NO", None: "-"}[r.equal], num(read), num(native), num(write),
                     ratio(r.rows_per_s_e2e, read), ratio(r.rows_per_s_e2e, native), ratio(r.rows_per_s_e2e, write)])
    return _table(cols, rows)


# The speed issue's goals (issue 22): (what, workload or rate, goal, higher is better)
GOALS_NATIVE = {"a": 1.0, "b": 1.5, "c": 1.5}  # PG -> PG / native logical replication
GOALS_LOAD_DATA = {"a": 0.5, "b": 0.4, "c": 0.4}  # PG -> MariaDB / LOAD DATA LOCAL INFILE of the same rows
GOAL_READ = 0.9  # blackhole / pg_recvlogical
GOAL_LAG_RATE, GOAL_LAG_P50, GOAL_LAG_P99 = 10000, 0.03, 0.1  # apply lag into PostgreSQL and MariaDB, seconds
GOAL_BIG_MB, GOAL_ANON_MB = 1024.0, 150.0  # capture anonymous memory during a 1 GB transaction
GOALS_COPY = {"postgresql": 1.0, "mariadb": 0.7}  # initial copy / pg_dump | psql of the same tables


# issue 23 item 7, a MariaDB upstream: blackhole / mariadb-binlog, MariaDB -> MariaDB / the native replica, and the
# single-row transactions' rate into blackhole (rows/s)
GOAL_MY_READ, GOAL_MY_NATIVE, GOAL_MY_SINGLE_ROW = 0.8, 1.0, 50_000.0


def ratio_goals(rep: Report, phase: PhaseReport) -> list[RatioGoal]:
    """The goals of the form Tidewater's rate / a reference's rate that ``phase`` measured (both figures there): issue
    23's for a MariaDB upstream, else issue 22's PG -> PG / native, PG -> MariaDB / LOAD DATA, blackhole /
    pg_recvlogical."""
    out: list[RatioGoal] = []
    p = phase

    def add(what: str, tw: Measurement | None, ref: Measurement | None, goal: float) -> None:
        if tw is not None and tw.ok and ref is not None and ref.rows_per_s:
            out.append(RatioGoal(f"{what} ({p.workload})", tw, ref, goal))

    tw = p.tidewater.get
    if rep.upstream == "mariadb":
        add("blackhole / mariadb-binlog", tw("blackhole"), p.recv, GOAL_MY_READ)
        add("MariaDB -> MariaDB / native replica", tw("mariadb"), p.native, GOAL_MY_NATIVE)
        return out
    if p.workload in GOALS_NATIVE:
        add("PG -> PG / native logical replication", tw("postgresql"), p.native, GOALS_NATIVE[p.workload])
    if p.workload in GOALS_LOAD_DATA:
        add("PG -> MariaDB / LOAD DATA", tw("mariadb"), p.ceiling.get("mariadb"), GOALS_LOAD_DATA[p.workload])
    if p.workload != "d":
        add("blackhole / pg_recvlogical", tw("blackhole"), p.recv, GOAL_READ)
    return out


def goals_table(rep: Report) -> str:
    """Each goal of the speed issue that this run measured: the figure, the goal and whether it is met (figures
    come from the tables above, measured in this run; a goal this run did not measure has no line)."""
    rows: list[list[str]] = []

    def add(what: str, value: float | None, goal: float, higher: bool, digits: int = 2, ref: str = "-") -> None:
        if value is None:
            return
        met = value >= goal if higher else value <= goal
        rows.append([what, f"{value:.{digits}f}", ref, (">= " if higher else "<= ") + f"{goal:g}",
                     "yes" if met else "NO"])

    for p in rep.phases:
        for g in ratio_goals(rep, p):
            add(g.what, g.value, g.goal, True, ref=num(g.reference.rows_per_s))
        bh = p.tidewater.get("blackhole")
        if rep.upstream == "mariadb" and p.workload == "o" and bh is not None and bh.ok:
            add("single-row transactions -> blackhole, rows/s (o)", bh.rows_per_s, GOAL_MY_SINGLE_ROW, True, 0)
    if rep.upstream == "mariadb":
        return _table(("goal (issue 23)", "measured", "reference", "goal", "met"), rows) if rows else ""

    native_lag = {r.offered: r for r in rep.lag if r.consumer == "native" and not r.error}
    for r in rep.lag:
        if r.consumer == "native" or r.error or r.offered != GOAL_LAG_RATE or r.sink not in ("postgresql", "mariadb"):
            continue
        n = native_lag.get(r.offered)
        add(f"apply lag p50 s at {r.offered} rows/s -> {r.sink}", r.apply_p50, GOAL_LAG_P50, False, 3,
            num(n.apply_p50, 3) if n else "-")
        add(f"apply lag p99 s at {r.offered} rows/s -> {r.sink}", r.apply_p99, GOAL_LAG_P99, False, 3,
            num(n.apply_p99, 3) if n else "-")
    for b in rep.big:
        if not b.error and b.anon_peak and b.size_mb >= GOAL_BIG_MB:
            add(f"capture anonymous memory MB, {b.size_mb:g} MB transaction -> {b.sink}", b.anon_peak / MiB,
                GOAL_ANON_MB, False, 0)
    if rep.snapshot is not None:
        dump = rep.snapshot.find("dump")
        for sink, goal in GOALS_COPY.items():
            run = rep.snapshot.find("tidewater", sink)
            if run is not None and not run.error and dump is not None and not dump.error and dump.rows_per_s:
                add(f"initial copy -> {sink} / pg_dump \\| psql",  # (a pipe escaped in a markdown cell)
                    (run.rows_per_s or 0) / dump.rows_per_s, goal, True, ref=num(dump.rows_per_s))
                ceil = rep.snapshot.find("ceiling", sink)  # the goal's "next to": the target's own bulk loader
                if ceil is not None and not ceil.error and ceil.rows_per_s:
                    loader = "LOAD DATA" if sink == "mariadb" else "COPY FROM STDIN"
                    rows[-1][2] += f"; {loader} {num(ceil.rows_per_s)} ({(run.rows_per_s or 0) / ceil.rows_per_s:.2f}x)"
    if not rows:
        return ""
    return _table(("goal (issue 22)", "measured", "reference", "goal", "met"), rows)


def cores(rep: Report) -> int:
    """The cores of the machine the run measured (its machine info; this machine's when it has none)."""
    try:
        return int(rep.machine["cores"])
    except (KeyError, ValueError):
        return os.cpu_count() or 1


def format_report(rep: Report, sinks: list[str]) -> str:
    out = [f"Tidewater benchmark, {rep.started}; " + ", ".join(f"{k} {v}" for k, v in rep.machine.items()), ""]
    timed = [p for p in rep.phases if p.workload != "d"]
    if timed:
        out += ["## Throughput (catch-up: rows / seconds from starting the consumer until it has everything "
                "up to the workload's last commit; every consumer reads the same WAL (MariaDB: binlog), one at a time)", "",
                main_table(timed, sinks), "", "### Details", "", detail_table(timed, sinks, rep.upstream), ""]
    if rep.lag:
        out += ["## Lag under a fixed offered rate (workload (a); apply: per transaction, polled every 5 ms; checkpoint: the API sampled every 100 ms)", "", lag_table(rep.lag), ""]
    if rep.consistency:
        catch_up = next((p.tidewater for p in rep.phases if p.workload == "a"), {})
        out += ["## Consistency modes side by side (workload (a); issue 25, docs/consistency.md): catch-up until "
                "readers see the last commit (snapshot: its barrier is applied), visible lag = until a transaction is "
                "visible to readers (snapshot: the barrier's tidewater_syncpoint row; default: the exactly-once "
                "position), checkpoint lag = the API's (snapshot: staged)", "",
                consistency_table(catch_up, rep.lag, rep.consistency, rep.barrier_interval), ""]
    if rep.big:
        refs = next((p for p in rep.phases if p.workload == "d"), None)
        out += ["## One big transaction (d): Tidewater via scripts/bench_big_txn.py (live), references in "
                "catch-up", "", big_table(rep.big, refs), ""]
        if refs is not None:
            out += [detail_table([refs], sinks), ""]
    if rep.snapshot is not None:
        out += [format_snapshot(rep.snapshot)]
    if rep.verify is not None:
        out += [format_verify(rep.verify)]
    goals = goals_table(rep)
    if goals:
        out += ["## Goals of the speed issue (ratios and figures of this run; reference = native, LOAD DATA, "
                "pg_recvlogical or pg_dump | psql rows/s, or native's lag)", "", goals, ""]
    budget = format_budget([g for p in timed for g in ratio_goals(rep, p)], rep.upstream, cores(rep))
    if budget:
        out += ["## Where the time goes (CPU per million rows of every process in the chain)", "", budget, ""]
    if rep.notes:
        out += ["## Notes", ""] + [f"- {n}" for n in rep.notes] + [""]
    if rep.errors:
        out += ["## Errors", ""] + [f"- {e}" for e in rep.errors] + [""]
    return "\n".join(out)
