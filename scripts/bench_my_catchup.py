"""Where the wall time of a MariaDB catch-up goes: the timeline of one changefeed's resume, from an etcd watch.

    .venv/bin/python scripts/bench_my_catchup.py [--rows 100000] [--rounds 8] [--shape insert|update]
                                                 [--sink blackhole] [--api-poll 0.25]

Starts what ``python -m bench --upstream mariadb`` starts for one sink (:class:`bench.mariadb_run.MariaDBBenchEnv`:
etcd, the MariaDB upstream and replica, one ``cdc server``), creates one changefeed of ``sbtest`` (the bench's table)
and then ``--rounds`` times: pause, write ``--rows`` rows upstream (``insert``: new keys, 100 per transaction, as
workload (a); ``update``: every row once by key, 100 random keys per transaction, as (b)), resume, and follow the
changefeed's keys in etcd by a watch of this script's own (no polling, so nothing is quantised and the capture
serves no request meanwhile) until the changefeed checkpoint reaches the binlog end. Per round it prints the times
after the resume request at which:

* ``assign``: the owner wrote the span's assignment;
* ``running``: the span's first status said it runs;
* ``first``: the first stored span checkpoint past its start;
* ``span end``: the stored span checkpoint reached the binlog end (and its rows column then);
* ``cf end``: the owner's changefeed checkpoint reached it (what the bench waits for);
* ``api``: with ``--api-poll S``, when a poll of the HTTP API every S seconds (the bench's way) would first have
  seen it: the first poll time at or after ``cf end`` on the grid 0, S + d, 2(S + d)..., d the measured duration of
  one API request;

and the capture's CPU seconds from resume to ``cf end``. ``--steady S`` then runs a steady stream for S seconds
and counts the span status writes it costs. With ``--threads``, every thread of the capture and of the
upstream ``mariadbd`` is sampled every 5 ms (:class:`bench.threadclock.ThreadClock`: time on a CPU and time runnable
but waiting for one, from ``schedstat``) and each round prints the busy threads (the capture's named by a
``py-spy dump`` taken at ``cf end``, before the pause) with their CPU, run-queue and sleeping share of the round, and
a timeline in ``--bucket`` ms buckets: per thread the share of the bucket it ran (``#`` per tenth), so it shows which
thread works while which waits. Everything it starts is stopped and its work directory removed at the end.
"""

from __future__ import annotations

import argparse
import math
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.mariadb_refs import MariaDBFeed, binlog_end
from bench.mariadb_run import INSERT, SBTEST, MariaDBBenchEnv
from bench.procstat import tree_cpu_seconds
from bench.profile import py_spy_binary
from bench.threadclock import ThreadClock
from bench.workloads import ROWS_PER_TXN
from cdc import serde
from cdc.meta import keys
from cdc.meta.etcd import EtcdClient
from cdc.meta.keys import KeyKind
from cdc.meta.kv import WatchResponse
from cdc.model import ChangefeedStatus, SpanStatus

DB = "bench_cu"
CF = "bench-catchup"


@dataclass
class Round:
    """What the watch saw after one resume (monotonic seconds, absolute; 0 = not seen)."""

    end: int
    t0: float = 0.0
    assign: float = 0.0
    running: float = 0.0
    first: float = 0.0
    span_end: float = 0.0
    span_rows: int = 0
    cf_end: float = 0.0
    done: threading.Event = field(default_factory=threading.Event)
    reports: list[tuple[float, int, int]] = field(default_factory=list)  # (at, span checkpoint, rows)


class Timeline:
    """The watch's callback: fills the current :class:`Round` (one at a time)."""

    def __init__(self) -> None:
        self.round: Round | None = None
        self.start_ts = 0

    def on_events(self, resp: WatchResponse) -> None:
        now = time.monotonic()
        r = self.round
        if r is None:
            return
        for ev in resp.events:
            try:
                k = keys.parse_key(ev.kv.key)
            except ValueError:
                continue
            if getattr(k, "changefeed", None) != CF or ev.type == "delete":
                continue
            if k.kind is KeyKind.SPAN_ASSIGNMENT and not r.assign:
                r.assign = now
            elif k.kind is KeyKind.SPAN_STATUS:
                st = serde.from_json(SpanStatus, ev.kv.value)
                r.reports.append((now, st.checkpoint_ts, st.rows))
                if st.running and not r.running:
                    r.running = now
                if st.checkpoint_ts > self.start_ts and not r.first:
                    r.first = now
                if st.checkpoint_ts >= r.end and not r.span_end:
                    r.span_end, r.span_rows = now, st.rows
            elif k.kind is KeyKind.CHANGEFEED_STATUS:
                cf = serde.from_json(ChangefeedStatus, ev.kv.value)
                if cf.checkpoint_ts >= r.end and not r.cf_end:
                    r.cf_end = now
                    r.done.set()


