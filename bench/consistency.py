"""``--consistency default,snapshot``: the cost of ``[consistency] mode = "snapshot"`` next to the default mode,
measured in the same run (issue 25 item 5, docs/consistency.md).

Each SQL sink asked for gets a *variant* per mode: a changefeed of its own into a target database of its own, from the
same upstream database, catching up on the same WAL and running the same lag runs as the default one, one consumer at
a time. A snapshot-mode variant's figures are what a *reader* of the target gets: its catch-up lasts until the target
shows a barrier at or past the workload's last commit (``tidewater_syncpoint``, not only the staged checkpoint), and
its apply lag is the time until a transaction's barrier is visible (:class:`bench.consumers.SyncpointPosition`).

:func:`consistency_table` prints the variants side by side: catch-up rows/s, capture and target-server CPU per million
rows, and per offered rate the visible lag (p50/p99) next to the checkpoint lag, with the barrier interval.
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.consumers import Measurement
from bench.lag import LagResult

MODES = ("default", "snapshot")
SNAPSHOT_SINKS = ("sqlite", "mariadb", "postgresql")  # snapshot mode is for SQL targets only (docs/consistency.md)


@dataclass(frozen=True)
class Variant:
    """One changefeed per (sink, mode): ``label`` names it in every table (the sink alone in the default mode)."""

    sink: str
    mode: str
    label: str

    @property
    def snapshot(self) -> bool:
        return self.mode == "snapshot"

    def target_key(self, scenario: str) -> str:
        """The target database (or SQLite file) key of this variant in ``scenario``: its own, so that the two modes
        never write the same tables (a key already ending in ``_snap`` is its own)."""
        return scenario if not self.snapshot or scenario.endswith("_snap") else f"{scenario}_snap"


def variants(sinks: list[str], modes: list[str]) -> list[Variant]:
    """The variants of a run, sink by sink, the default mode first; snapshot mode only for SQL sinks."""
    out: list[Variant] = []
    for sink in sinks:
        if "default" in modes:
            out.append(Variant(sink, "default", sink))
        if "snapshot" in modes and sink in SNAPSHOT_SINKS:
            out.append(Variant(sink, "snapshot", f"{sink} snapshot"))
    return out


def with_consistency(config: str, interval: float) -> str:
    """``config`` (changefeed TOML) with ``[consistency] mode = "snapshot"`` and ``interval``; refused when the TOML
    has a ``[consistency]`` table already (two would be invalid TOML, one would be overridden silently)."""
    if any(line.strip() == "[consistency]" for line in config.splitlines()):
        raise ValueError("--consistency snapshot sets [consistency] itself: remove it from --changefeed-config")
    sep = "\n" if config and not config.endswith("\n") else ""
    return f'{config}{sep}[consistency]\nmode = "snapshot"\ninterval = {interval!r}\n'


def _num(x: float | None, digits: int = 0) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def consistency_table(catch_up: dict[str, Measurement], lag: list[LagResult], run: list[Variant],
                      interval: float) -> str:
    """One line per variant and offered rate (one per variant without lag runs): the catch-up of workload (a)
    (``catch_up``, keyed by label) and the lag runs (``lag``, whose ``sink`` is the label)."""
    cols = ("mode", "sink", "barrier interval s", "catch-up rows/s", "capture CPU s/M rows", "target CPU s/M rows",
            "offered rows/s", "visible lag p50 s", "visible lag p99 s", "checkpoint lag p50 s", "checkpoint lag p99 s")
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for v in run:
        m = catch_up.get(v.label)
        head = [v.mode, v.sink, f"{interval:g}" if v.snapshot else "-",
                _num(m.rows_per_s) if m else "-", _num(m.per_mrows(m.cpu_s), 1) if m else "-",
                _num(m.per_mrows(m.target_cpu_s), 1) if m else "-"]
        runs = [r for r in lag if r.consumer == "tidewater" and r.sink == v.label]
        for r in runs or [None]:
            tail = ["-"] * 5 if r is None or r.error else [
                str(r.offered), _num(r.apply_p50, 3), _num(r.apply_p99, 3), _num(r.p50, 3), _num(r.p99, 3)]
            if r is not None and r.error:
                tail[0] = str(r.offered)
            lines.append("| " + " | ".join(head + tail) + " |")
    return "\n".join(lines)
