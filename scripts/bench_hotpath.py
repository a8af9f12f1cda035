"""The span's hot path without servers: PgSpanSource.run (the puller) -> LevelDB sorter -> TxnBatcher -> Mounter -> SQL sink.

Feeds pre-built pgoutput messages (Relation, then Begin / N Inserts / Commit per transaction) for the
table ``t (id int primary key, a text, b int, c numeric(10,2), d timestamptz)`` — the rows of
/work/helpers/prof_catchup.py — through the real ``PgSpanSource.run`` (upstream.postgres.source) into a LevelDB sorter, then drains
the sorter the way ``SpanRunner._run_sink`` does (clean, read, whole-transaction batches of
``txn_rows``, ``Mounter.mount``, ``SQLSink.write``). Prints wall time and thread CPU time of both
phases; CPU time is what to compare on a loaded host. Between the two it also times, in thread CPU per row, the
sink thread's stages alone: reading the sorter (``read_txns``, every payload) and mounting every payload
(``Mounter.mount``); ``write`` is the sink phase less those two (the batcher and the sink's own work). "sink
phase, all threads" is the process CPU of the sink phase: the sink thread and the SQL sink's statement pipeline
thread (the driver's work: psycopg2's COPY, PyMySQL's send), where the other numbers count the sink thread alone.

    .venv/bin/python scripts/bench_hotpath.py [--rows 300000] [--txn 100] [--txn-rows 20000]
        [--batch-rows 1000] [--sink URI] [--repeat 3] [--codec c|python] [--threads]

``--txn 1`` is the single-row-transaction shape (per-transaction costs: also printed in us per transaction).
``--threads`` runs the span as a capture does instead of phase by phase: a ``SpanRunner`` whose puller thread
feeds the sorter while its sink thread drains it into blackhole (the processor's ``persisted`` every 0.2 s), and
prints the process CPU per row and per transaction and how many transactions each sink write carried: the cost
of the two threads handing transactions over (wake-ups, one batch per wake) that the phases do not show.
``--threads --release-gil``: the fake stream releases the GIL after each commit (``time.sleep(0)``), as reading a
socket between messages does, which lets the sink thread wake per transaction (the e2e case the phases cannot show).
``--idle-every N``: the fake stream's idle mark (``None``, what ``ReplicationStream.messages`` yields before it waits)
after every N commits: how often the puller reports its resolved watermark (0: a catch-up read in one go).
``--threads --mysql`` feeds stored MySQL changes (workload (o)'s mix: updates with both images, inserts, deletes)
straight into the sorter, as the MySQL span source hands them over, without a binlog: the part of a MySQL span's
cost after its source.

``TIDEWATER_ROWTEXT=python`` in the environment makes the SQL sink render its rows in Python
(sinks.sql.dialect.rowtext) instead of C.

Without ``--sink`` it writes to a fresh SQLite file in a temporary directory; ``--sink blackhole://`` discards
the rows (the sink phase is then the batcher and the mounter). With a ``mysql://`` or ``postgresql://`` URI the
table ``t`` is dropped first. ``--codec`` picks the implementation of the per-row functions
(upstream.postgres.rowcodec: ``c``, or the pure-Python reference ``python``; default: the best available). Profile it with
``.venv/bin/py-spy record -r 200 -f raw -o prof.txt -- .venv/bin/python scripts/bench_hotpath.py``.

On a loaded host, count instructions instead of time: ``--perf-phase sink`` (or ``puller``) switches
perf's counters on only around that phase through perf's control FIFOs::

    mkfifo /tmp/ctl /tmp/ack
    perf stat -e instructions:u --delay=-1 --control fifo:/tmp/ctl,/tmp/ack -- \
        .venv/bin/python scripts/bench_hotpath.py --repeat 1 --perf-phase sink --perf-ctl /tmp/ctl,/tmp/ack
"""

from __future__ import annotations

