"""Where the time goes: CPU per million rows of every process in each goal's chain, Tidewater's next to the
reference's (issue 22 item 9, issue 23 item 7).

A goal ratio compares two catch-up rates measured on the same rows. Each consumer is a chain of processes: Tidewater
is the upstream side (a PostgreSQL walsender; for a MariaDB upstream the whole ``mariadbd``, whose binlog dump thread
is not a process of its own), the capture (all its processes), the target server and etcd; the references are
the chains named in :func:`reference_chain`. With ``c`` cores, a chain that spends ``T`` CPU seconds per row and keeps
a share ``u`` of the cores busy (its *utilisation*, total CPU / (seconds x cores)) runs at ``u x c / T`` rows a second,
so the measured rate ratio Tidewater / reference is exactly

    (reference's T / Tidewater's T)  x  (Tidewater's u / reference's u)
         the CPU ratio                      the utilisation ratio

The CPU ratio is what the ratio would be if both chains kept the cores equally busy: below the goal, the gap is a
CPU budget, and the per-process differences say whose cost makes it. A utilisation well below 1 means the chain
waited (latency, a serial step, a timer), unless the host was busy with other work meanwhile (contention: the
host's busy share is measured over the same seconds); that part the CPU ratio does not explain. A run shorter than
:data:`SHORT_S` is dominated by fixed costs and says neither.

Pure computation over :class:`bench.consumers.Measurement` objects; thread-safe.
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.consumers import Measurement

SHORT_S = 0.3  # a run shorter than this is mostly start-up and polling: its figures are not steady
BUSY = 0.8  # a chain at or above this utilisation counts as CPU-bound (so does a host at or above it)
ROLES = ("upstream side", "consumer", "target server", "etcd")


@dataclass(frozen=True)
class Part:
    role: str  # one of ROLES
    process: str  # what it is in this chain ("walsender", "capture", "subscriber server", ...)
    cpu_s: float | None  # its CPU seconds over the run; None: not measured


@dataclass(frozen=True)
class Chain:
    """One consumer's measured run and the processes it took, each with its CPU seconds."""

    who: str
    m: Measurement
    parts: tuple[Part, ...]
    note: str = ""

    def part(self, role: str) -> Part | None:
        return next((p for p in self.parts if p.role == role), None)

    def per_mrows(self, role: str) -> float | None:
        p = self.part(role)
        return self.m.per_mrows(p.cpu_s) if p is not None else None

    @property
    def missing(self) -> list[str]:
        return [p.process for p in self.parts if p.cpu_s is None]

    @property
    def total_s(self) -> float | None:
        """CPU seconds of every process of the chain; None when one was not measured (a partial sum would flatter)."""
        return None if self.missing else sum(p.cpu_s or 0.0 for p in self.parts)

    @property
    def total_per_mrows(self) -> float | None:
        return self.m.per_mrows(self.total_s)

    def utilisation(self, cores: int) -> float | None:
        """Total CPU / (seconds x cores): near 1 the chain was CPU-bound, well below it waited."""
        total = self.total_s
        return total / (self.m.seconds * cores) if total is not None and self.m.ok and cores > 0 else None

    @property
    def short(self) -> bool:
        return self.m.ok and self.m.seconds < SHORT_S


def tidewater_chain(m: Measurement, upstream: str) -> Chain:
    """Tidewater into ``m.sink``: the upstream side, the capture (with its child processes, live or reaped), the
    target server (none for blackhole) and etcd."""
    upstream_part = (Part("upstream side", "walsender", m.walsender_cpu_s) if upstream == "postgresql"
                     else Part("upstream side", "upstream server", m.upstream_cpu_s))
    procs = f"capture ({m.tree_procs} processes)" if m.tree_procs and m.tree_procs > 1 else "capture"
    parts = [upstream_part, Part("consumer", procs, m.cpu_s)]
    if m.sink != "blackhole":
        parts.append(Part("target server", f"{m.sink} server", m.target_cpu_s))
    parts.append(Part("etcd", "etcd", m.meta_cpu_s))
    return Chain(f"Tidewater -> {m.sink}", m, tuple(parts))


