"""A target that refuses a row of the initial copy names the table and the row's key (spark_jobs.rejected): a CHECK
constraint someone put on an existing, empty PostgreSQL target table, a MariaDB column too narrow for a value
(strict mode), a key-less table's row refused by a NOT NULL. The job ends with one line
``[CDC:ErrSinkDataRejected] chunk ...: table ...: the target refused the row with key ...: <the database's reason>.
Fix: ...``,
nothing of the search stays downstream, and chunks copied before stay copied. Real upstream, targets and etcd."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from spark_jobs.plan import SnapshotJob, write_job
from tests.snapshot_helpers import execute, pg_target
from tests.sql_targets import SqlTarget

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def pg_tgt(request: pytest.FixtureRequest) -> Iterator[SqlTarget]:
    yield from pg_target(request)


def _job(pg_server: Any, pg_database: str, etcd_server: Any, cluster_id: str, sink: str, *tables: str,
         chunk_rows: int = 1000) -> SnapshotJob:
    return SnapshotJob(changefeed="cf-refused", upstream=pg_server.uri(pg_database), sink=sink, tables=tables,
                       etcd=(etcd_server.url,), cluster=cluster_id, chunk_rows=chunk_rows, spark_master="local[1]",
                       local=True)  # the same task code without starting Spark


def _run(job: SnapshotJob, tmp_path: Path, log: list[str] | None = None) -> str:
    plan = write_job(job, tmp_path / "job.json")
    out = subprocess.run([sys.executable, "-m", "spark_jobs.snapshot", "--plan", str(plan)], cwd=ROOT,
                         capture_output=True, text=True, timeout=180)
    assert out.returncode == 3, out.stderr[-3000:]  # neither bad input nor an outage: the target refuses
    assert "Traceback" not in out.stderr
    last = out.stderr.rstrip().splitlines()[-1]
    if log is not None:
        log.append(out.stderr)
    assert last.startswith("snapshot copy failed: [CDC:ErrSinkDataRejected] chunk "), out.stderr[-3000:]
    return last


def test_a_check_constraint_on_an_existing_postgresql_target_names_the_row(
        pg_server: Any, pg_database: str, etcd_server: Any, cluster_id: str, tmp_path: Path, pg_tgt: SqlTarget) -> None:
    execute(pg_server, pg_database, "CREATE TABLE orders (id int PRIMARY KEY, qty int, note text)",
            "INSERT INTO orders SELECT g, g % 50, 'n' || g FROM generate_series(1, 5000) g",
            "UPDATE orders SET qty = -7 WHERE id = 3777")
    # someone created the target (empty) with a constraint the upstream does not have
    pg_tgt.execute("CREATE TABLE public.orders (id int PRIMARY KEY, qty int CONSTRAINT qty_not_negative "
                   "CHECK (qty >= 0), note text)")
    line = _run(_job(pg_server, pg_database, etcd_server, cluster_id, pg_tgt.uri, "public.orders"), tmp_path)
    assert "chunk public.orders#3: table public.orders: the target refused the row with key id=3777: " in line, line
    assert 'violates check constraint "qty_not_negative"' in line and "Fix: make the target take it" in line, line
    assert "password" not in line.lower()
    # the refused chunk left nothing (neither did the search's probes); chunks before it stay copied
    [(in_chunk,)] = pg_tgt.execute("SELECT count(*) FROM public.orders WHERE id BETWEEN 3001 AND 4000")
    assert in_chunk == 0
    [(before,)] = pg_tgt.execute("SELECT count(*) FROM public.orders WHERE id <= 3000")
    assert before in (0, 1000, 2000, 3000)  # whole chunks only (the copy may stop before reaching them)


def test_a_mariadb_column_too_narrow_names_the_row(pg_server: Any, pg_database: str, etcd_server: Any,
                                                    cluster_id: str, tmp_path: Path, mariadb_server: Any,
                                                    mariadb_database: str) -> None:
    execute(pg_server, pg_database, "CREATE TABLE items (sku text, region int, label text, PRIMARY KEY (sku, region))",
            "INSERT INTO items SELECT 'sku-' || g, g % 3, 'short' FROM generate_series(1, 2500) g",
            "UPDATE items SET label = 'a label much longer than the target column' WHERE sku = 'sku-1234'")
    mariadb_server.execute("CREATE TABLE items (sku varchar(20), region int, label varchar(10), "
                           "PRIMARY KEY (sku, region))", db=mariadb_database)
    line = _run(_job(pg_server, pg_database, etcd_server, cluster_id, mariadb_server.uri(mariadb_database),
                     "public.items"), tmp_path)
    assert "table public.items: the target refused the row with key (sku, region)=('sku-1234', 1)" in line, line
    assert "Data too long for column 'label'" in line, line


def test_a_keyless_row_refused_by_not_null_is_named_by_its_values(
        pg_server: Any, pg_database: str, etcd_server: Any, cluster_id: str, tmp_path: Path, pg_tgt: SqlTarget) -> None:
    execute(pg_server, pg_database, "CREATE TABLE bag (g int, s text)", "ALTER TABLE bag REPLICA IDENTITY FULL",
            "INSERT INTO bag SELECT g % 10, 's' FROM generate_series(1, 300) g", "INSERT INTO bag VALUES (42, NULL)")
    pg_tgt.execute("CREATE TABLE public.bag (g int, s text NOT NULL)")
    log: list[str] = []
    line = _run(_job(pg_server, pg_database, etcd_server, cluster_id, pg_tgt.uri, "public.bag"), tmp_path, log)
    assert "table public.bag: the target refused the row with key (g, s)=(42, None)" in line, line
    assert 'null value in column "s"' in line, line
    # the job's log says the key-less table is one chunk
    assert "table public.bag: 301 rows planned, 0/1 chunks done, copied as one chunk: the table has no key" in log[0]
    [(n,)] = pg_tgt.execute("SELECT count(*) FROM public.bag")
    assert n == 0


def test_a_value_with_more_fractional_digits_than_an_existing_postgresql_column_is_refused_not_rounded(
        pg_server: Any, pg_database: str, etcd_server: Any, cluster_id: str, tmp_path: Path, pg_tgt: SqlTarget) -> None:
    """The COPY passthrough (sinks/sql/ops/bulk.py) would send the upstream text ``0.000000100`` into the existing
    ``numeric(10,2)`` target, which PostgreSQL rounds to 0.00 without a word: the chunk is parsed instead, and the
    value refused (docs/limits.md), naming table, key and column."""
    execute(pg_server, pg_database, "CREATE TABLE amounts (id int PRIMARY KEY, n numeric(20,9))",
            "INSERT INTO amounts SELECT g, g * 0.25 FROM generate_series(1, 2500) g",
            "UPDATE amounts SET n = 0.0000001 WHERE id = 1234")
    pg_tgt.execute("CREATE TABLE public.amounts (id int PRIMARY KEY, n numeric(10,2))")
    line = _run(_job(pg_server, pg_database, etcd_server, cluster_id, pg_tgt.uri, "public.amounts"), tmp_path)
    assert "table public.amounts: the target refused the row with key id=1234: " in line, line
    assert "column 'n' value 0.000000100 has more than 2 fractional digits" in line, line
    [(rounded,)] = pg_tgt.execute("SELECT count(*) FROM public.amounts WHERE id = 1234 OR n = 0")
    assert rounded == 0
