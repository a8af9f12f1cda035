"""Big-transaction benchmark (issue 2): does the capture's memory stay flat when one upstream
transaction is 1 GB?

Each run starts its own etcd, PostgreSQL (``logical_decoding_work_mem=64kB``, so the transaction is
streamed before it commits) and one ``cdc server``, all on 127.0.0.1 in a temporary directory, creates a
changefeed into the sink, then runs ONE upstream transaction of ``--size-mb`` MB of row data
(``INSERT ... SELECT`` of rows with a 1920-character hex text column made of SHA-512 digests, so neither
PostgreSQL, LevelDB's snappy nor the target can compress it). While it replicates, the ``cdc server``
process (and its process tree) is sampled every 0.5 s: VmRSS and VmHWM from ``/proc/<pid>/status``, and
the bytes under its ``--data-dir`` (the sorter). When the changefeed checkpoint covers the commit, the
target is checked against the source: row count, sum of ``length(payload)``, sum of ``id``, and the full
values of 200 evenly spaced rows.

    .venv/bin/python scripts/bench_big_txn.py [--size-mb 1024] [--sink sqlite|blackhole|mariadb|sqlite:///F]
        [--compare-small] [--small-mb 100] [--timeout 3600] [--work-dir DIR] [--keep] [--json FILE]

``--compare-small`` first runs the same benchmark with ``--small-mb`` (default 100) MB, each run on fresh
servers, so that the growth of the capture's memory against the transaction size is visible.
Exit code 0 only when every run's target equals its source. Everything started is stopped at the end,
also on Ctrl-C and SIGTERM.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.procstat import status_bytes  # noqa: E402
from cdc.procs import descendants  # noqa: E402
from playground.cluster import CdcServer, current_lsn  # noqa: E402
from playground.compare import sqlalchemy_url  # noqa: E402
from playground.servers import EtcdServer, MariaDBServer, PostgresServer  # noqa: E402

MiB = 1 << 20
PAYLOAD_CHARS = 1920  # 15 SHA-512 hex digests; the row stays under PostgreSQL's 2032-byte TOAST threshold
ROW_BYTES = PAYLOAD_CHARS + 8  # payload + bigint id: what "MB of row data" counts
TABLE = "big_txn"
CHANGEFEED = "bigtxn"
SAMPLE_INTERVAL = 0.5
SETTLE_S = 30.0  # after the checkpoint, wait at most this long for the sorter to release the transaction
CHECK_ROWS = 200  # rows compared value by value
SCHEMA = f"CREATE TABLE {TABLE} (id bigint PRIMARY KEY, payload text NOT NULL)"
INSERT_SQL = (
    f"INSERT INTO {TABLE} SELECT g, (SELECT string_agg(encode(sha512((g::text || '.' || i)::bytea), 'hex'), '' "
    "ORDER BY i) FROM generate_series(1, 15) i) FROM generate_series(1, %s) g"
)
CHECKSUM_SQL = f"SELECT count(*), coalesce(sum(length(payload)), 0), coalesce(sum(id), 0) FROM {TABLE}"
SINK_KINDS = ("sqlite", "blackhole", "mariadb")

Progress = Callable[[str], None]


def rows_for(size_mb: float) -> int:
    """Rows needed for ``size_mb`` MiB of row data (``ROW_BYTES`` per row), at least 1."""
    return max(1, math.ceil(size_mb * MiB / ROW_BYTES))


# ---- sampling ---------------------------------------------------------------------------------------------
def dir_bytes(path: Path) -> int:
    """Apparent size of every file under ``path`` (files vanishing during the walk are skipped)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