def _write(conn: object, shape: str, lo: int, rows: int, rnd: random.Random) -> None:
    with conn.cursor() as cur:  # type: ignore[attr-defined]
        if shape == "insert":
            for start in range(lo, lo + rows, ROWS_PER_TXN):
                cur.execute("BEGIN")
                cur.execute(INSERT.format(lo=start, hi=min(start + ROWS_PER_TXN - 1, lo + rows - 1)))
                cur.execute("COMMIT")
            return
        ids = list(range(1, rows + 1))
        rnd.shuffle(ids)
        for i in range(0, rows, ROWS_PER_TXN):
            cur.execute("BEGIN")
            cur.execute("UPDATE sbtest SET k = k + 1, c = LEFT(CONCAT(MD5(c), c), 60) WHERE id IN ("
                        + ",".join(map(str, ids[i: i + ROWS_PER_TXN])) + ")")
            cur.execute("COMMIT")


def steady(feed: MariaDBFeed, up: object, timeline: Timeline, seconds: float, rows_per_txn: int, next_id: int) -> None:
    """The changefeed running while one connection commits ``rows_per_txn``-row inserts as fast as it can for
    ``seconds`` (a steady stream, never a backlog): the span status writes it costs per second."""
    feed.resume()
    feed.wait(binlog_end(up), 60)  # type: ignore[arg-type]
    r = Round(1 << 62)
    timeline.round = r
    conn = up.connect(DB)  # type: ignore[attr-defined]
    txns = 0
    t0 = time.monotonic()
    with conn.cursor() as cur:
        while time.monotonic() - t0 < seconds:
            cur.execute("BEGIN")
            cur.execute(INSERT.format(lo=next_id, hi=next_id + rows_per_txn - 1))
            cur.execute("COMMIT")
            next_id += rows_per_txn
            txns += 1
    took = time.monotonic() - t0
    conn.close()
    time.sleep(0.5)
    timeline.round = None
    n = sum(1 for at, _ts, _rows in r.reports if at - t0 <= took)
    print(f"\nsteady: {txns} transactions of {rows_per_txn} rows in {took:.1f} s ({txns / took:.0f}/s): "
          f"{n} span status writes ({n / took:.1f}/s)")
    feed.pause()


def thread_names(pid: int) -> dict[int, str]:
    """The Python thread names of ``pid`` by native thread id, from ``py-spy dump`` (empty without py-spy)."""
    binary = py_spy_binary()
    if binary is None:
        return {}
    out = subprocess.run([binary, "dump", "--pid", str(pid), "--nonblocking"], capture_output=True, text=True,
                         timeout=30).stdout
    return {int(m.group(1)): m.group(2) for m in re.finditer(r'^Thread (\d+) \([a-z]+\): "(.*)"$', out, re.M)}


def print_threads(clock: ThreadClock, r: Round, names: dict[int, str], bucket: float) -> None:
    """The busy threads of the round (resume to ``cf end``) and their timeline (module docstring)."""
    t0, t1 = r.t0, r.cf_end
    wall = t1 - t0
    rows = clock.busiest(t0, t1)
    print(f"    threads over {wall * 1000:.0f} ms: CPU / run queue / other (sleeping), ms")
    for s, cpu, wait in rows:
        label = names.get(s.tid, "") if s.process == "capture" else ""
        shares = " ".join(f"{k} {v:.0%}" for k, v in s.state_shares(t0, t1).items())
        print(f"      {s.process}:{s.tid} {label[:28]:28} {cpu * 1000:6.0f} {wait * 1000:6.0f} "
              f"{max(0.0, wall - cpu - wait) * 1000:6.0f}   {shares}")
    n = max(1, math.ceil(wall / bucket))
    print(f"    timeline, {bucket * 1000:.0f} ms buckets (# = a tenth of the bucket on a CPU, . = waiting for one)")
    for s, _cpu, _wait in rows[:8]:
        line = []
        for i in range(n):
            c, w = s.between(t0 + i * bucket, t0 + (i + 1) * bucket)
            line.append("#" * round(c / bucket * 10) + "." * round(w / bucket * 10))
        label = names.get(s.tid, "") if s.process == "capture" else ""
        print(f"      {s.process[:7]:7} {label[:14]:14} |{'|'.join(f'{x:10.10}' for x in line)}|")
    print("    states, one letter per sample (r running or runnable, f futex: a lock, condition or the GIL, s socket: "
          "recvfrom/read/poll, n sleep, e epoll, ? other)")
    letters = {"run": "r", "futex": "f", "recvfrom": "s", "read": "s", "poll": "s", "ppoll": "s", "select": "s",
               "nanosleep": "n", "epoll_wait": "e"}
    for s, _cpu, _wait in rows[:4]:
        text = "".join(letters.get(st, "?") for t, st in s.states if t0 <= t <= t1)
        label = names.get(s.tid, "") if s.process == "capture" else ""
        print(f"      {s.process[:7]:7} {label[:14]:14} {text}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--shape", choices=("insert", "update"), default="insert")
    ap.add_argument("--sink", choices=("blackhole", "mariadb"), default="blackhole")
    ap.add_argument("--api-poll", type=float, default=0.25, help="the bench's poll interval to project (0: none)")
    ap.add_argument("--server-config", default="", help="TOML of the cdc server, e.g. 'checkpoint-min-interval = "
                    "0.02' to see the span's progress at a finer grain")
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--threads", action="store_true", help="per-thread CPU and run-queue time of the capture and "
                    "the upstream server, with a timeline (module docstring)")
    ap.add_argument("--bucket", type=float, default=0.05, help="with --threads: the timeline's bucket, seconds")
    ap.add_argument("--steady", type=float, default=0, help="after the rounds: SECONDS of a steady stream (one "
                    "connection committing inserts as fast as it can while the changefeed runs), and the span status "
                    "writes per second it costs")
    ap.add_argument("--steady-rows", type=int, default=1, help="rows per transaction of --steady")
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    work = Path(tempfile.mkdtemp(prefix="tidewater-catchup-"))
    try:
        return _measure(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)  # (the servers' data: ~0.7 GB after 4 rounds of 300,000 rows)


