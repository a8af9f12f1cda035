"""One initial-copy chunk into MariaDB, through each of the copy's paths, alternately.

Starts a PostgreSQL and a MariaDB server (playground), loads ``--rows`` rows of the bench's snapshot table (``id
bigint`` key, ``int``, ``varchar(60)``, ``varchar(20)``, ``timestamp``) and copies them as one chunk with the copy
task's code (:func:`spark_jobs.copy.copy_chunk`, no Spark) into a fresh MariaDB database per pass, ``--repeat``
times each way of ``--modes``: ``load`` (``LOAD DATA LOCAL INFILE`` of rows rendered in C, sinks/sql/ops/load_copy.py),
``c`` (the C literal rows' statements: ``TIDEWATER_COPY_LOAD=off``), ``python`` (the parsed path: also
``TIDEWATER_COPY_LITERALS=python``). Prints wall time, the copying thread's CPU, the process's CPU and the MariaDB
server's CPU (``/proc/<mariadbd>/stat``) per row; ``--profile`` adds cProfile's top functions.

    .venv/bin/python scripts/bench_copy_chunk.py [--rows 500000] [--repeat 2] [--modes load,c,python] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import shutil
import tempfile
import time
from pathlib import Path

from cdc.events import TableName
from playground.servers import MariaDBServer, PostgresServer
from sinks.factory import open_sink
from spark_jobs.copy import ChunkTask, copy_chunk
from spark_jobs.plan import SnapshotJob
from upstream.postgres.snapshot_read import PgSnapshotReader


def _cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=500_000)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--modes", default="load,c", help="comma-separated: load, c, python (default: load,c)")
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="tidewater-copy-chunk-"))
    pg = PostgresServer(base / "pg").start()
    maria = MariaDBServer(base / "maria").start()
    try:
        pg.create_database("src")
        conn = pg.connect("src")
        with conn.cursor() as cur:
            cur.execute("CREATE TABLE sb (id bigint PRIMARY KEY, k int, c varchar(60), pad varchar(20), ts timestamp)")
            cur.execute(f"INSERT INTO sb SELECT g, g % 1000, left(md5(g::text) || md5((g + 1)::text), 60), "
                        f"left(md5(g::text), 20), timestamp '2024-01-01' + g * interval '1.5 second' "
                        f"FROM generate_series(1, {args.rows}) g")
            cur.execute("VACUUM ANALYZE sb")
        conn.close()
        assert maria.pid is not None
        modes = args.modes.split(",")
        if set(modes) - {"load", "c", "python"}:
            ap.error(f"unknown mode in {args.modes!r}")
        for run, mode in enumerate(modes * args.repeat):
            db = f"t{run}"
            maria.create_database(db)
            for var, off, value in (("TIDEWATER_COPY_LITERALS", mode == "python", "python"),
                                    ("TIDEWATER_COPY_LOAD", mode != "load", "off")):
                if off:
                    os.environ[var] = value
                else:
                    os.environ.pop(var, None)
            job = SnapshotJob(changefeed="chunk", upstream=pg.uri("src"), sink=maria.uri(db), tables=("public.sb",),
                              etcd=("http://127.0.0.1:1",))  # copy_chunk never talks to etcd
            reader = PgSnapshotReader(pg.uri("src"))
            sink = open_sink(job.sink, job.sink_settings)
            sink.set_bulk_load()
            schema = reader.table_schema(TableName("public", "sb"))
            (chunk,) = reader.plan(schema, 1 << 40).chunks
            reader.release()
            prof = cProfile.Profile() if args.profile else None
            s0, c0, p0, w0 = _cpu(maria.pid), time.thread_time(), time.process_time(), time.monotonic()
            if prof is not None:
                prof.enable()
            rows, as_text = copy_chunk(reader, sink, ChunkTask(job, schema, chunk))
            if prof is not None:
                prof.disable()
            w = time.monotonic() - w0
            us = 1e6 / rows
            print(f"{mode}: {rows} rows (as text: {as_text}) {w:.2f} s, {rows / w:,.0f} rows/s; CPU us/row: thread "
                  f"{(time.thread_time() - c0) * us:.2f}, process {(time.process_time() - p0) * us:.2f}, mariadbd "
                  f"{(_cpu(maria.pid) - s0) * us:.2f}", flush=True)
            if prof is not None:
                pstats.Stats(prof).sort_stats("tottime").print_stats(10)
            sink.close()
            reader.close()
    finally:
        maria.stop()
        pg.stop()
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
