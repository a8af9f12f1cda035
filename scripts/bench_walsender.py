"""What the walsender does for each consumer of the same WAL: CPU, syscalls and loopback packets per row.

Starts one PostgreSQL 18 (and a subscriber for native logical replication), writes workload (a) (``--rows`` inserts
of ~100-byte rows, 100 per transaction) once per round, then lets each consumer catch up on exactly that WAL, one at
a time, on a slot of its own created before the writes:

- ``tidewater``: :class:`upstream.postgres.stream.ReplicationStream` read as a span source reads it (the C drain,
  routed into runs, :class:`StreamWaits`), nothing else in the process;
- ``recvlogical``: ``pg_recvlogical`` as the bench runs it (proto 4, streaming on, to /dev/null);
- ``native``: a ``CREATE SUBSCRIPTION`` on the second server, applying.

For each, the walsender's CPU (``/proc``), the reading thread's CPU (Tidewater) and, unless ``--cpu-only``, what
``perf stat -p`` counts on the walsender (tracepoints, no ptrace, so the consumer's pace is not changed; they cost the
walsender ~1 us per syscall, so compare CPU from ``--cpu-only`` runs): its syscalls (sendto, recvfrom, epoll, all),
context switches, and the packets sent in its context on the loopback (``net:net_dev_xmit``: its data segments, and
ACKs its softirq sends). The walsender is found as the postmaster forks it, stopped (SIGSTOP) until perf counts, then
let go: the counts cover its whole stream (``perf stat -a --per-thread`` misses a thread started after it, ``-p``
does not follow a fork). ``--record DIR``: ``perf record -g`` of each walsender instead of the counts.

``tidewater:unix`` reads over the server's Unix socket instead of TCP. ``tidewater:N`` as a consumer sets the reader's ``SO_RCVBUF`` to N after the connection is up (``--rcvbuf`` for
every Tidewater consumer); ``--lowat`` / ``--busy-wait`` change :class:`StreamWaits`. Below the sender's MSS (half the
largest window it saw, 32 KiB here) a shrunk window wedges the stream on the persist timer: ``tidewater:8192`` read
18 MB in 4 minutes, ``tidewater:16384`` once 50,000 rows in 57 s (``--timeout`` ends such a run).

    .venv/bin/python scripts/bench_walsender.py [--rows 300000] [--rounds 2] [--consumers tidewater,recvlogical,native]
        [--cpu-only] [--record DIR] [--label L]

Prints one line per consumer and round: rows/s, walsender and reader CPU s per million rows, counts per row.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.consumers import NativeSubscription, create_recv_slot, drop_slot  # noqa: E402
from bench.procstat import LastCpu  # noqa: E402
from bench.workloads import insert_sql, sbtest_ddl, timed_writes  # noqa: E402
from cdc.ts import lsn_to_str  # noqa: E402
from playground.servers import PostgresServer  # noqa: E402
from upstream.postgres.stream import Keepalive, ReplicationStream  # noqa: E402

DB = "w"
PUB = "wpub"
EVENTS = ["syscalls:sys_enter_sendto", "syscalls:sys_enter_recvfrom", "syscalls:sys_enter_epoll_wait", "syscalls:sys_enter_epoll_pwait",
          "raw_syscalls:sys_enter", "net:net_dev_xmit", "sched:sched_switch"]
SHORT = {"syscalls:sys_enter_sendto": "send", "syscalls:sys_enter_recvfrom": "recv",
         "syscalls:sys_enter_epoll_wait": "epoll", "syscalls:sys_enter_epoll_pwait": "epollp", "raw_syscalls:sys_enter": "sys", "net:net_dev_xmit": "pkts",
         "sched:sched_switch": "cswitch"}


class WalsenderWatch:
    """Finds the next walsender the postmaster forks (``/proc``, every millisecond), stops it (SIGSTOP), attaches
    ``perf stat -p`` to it and lets it go on (SIGCONT) once perf counts: its counts cover its whole stream. (``perf
    stat -a --per-thread`` misses a thread started after it, ``-p`` does not follow a fork.)"""

    def __init__(self, postmaster: int, known: set[int], record: str = "") -> None:
        self.postmaster, self.known, self.record = postmaster, known, record
        self.pid: int | None = None
        self.paused = 0.0
        self.cpu = LastCpu(0.02)
        fd, out = tempfile.mkstemp(prefix="walsnd-perf-", suffix=".txt")
        os.close(fd)
        self._out = Path(out)
        self._proc: subprocess.Popen[bytes] | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @staticmethod
    def children(postmaster: int) -> set[int]:
        try:
            return {int(p) for p in Path(f"/proc/{postmaster}/task/{postmaster}/children").read_text().split()}
        except OSError:
            return set()

    def _run(self) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for pid in self.children(self.postmaster) - self.known:
                try:
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
                except OSError:
                    continue
                if b"walsender" in cmd:
                    self._attach(pid)
                    return
            time.sleep(0.001)

    def _attach(self, pid: int) -> None:
        t0 = time.monotonic()
        os.kill(pid, signal.SIGSTOP)
        argv = (["perf", "record", "-g", "-F", "2000", "-p", str(pid), "-o", self.record] if self.record else
                ["perf", "stat", "-p", str(pid), "-e", ",".join(EVENTS), "-o", str(self._out)])
        if self.record != "-":
            self._proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(0.3)  # (perf opens its counters)
        self.cpu.watch(pid)
        self.pid = pid
        os.kill(pid, signal.SIGCONT)
        self.paused = time.monotonic() - t0

    def wait_found(self, timeout: float = 30) -> int:
        deadline = time.monotonic() + timeout
        while self.pid is None:
            if time.monotonic() > deadline:
                raise TimeoutError("no walsender")
            time.sleep(0.01)
        return self.pid

    def finish(self) -> tuple[float, dict[str, int]]:
        """(walsender CPU seconds, perf counts); call once the stream is over (the walsender may be gone)."""
        self._thread.join(5)
        cpu = self.cpu.stop()
        got: dict[str, int] = {}
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.send_signal(signal.SIGINT)
            self._proc.wait(30)
            for line in [] if self.record else self._out.read_text().splitlines():
                m = re.match(r"\s*([\d,]+)\s+(\S+)", line)
                if m:
                    got[SHORT.get(m.group(2), m.group(2))] = int(m.group(1).replace(",", ""))
        self._out.unlink()
        return cpu, got


def slot_pid(up: PostgresServer, slot: str) -> int | None:
    rows = up.execute("SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s", db=DB, params=(slot,))
    return int(rows[0][0]) if rows and rows[0][0] is not None else None


def relid(up: PostgresServer) -> int:
    rows = up.execute("SELECT 'sbtest'::regclass::oid::int", db=DB)
    assert rows
    return int(rows[0][0])


def run_tidewater(up: PostgresServer, slot: str, start: int, target: int, args: argparse.Namespace) -> float:
    """Read the slot up to ``target`` as a span source does; returns the reading thread's CPU seconds."""
    from upstream.postgres import stream as stream_mod

    if args.lowat is not None:
        stream_mod.StreamWaits.BUSY_BYTES = args.lowat
    if args.busy_wait is not None:
        stream_mod.StreamWaits.BUSY_WAIT = args.busy_wait
    s = ReplicationStream(up.uri(DB), slot, PUB, start, holder="walsnd")
    if getattr(args, "unix", ""):  # (our URIs name a TCP host only: the socket directory is put in behind them)
        from upstream.postgres import conn as conn_mod

        plain = conn_mod.connect_kwargs

        def over_socket(*a: Any, **k: Any) -> dict[str, Any]:
            return {**plain(*a, **k), "host": args.unix}

        conn_mod.connect_kwargs = over_socket  # type: ignore[assignment]
        try:
            s.open()
        finally:
            conn_mod.connect_kwargs = plain  # type: ignore[assignment]
    else:
        s.open()
    stop = threading.Event()
    prefixes = {relid(up): b"p"}
    cpu0 = time.thread_time()
    rows = 0
    deadline = time.monotonic() + args.timeout
    plain_waits = stream_mod.StreamWaits
    if args.rcvbuf:
        class Shrunk(plain_waits):  # (the stream's waits, on a socket whose receive buffer is set first)
            def __init__(self, conn: Any) -> None:
                with socket.socket(fileno=os.dup(conn.fileno())) as sock:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, args.rcvbuf)
                super().__init__(conn)

        stream_mod.StreamWaits = Shrunk  # type: ignore[misc]
    try:
        for m in s.messages(stop, prefixes):
            if type(m) is list:
                rows += len(m)
            elif type(m) is Keepalive and m.ts >= target:
                s.ack(m.ts)
                break
            elif m is None and time.monotonic() > deadline:
                raise TimeoutError(f"tidewater read {rows} rows in {args.timeout:.0f} s: the stream stalled")
    finally:
        stream_mod.StreamWaits = plain_waits  # type: ignore[misc]
        s.close()
    return time.thread_time() - cpu0