def reference_chain(m: Measurement, upstream: str) -> Chain:
    """The reference ``m`` (its ``consumer`` says which) as a chain of processes."""
    if m.consumer == "native" and upstream == "postgresql":
        return Chain("native PG->PG", m, (Part("upstream side", "walsender", m.walsender_cpu_s),
                                           Part("target server", "subscriber server", m.target_cpu_s)),
                     "apply worker inside the subscriber server")
    if m.consumer == "native":
        return Chain("native replica", m, (Part("upstream side", "upstream server", m.upstream_cpu_s),
                                            Part("target server", "replica server", m.target_cpu_s)),
                     "I/O and SQL threads inside the replica server")
    if m.consumer == "write ceiling":
        return Chain(f"{m.note or 'bulk load'} into {m.sink}", m, (Part("target server", f"{m.sink} server",
                                                                      m.target_cpu_s),),
                     "replicates nothing: loads the phase's final rows from a file")
    if m.consumer == "pg_recvlogical":
        return Chain("pg_recvlogical", m, (Part("upstream side", "walsender", m.walsender_cpu_s),
                                          Part("consumer", "pg_recvlogical", m.cpu_s)), "to /dev/null")
    return Chain(m.consumer, m, (Part("upstream side", "upstream server", m.upstream_cpu_s),
                                 Part("consumer", m.consumer, m.cpu_s)), "to /dev/null, rows not decoded")


@dataclass(frozen=True)
class RatioGoal:
    """One goal of the form Tidewater's rate / a reference's rate >= ``goal``, with both measurements."""

    what: str  # the goal's line in the goal table, e.g. "PG -> PG / native logical replication (a)"
    tidewater: Measurement
    reference: Measurement
    goal: float

    @property
    def value(self) -> float | None:
        return _over(self.tidewater.rows_per_s, self.reference.rows_per_s)