import argparse
import random
import shutil
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from hashlib import md5
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cdc.config import SinkConfig  # noqa: E402
from cdc.filter import TableFilter  # noqa: E402
from cdc.ts import Watermark  # noqa: E402
from processor.batcher import TxnBatcher  # noqa: E402
from processor.mounter import Mounter  # noqa: E402
from sinks.base import TextRows  # noqa: E402
from sinks.blackhole import BlackholeSink  # noqa: E402
from sinks.sql.sink import SQLSink  # noqa: E402
from sorter.leveldb import LevelDBSorter  # noqa: E402
from upstream.postgres import pgoutput  # noqa: E402
from upstream.postgres.source import PgSpanSource  # noqa: E402

RELID = 16385
PG_EPOCH = 946_684_800
# (name, type oid, typmod, key)
COLUMNS = (("id", 23, -1, True), ("a", 25, -1, False), ("b", 23, -1, False), ("c", 1700, (10 << 16 | 2) + 4, False),
           ("d", 1184, -1, False))


def relation_message(relid: int = RELID, name: str = "t") -> bytes:
    out = b"R" + struct.pack(">I", relid) + b"public\0" + name.encode() + b"\0d" + struct.pack(">H", len(COLUMNS))
    for name, oid, typmod, key in COLUMNS:
        out += bytes([1 if key else 0]) + name.encode() + b"\0" + struct.pack(">Ii", oid, typmod)
    return out


def insert_message(i: int, relid: int = RELID) -> bytes:
    vals = [str(i), md5(str(i).encode()).hexdigest(), str(i), f"{i / 3.0:.2f}",
            f"2026-11-22 01:{(i // 60) % 60:02d}:{i % 60:02d}.{(i * 7919) % 1_000_000:06d}+00"]
    out = b"I" + struct.pack(">I", relid) + b"N" + struct.pack(">H", len(vals))
    for v in vals:
        b = v.encode()
        out += b"t" + struct.pack(">i", len(b)) + b
    return out


def update_message(i: int, relid: int = RELID) -> bytes:
    """An UPDATE of row ``i`` by key (REPLICA IDENTITY DEFAULT, key unchanged: the new tuple only, as workload (b)
    sends it), every other column new."""
    return b"U" + _update_body(i, relid)


def _update_body(i: int, relid: int) -> bytes:
    vals = [str(i), md5(str(-i).encode()).hexdigest(), str(i + 1), f"{i / 7.0:.2f}",
            f"2026-11-23 02:{(i // 60) % 60:02d}:{i % 60:02d}.{(i * 104729) % 1_000_000:06d}+00"]
    out = struct.pack(">I", relid) + b"N" + struct.pack(">H", len(vals))
    for v in vals:
        b = v.encode()
        out += b"t" + struct.pack(">i", len(b)) + b
    return out


def wal_of(relations: list[bytes], txns: Iterable[list[bytes]]) -> tuple[list[bytes], int]:
    """``relations`` then each list of row messages of ``txns`` between a Begin and a Commit; the end LSN."""
    msgs = list(relations)
    lsn = 1 << 24
    xid = 1000
    t_us = 848_000_000_000_000
    for rows in txns:
        xid += 1
        n = len(rows)
        msgs.append(b"B" + struct.pack(">QqI", lsn + n * 100, t_us, xid))
        msgs.extend(rows)
        lsn += n * 100 + 50
        msgs.append(b"C" + struct.pack(">BQQq", 0, lsn - 50, lsn, t_us))
        t_us += 1000
    return msgs, lsn


def build_wal(rows: int, txn: int, keys: list[int] | None = None) -> tuple[list[bytes], int]:
    """Transactions of ``txn`` rows: inserts of rows 0..rows-1, or (``keys``) updates of those rows by key, in that
    order."""
    return wal_of([relation_message()], (
        [insert_message(i) for i in range(start, min(rows, start + txn))] if keys is None else
        [update_message(keys[i]) for i in range(start, min(rows, start + txn))] for start in range(0, rows, txn)))


def build_load_wal(keys: int, tables: int) -> list[bytes]:
    """Inserts of keys 0..keys-1 into each of ``public.t0`` .. ``t{tables - 1}``, 100 per transaction."""
    return wal_of([relation_message(RELID + n, f"t{n}") for n in range(tables)], (
        [insert_message(i, RELID + n) for i in range(start, min(keys, start + 100))]
        for n in range(tables) for start in range(0, keys, 100)))[0]