def run_recvlogical(up: PostgresServer, slot: str, target: int) -> subprocess.Popen[bytes]:
    argv = [str(up.bin_dir / "pg_recvlogical"), "-d", up.dsn(DB), "-S", slot, "--start", "-f", "/dev/null",
            f"--endpos={lsn_to_str(target)}", "--no-loop", "-s", "1", "-o", "proto_version=4",
            "-o", f"publication_names={PUB}", "-o", "streaming=on"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)


def measure(up: PostgresServer, sub_server: PostgresServer, consumer: str, rnd: int, lo: int, rows: int,
            args: argparse.Namespace) -> dict[str, Any]:
    consumer, _, rcvbuf = consumer.partition(":")
    if rcvbuf == "unix":
        args = argparse.Namespace(**{**vars(args), "unix": str(up.socket_dir)})
    elif rcvbuf:
        args = argparse.Namespace(**{**vars(args), "rcvbuf": int(rcvbuf)})
    slot = f"w_{consumer}_{rnd}_{rcvbuf or 'd'}"
    native: NativeSubscription | None = None
    if consumer == "native":
        native = NativeSubscription(up, DB, sub_server, DB, slot, PUB)
        native.create()
    else:
        create_recv_slot(up, DB, slot)
    start_rows = up.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
                            db=DB, params=(slot,))
    assert start_rows
    hi, lo_s = str(start_rows[0][0]).split("/")
    start = (int(hi, 16) << 32) | int(lo_s, 16)
    sql = insert_sql("sbtest")

    def body(conn: Any, cur: Any) -> int:
        for i in range(lo, lo + rows, 100):
            cur.execute(sql, (i, min(i + 99, lo + rows - 1)))
            conn.commit()
        return rows

    target = timed_writes(up, DB, body).target_lsn
    time.sleep(1.0)  # (the checkpointer and the writer's backend quiet down)
    assert up.pid is not None
    record = "-" if args.cpu_only else f"{args.record}/{args.label}-{consumer}-{rnd}.data" if args.record else ""
    watch = WalsenderWatch(up.pid, WalsenderWatch.children(up.pid), record)
    t0 = time.monotonic()
    reader_cpu = 0.0
    if consumer == "tidewater":
        reader_cpu = run_tidewater(up, slot, start, target, args)
    elif consumer == "recvlogical":
        proc = run_recvlogical(up, slot, target)
        proc.wait(300)
    else:
        assert native is not None
        with native.polling():
            native.enable()
            deadline = time.monotonic() + 300
            while native.confirmed_lsn() < target and native.applied_lsn() < target:
                if time.monotonic() > deadline:
                    raise TimeoutError("native did not catch up")
                time.sleep(0.01)
    seconds = time.monotonic() - t0 - watch.paused
    if native is not None:
        native.disable()
    walsender_cpu, counts = watch.finish()
    if native is not None:
        native.drop()
    else:
        for _ in range(100):
            if slot_pid(up, slot) is None:
                break
            time.sleep(0.05)
        drop_slot(up, DB, slot)
    per = {k: v / rows for k, v in counts.items()}
    return {"consumer": consumer + (f":{rcvbuf}" if rcvbuf else ""), "round": rnd, "rows/s": rows / seconds, "cpu_s_per_M": walsender_cpu / rows * 1e6,
            "reader_s_per_M": reader_cpu / rows * 1e6,
            **per}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=300_000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--consumers", default="tidewater,recvlogical,native")
    ap.add_argument("--rcvbuf", type=int, default=0, help="SO_RCVBUF of the Tidewater reader's socket (0: as is)")
    ap.add_argument("--lowat", type=int, default=None, help="StreamWaits.BUSY_BYTES")
    ap.add_argument("--busy-wait", type=float, default=None, help="StreamWaits.BUSY_WAIT")
    ap.add_argument("--label", default="")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds a consumer may take")
    ap.add_argument("--cpu-only", action="store_true", help="no perf (its tracepoints cost the walsender CPU)")
    ap.add_argument("--record", default="", help="a directory: perf record -g of each walsender instead of counts")
    args = ap.parse_args()
    consumers = args.consumers.split(",")
    with tempfile.TemporaryDirectory(prefix="walsnd-") as d:
        up = PostgresServer(Path(d) / "up").start()
        sub_server = PostgresServer(Path(d) / "sub").start()
        try:
            for server in (up, sub_server):
                server.execute(f"CREATE DATABASE {DB}")
                server.execute(sbtest_ddl("sbtest"), db=DB)
            up.execute(f"CREATE PUBLICATION {PUB} FOR ALL TABLES", db=DB)
            lo = 1
            print(f"# {args.label} load {os.getloadavg()[0]:.1f}", flush=True)
            for rnd in range(args.rounds):
                for consumer in consumers:
                    r = measure(up, sub_server, consumer, rnd, lo, args.rows, args)
                    lo += args.rows
                    counts = "  per row: " + " ".join(
                        f"{k} {r[k]:.3f}" for k in SHORT.values() if k in r) if "sys" in r else ""
                    print(f"{args.label} {r['consumer']:16s} r{rnd} {r['rows/s']:9.0f} rows/s  walsender "
                          f"{r['cpu_s_per_M']:5.2f} s/M  reader {r['reader_s_per_M']:5.2f} s/M{counts}", flush=True)
            print(f"# load {os.getloadavg()[0]:.1f}", flush=True)
        finally:
            up.stop()
            sub_server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
