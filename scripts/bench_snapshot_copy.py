"""Benchmark of the Spark snapshot copy (PostgreSQL -> PostgreSQL) next to references measured in the same run.

    .venv/bin/python scripts/bench_snapshot_copy.py [--rows 1000000] [--tables 4] [--chunk-rows 10000,50000,200000]
                                                    [--master local[*]] [--target postgresql|sqlite]

Starts its own PostgreSQL 18 and etcd (playground.servers), loads ``--rows`` rows of about 100 bytes
(sysbench-like ``id bigint PRIMARY KEY, k int, c text, pad text``) spread over ``--tables`` tables, creates a
logical slot with an exported snapshot, and measures, each into a fresh target:

- ``pg_dump | psql``: the reference of issue 10 (schema and data of the same tables into an empty database);
- ``COPY TO STDOUT | COPY FROM STDIN`` (psql on both ends, one table after the other): the bulk-load ceiling;
- the same copy in this one process without Spark (``spark_jobs.copy.copy_chunks`` over every chunk in order,
  chunk-rows 50000): the per-core speed of the read -> parse -> sink path;
- the snapshot job (``spark_jobs.snapshot.run``) once per ``--chunk-rows`` value, on one SparkSession (its
  start-up time is printed apart: a job process pays it once).

Prints rows/s of each and the ratio to ``pg_dump | psql``. Host noise is large on shared machines: compare
ratios of one run, and run it more than once.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cdc.meta.etcd import EtcdClient  # noqa: E402
from cdc.meta.snapshot_progress import SnapshotProgressStore  # noqa: E402
from playground.servers import EtcdServer, PostgresServer  # noqa: E402
from spark_jobs.copy import copy_chunks  # noqa: E402
from spark_jobs.plan import SnapshotJob  # noqa: E402
from spark_jobs.session import spark_session  # noqa: E402
from spark_jobs.snapshot import plan_tasks, run  # noqa: E402


def sh(cmd: str) -> None:
    subprocess.run(["bash", "-o", "pipefail", "-c", cmd], check=True, stdout=subprocess.DEVNULL)


def timed(fn: object) -> float:
    t0 = time.monotonic()
    fn()  # type: ignore[operator]
    return time.monotonic() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--tables", type=int, default=4)
    ap.add_argument("--chunk-rows", default="10000,50000,200000")
    ap.add_argument("--master", default="local[*]")
    ap.add_argument("--target", choices=["postgresql", "sqlite"], default="postgresql")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-snapshot-"))
    pg = PostgresServer(work / "pg").start()
    etcd = EtcdServer(work / "etcd").start()
    try:
        return bench(args, pg, etcd, work)
    finally:
        pg.stop()
        etcd.stop()
        shutil.rmtree(work, ignore_errors=True)


def bench(args: argparse.Namespace, pg: PostgresServer, etcd: EtcdServer, work: Path) -> int:
    import psycopg2
    import psycopg2.extras

    bin_dir = pg.bin_dir
    conn_opts = f"-h 127.0.0.1 -p {pg.port} -U postgres"
    tables = [f"sbtest{i}" for i in range(1, args.tables + 1)]
    per_table = args.rows // len(tables)
    pg.create_database("src")
    def load() -> None:
        for t in tables:
            pg.execute(f"CREATE TABLE {t} (id bigint PRIMARY KEY, k int NOT NULL, c text NOT NULL, pad text NOT NULL); "
                       f"INSERT INTO {t} SELECT i, (i * 7919) % 100000, md5(i::text) || md5((i + 1)::text), "
                       f"substr(md5((i * 3)::text), 1, 30) FROM generate_series(1, {per_table}) i", db="src")
            pg.execute(f"VACUUM ANALYZE {t}", db="src")

    t_load = timed(load)
    rows = per_table * len(tables)
    print(f"machine: {os.cpu_count()} cores; {rows} rows in {len(tables)} tables (~100 bytes), loaded in {t_load:.1f} s")

    rconn = psycopg2.connect(pg.dsn("src"), connection_factory=psycopg2.extras.LogicalReplicationConnection)
    cur = rconn.cursor()
    cur.execute("CREATE_REPLICATION_SLOT bench_snap LOGICAL pgoutput (SNAPSHOT 'export')")
    _, point, snapshot, _ = cur.fetchone()
    hi, lo = point.split("/")
    commit_ts = (int(hi, 16) << 32) | int(lo, 16)

    results: list[tuple[str, float]] = []
    pg.create_database("ref_dump")
    t = timed(lambda: sh(f"{bin_dir}/pg_dump {conn_opts} {' '.join('-t ' + x for x in tables)} src | "
                         f"{bin_dir}/psql -q {conn_opts} -d ref_dump -v ON_ERROR_STOP=1"))
    results.append(("pg_dump | psql", t))
    pg.create_database("ref_copy")
    sh(f"{bin_dir}/pg_dump {conn_opts} --schema-only {' '.join('-t ' + x for x in tables)} src | "
       f"{bin_dir}/psql -q {conn_opts} -d ref_copy -v ON_ERROR_STOP=1")
    t = timed(lambda: [sh(f"{bin_dir}/psql {conn_opts} -d src -c 'COPY {x} TO STDOUT' | "
                          f"{bin_dir}/psql {conn_opts} -d ref_copy -c 'COPY {x} FROM STDIN'") for x in tables])
    results.append(("COPY TO STDOUT | COPY FROM STDIN", t))

    def target(name: str) -> str:
        if args.target == "postgresql":
            pg.create_database(name)
            return pg.uri(name)
        return f"sqlite:///{work / f'{name}.db'}"

    job = SnapshotJob(changefeed="bench-nospark", upstream=pg.uri("src"), sink=target("nospark"),
                      tables=tuple(f"public.{x}" for x in tables), etcd=(etcd.url,), snapshot=snapshot,
                      commit_ts=commit_ts, chunk_rows=50_000)
    t0 = time.monotonic()
    with EtcdClient([etcd.url]) as client:
        tasks, _ = plan_tasks(job, SnapshotProgressStore(client, job.cluster))
    copied = sum(r.rows for r in copy_chunks(tasks))
    assert copied == rows, copied
    results.append((f"one process, no Spark -> {args.target}, chunk-rows 50000", time.monotonic() - t0))

    t0 = time.monotonic()
    spark = spark_session(args.master, {"spark.sql.shuffle.partitions": "4"}, app_name="bench-snapshot")
    print(f"spark session ({args.master}) started in {time.monotonic() - t0:.1f} s (paid once per job process)")
    for n, chunk_rows in enumerate(int(x) for x in args.chunk_rows.split(",")):
        sink = target(f"tgt{n}")
        job = SnapshotJob(changefeed=f"bench-{n}", upstream=pg.uri("src"), sink=sink,
                          tables=tuple(f"public.{x}" for x in tables), etcd=(etcd.url,), snapshot=snapshot,
                          commit_ts=commit_ts, chunk_rows=chunk_rows, spark_master=args.master)
        t0 = time.monotonic()
        report = run(job, spark=spark)
        t = time.monotonic() - t0
        assert report.rows_copied == rows, report
        results.append((f"snapshot job -> {args.target}, chunk-rows {chunk_rows} ({report.chunks_total} chunks)", t))
    spark.stop()
    rconn.close()

    ref = results[0][1]
    print(f"{'what':<64} {'seconds':>8} {'rows/s':>10} {'vs pg_dump|psql':>16}")
    for what, t in results:
        print(f"{what:<64} {t:8.2f} {rows / t:10.0f} {ref / t:15.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
