"""Cost of exactly-once delivery, sink alone: small writes (one 10-row transaction per ``write`` call, as
when streaming a light load live) and big ones (20k rows per call, catch-up), ``delivery = "exactly-once"``
vs ``"at-least-once"``, interleaved, best of three, into SQLite, PostgreSQL and MariaDB (own servers).

    .venv/bin/python scripts/bench_delivery.py
"""

import itertools
import tempfile
import time
from pathlib import Path

from cdc.config import SinkConfig
from cdc.events import ColumnSchema, OpType, RowChange, TableName, TableSchema
from playground.servers import MariaDBServer, PostgresServer
from sinks.factory import open_sink

T = TableSchema(TableName("public", "t"), (ColumnSchema("id", 0, "int4", nullable=False, is_key=True),
                ColumnSchema("v", 0, "text", nullable=True)), ("id",), has_key=True)
IDS = itertools.count(1)


def txn(ts: int, n: int) -> list[RowChange]:
    return [RowChange(OpType.INSERT, T, ts, float(ts), values={"id": next(IDS), "v": "x" * 80}) for _ in range(n)]



def run(uri: str, mode: str, writes: int, n: int, ts0: int) -> float:
    s = open_sink(uri, SinkConfig(delivery=mode))
    s.check()
    s.open_position("bench", 0, 1)
    s.write(txn(ts0, 1))
    t = time.perf_counter()
    for w in range(writes):
        s.write(txn(ts0 + 1 + w, n))
    dt = time.perf_counter() - t
    s.close()
    return dt



tmp = Path(tempfile.mkdtemp())
pg = PostgresServer(tmp / "pg").start()
pg.create_database("b")
my = MariaDBServer(tmp / "my").start()
my.create_database("b")
targets = {"sqlite": f"sqlite:///{tmp}/b.db", "postgresql": pg.uri("b"), "mariadb": my.uri("b")}
ts = 10
try:
    for name, uri in targets.items():
        for writes, n in ((2000, 10), (5, 20000)):
            res: dict[str, list[float]] = {"exactly-once": [], "at-least-once": []}
            for _ in range(3):
                for mode in res:
                    ts += 100000
                    res[mode].append(run(uri, mode, writes, n, ts))
            eo, alo = min(res["exactly-once"]), min(res["at-least-once"])
            print(f"{name:10s} {writes:5d} writes x {n:5d} rows: exactly-once {writes*n/eo:9.0f} rows/s "
                  f"({eo/writes*1000:.3f} ms/write), at-least-once {writes*n/alo:9.0f} rows/s "
                  f"({alo/writes*1000:.3f} ms/write); eo/alo time {eo/alo:.3f}", flush=True)
finally:
    pg.stop()
    my.stop()
