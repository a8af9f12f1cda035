"""What recording the copied tables for the changefeed costs the copy (``spark_jobs.copy.open_job_sink``).

Starts etcd, a PostgreSQL upstream and the target's server (playground), loads ``--tables`` tables of ``--rows`` rows
each (``id bigint`` key, ``int``, ``varchar(60)``), plans them in ``--chunk-rows`` chunks under an exported snapshot,
and copies every chunk with the copy task's code (:func:`spark_jobs.copy.copy_chunks`, no Spark) into a fresh target
database per pass, alternately ``none`` (a plan without origin: the sinks are bound to nothing, as before) and
``bound`` (the plan names the span's origin: each sink reads the record once and upserts each table it binds that the
record does not show). ``--per-task`` (default 1) chunks per task: 1 is the worst case, a sink (and its record read)
per chunk. Prints per pass wall time, this process's CPU per chunk, and the statements SQLAlchemy sent that name
``tidewater_tables`` (the record's: its CREATEs, SELECTs and upserts) and in all.

    PYTHONPATH=$PWD .venv/bin/python scripts/bench_copy_record.py [--target postgresql|mariadb] [--tables 4] [--rows 20000]
        [--chunk-rows 500] [--per-task 1] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine

from cdc.meta.etcd import EtcdClient
from cdc.meta.snapshot_progress import SnapshotProgressStore
from playground.servers import MariaDBServer, PostgresServer
from playground.servers.etcd import EtcdServer
from spark_jobs.copy import copy_chunks
from spark_jobs.plan import SnapshotJob
from spark_jobs.snapshot import plan_tasks
from tests.snapshot_helpers import exported_snapshot

COUNTS = {"record": 0, "all": 0}


@event.listens_for(Engine, "before_cursor_execute")
def _count(conn: Any, cursor: Any, statement: str, params: Any, context: Any, executemany: bool) -> None:
    COUNTS["all"] += 1
    if "tidewater_tables" in statement:
        COUNTS["record"] += 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", choices=("postgresql", "mariadb"), default="postgresql")
    ap.add_argument("--tables", type=int, default=4)
    ap.add_argument("--rows", type=int, default=20_000)
    ap.add_argument("--chunk-rows", type=int, default=500)
    ap.add_argument("--per-task", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="tidewater-copy-record-"))
    etcd = EtcdServer(base / "etcd").start()
    pg = PostgresServer(base / "pg").start()
    maria = MariaDBServer(base / "maria").start() if args.target == "mariadb" else None
    tables = tuple(f"public.t{i}" for i in range(args.tables))
    try:
        pg.create_database("src")
        conn = pg.connect("src")
        with conn.cursor() as cur:
            for t in tables:
                cur.execute(f"CREATE TABLE {t} (id bigint PRIMARY KEY, k int, c varchar(60))")
                cur.execute(f"INSERT INTO {t} SELECT g, g % 1000, md5(g::text) FROM generate_series(1, {args.rows}) g")
        conn.close()
        with exported_snapshot(pg, "src") as exp:
            passes(args, etcd, pg, maria, tables, exp.snapshot, exp.commit_ts)
    finally:
        if maria is not None:
            maria.stop()
        pg.stop()
        etcd.stop()
        shutil.rmtree(base, ignore_errors=True)
    return 0


def passes(args: argparse.Namespace, etcd: EtcdServer, pg: PostgresServer, maria: MariaDBServer | None,
           tables: tuple[str, ...], snapshot: str, commit_ts: int) -> None:
    """The passes of ``none`` and ``bound``, alternately, under the exported ``snapshot``."""
    print(f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}; target {args.target}; "
          f"{args.tables} tables x {args.rows} rows, chunk-rows {args.chunk_rows}, {args.per_task} chunk(s) per task")
    for n, mode in enumerate(("none", "bound") * args.repeat):
        db = f"tgt{n}"
        server = maria if maria is not None else pg
        server.create_database(db)
        job = SnapshotJob(changefeed=f"bench-{n}", upstream=pg.uri("src"), sink=server.uri(db), tables=tables,
                          etcd=(etcd.url,), snapshot=snapshot, commit_ts=commit_ts, chunk_rows=args.chunk_rows,
                          origin=1 if mode == "bound" else None)
        with EtcdClient([etcd.url]) as client:
            tasks, total = plan_tasks(job, SnapshotProgressStore(client, job.cluster))
        COUNTS.update(record=0, all=0)
        w0, p0 = time.monotonic(), time.process_time()
        rows = 0
        for i in range(0, len(tasks), args.per_task):
            for r in copy_chunks(tasks[i:i + args.per_task]):
                assert r.error is None, r.error
                rows += r.rows
        w, p = time.monotonic() - w0, time.process_time() - p0
        assert rows == args.tables * args.rows, rows
        print(f"{mode:5s}: {total} chunks, {rows} rows in {w:.2f} s; per chunk: wall {w / total * 1e3:.2f} ms, "
              f"process CPU {p / total * 1e3:.2f} ms; statements naming tidewater_tables {COUNTS['record']}, "
              f"all SQLAlchemy statements {COUNTS['all']}", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
