"""``changefeed verify`` on a storage sink (docs/verify.md, "A storage sink: the lake"): a real `cdc server`, etcd,
PostgreSQL 18, the storage sink's CSV files and Spark. While an upstream writer keeps committing, the verifier
holds the changefeed at the exported snapshot's Ts ``Y`` until the sink's ``metadata`` checkpoint reaches ``Y``,
has Spark's lake job apply the files cut at exactly ``Y``, and finds the lake equal to the upstream under the
snapshot, row by row; a divergence injected into the lake's Parquet files (a row changed, one removed, one extra) is
reported with exactly those keys by ``cdc cli changefeed verify`` (the job run by the capture; exit 1), whose
``--repair`` refuses a storage sink with its reason."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from e2e_workload import BackgroundWriter

from cdc import serde
from cdc.verify import DIFFERENT, EXIT_DIFFERS, EXIT_EQUAL, EXTRA, MISSING, VerifyReport
from playground.cluster import CdcServer, current_lsn
from playground.servers import PostgresServer
from spark_jobs import lake
from spark_jobs.verify import VerifyJob, verify_changefeed
from spark_jobs.verify_lake import lake_root

pytestmark = pytest.mark.e2e

SCHEMA = """
CREATE TABLE busy (id int PRIMARY KEY, v int NOT NULL, note text, at timestamptz, amount numeric(12,2), f real);
CREATE TABLE still (id int PRIMARY KEY, label text, ok boolean, d date);
INSERT INTO busy SELECT i, i, 'n' || i, now(), i * 0.25, i / 10.0 FROM generate_series(1, 3000) i;
INSERT INTO still SELECT i, 'l' || i, i % 3 = 0, date '2024-01-01' + i FROM generate_series(1, 1200) i;
"""
TABLES = ("public.busy", "public.still")
CF = "cf-lake"


@pytest.fixture
def source_schema() -> str:
    return SCHEMA


def busy_step(conn: Any, n: int) -> int:
    """One transaction: 50 new rows, ~30 updated, 10 deleted (~90 rows; with the 50 ms pause about 1-1.5k rows/s)."""
    base = 10_000 + n * 50
    with conn.cursor() as cur:
        cur.execute("BEGIN")
        cur.execute("INSERT INTO busy SELECT i, i, 'w', now(), i * 0.5, i / 3.0 FROM generate_series(%s, %s) i",
                    (base, base + 49))
        cur.execute("UPDATE busy SET v = v + 1, at = now() WHERE id %% 97 = %s AND id <= 3000", (n % 97,))
        cur.execute("DELETE FROM busy WHERE id BETWEEN %s AND %s", (base - 500, base - 491))
        cur.execute("COMMIT")
    return 1


def _inject(path: str) -> None:
    """In the lake's Parquet version of ``still``: id 5 relabelled, id 700 removed, id 5000 added."""
    table = pq.read_table(path)
    rows = [r for r in table.to_pylist() if r["id"] != 700]
    for r in rows:
        if r["id"] == 5:
            r["label"] = "changed"
    rows.append({"id": 5000, "label": "extra", "ok": True, "d": None})
    for name in os.listdir(path):
        if name.endswith(".parquet"):
            os.remove(os.path.join(path, name))
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), os.path.join(path, "part-00000-injected.parquet"))


def _cli(cdc: CdcServer, *args: str) -> tuple[int, Any, str]:
    proc = subprocess.run([sys.executable, "-m", "cli", "cli", "--server", cdc.url, "changefeed", "verify", *args],
                          capture_output=True, text=True, timeout=600, cwd=os.getcwd(),
                          env={**os.environ, "PYTHONPATH": os.getcwd()})
    out: Any = json.loads(proc.stdout) if proc.stdout.strip().startswith("{") else proc.stdout
    return proc.returncode, out, proc.stderr


def test_the_lake_verifies_equal_under_writes_then_names_the_keys_injected_into_its_files(
        cdc_server: CdcServer, etcd_server: Any, cluster_id: str, pg_server: PostgresServer, pg_database: str,
        source: Any, tmp_path: Path, spark: Any) -> None:
    sink = f"file://{tmp_path / 'files'}?protocol=csv&flush-interval=300ms"
    upstream = pg_server.uri(pg_database)
    cdc_server.create_changefeed(CF, upstream, sink)
    cdc_server.wait_checkpoint(CF, current_lsn(source), timeout=180)
    job = VerifyJob(upstream=upstream, sink=sink, tables=TABLES, changefeed=CF, etcd=(etcd_server.url,),
                    cluster=cluster_id, chunk_rows=500)
    with BackgroundWriter(pg_server.connect(pg_database), busy_step, pause=0.05) as writer:
        time.sleep(1.0)
        before, began = writer.txns, time.monotonic()
        report = verify_changefeed(job, spark=spark)
        txns, took = writer.txns - before, time.monotonic() - began
        assert txns > 0  # the upstream kept writing while the lake was cut and compared
        print(f"verify lake: {txns * 90 / took:.0f} upstream rows/s during {took:.1f} s; hold {report.hold_seconds} s;"
              f" rows compared {sum(t.source_rows for t in report.tables)}")
        assert report.exit_code == EXIT_EQUAL, report
        assert report.consistency == "hold" and report.ts > 0
        assert [(t.source_rows == t.target_rows > 0, t.chunks > 1) for t in report.tables] == [(True, True)] * 2
        q = cdc_server.changefeed(CF)
        assert q["verify_hold"] is None and q["state"] == "normal"  # released, and replication goes on

        # the lake's own files, in a table the writer does not touch: keys in three different chunks of 500
        path = lake.current_path(os.path.join(lake_root(sink, CF), "tables", "public.still"))
        assert path is not None
        _inject(path)
        writer.finish()
    # through the server and the CLI (the same job, run by the capture): exactly the three keys, exit 1; --repair
    # refuses a storage sink, saying why. (The busy table's files were verified equal under writes above; a lake
    # table's verdict is its own Parquet version's.)
    code, run, err = _cli(cdc_server, "-c", CF, "--tables", "public.still", "--chunk-rows", "500", "--output", "json",
                          "--repair")
    assert code == EXIT_DIFFERS, (run, err)
    report = serde.from_dict(VerifyReport, run["report"])
    (still,) = report.tables
    assert still.table == "public.still" and [(d.kind, d.key, d.columns) for d in still.diffs] == [
        (DIFFERENT, ("5",), ("label",)), (EXTRA, ("5000",), ()), (MISSING, ("700",), ())], still
    assert report.exit_code == EXIT_DIFFERS and report.consistency == "hold", report
    assert "storage sink" in run["repair_refused"] and "--repair refused" in err