def build_mixed_wal(txns: int, keys: int, seed: int = 42) -> tuple[list[bytes], int]:
    """pgbench's shape on tables of ``COLUMNS``: per transaction updates of random keys (below ``keys``) of
    ``public.t0``, ``t1`` and ``t2`` and one insert into ``t3`` (a new key each), four rows."""
    rng = random.Random(seed)
    return wal_of([relation_message(RELID + n, f"t{n}") for n in range(4)], (
        [*(update_message(rng.randrange(keys), RELID + n) for n in range(3)), insert_message(x, RELID + 3)]
        for x in range(txns)))


class FakeStream:
    """Stands in for ReplicationStream: decodes the pre-built payloads, then stops."""

    def __init__(self, payloads: list[bytes], release_gil: bool = False, idle_every: int = 0) -> None:
        self.payloads = payloads
        self.release_gil = release_gil  # after each Commit, as a socket read between messages does
        self.idle_every = idle_every  # the stream's idle mark (None) after every this many Commits (0: never)

    def open(self) -> None:
        pass

    def messages(self, stop: threading.Event, prefixes: dict[int, bytes] | None = None) -> Iterator[Any]:
        decode, plain = pgoutput.decode, getattr(pgoutput, "PLAIN_CHANGE_TYPES", frozenset())
        release, idle_every, commits = self.release_gil, self.idle_every, 0
        for p in self.payloads:  # as ReplicationStream.messages: plain changes stay raw bytes
            yield p if p[0] in plain or p[0] in (66, 67) else decode(p, False)  # (Begin, Commit: raw too)
            if p[0] == 67:  # b"C"
                if release:
                    time.sleep(0)
                commits += 1
                if idle_every and commits % idle_every == 0:
                    yield None

    def ack(self, lsn: int) -> None:
        pass

    def close(self) -> None:
        pass


class NoCatalog:
    """A catalog connection that cannot answer: the puller falls back to the Relation message."""

    def close(self) -> None:
        pass


def no_catalog() -> Any:
    return NoCatalog()


def drop_target(uri: str) -> None:
    import sqlalchemy as sa

    if uri.startswith(("sqlite", "blackhole")):
        return
    scheme = "mysql+pymysql" if uri.startswith(("mysql", "mariadb")) else "postgresql+psycopg2"
    eng = sa.create_engine(scheme + uri[uri.index("://"):])
    with eng.begin() as c:
        for t in ("t", "t0", "t1", "t2", "t3"):  # (t0..t3: bench_sqlsink's pg-mixed shape)
            c.exec_driver_sql("DROP TABLE IF EXISTS " + (f"public.{t}" if "postgres" in scheme else t))
    eng.dispose()


class PerfControl:
    """Enables/disables ``perf stat --control`` counters around one phase (no-op without FIFOs)."""

    def __init__(self, spec: str | None, phase: str | None) -> None:
        self.phase = phase
        self.ctl = self.ack = None
        if spec:
            ctl, ack = spec.split(",")
            self.ctl = open(ctl, "w")  # noqa: SIM115 - kept open for the whole run
            self.ack = open(ack)  # noqa: SIM115

    def _send(self, cmd: str) -> None:
        if self.ctl is not None and self.ack is not None:
            self.ctl.write(cmd + "\n")
            self.ctl.flush()
            self.ack.readline()

    def start(self, phase: str) -> None:
        if phase == self.phase:
            self._send("enable")

    def stop(self, phase: str) -> None:
        if phase == self.phase:
            self._send("disable")