def _measure(args: argparse.Namespace, work: Path) -> int:
    timeline = Timeline()
    rnd = random.Random(5)
    with MariaDBBenchEnv(work / "servers", [args.sink], args.server_config) as env:
        assert env.etcd is not None and env.cdc is not None
        up = env.up
        up.drop_database(DB)
        up.create_database(DB)
        up.execute(SBTEST, db=DB)
        env.prepare_target(args.sink, "cu")
        feed = MariaDBFeed(env.cdc, up, DB, CF, args.sink, env.sink_uri(args.sink, "cu"))
        feed.create(args.timeout)
        feed.pause()
        client = EtcdClient([env.etcd.url])
        watch = client.watch_prefix(keys.cluster_prefix("bench"), None, timeline.on_events)
        t_api = time.monotonic()
        feed.info()
        api_s = time.monotonic() - t_api
        next_id = 1
        if args.shape == "update":
            conn = up.connect(DB)
            _write(conn, "insert", 1, args.rows, rnd)
            conn.close()
            next_id = args.rows + 1
            feed.resume()
            feed.wait(binlog_end(up), args.timeout)
            feed.pause()
        rounds: list[Round] = []
        print(f"# {args.shape} x {args.rows} rows into {args.sink}; one API request took {api_s * 1000:.1f} ms",
              flush=True)
        print("| round | assign | running | first | span end (rows) | cf end | api poll | capture CPU s |")
        print("|---|---|---|---|---|---|---|---|")
        for i in range(args.rounds):
            conn = up.connect(DB)
            try:
                _write(conn, args.shape, next_id, args.rows, rnd)
            finally:
                conn.close()
            if args.shape == "insert":
                next_id += args.rows
            r = Round(binlog_end(up))
            timeline.start_ts = int(feed.info()["checkpoint_ts"])
            timeline.round = r
            clock = None
            if args.threads:
                assert up.pid is not None
                clock = ThreadClock({"capture": env.capture_pid, "mariadbd": up.pid}).start()
            cpu0 = tree_cpu_seconds(env.capture_pid)
            r.t0 = time.monotonic()
            feed.resume()
            if not r.done.wait(args.timeout):
                raise TimeoutError(f"round {i + 1}: the changefeed checkpoint did not reach {r.end:X}")
            cpu = tree_cpu_seconds(env.capture_pid) - cpu0
            names: dict[int, str] = {}
            if clock is not None:
                clock.stop()
                names = thread_names(env.capture_pid)
            timeline.round = None
            feed.pause()
            rounds.append(r)

            def ms(at: float, r: Round = r) -> str:
                return f"{(at - r.t0) * 1000:.0f}" if at else "-"

            api = ""
            if args.api_poll > 0:
                step = args.api_poll + api_s
                api = f"{math.ceil((r.cf_end - r.t0) / step) * step * 1000:.0f}"
            print(f"| {i + 1} | {ms(r.assign)} | {ms(r.running)} | {ms(r.first)} | {ms(r.span_end)} "
                  f"({r.span_rows}) | {ms(r.cf_end)} | {api} | {cpu:.2f} |", flush=True)
            tail = [f"{(at - r.t0) * 1000:.0f}ms:{rows}" for at, ts, rows in r.reports]
            print(f"    reports: {' '.join(tail)}", flush=True)
            if clock is not None:
                print_threads(clock, r, names, args.bucket)
        if rounds:
            ends = [r.cf_end - r.t0 for r in rounds]
            print(f"\ncf end: median {statistics.median(ends) * 1000:.0f} ms, min {min(ends) * 1000:.0f}, "
                  f"max {max(ends) * 1000:.0f}")
        if args.steady > 0:
            steady(feed, up, timeline, args.steady, args.steady_rows, next_id)
        watch.cancel()
        client.close()
        feed.remove()  # (its own watch too, before etcd stops)
    return 0


if __name__ == "__main__":
    sys.exit(main())
