"""The consumers measured on the same upstream WAL: Tidewater changefeeds, ``pg_recvlogical`` (read
ceiling) and PostgreSQL's native logical replication (``CREATE SUBSCRIPTION`` on a second server).

Every consumer is measured in *catch-up* mode: its slot existed before the phase's writes, it was not
reading while they ran, and the measurement is the time from starting it (resume / enable / exec) until
it has consumed everything up to the phase's target LSN (the upstream insert position after the last
commit). Consumers are measured one at a time, so none competes with another or with the writer.

Not thread-safe: one thread drives a consumer.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from bench.checkpoint_watch import CheckpointWatch
from bench.procstat import (
    HostCpu,
    LastCpu,
    TreeSampler,
    cpu_seconds,
    reset_peak_rss,
    status_bytes,
    tree_cpu_seconds,
)
from cdc.ts import lsn_to_str, str_to_lsn
from playground.cluster import ApiError, CdcServer, current_lsn
from playground.servers import HOST, PostgresServer
from sinks.sql.target.own_table import PG_SCHEMA
from sinks.sql.target.position import DEFAULT_TABLE
from sinks.sql.target.staging import SYNCPOINT_TABLE


class Rated:
    """A timed run of ``rows`` rows in ``seconds`` (``error`` when it failed): its rate, and CPU per million rows."""

    rows: int
    seconds: float
    error: str

    @property
    def ok(self) -> bool:
        return not self.error and self.seconds > 0

    @property
    def rows_per_s(self) -> float | None:
        return self.rows / self.seconds if self.ok else None

    def per_mrows(self, cpu: float | None) -> float | None:
        return cpu / self.rows * 1e6 if cpu is not None and self.rows and self.ok else None


@dataclass
class Measurement(Rated):
    """One consumer catching up on one phase (or one bulk load for a write ceiling)."""

    consumer: str  # tidewater | pg_recvlogical | native | write ceiling
    sink: str  # sink kind for tidewater and write ceilings, "" otherwise
    rows: int  # upstream row changes of the phase (or rows loaded)
    seconds: float = 0.0
    cpu_s: float | None = None  # the consumer's own process(es): capture (with its children), pg_recvlogical, apply
    # workers, loader
    tree_cpu_s: float | None = None  # capture with its descendants
    walsender_cpu_s: float | None = None  # the upstream walsender(s) decoding for it
    target_cpu_s: float | None = None  # the target server's process tree (all its backends) while it ran
    upstream_cpu_s: float | None = None  # the upstream server's process tree while it ran (a MariaDB upstream: its
    # binlog dump threads live inside mariadbd, so this is the server's whole CPU, whatever else it did)
    meta_cpu_s: float | None = None  # the meta store (etcd) while it ran: Tidewater's checkpoints and owner ticks
    host_busy: float | None = None  # share of all the host's cores busy (any process) while it ran
    tree_procs: int | None = None  # most processes seen at once in the capture's tree (1: no child process)
    rss_peak: int | None = None  # capture VmHWM during the catch-up (bytes)
    tree_rss_peak: int | None = None  # highest sampled RSS of the capture's process tree (bytes)
    replicated_rows: int | None = None  # rows the changefeed reports written (check)
    error: str = ""
    note: str = ""



@dataclass(frozen=True)
class Around:
    """The servers whose CPU is measured around a consumer's run besides the consumer itself (None: not measured)."""

    target: int | None = None  # the target server's root process (postmaster, mariadbd)
    upstream: int | None = None  # the upstream server's (MariaDB: mariadbd, whose threads serve the binlog dumps)
    meta: int | None = None  # etcd's (Tidewater's meta store)


class RunCpu:
    """The CPU of :class:`Around`'s servers and the host's busy share from construction to :meth:`fill`."""

    def __init__(self, around: Around) -> None:
        self.target, self.upstream, self.meta = (TargetCpu(around.target), TargetCpu(around.upstream),
                                                 TargetCpu(around.meta))
        self.host = HostCpu()

    def fill(self, m: Measurement) -> None:
        m.target_cpu_s, m.upstream_cpu_s = self.target.spent(), self.upstream.spent()
        m.meta_cpu_s, m.host_busy = self.meta.spent(), self.host.busy()