def run_once(payloads: list[bytes], rows: int, end_lsn: int, sink_uri: str, txn_rows: int, batch_rows: int,
             work: Path, perf: PerfControl, codec: Any = None, idle_every: int = 0) -> dict[str, float]:
    sorter = LevelDBSorter(work / "sorter", fresh=True)
    sp = sorter.span("bench/0")
    sp.clear()
    extra = {} if codec is None else {"codec": codec}
    puller = PgSpanSource(FakeStream(payloads, idle_every=idle_every), TableFilter(["*.*"]), Watermark(0, 0.0), no_catalog, "bench",  # type: ignore[arg-type]
                          **extra)
    resolved: list[Watermark] = []
    stop = threading.Event()
    perf.start("puller")
    t0, c0 = time.perf_counter(), time.thread_time()
    puller.run(sp, stop, resolved.append)
    t1, c1 = time.perf_counter(), time.thread_time()
    perf.stop("puller")
    assert resolved and resolved[-1].ts == end_lsn, (resolved[-1:], end_lsn)

    # the sink thread's stages alone: read every payload from the sorter; read and mount every payload (nothing kept)
    c4 = time.thread_time()
    for t in sp.read_txns(0, resolved[-1].ts):
        for _p in t.payloads:
            pass
    c5 = time.thread_time()
    defer = not sink_uri.startswith("blackhole")  # mounted as a span mounts for its sink (SQLSink: sinks.base.TextRows)
    mount_alone = Mounter(puller.decoder(), defer=defer).mount
    for t in sp.read_txns(0, resolved[-1].ts):
        ts, tm = t.commit_ts, t.commit_time
        for p in t.payloads:
            mount_alone(p, ts, tm)
    c6 = time.thread_time()

    drop_target(sink_uri)
    sink: Any = (BlackholeSink() if sink_uri.startswith("blackhole")
                 else SQLSink(sink_uri, SinkConfig(batch_rows=batch_rows, txn_rows=txn_rows)))
    sink.check()
    assert defer == isinstance(sink, TextRows)
    mount_fn = Mounter(puller.decoder(), defer=defer).mount
    written = 0
    perf.start("sink")
    t2, c2, p2 = time.perf_counter(), time.thread_time(), time.process_time()
    checkpoint = Watermark(0, 0.0)
    target = resolved[-1]
    batcher = TxnBatcher(sp.read_txns(checkpoint.ts, target.ts), mount_fn, txn_rows)
    while batcher.has_more():
        written += sink.write(batcher.next_batch(), lambda: None)
        assert batcher.last is not None
        sp.clean(batcher.last.ts)  # the sink thread cleans what the processor persisted (one batch behind)
    t3, c3, p3 = time.perf_counter(), time.thread_time(), time.process_time()
    perf.stop("sink")
    sink.close()
    sorter.close()
    assert written == rows, (written, rows)
    return {"pull_wall": t1 - t0, "pull_cpu": c1 - c0, "sink_wall": t3 - t2, "sink_cpu": c3 - c2,
            "sink_proc": p3 - p2,
            "read_cpu": c5 - c4, "mount_cpu": (c6 - c5) - (c5 - c4)}