def _over(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


@dataclass(frozen=True)
class Budget:
    """A goal ratio explained by its two chains (module doc)."""

    goal: RatioGoal
    tw: Chain
    ref: Chain
    cores: int

    @property
    def cpu_ratio(self) -> float | None:
        """Reference's total CPU per row / Tidewater's: the rate ratio if both kept the cores equally busy."""
        return _over(self.ref.total_per_mrows, self.tw.total_per_mrows)

    @property
    def utilisation_ratio(self) -> float | None:
        return _over(self.tw.utilisation(self.cores), self.ref.utilisation(self.cores))

    def differences(self) -> list[tuple[str, float]]:
        """Tidewater's CPU per million rows minus the reference's, per role, largest first (a role one chain does not
        have counts 0 there: the native subscriber's apply worker is inside its server, so the capture has no
        counterpart)."""
        out = []
        for role in ROLES:
            tw, ref = self.tw.part(role), self.ref.part(role)
            if tw is None and ref is None:
                continue
            a = self.tw.per_mrows(role) if tw is not None else 0.0
            b = self.ref.per_mrows(role) if ref is not None else 0.0
            if a is not None and b is not None:
                name = tw.process if tw is not None else ref.process if ref is not None else role
                out.append((name, a - b))
        return sorted(out, key=lambda d: -abs(d[1]))

    def reading(self) -> str:
        """What the figures say about this ratio (module doc), in one cell."""
        short = [c for c in (self.tw, self.ref) if c.short]
        if short:
            return "short run: " + ", ".join(f"{c.who} {c.m.seconds:.2f} s" for c in short) + \
                f" (< {SHORT_S:g} s): start-up and polling dominate, neither factor is steady"
        missing = [f"{c.who}: {', '.join(c.missing)}" for c in (self.tw, self.ref) if c.missing]
        if missing:
            return "not explained: not measured " + "; ".join(missing)
        value, cpu, util = self.goal.value, self.cpu_ratio, self.utilisation_ratio
        if value is None or cpu is None or util is None:
            return "-"
        says = [f"{value:.2f} = CPU {cpu:.2f} x utilisation {util:.2f}"]
        if value >= self.goal.goal:
            return "met; " + says[0]
        if cpu < self.goal.goal:
            diffs = ", ".join(f"{name} {d:+.1f}" for name, d in self.differences() if abs(d) >= 0.05)
            says.append(f"CPU budget: at equal utilisation {cpu:.2f} < {self.goal.goal:g}; Tidewater minus reference, "
                        f"CPU s/M rows: {diffs}")
        u_tw = self.tw.utilisation(self.cores) or 0.0
        if u_tw < BUSY:
            host = self.tw.m.host_busy
            if host is not None and host >= BUSY:
                says.append(f"contention: Tidewater's chain had {u_tw:.2f} of the cores while the host was {host:.2f} "
                            "busy (other work took the rest)")
            else:
                says.append(f"wait: Tidewater's chain kept {u_tw:.2f} of the cores busy"
                            + (f" (host {host:.2f})" if host is not None else "")
                            + ": latency, a serial step or a timer, which the CPU ratio does not explain")
        elif util < 1 and cpu >= self.goal.goal:
            says.append(f"the reference kept more of the cores busy ({self.ref.utilisation(self.cores):.2f} against "
                        f"{u_tw:.2f})")
        if cpu >= self.goal.goal and says[-1].startswith(("contention", "the reference")):
            says.append("the CPU ratio does not explain the gap")
        return "; ".join(says)


def budgets(goals: list[RatioGoal], upstream: str, cores: int) -> list[Budget]:
    return [Budget(g, tidewater_chain(g.tidewater, upstream), reference_chain(g.reference, upstream), cores)
            for g in goals]


def _num(x: float | None, digits: int) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _table(columns: tuple[str, ...], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


CHAIN_COLUMNS = ("goal", "chain", "seconds", "upstream side CPU s/M rows", "consumer CPU s/M rows",
                 "target server CPU s/M rows", "etcd CPU s/M rows", "total CPU s/M rows", "utilisation", "host busy",
                 "processes")
RATIO_COLUMNS = ("goal", "Tidewater CPU s/M rows", "reference CPU s/M rows", "CPU ratio (reference / Tidewater)",
                 "Tidewater utilisation", "reference utilisation", "measured ratio", "goal ratio", "reading")


def chain_table(items: list[Budget]) -> str:
    """Two lines per goal: Tidewater's chain, then the reference's, each process's CPU per million rows."""
    rows = []
    for b in items:
        for c in (b.tw, b.ref):
            procs = " + ".join(f"{p.process}" for p in c.parts) + (f" ({c.note})" if c.note else "")
            rows.append([b.goal.what, c.who, _num(c.m.seconds, 2) if c.m.ok else "-",
                         *(_num(c.per_mrows(r), 1) for r in ROLES), _num(c.total_per_mrows, 1),
                         _num(c.utilisation(b.cores), 2), _num(c.m.host_busy, 2), procs])
    return _table(CHAIN_COLUMNS, rows)


def ratio_table(items: list[Budget]) -> str:
    """One line per goal: the totals, their ratio, the utilisations, the measured ratio, the goal and the reading."""
    rows = [[b.goal.what, _num(b.tw.total_per_mrows, 1), _num(b.ref.total_per_mrows, 1), _num(b.cpu_ratio, 2),
             _num(b.tw.utilisation(b.cores), 2), _num(b.ref.utilisation(b.cores), 2), _num(b.goal.value, 2),
             f"{b.goal.goal:g}", b.reading()] for b in items]
    return _table(RATIO_COLUMNS, rows)


LEGEND = (
    "CPU seconds per million rows of each process over the consumer's catch-up. Upstream side: the walsender(s) "
    "started for the run (their whole life, polled every 50 ms); for a MariaDB upstream the whole upstream mariadbd "
    "(its binlog dump thread and whatever else the server did meanwhile). Consumer: the capture's process with its "
    "child processes, live or reaped ('processes': the most seen at once), pg_recvlogical or mariadb-binlog "
    "(rusage). Target server: the whole server (PostgreSQL: postmaster and every backend, live or reaped, the apply "
    "worker and background writers; mariadbd: all threads). etcd: Tidewater's meta store. Utilisation: the chain's "
    "total CPU / (seconds x {cores} cores); host busy: the share of all cores busy with anything over Tidewater's "
    "run (the reference's line: over its own). Measured ratio = CPU ratio x (Tidewater's utilisation / the "
    "reference's). Runs under {short:g} s are marked short.")


def format_budget(goals: list[RatioGoal], upstream: str, cores: int) -> str:
    """The section's body: the legend, the chains and the ratios ("" when no goal ratio was measured)."""
    items = budgets(goals, upstream, cores)
    if not items:
        return ""
    return "\n\n".join([LEGEND.format(cores=cores, short=SHORT_S), chain_table(items), ratio_table(items)])