def mapped_files(pid: int) -> dict[str, dict[str, int]]:
    """Resident bytes of ``pid``'s file mappings from /proc/<pid>/smaps, grouped by kind of file:
    ``leveldb .ldb`` (LevelDB table files, which LevelDB maps read-only), ``sqlite`` (``-shm``/``.db``),
    ``libraries`` (``.so``), ``other``. Each value: ``{"rss": .., "dirty": .., "mappings": ..}``."""
    out: dict[str, dict[str, int]] = {}
    cur: dict[str, int] | None = None
    try:
        with open(f"/proc/{pid}/smaps") as f:
            for line in f:
                head = line.split(None, 5)
                if head and "-" in head[0] and len(head) >= 5 and ":" not in head[0]:
                    path = head[5].strip() if len(head) == 6 else ""
                    if not path.startswith("/"):
                        cur = None  # anonymous, [heap], [stack]...
                        continue
                    kind = ("leveldb .ldb" if path.endswith((".ldb", ".sst")) else
                            "sqlite" if path.endswith(("-shm", ".db", "-wal")) else
                            "libraries" if ".so" in path.rsplit("/", 1)[-1] else "other")
                    cur = out.setdefault(kind, {"rss": 0, "dirty": 0, "mappings": 0})
                    cur["mappings"] += 1
                elif cur is not None and head:
                    if head[0] == "Rss:":
                        cur["rss"] += int(head[1]) * 1024
                    elif head[0] in ("Private_Dirty:", "Shared_Dirty:"):
                        cur["dirty"] += int(head[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return out


@dataclass
class Sample:
    t: float  # monotonic seconds
    rss: int  # VmRSS of the capture process
    hwm: int  # VmHWM of the capture process (its peak RSS since start)
    anon: int  # RssAnon: the process's own memory (heap, arenas, stacks)
    file: int  # RssFile: resident pages of mapped files (LevelDB maps its table files for reading)
    tree_rss: int  # VmRSS summed over the capture and its descendants
    tree_procs: int
    disk: int  # bytes under the capture's --data-dir (the sorter)


class Sampler:
    """Samples one process (and its tree) and a directory every ``interval`` seconds on its own thread."""

    def __init__(self, pid: int, data_dir: Path, interval: float = SAMPLE_INTERVAL) -> None:
        self.pid = pid
        self.data_dir = data_dir
        self.interval = interval
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def sample(self) -> Sample | None:
        st = status_bytes(self.pid, ("VmRSS", "VmHWM", "RssAnon", "RssFile"))
        if "VmRSS" not in st:
            return None
        tree = descendants(self.pid)
        tree_rss = st["VmRSS"] + sum(status_bytes(p, ("VmRSS",)).get("VmRSS", 0) for p in tree)
        s = Sample(time.monotonic(), st["VmRSS"], st.get("VmHWM", 0), st.get("RssAnon", 0), st.get("RssFile", 0),
                   tree_rss, 1 + len(tree), dir_bytes(self.data_dir))
        self.samples.append(s)
        return s

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def start(self) -> Sampler:
        self.sample()
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread and take a last sample (idempotent: later calls do nothing)."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)
        self.sample()

    def window(self, t0: float, t1: float) -> list[Sample]:
        return [s for s in self.samples if t0 <= s.t <= t1]


# ---- result -----------------------------------------------------------------------------------------------
@dataclass
class BenchResult:
    sink: str
    size_mb: float
    rows: int
    data_bytes: int  # source: sum(length(payload)) + 8 * rows
    wal_bytes: int  # upstream WAL written by the transaction (insert LSN after commit - before)
    insert_s: float  # BEGIN .. COMMIT returned
    commit_to_checkpoint_s: float  # COMMIT returned .. changefeed checkpoint >= insert LSN after commit
    rss_start: int  # capture VmRSS just before the transaction (pipeline running, sink connected)
    rss_peak_streaming: int  # highest sampled VmRSS while the transaction was streamed (before COMMIT)
    rss_peak_applying: int  # highest sampled VmRSS from COMMIT to checkpoint (sorter -> sink)
    anon_peak_streaming: int  # highest sampled RssAnon in the same phases, and after the checkpoint until
    anon_peak_applying: int  # the sorter released the transaction (its range deletes fill LevelDB's
    anon_peak_cleanup: int  # memtable, bounded by 2 x write_buffer_size)
    phases: dict[str, float]  # seconds since the first sample: begin, commit, checkpoint, settled
    rss_end: int  # VmRSS when the checkpoint was reached
    anon_end: int  # RssAnon then
    file_end: int  # RssFile then
    rss_settled: int  # VmRSS once the sorter cleaned the checkpointed transaction (or after SETTLE_S)
    settled_s: float  # seconds from the checkpoint to that sample
    hwm: int  # capture VmHWM at the end: the kernel's exact peak RSS since the process started
    anon_start: int  # capture RssAnon just before the transaction
    anon_peak: int  # highest sampled RssAnon (the process's own memory: what must not grow with the size)
    file_peak: int  # highest sampled RssFile (mapped files: reclaimable page cache, counted in VmRSS)
    mapped_at_checkpoint: dict[str, dict[str, int]]  # mapped_files() of the capture at the checkpoint
    tree_rss_peak: int  # highest sampled RSS summed over the capture's process tree
    tree_procs: int  # processes in that tree (1 = no children)
    sorter_disk_peak: int  # highest sampled bytes under the capture's --data-dir
    source: tuple[int, int, int]  # count, sum(length(payload)), sum(id)
    target: tuple[int, int, int] | None  # the same downstream; None for blackhole (rows counted instead)
    replicated_rows: int  # rows the changefeed reports written by its spans
    rows_checked: int  # rows compared value by value
    rows_mismatched: int
    pids: dict[str, int]  # processes this run started (all stopped when run_benchmark returns)
    samples: list[Sample] = field(default_factory=list, repr=False)

    @property
    def equal(self) -> bool:
        if self.rows_mismatched:
            return False
        if self.target is None:  # blackhole: nothing stored, so compare the count of rows written
            return self.replicated_rows == self.source[0]
        return self.target == self.source

    @property
    def rows_per_s(self) -> float:
        return self.rows / max(self.commit_to_checkpoint_s, 1e-9)

    @property
    def end_to_end_rows_per_s(self) -> float:
        return self.rows / max(self.insert_s + self.commit_to_checkpoint_s, 1e-9)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["samples"] = [asdict(s) for s in self.samples]
        d.update(equal=self.equal, rows_per_s=self.rows_per_s, end_to_end_rows_per_s=self.end_to_end_rows_per_s)
        return d


# ---- sinks ------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def open_target(sink: str, work: Path) -> Iterator[tuple[str, str, int | None]]:
    """(sink kind, sink URI, pid of the target server we started) for ``--sink``; a MariaDB target is
    started here and stopped on exit."""
    if sink in ("sqlite", "sqlite://"):
        yield "sqlite", f"sqlite:///{work / 'target.db'}", None
    elif sink in ("blackhole", "blackhole://"):
        yield "blackhole", "blackhole://", None
    elif sink in ("mariadb", "mysql"):
        server = MariaDBServer(work / "mariadb-target")
        try:
            server.start()
            server.create_database("bench")
            yield "mariadb", server.uri("bench"), server.pid
        finally:
            server.stop()
    elif sink.startswith("sqlite:///"):
        yield "sqlite", sink, None
    else:
        raise SystemExit(f"--sink must be one of {', '.join(SINK_KINDS)} or a sqlite:/// URI, got {sink!r}")


def target_checksum(sink_uri: str) -> tuple[int, int, int]:
    import sqlalchemy as sa

    engine = sa.create_engine(sqlalchemy_url(sink_uri))
    try:
        with engine.connect() as conn:
            n, length, ids = conn.exec_driver_sql(CHECKSUM_SQL).one()
    finally:
        engine.dispose()
    return int(n), int(length or 0), int(ids or 0)


def compare_sample(pg_conn: Any, sink_uri: str, rows: int, n: int = CHECK_ROWS) -> tuple[int, int]:
    """Compare the full rows of ``n`` evenly spaced ids on both sides; (rows checked, rows different)."""
    import sqlalchemy as sa

    ids = sorted({1 + (i * rows) // n for i in range(n)})
    in_list = ",".join(str(i) for i in ids)  # integers we made: no injection
    sql = f"SELECT id, payload FROM {TABLE} WHERE id IN ({in_list})"
    with pg_conn.cursor() as cur:
        cur.execute(sql)
        src = {int(i): p for i, p in cur.fetchall()}
    engine = sa.create_engine(sqlalchemy_url(sink_uri))
    try:
        with engine.connect() as conn:
            dst = {int(i): p for i, p in conn.exec_driver_sql(sql).all()}
    finally:
        engine.dispose()
    bad = sum(1 for i in ids if src.get(i) != dst.get(i) or i not in src)
    return len(ids), bad


# ---- one run ----------------------------------------------------------------------------------------------
def _changefeed_rows(info: dict[str, Any]) -> int:
    return int(sum(s.get("rows") or 0 for s in info.get("spans", [])))


def _wait_checkpoint(cdc: CdcServer, lsn: int, timeout: float, sampler: Sampler | None, progress: Progress,
                     every: float = 5.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    next_report = time.monotonic() + every
    while True:
        info = cdc.changefeed(CHANGEFEED)
        if info["checkpoint_ts"] >= lsn:
            return info
        if info.get("state") == "failed":
            raise RuntimeError(f"changefeed failed: {info.get('error')}\n{cdc.log_tail()}")
        now = time.monotonic()
        if now > deadline:
            raise TimeoutError(f"checkpoint {info.get('checkpoint')} did not reach {lsn:X} in {timeout:.0f}s; "
                               f"state={info.get('state')} error={info.get('error')}\n{cdc.log_tail()}")
        if now >= next_report:
            last = sampler.samples[-1] if sampler and sampler.samples else None
            mem = (f"  rss {last.rss / MiB:.0f} MB (anon {last.anon / MiB:.0f}, file {last.file / MiB:.0f})  "
                   f"sorter {last.disk / MiB:.0f} MB") if last else ""
            progress(f"  rows written {_changefeed_rows(info):>9}  checkpoint {info.get('checkpoint')}  "
                     f"state {info.get('state')}{mem}")
            next_report = now + every
        time.sleep(0.2)


def _run_insert(pg: PostgresServer, db: str, rows: int) -> tuple[float, int, int]:
    """Run the one big transaction on a worker thread (the main thread stays responsive to signals);
    return (seconds BEGIN..COMMIT, insert LSN before, insert LSN after the commit)."""
    conn = pg.connect(db)
    result: dict[str, Any] = {}

    def work() -> None:
        try:
            conn.autocommit = False
            t0 = time.monotonic()
            with conn.cursor() as cur:
                cur.execute(INSERT_SQL, (rows,))
            conn.commit()
            result["seconds"] = time.monotonic() - t0
        except BaseException as exc:  # noqa: BLE001 - re-raised by the caller
            result["error"] = exc

    try:
        conn.autocommit = True
        before = current_lsn(conn)
        th = threading.Thread(target=work, name="big-insert", daemon=True)
        th.start()
        try:
            while th.is_alive():
                th.join(0.2)
        except BaseException:
            with contextlib.suppress(Exception):
                conn.cancel()
            th.join(10)
            raise
        if "error" in result:
            raise result["error"]
        conn.autocommit = True
        after = current_lsn(conn)
        return float(result["seconds"]), before, after
    finally:
        with contextlib.suppress(Exception):
            conn.close()


def _settle(sampler: Sampler, base_file: int, deadline: float) -> Sample:
    """Sample until the capture's mapped-file RSS is back near ``base_file`` (the sorter deleted and
    compacted the checkpointed transaction, so LevelDB unmapped its table files) or ``deadline``."""
    while True:
        s = sampler.sample()
        if s is None:
            raise RuntimeError("the capture process exited during the benchmark")
        if s.file <= base_file + 16 * MiB or time.monotonic() >= deadline:
            return s
        time.sleep(SAMPLE_INTERVAL)


def run_benchmark(size_mb: float, sink: str = "sqlite", work_dir: Path | None = None, timeout: float = 3600.0,
                  progress: Progress | None = None) -> BenchResult:
    """One run on fresh servers in ``work_dir`` (a new temporary directory, removed afterwards, if None).

    Starts etcd, PostgreSQL, the target (MariaDB only) and one ``cdc server``, replicates one transaction
    of ``size_mb`` MiB of row data, verifies the target and returns the measurements. Everything it
    started is stopped (capture first) before it returns or raises, KeyboardInterrupt and SystemExit
    included.
    """
    say = progress or (lambda _msg: None)
    work = Path(tempfile.mkdtemp(prefix="tidewater-bigtxn-")) if work_dir is None else Path(work_dir)
    work.mkdir(parents=True, exist_ok=True)
    rows = rows_for(size_mb)
    with contextlib.ExitStack() as stack:  # unwinds in reverse: sampler, capture, PostgreSQL, etcd, target
        if work_dir is None:
            stack.callback(shutil.rmtree, work, ignore_errors=True)
        kind, sink_uri, target_pid = stack.enter_context(open_target(sink, work))
        etcd = EtcdServer(work / "etcd")
        stack.callback(etcd.stop)
        etcd.start()
        pg = PostgresServer(work / "pg", settings={"logical_decoding_work_mem": "64kB"})
        stack.callback(pg.stop)
        pg.start()
        pg.create_database("bench")
        pg.execute(SCHEMA, db="bench")
        cdc = CdcServer(etcd.url, work / "cdc")
        stack.callback(cdc.terminate)
        cdc.start()
        assert cdc.proc is not None
        pids = {"etcd": etcd.pid or 0, "postgres": pg.pid or 0, "cdc": cdc.proc.pid}
        if target_pid is not None:
            pids[kind] = target_pid
        say(f"{size_mb:g} MB ({rows} rows) into {kind}: etcd {etcd.url}, PostgreSQL {pg.uri('bench')}, "
            f"cdc server {cdc.url} (log {cdc.log_file}); pids {json.dumps(pids)}")
        cdc.create_changefeed(CHANGEFEED, pg.uri("bench"), sink_uri)
        src = pg.connect("bench")
        stack.callback(src.close)
        # The pipeline is up (span running, sink connected) once the checkpoint passes "now".
        _wait_checkpoint(cdc, current_lsn(src), 120, None, say)
        sampler = Sampler(cdc.proc.pid, work / "cdc" / f"data-{cdc.port}")
        stack.callback(sampler.stop)
        sampler.start()
        time.sleep(2 * SAMPLE_INTERVAL)
        rss_start = sampler.samples[-1].rss
        anon_start = sampler.samples[-1].anon
        t_begin = time.monotonic()
        say(f"  capture RSS before the transaction: {rss_start / MiB:.1f} MB; inserting {rows} rows in one "
            "transaction")
        insert_s, lsn_before, lsn_after = _run_insert(pg, "bench", rows)
        t_commit = time.monotonic()
        say(f"  committed after {insert_s:.1f}s ({(lsn_after - lsn_before) / MiB:.0f} MB of WAL); "
            "waiting for the checkpoint")
        info = _wait_checkpoint(cdc, lsn_after, timeout, sampler, say)
        t_ckpt = time.monotonic()
        mapped = mapped_files(cdc.proc.pid)
        end = sampler.sample()
        if end is None:
            raise RuntimeError(f"the capture process exited during the benchmark\n{cdc.log_tail()}")
        say(f"  checkpoint after {t_ckpt - t_commit:.1f}s; verifying the target")
        with src.cursor() as cur:
            cur.execute(CHECKSUM_SQL)
            n, length, ids = cur.fetchone()
        source = (int(n), int(length), int(ids))
        target: tuple[int, int, int] | None = None
        checked = bad = 0
        if kind != "blackhole":
            target = target_checksum(sink_uri)
            checked, bad = compare_sample(src, sink_uri, rows)
        settled = _settle(sampler, base_file=sampler.samples[0].file, deadline=t_ckpt + SETTLE_S)
        sampler.stop()
        last = sampler.samples[-1]
        streaming = sampler.window(t_begin, t_commit)
        applying = sampler.window(t_commit, t_ckpt)
        cleanup = sampler.window(t_ckpt, settled.t)
        t0 = sampler.samples[0].t
        return BenchResult(
            sink=kind, size_mb=size_mb, rows=rows, data_bytes=source[1] + 8 * source[0],
            wal_bytes=lsn_after - lsn_before, insert_s=insert_s, commit_to_checkpoint_s=t_ckpt - t_commit,
            rss_start=rss_start,
            rss_peak_streaming=max((s.rss for s in streaming), default=0),
            rss_peak_applying=max((s.rss for s in applying), default=0),
            anon_peak_streaming=max((s.anon for s in streaming), default=0),
            anon_peak_applying=max((s.anon for s in applying), default=0),
            anon_peak_cleanup=max((s.anon for s in cleanup), default=0),
            phases={"begin": t_begin - t0, "commit": t_commit - t0, "checkpoint": t_ckpt - t0,
                    "settled": settled.t - t0},
            rss_end=end.rss, anon_end=end.anon, file_end=end.file, rss_settled=settled.rss,
            settled_s=settled.t - t_ckpt, hwm=last.hwm, anon_start=anon_start,
            anon_peak=max(s.anon for s in sampler.samples), file_peak=max(s.file for s in sampler.samples),
            mapped_at_checkpoint=mapped,
            tree_rss_peak=max(s.tree_rss for s in sampler.samples),
            tree_procs=max(s.tree_procs for s in sampler.samples),
            sorter_disk_peak=max(s.disk for s in sampler.samples),
            source=source, target=target, replicated_rows=_changefeed_rows(info),
            rows_checked=checked, rows_mismatched=bad, pids=pids, samples=list(sampler.samples),
        )
    raise AssertionError("unreachable")  # ExitStack does not swallow exceptions


# ---- report -----------------------------------------------------------------------------------------------
COLUMNS = ("sink", "rows", "MB", "WAL MB", "insert s", "commit->ckpt s", "rows/s", "RSS start MB",
           "RSS peak MB (VmHWM)", "anon start MB", "anon peak MB", "file-mapped peak MB", "tree procs",
           "sorter disk peak MB", "target = source")


def _row(r: BenchResult) -> list[str]:
    return [r.sink, str(r.rows), f"{r.data_bytes / MiB:.0f}", f"{r.wal_bytes / MiB:.0f}", f"{r.insert_s:.1f}",
            f"{r.commit_to_checkpoint_s:.1f}", f"{r.rows_per_s:.0f}", f"{r.rss_start / MiB:.1f}",
            f"{r.hwm / MiB:.1f}", f"{r.anon_start / MiB:.1f}", f"{r.anon_peak / MiB:.1f}",
            f"{r.file_peak / MiB:.1f}", str(r.tree_procs),
            f"{r.sorter_disk_peak / MiB:.0f}",
            ("yes" if r.equal else "NO") + (" (count)" if r.target is None else "")]


def format_table(results: list[BenchResult]) -> str:
    """A Markdown table of the runs (one line per run)."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(_row(r)) + " |" for r in results]
    return "\n".join(lines)


def format_phases(results: list[BenchResult]) -> str:
    """Per phase, VmRSS / RssAnon (MB): before the transaction, while it streams in (BEGIN..COMMIT), while
    it is applied (COMMIT..checkpoint), while the sorter deletes it (checkpoint..settled)."""
    lines = ["| sink | MB | start RSS / anon | streaming: peak RSS / anon | applying: peak RSS / anon | "
             "at ckpt: RSS / anon / file | cleanup: peak anon | settled RSS (s after ckpt) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(
            f"| {r.sink} | {r.data_bytes / MiB:.0f} | {r.rss_start / MiB:.0f} / {r.anon_start / MiB:.0f} | "
            f"{r.rss_peak_streaming / MiB:.0f} / {r.anon_peak_streaming / MiB:.0f} | "
            f"{r.rss_peak_applying / MiB:.0f} / {r.anon_peak_applying / MiB:.0f} | "
            f"{r.rss_end / MiB:.0f} / {r.anon_end / MiB:.0f} / {r.file_end / MiB:.0f} | "
            f"{r.anon_peak_cleanup / MiB:.0f} | {r.rss_settled / MiB:.0f} ({r.settled_s:.0f} s) |")
    lines += ["", "Resident file mappings of the capture at the checkpoint (MB, dirty MB, mappings):"]
    for r in results:
        parts = [f"{k} {v['rss'] / MiB:.1f} (dirty {v['dirty'] / MiB:.1f}, {v['mappings']})"
                 for k, v in sorted(r.mapped_at_checkpoint.items(), key=lambda kv: -kv[1]["rss"])]
        lines.append(f"- {r.sink} {r.data_bytes / MiB:.0f} MB: " + "; ".join(parts))
    return "\n".join(lines)


def _on_sigterm(signum: int, _frame: Any) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=float, default=1024, help="MiB of row data in the one transaction")
    ap.add_argument("--sink", default="sqlite", help="sqlite (file in the work dir), blackhole, mariadb "
                    "(a MariaDB started by this script) or a sqlite:/// URI")
    ap.add_argument("--compare-small", action="store_true", help="also run --small-mb first, on fresh servers")
    ap.add_argument("--small-mb", type=float, default=100)
    ap.add_argument("--timeout", type=float, default=3600, help="seconds to wait for the checkpoint")
    ap.add_argument("--work-dir", type=Path, help="directory for the servers' data (default: a new temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--json", type=Path, help="also write the results (with the RSS samples) to this file")
    ap.add_argument("--quiet", action="store_true", help="print only the result table")
    args = ap.parse_args(argv)

    def say(msg: str) -> None:
        if not args.quiet:
            print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    old = signal.signal(signal.SIGTERM, _on_sigterm) if threading.current_thread() is threading.main_thread() else None
    base = Path(tempfile.mkdtemp(prefix="tidewater-bigtxn-")) if args.work_dir is None else args.work_dir
    results: list[BenchResult] = []
    try:
        sizes = ([args.small_mb] if args.compare_small else []) + [args.size_mb]
        for i, size in enumerate(sizes):
            results.append(run_benchmark(size, args.sink, base / f"run{i}-{size:g}mb", args.timeout, say))
            if not args.keep:
                shutil.rmtree(base / f"run{i}-{size:g}mb", ignore_errors=True)
    finally:
        if old is not None:
            signal.signal(signal.SIGTERM, old)
        if args.keep:
            say(f"kept {base}")
        elif args.work_dir is None:
            shutil.rmtree(base, ignore_errors=True)
    print(format_table(results))
    print()
    print(format_phases(results))
    if args.json is not None:
        args.json.write_text(json.dumps([r.to_dict() for r in results], indent=1))
    for r in results:
        if not r.equal:
            print(f"MISMATCH ({r.size_mb:g} MB into {r.sink}): source {r.source} target {r.target} "
                  f"replicated rows {r.replicated_rows}, {r.rows_mismatched} of {r.rows_checked} sampled rows differ",
                  file=sys.stderr)
    return 0 if results and all(r.equal for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