class MySqlShapedSource:
    """A span source that hands the sorter stored MySQL changes (``upstream.mysql.payload``) as the MySQL span source
    does (``add_many`` of each transaction's rows, ``commit``, ``on_resolved`` per commit), with no binlog to read: the
    sorter, batcher and mounter of a MySQL span without its source's cost. The rows are workload (o)'s of the MariaDB
    bench (an sbtest-like table; 1/2 updates by key with both images, 1/4 inserts, 1/4 deletes), ``txn`` per
    transaction; ``inserts_only``: every row an insert (workload (a)'s shape)."""

    runs_in_child = False

    def __init__(self, rows: int, txn: int, *, inserts_only: bool = False) -> None:
        from cdc.events import TableName, TableSchema
        from upstream.base import encode_payload
        from upstream.mysql import payload
        from upstream.mysql.source import MySqlChangeDecoder
        from upstream.mysql.types import column_schema

        cols = (column_schema("id", "int", "int", nullable=False, is_key=True, char_len=None, precision=None,
                              scale=None, fsp=None),
                column_schema("k", "int", "int", nullable=False, is_key=False, char_len=None, precision=None,
                              scale=None, fsp=None),
                column_schema("c", "char", "char(120)", nullable=False, is_key=False, char_len=120, precision=None,
                              scale=None, fsp=None),
                column_schema("pad", "char", "char(60)", nullable=False, is_key=False, char_len=60, precision=None,
                              scale=None, fsp=None))
        self.schema = TableSchema(TableName("bench", "t"), cols, ("id",), "d", 7, 1, True)
        self._decoder = MySqlChangeDecoder(lambda v: self.schema)
        prefix = encode_payload(1, b"")

        def image(i: int, salt: int) -> list[str | None]:
            return [str(i), str((i * 7 + salt) % 100_000), md5(f"{i}-{salt}".encode()).hexdigest() * 3 + "x" * 24,
                    md5(f"{salt}-{i}".encode()).hexdigest() + "y" * 28]

        self.txns: list[list[bytes]] = []
        run: list[bytes] = []
        for i in range(rows):
            kind = 2 if inserts_only else i % 4
            if kind in (0, 1):  # an update by key: old and new images
                raw = payload.encode(b"U", 7, image(i, 1), image(i, 0))
            elif kind == 2:
                raw = payload.encode(b"I", 7, image(i, 0), None)
            else:
                raw = payload.encode(b"D", 7, None, image(i, 0))
            run.append(prefix + raw)
            if len(run) == txn:
                self.txns.append(run)
                run = []
        if run:
            self.txns.append(run)
        self.end_ts = len(self.txns)

    def open(self) -> None:
        pass

    def run(self, buffer: Any, stop: threading.Event, on_resolved: Any) -> None:
        add_many, commit = buffer.add_many, buffer.commit
        resolved = Watermark(0, 0.0)
        for n, rows in enumerate(self.txns, 1):
            if stop.is_set():
                return
            add_many(n, n, rows)
            commit(n, n, 1_700_000_000.0 + n / 1e4)
            if n > resolved.ts:
                resolved = Watermark(n, max(1_700_000_000.0 + n / 1e4, resolved.time))
                on_resolved(resolved)

    def decoder(self) -> Any:
        return self._decoder

    def ack(self, ts: int) -> None:
        pass

    def close(self) -> None:
        pass

    def take_warnings(self) -> list[Any]:
        return []

    def take_schema_versions(self) -> list[Any]:
        return []

    def schema_change_commits(self) -> set[int]:
        return set()

    def caught_up_ts(self) -> int:
        return 0