class TargetCpu:
    """CPU seconds a target server's process tree (postmaster or mariadbd, with every backend, live or reaped)
    spends from construction to :meth:`spent`: the server's own work for what was applied, next to the
    consumer's. The tree includes the server's background processes (checkpointer, WAL writer, InnoDB's
    threads), which work for the writes too; an idle server costs ~0."""

    def __init__(self, pid: int | None) -> None:
        self.pid = pid
        self.start = tree_cpu_seconds(pid) if pid is not None else None

    def spent(self) -> float | None:
        if self.pid is None or self.start is None:
            return None
        return tree_cpu_seconds(self.pid) - self.start


def _slot_pids(upstream: PostgresServer, db: str, slots: list[str]) -> dict[str, int | None]:
    rows = upstream.execute("SELECT slot_name, active_pid FROM pg_replication_slots WHERE slot_name = ANY(%s)",
                            db=db, params=(slots,)) or []
    return {str(name): (int(pid) if pid is not None else None) for name, pid in rows}


def wait_slots_inactive(upstream: PostgresServer, db: str, slots: list[str], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while any(p is not None for p in _slot_pids(upstream, db, slots).values()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"slots {slots} still active after {timeout:.0f}s")
        time.sleep(0.05)


def log_running_xacts(upstream: PostgresServer, db: str) -> int:
    """Write a running-transactions record now (``pg_log_standby_snapshot``, PostgreSQL 16+) and return the WAL
    position after it. A logical slot's ``restart_lsn`` (where its walsender starts decoding on the next start)
    moves only to such a record, once its consumer has confirmed a position past it; the server writes one only
    every 15 s (bgwriter) or at a checkpoint."""
    conn = upstream.connect(db)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT pg_log_standby_snapshot()")
        return current_lsn(conn)
    finally:
        conn.close()


def slots_restarting_before(upstream: PostgresServer, db: str, slots: list[str], lsn: int) -> list[str]:
    """The slots among ``slots`` whose walsender would start decoding before ``lsn`` (``restart_lsn < lsn``)."""
    rows = upstream.execute("SELECT slot_name FROM pg_replication_slots WHERE slot_name = ANY(%s) "
                            "AND restart_lsn < %s::pg_lsn", db=db, params=(slots, lsn_to_str(lsn))) or []
    return [str(name) for (name,) in rows]


def wait_restart_past(upstream: PostgresServer, db: str, slots: list[str], lsn: int, timeout: float = 30) -> list[str]:
    """Wait until no slot of ``slots`` restarts decoding before ``lsn``; return those that still do after
    ``timeout`` (their consumer must keep running meanwhile: its confirmations move the restart point)."""
    deadline = time.monotonic() + timeout
    while (behind := slots_restarting_before(upstream, db, slots, lsn)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return behind


class WalNudger:
    """While a wait runs longer than ``after`` seconds, writes a tiny non-transactional logical message
    upstream every ``every`` seconds. A target LSN read with ``pg_current_wal_insert_lsn()`` can lie just
    past a page header that no record ends at; a later record lets the WAL flush position (and so every
    reader's position) pass it. Harmless for every consumer (no publication carries the message)."""

    def __init__(self, server: PostgresServer, db: str, after: float = 3.0, every: float = 1.0) -> None:
        self.server, self.db, self.after, self.every = server, db, after, every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="wal-nudge", daemon=True)

    def _run(self) -> None:
        if self._stop.wait(self.after):
            return
        while not self._stop.is_set():
            with contextlib.suppress(Exception):
                self.server.execute("SELECT pg_logical_emit_message(false, 'bench-nudge', '')", db=self.db)
            self._stop.wait(self.every)

    def __enter__(self) -> WalNudger:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


# ---- Tidewater ------------------------------------------------------------------------------------------
def remove_changefeed(cdc: CdcServer, cf_id: str, timeout: float = 60) -> None:
    """Remove the changefeed and wait until the API no longer knows it (best effort: a bench cleaning up)."""
    with contextlib.suppress(ApiError, OSError):
        cdc.request("DELETE", f"/api/v2/changefeeds/{cf_id}")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                cdc.changefeed(cf_id)
            except ApiError:
                return
            time.sleep(0.2)


class TidewaterFeed:
    """One changefeed of the ``cdc server`` under test, from the scenario's upstream database to one sink. :meth:`wait`
    sees the checkpoint reach its LSN by an etcd watch (:class:`bench.checkpoint_watch.CheckpointWatch`, open from
    :meth:`create` to :meth:`remove`) and polls the API only for the changefeed's state and progress."""

    def __init__(self, cdc: CdcServer, upstream: PostgresServer, db: str, cf_id: str, sink: str, sink_uri: str,
                 config: str = "") -> None:
        self.cdc, self.upstream, self.db = cdc, upstream, db
        self.cf_id, self.sink, self.sink_uri, self.config = cf_id, sink, sink_uri, config
        self.checkpoints = CheckpointWatch(cdc.etcd_url, cdc.cluster_id, cf_id)
        self.reached_at = 0.0  # monotonic time the last wait() saw what it waited for
        self.slots: list[str] = []
        # snapshot mode: the barrier the target shows (SyncpointPosition); wait() then also waits for it
        self.visible: Callable[[], int | None] | None = None

    def create(self, timeout: float = 300) -> None:
        """Create the changefeed and wait until its pipeline is up (checkpoint past the current LSN)."""
        self.checkpoints.open()
        self.cdc.request("POST", "/api/v2/changefeeds", {"changefeed_id": self.cf_id,
                         "upstream_uri": self.upstream.uri(self.db), "sink_uri": self.sink_uri,
                         "config": self.config}, timeout=timeout)
        info = self.cdc.changefeed(self.cf_id)
        self.slots = [s["slot"] for s in info["spans"]]
        conn = self.upstream.connect(self.db)
        try:
            self.wait(current_lsn(conn), timeout)
        finally:
            conn.close()

    def info(self) -> dict[str, Any]:
        return self.cdc.changefeed(self.cf_id)

    def wait(self, lsn: int, timeout: float, poll: float = 0.1,
             on_poll: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
        """Wait until the changefeed checkpoint reaches ``lsn`` (seen by the watch at once; the API is read every
        ``poll`` seconds for the state, and once more at the end) and, given :attr:`visible` (snapshot mode), until the
        target shows a barrier at or past it (what a reader sees, polled); raise if it fails or times out."""
        deadline = time.monotonic() + timeout
        with WalNudger(self.upstream, self.db):
            while True:
                info = self.info()
                if on_poll is not None:
                    on_poll(info)
                if info["checkpoint_ts"] >= lsn:
                    if self.visible is None:
                        self.reached_at = self.checkpoints.wait(lsn, 1.0) or time.monotonic()
                        return info
                    shown = self.visible()
                    if shown is not None and shown >= lsn:
                        self.reached_at = time.monotonic()
                        return info
                if info["state"] == "failed":
                    raise RuntimeError(f"changefeed {self.cf_id} failed: {info.get('error')}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"changefeed {self.cf_id} checkpoint {info['checkpoint']} did not reach "
                                       f"{lsn_to_str(lsn)} in {timeout:.0f}s (state {info['state']}, "
                                       f"error {info.get('error')}, spans {[s.get('error') for s in info['spans']]})")
                if info["checkpoint_ts"] >= lsn:
                    time.sleep(poll)  # (the barrier shown by the target is polled)
                else:
                    self.checkpoints.wait(lsn, poll)

    def pause(self) -> None:
        """Pause and wait until its slots have no reader (the span stopped)."""
        self.cdc.request("POST", f"/api/v2/changefeeds/{self.cf_id}/pause")
        wait_slots_inactive(self.upstream, self.db, self.slots)

    def resume(self) -> None:
        self.cdc.request("POST", f"/api/v2/changefeeds/{self.cf_id}/resume")

    def idle_resume_seconds(self, timeout: float) -> float:
        """Resume with nothing to replicate until the checkpoint passes the current LSN, pause again: the
        fixed cost included in every catch-up figure (owner tick, span start, checkpoint interval)."""
        conn = self.upstream.connect(self.db)
        try:
            with conn.cursor() as cur:  # new WAL past the checkpoint, so that there is something to reach; flushed
                # (PostgreSQL 17+): unflushed, a walsender saw it only after the WAL writer's next round (up to
                # wal_writer_delay, 200 ms), which this figure counted as Tidewater's
                cur.execute("SELECT pg_logical_emit_message(false, 'bench-idle', '', true)")
            lsn = current_lsn(conn)
        finally:
            conn.close()
        t0 = time.monotonic()
        self.resume()
        self.wait(lsn, timeout, poll=0.02)  # (0.25 s polls added up to 0.25 s to a ~0.2 s figure)
        seconds = self.reached_at - t0
        self.pause()
        return seconds

    def remove(self) -> None:
        self.checkpoints.close()
        remove_changefeed(self.cdc, self.cf_id)

    def reader_pids(self) -> list[int]:
        """The upstream processes reading for this changefeed now (its slots' walsenders)."""
        return [p for p in _slot_pids(self.upstream, self.db, self.slots).values() if p is not None]

    def walsender_cpu(self) -> float | None:
        pids = [p for p in _slot_pids(self.upstream, self.db, self.slots).values() if p is not None]
        cpus = [cpu_seconds(p) for p in pids]
        return sum(c for c in cpus if c is not None) if pids else None


class TargetQuery:
    """One aggregate row read again and again from a Tidewater table in a SQL target (``table`` in the sink's
    ``tidewater`` schema on PostgreSQL, in its database elsewhere), filtered by changefeed, on one autocommit
    connection (each read sees the latest commit). ``row()`` is ``None`` while the table does not exist yet."""

    def __init__(self, conn: Any, kind: str, changefeed: str, select: str, table: str) -> None:
        self.conn, self.changefeed = conn, changefeed
        qualified = f"{PG_SCHEMA}.{table}" if kind == "postgresql" else table
        mark = "?" if kind == "sqlite" else "%s"
        self.sql = f"SELECT {select} FROM {qualified} WHERE changefeed = {mark}"
        if kind == "mariadb":
            conn.autocommit(True)

    def row(self) -> tuple[Any, ...] | None:
        cur = self.conn.cursor()
        try:
            cur.execute(self.sql, (self.changefeed,))
            return tuple(cur.fetchone())
        except Exception:  # noqa: BLE001 - the table appears with the sink's first write / first barrier
            return None
        finally:
            cur.close()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.conn.close()


class SyncpointPosition:
    """The barrier a SQL target shows for one snapshot-mode changefeed: the highest ``barrier_ts`` of its
    ``tidewater_syncpoint`` rows, committed in the barrier's one transaction with the rows it makes visible (what a
    reader of the real tables sees; docs/consistency.md). ``None`` until the first barrier is applied."""

    def __init__(self, conn: Any, kind: str, changefeed: str) -> None:
        self.query = TargetQuery(conn, kind, changefeed, "max(barrier_ts)", SYNCPOINT_TABLE)

    def __call__(self) -> int | None:
        row = self.query.row()
        return int(row[0]) if row is not None and row[0] is not None else None

    def close(self) -> None:
        self.query.close()


class TargetPosition:
    """The commit Ts a SQL target holds for one changefeed: the lowest ``commit_ts`` of its spans in the
    exactly-once position table (``sinks.sql.target.position``), committed with the rows it covers. ``None`` until
    every span has a row."""

    def __init__(self, conn: Any, kind: str, changefeed: str, spans: int) -> None:
        self.spans = spans
        self.query = TargetQuery(conn, kind, changefeed, "min(commit_ts), count(*)", DEFAULT_TABLE)

    def __call__(self) -> int | None:
        row = self.query.row()
        if row is None:
            return None
        low, n = row
        return int(low) if n >= self.spans and low is not None else None

    def close(self) -> None:
        self.query.close()


class Profiler:
    """Hooks a sampling profiler onto the capture during each Tidewater catch-up (see bench.profile, bench.states)."""

    def start(self, pid: int, name: str) -> Callable[[], None]:
        raise NotImplementedError


class Profilers(Profiler):
    """Several profilers around the same catch-ups (started in order, stopped in reverse order)."""

    def __init__(self, parts: list[Profiler]) -> None:
        self.parts = parts

    def start(self, pid: int, name: str) -> Callable[[], None]:
        stops = [p.start(pid, name) for p in self.parts]

        def stop() -> None:
            for s in reversed(stops):
                s()

        return stop


class Feed(Protocol):
    """What :func:`measure_tidewater` drives: a paused changefeed of the capture under test (:class:`TidewaterFeed`
    for a PostgreSQL upstream, ``bench.mariadb_refs.MariaDBFeed`` for MariaDB)."""

    cf_id: str
    sink: str
    reached_at: float  # monotonic time the last wait() saw the checkpoint reach its target

    def resume(self) -> None: ...

    def pause(self) -> None: ...

    def wait(self, lsn: int, timeout: float, poll: float = 0.1,
             on_poll: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]: ...

    def reader_pids(self) -> list[int]: ...


def measure_tidewater(feed: Feed, capture_pid: int, target_lsn: int, rows: int, timeout: float,
                      profiler: Profiler | None = None, name: str = "",
                      say: Callable[[str], None] | None = None, around: Around = Around()) -> Measurement:
    """Resume ``feed`` (paused, with the phase's WAL waiting in its slot), time it until its checkpoint
    covers ``target_lsn``, measure the capture's CPU (all its processes) and memory meanwhile, its walsenders' and
    those of ``around``'s servers (target, MariaDB upstream, etcd), pause it again."""
    m = Measurement("tidewater", feed.sink, rows)
    servers = RunCpu(around)
    hwm_reset = reset_peak_rss(capture_pid)
    cpu0 = cpu_seconds(capture_pid)
    tree0 = tree_cpu_seconds(capture_pid)
    sampler = TreeSampler(capture_pid).start()
    stop_profile = profiler.start(capture_pid, name) if profiler is not None else None
    walsender = LastCpu()
    watched: set[int] = set()
    next_report = [time.monotonic() + 30]

    def watch(info: dict[str, Any]) -> None:
        if say is not None and time.monotonic() > next_report[0]:
            next_report[0] += 30
            done = sum(s.get("rows") or 0 for s in info["spans"])
            say(f"    {feed.cf_id}: {done} of {rows} rows, checkpoint {info['checkpoint']}, state {info['state']}")
        for pid in feed.reader_pids():
            if pid not in watched:
                watched.add(pid)
                walsender.watch(pid)

    try:
        t0 = time.monotonic()
        feed.resume()
        info = feed.wait(target_lsn, timeout, on_poll=watch, poll=0.25)
        m.seconds = feed.reached_at - t0  # (seen by the feed's etcd watch: not rounded up to a poll of the API)
        watch(info)
        m.walsender_cpu_s = walsender.total() if watched else None
        cpu1 = cpu_seconds(capture_pid)
        own = cpu1 - cpu0 if cpu0 is not None and cpu1 is not None else None
        m.tree_cpu_s = tree_cpu_seconds(capture_pid) - tree0
        # the capture's CPU is all its processes' (span source processes with puller-process = true: live ones, and
        # those it reaped meanwhile through its cutime)
        m.cpu_s = m.tree_cpu_s if own is not None else None
        if own is not None and m.tree_cpu_s - own > 0.05 * max(own, 0.01):
            m.note = f"capture process alone {own / rows * 1e6:.1f} CPU s/M rows" if rows else m.note
        m.rss_peak = status_bytes(capture_pid, ("VmHWM",)).get("VmHWM")
        if not hwm_reset:
            m.note = "VmHWM not reset (peak since the capture started)"
        m.replicated_rows = int(sum(s.get("rows") or 0 for s in info["spans"]))
        servers.fill(m)
    except Exception as exc:  # noqa: BLE001 - reported in the table, the run goes on
        m.error = f"{type(exc).__name__}: {exc}"
    finally:
        walsender.stop()
        peak = sampler.stop()
        m.tree_rss_peak, m.tree_procs = peak.tree_rss_peak, peak.tree_procs
        if stop_profile is not None:
            stop_profile()
        try:
            feed.pause()
        except Exception as exc:  # noqa: BLE001
            m.error = m.error or f"pause failed: {exc}"
    return m


# ---- native logical replication -------------------------------------------------------------------------
class NativeSubscription:
    """``CREATE SUBSCRIPTION ... WITH (copy_data = false, enabled = false)`` on the subscriber for the
    upstream publication ``publication`` (PostgreSQL's defaults otherwise: in PostgreSQL 18 large
    transactions are streamed and applied by parallel workers). Its slot is created upstream at once."""

    def __init__(self, upstream: PostgresServer, up_db: str, subscriber: PostgresServer, sub_db: str, name: str,
                 publication: str) -> None:
        self.upstream, self.up_db = upstream, up_db
        self.subscriber, self.sub_db = subscriber, sub_db
        self.name, self.publication = name, publication
        self._conns: dict[str, Any] = {}  # "sub" / "up": the connections :meth:`polling` holds

    @contextlib.contextmanager
    def polling(self) -> Iterator[None]:
        """Inside it, the status queries of a wait go over one connection to each server: a new connection per
        query is a new PostgreSQL backend per poll (40 a second on the subscriber), whose start-up CPU landed in
        the subscriber's figure, i.e. in native's target server CPU."""
        self._conns = {"sub": self.subscriber.connect(self.sub_db), "up": self.upstream.connect(self.up_db)}
        try:
            yield
        finally:
            conns, self._conns = self._conns, {}
            for conn in conns.values():
                with contextlib.suppress(Exception):
                    conn.close()

    def _rows(self, on: str, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        """``sql`` on the subscriber (``on == "sub"``) or the upstream (``"up"``), over :meth:`polling`'s connection
        when there is one, else over a new one."""
        conn = self._conns.get(on)
        if conn is None:
            server, db = (self.subscriber, self.sub_db) if on == "sub" else (self.upstream, self.up_db)
            return server.execute(sql, db=db, params=params) or []
        with conn.cursor() as cur:
            cur.execute(sql, params)
            return list(cur.fetchall())

    def create(self) -> None:
        conninfo = f"host={HOST} port={self.upstream.port} user=postgres dbname={self.up_db}"
        self.subscriber.execute(f"CREATE SUBSCRIPTION {self.name} CONNECTION '{conninfo}' PUBLICATION "
                                f"{self.publication} WITH (copy_data = false, enabled = false)", db=self.sub_db)

    def enable(self) -> None:
        self.subscriber.execute(f"ALTER SUBSCRIPTION {self.name} ENABLE", db=self.sub_db)

    def disable(self) -> None:
        self.subscriber.execute(f"ALTER SUBSCRIPTION {self.name} DISABLE", db=self.sub_db)
        wait_slots_inactive(self.upstream, self.up_db, [self.name])

    def drop(self) -> None:
        with contextlib.suppress(Exception):
            self.disable()
        with contextlib.suppress(Exception):
            self.subscriber.execute(f"DROP SUBSCRIPTION IF EXISTS {self.name}", db=self.sub_db)
        with contextlib.suppress(Exception):
            self.upstream.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                                  "WHERE slot_name = %s", db=self.up_db, params=(self.name,))

    def applied_lsn(self) -> int:
        """End LSN of the last upstream transaction the subscriber has committed (replication origin)."""
        rows = self._rows("sub", "SELECT s.remote_lsn::text FROM pg_replication_origin_status s JOIN pg_subscription "
                          "sub ON s.external_id = 'pg_' || sub.oid WHERE sub.subname = %s", (self.name,))
        return str_to_lsn(rows[0][0]) if rows and rows[0][0] else 0

    def confirmed_lsn(self) -> int:
        """The slot's confirmed flush position: the subscriber reports everything received once every
        applied transaction is flushed locally (covers a target past the last commit record)."""
        rows = self._rows("up", "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
                          (self.name,))
        return str_to_lsn(rows[0][0]) if rows and rows[0][0] else 0

    def worker_pids(self) -> list[int]:
        rows = self._rows("sub", "SELECT pid FROM pg_stat_subscription WHERE subname = %s AND pid IS NOT NULL",
                          (self.name,))
        return [int(r[0]) for r in rows]

    def walsender_pids(self) -> list[int]:
        """The upstream walsender serving the subscription now (none while it is disabled)."""
        rows = self._rows("up", "SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s AND active_pid IS "
                          "NOT NULL", (self.name,))
        return [int(r[0]) for r in rows]

    def wait(self, lsn: int, timeout: float, on_poll: Callable[[], None] | None = None, poll: float = 0.05) -> None:
        deadline = time.monotonic() + timeout
        with WalNudger(self.upstream, self.up_db):
            while True:
                if on_poll is not None:
                    on_poll()
                if self.applied_lsn() >= lsn or self.confirmed_lsn() >= lsn:
                    return
                if time.monotonic() > deadline:
                    raise TimeoutError(f"subscription {self.name} applied {lsn_to_str(self.applied_lsn())}, not "
                                       f"{lsn_to_str(lsn)}, after {timeout:.0f}s")
                time.sleep(poll)


def measure_native(sub: NativeSubscription, target_lsn: int, rows: int, timeout: float,
                   around: Around = Around()) -> Measurement:
    """Enable the (disabled) subscription, time it until it has applied everything up to ``target_lsn``,
    disable it again. CPU: its apply workers (subscriber), its walsender (upstream) and, given ``around.target``
    (the subscriber's postmaster), the subscriber's whole process tree (apply workers included; the polls of the
    wait go over one connection each, :meth:`NativeSubscription.polling`)."""
    m = Measurement("native", "", rows)
    apply_cpu, walsender_cpu = LastCpu(), LastCpu()
    seen: set[int] = set()

    def watch() -> None:
        for pid in sub.worker_pids():
            if pid not in seen:
                seen.add(pid)
                apply_cpu.watch(pid)
        for pid in sub.walsender_pids():
            if pid not in seen:
                seen.add(pid)
                walsender_cpu.watch(pid)

    try:
        with sub.polling():
            servers = RunCpu(around)  # (after the polling connections' start-up)
            t0 = time.monotonic()
            sub.enable()
            sub.wait(target_lsn, timeout, on_poll=watch)
            m.seconds = time.monotonic() - t0
            watch()
        m.cpu_s = apply_cpu.total()
        m.walsender_cpu_s = walsender_cpu.total()
        servers.fill(m)
    except Exception as exc:  # noqa: BLE001
        m.error = f"{type(exc).__name__}: {exc}"
    finally:
        apply_cpu.stop()
        walsender_cpu.stop()
        try:
            sub.disable()
        except Exception as exc:  # noqa: BLE001
            m.error = m.error or f"disable failed: {exc}"
    return m


def catch_up_untimed(upstream: PostgresServer, db: str, feeds: list[TidewaterFeed], sub: NativeSubscription | None,
                     lsn: int, timeout: float) -> list[str]:
    """Every paused consumer reads an untimed setup's WAL up to ``lsn`` and stays on until its slot restarts decoding
    past it; paused again on return, which gives the slots that still restart before ``lsn`` (none normally).

    Paused at once, a slot keeps the restart point it had before the setup (it moves only to a running-transactions
    record its consumer confirmed, and the server logs one only every 15 s), and its walsender then decodes the whole
    setup again, spilling its large transactions to disk, at the start of the next timed catch-up: up to 2-3x the
    walsender CPU of (c), charged to Tidewater and native but never to pg_recvlogical, whose slot is created for each
    timed phase. A changefeed that restarts pays the same (so does native): that is PostgreSQL's restart rule, not
    what a timed phase measures."""
    mark = log_running_xacts(upstream, db)
    for feed in feeds:
        feed.resume()
    for feed in feeds:
        feed.wait(mark, timeout)
    behind = wait_restart_past(upstream, db, [slot for feed in feeds for slot in feed.slots], lsn)
    for feed in feeds:
        feed.pause()
    if sub is not None:
        sub.enable()
        sub.wait(mark, timeout)
        behind += wait_restart_past(upstream, db, [sub.name], lsn)
        sub.disable()
    return behind


# ---- pg_recvlogical -------------------------------------------------------------------------------------
def create_recv_slot(upstream: PostgresServer, db: str, slot: str) -> None:
    """(Re)create the logical slot ``slot`` (pgoutput) for ``pg_recvlogical``."""
    drop_slot(upstream, db, slot)
    upstream.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", db=db, params=(slot,))


def drop_slot(upstream: PostgresServer, db: str, slot: str) -> None:
    upstream.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s",
                     db=db, params=(slot,))


def measure_recvlogical(upstream: PostgresServer, db: str, slot: str, publication: str, target_lsn: int,
                        rows: int, timeout: float) -> Measurement:
    """``pg_recvlogical --start --endpos=<target>`` on ``slot`` with pgoutput (proto_version=4, streaming=on)
    writing to /dev/null: the time until it exits having reached the target."""
    m = Measurement("pg_recvlogical", "", rows)
    argv = [str(upstream.bin_dir / "pg_recvlogical"), "-d", upstream.dsn(db), "-S", slot, "--start",
            "-f", "/dev/null", f"--endpos={lsn_to_str(target_lsn)}", "--no-loop", "-s", "1",
            "-o", "proto_version=4", "-o", f"publication_names={publication}", "-o", "streaming=on"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    walsender = LastCpu()
    seen: set[int] = set()
    host = HostCpu()
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    status, usage = 0, None
    try:
        with WalNudger(upstream, db):
            deadline = t0 + timeout
            while True:
                pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
                if pid == proc.pid:
                    m.seconds = time.monotonic() - t0
                    proc.returncode = os.waitstatus_to_exitcode(status)
                    break
                for p in _slot_pids(upstream, db, [slot]).values():
                    if p is not None and p not in seen:
                        seen.add(p)
                        walsender.watch(p)
                if time.monotonic() > deadline:
                    raise TimeoutError(f"pg_recvlogical did not reach {lsn_to_str(target_lsn)} in {timeout:.0f}s")
                time.sleep(0.02)
        if proc.returncode != 0:
            err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
            raise RuntimeError(f"pg_recvlogical exited with {proc.returncode}: {err[-1000:]}")
        m.cpu_s = usage.ru_utime + usage.ru_stime if usage is not None else None
        m.walsender_cpu_s = walsender.total() if seen else None
        m.host_busy = host.busy()
    except Exception as exc:  # noqa: BLE001
        m.error = f"{type(exc).__name__}: {exc}"
        m.seconds = 0.0
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGKILL)
            proc.wait()
    finally:
        walsender.stop()
        if proc.stderr is not None:
            proc.stderr.close()
    return m