def run_threads(payloads: list[bytes], rows: int, txns: int, end_lsn: int, txn_rows: int, work: Path,
                codec: Any = None, mysql: MySqlShapedSource | None = None, release_gil: bool = False,
                idle_every: int = 0) -> dict[str, float]:
    """The span as a capture runs it: a ``SpanRunner``'s puller and sink threads side by side (the source feeding the
    LevelDB sorter while the sink thread drains it into blackhole), the processor's part played by this thread
    (``persisted`` every 0.2 s, as its report pass stores checkpoints). Process CPU of the whole catch-up."""
    from processor.span import SinkPlan, SpanRunner

    sorter = LevelDBSorter(work / "sorter", fresh=True)
    sp = sorter.span("bench/0")
    extra = {} if codec is None else {"codec": codec}
    source: Any = (mysql if mysql is not None else
                   PgSpanSource(FakeStream(payloads, release_gil, idle_every), TableFilter(["*.*"]), Watermark(0, 0.0), no_catalog, "bench",  # type: ignore[arg-type]
                                **extra))
    if mysql is not None:
        end_lsn = mysql.end_ts
    sinks: list[BlackholeSink] = []

    def open_sink() -> BlackholeSink:
        sinks.append(BlackholeSink())
        return sinks[-1]

    runner = SpanRunner("bench/0", Watermark(0, 0.0), source, sp, SinkPlan(open_sink, txn_rows))
    t0, p0 = time.perf_counter(), time.process_time()
    runner.start()
    while runner.checkpoint.ts < end_lsn and not runner.failed.is_set():
        time.sleep(0.2)
        runner.persisted(runner.checkpoint.ts)
    t1, p1 = time.perf_counter(), time.process_time()
    runner.stop()
    sorter.close()
    if runner.error is not None:
        raise runner.error
    assert sinks[0].rows == rows, (sinks[0].rows, rows)
    return {"wall": t1 - t0, "cpu": p1 - p0, "writes": sinks[0].writes, "txns": txns}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=300_000)
    ap.add_argument("--txn", type=int, default=100, help="rows per upstream transaction")
    ap.add_argument("--txn-rows", type=int, default=SinkConfig().txn_rows)
    ap.add_argument("--batch-rows", type=int, default=SinkConfig().batch_rows)
    ap.add_argument("--sink", help="sink URI (default: SQLite in a temporary directory)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--perf-phase", choices=["puller", "sink"], help="count only this phase (with --perf-ctl)")
    ap.add_argument("--perf-ctl", help="CTL_FIFO,ACK_FIFO of perf stat --control (see above)")
    ap.add_argument("--codec", choices=["c", "python"], help="per-row functions (default: the best available)")
    ap.add_argument("--threads", action="store_true",
                    help="run the span's two threads side by side (SpanRunner into blackhole) instead of the phases")
    ap.add_argument("--release-gil", action="store_true", help="with --threads: the fake stream releases the GIL "
                    "after each commit (time.sleep(0)), as a real socket read between messages does")
    ap.add_argument("--mysql", action="store_true", help="with --threads: stored MySQL changes of workload (o) "
                    "instead of the PostgreSQL source (sorter, batcher and mounter of a MySQL span)")
    ap.add_argument("--idle-every", type=int, default=0, help="the fake stream yields its idle mark (None: everything "
                    "received is read, as ReplicationStream does before it waits) after every this many commits "
                    "(default 0: never, a catch-up read in one go; 1: a reader that keeps up with each transaction)")
    args = ap.parse_args()
    from cdc.gcpolicy import tune_for_streaming

    print(f"garbage collector: {'tuned as a capture' if tune_for_streaming() else 'CPython defaults'} "
          "(TIDEWATER_GC=default keeps the defaults)")
    codec = None
    if args.codec:
        from upstream.postgres import rowcodec

        codec = rowcodec.PYTHON if args.codec == "python" else rowcodec.native()
        if codec is None:
            raise SystemExit("the C row codec is not available here (see the log)")
    perf = PerfControl(args.perf_ctl, args.perf_phase)
    payloads, end_lsn = build_wal(args.rows, args.txn)
    tmp = Path(tempfile.mkdtemp(prefix="bench-hotpath-"))
    txns = -(-args.rows // args.txn)
    try:
        for r in range(args.repeat):
            work = tmp / str(r)
            work.mkdir()
            if args.threads:
                mysql = MySqlShapedSource(args.rows, args.txn) if args.mysql else None
                t = run_threads(payloads, args.rows, txns, end_lsn, args.txn_rows, work, codec, mysql, args.release_gil,
                                args.idle_every)
                print(f"run {r + 1}: span threads {args.rows / t['wall']:>9,.0f} rows/s wall, process CPU "
                      f"{1e6 * t['cpu'] / args.rows:.2f} us/row {1e6 * t['cpu'] / txns:.2f} us/txn, "
                      f"{t['writes']} sink writes ({txns / max(1, t['writes']):.1f} txns each)", flush=True)
                continue
            uri = args.sink or f"sqlite:///{work}/t.db"
            m = run_once(payloads, args.rows, end_lsn, uri, args.txn_rows, args.batch_rows, work, perf, codec,
                         args.idle_every)
            n = args.rows
            us = {k: 1e6 * v / n for k, v in m.items()}
            ut = {k: 1e6 * v / txns for k, v in m.items()}
            print(f"run {r + 1}: puller {n / m['pull_wall']:>9,.0f} rows/s wall {n / m['pull_cpu']:>9,.0f} rows/s cpu | "
                  f"sink {n / m['sink_wall']:>9,.0f} rows/s wall {n / m['sink_cpu']:>9,.0f} rows/s cpu "
                  f"({us['sink_cpu']:.1f} us/row) | us/row cpu: puller {us['pull_cpu']:.2f} read {us['read_cpu']:.2f} "
                  f"mount {us['mount_cpu']:.2f} write {us['sink_cpu'] - us['read_cpu'] - us['mount_cpu']:.2f} | "
                  f"sink phase, all threads {us['sink_proc']:.2f} | us/txn cpu: puller {ut['pull_cpu']:.2f} "
                  f"read {ut['read_cpu']:.2f} mount {ut['mount_cpu']:.2f} "
                  f"write {ut['sink_cpu'] - ut['read_cpu'] - ut['mount_cpu']:.2f}",
                  flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
