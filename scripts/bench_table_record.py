"""What the record of the target tables a changefeed has had (sinks/sql/target/table_record.py) costs the SQL sink.

Through the sink's public calls only (so the same script measures the code before the record): a fresh target per
pass; ``open`` = ``check`` + ``open_position`` of a new sink; ``first`` = one write of one row into each of ``--tables``
new tables (each created and bound: the record's upsert per table); ``restart`` = a new sink's ``open_position`` and
the same write again (every table exists: bound from the catalog, the record read once); ``steady`` = ``--writes``
writes of ``--rows`` upserts of one table (the hot path: nothing of the record). Prints wall time and the process's
CPU time (the sink's statement thread included) per phase, and CPU per row for ``steady``. Run it with the tree to
measure first on ``PYTHONPATH`` and as the working directory:

    cd TREE && PYTHONPATH=TREE /work/wt-tabrec/.venv/bin/python /work/wt-tabrec/scripts/bench_table_record.py \
        [--kinds sqlite,postgresql] [--tables 200] [--writes 20] [--rows 1000]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from cdc.config import SinkConfig
from cdc.events import ColumnSchema, OpType, RowChange, TableName, TableSchema
from playground.servers import PostgresServer
from sinks.factory import open_sink


def _schema(name: str) -> TableSchema:
    return TableSchema(TableName("public", name), (ColumnSchema("id", 23, "int4", nullable=False, is_key=True),
                                                  ColumnSchema("v", 25, "text"), ColumnSchema("n", 23, "int4")),
                       ("id",))


def _phase(out: dict[str, float], name: str, fn: object) -> None:
    c0, w0 = time.process_time(), time.monotonic()
    fn()  # type: ignore[operator]
    out[f"{name}_cpu_ms"] = round((time.process_time() - c0) * 1000, 1)
    out[f"{name}_wall_ms"] = round((time.monotonic() - w0) * 1000, 1)


def one_pass(uri: str, tables: int, writes: int, rows: int) -> dict[str, float]:
    out: dict[str, float] = {}
    schemas = [_schema(f"t{i}") for i in range(tables)]
    ts = iter(range(1000, 10**9, 10))
    holder: dict[str, object] = {}

    def open_() -> None:
        s = open_sink(uri, SinkConfig())
        s.check()
        s.open_position("bench", 0, 500)
        holder["sink"] = s

    def one_each() -> None:
        t = next(ts)
        holder["sink"].write([RowChange(OpType.INSERT, s, t, values={"id": 1, "v": "x", "n": 1})  # type: ignore[attr-defined]
                              for s in schemas])

    def restart() -> None:
        holder["sink"].close()  # type: ignore[attr-defined]
        open_()
        one_each()

    def steady() -> None:
        s = schemas[0]
        for w in range(writes):
            t = next(ts)
            holder["sink"].write([RowChange(OpType.INSERT, s, t, values={"id": i, "v": f"v{w}", "n": w})  # type: ignore[attr-defined]
                                  for i in range(rows)])

    _phase(out, "open", open_)
    _phase(out, "first", one_each)
    _phase(out, "restart", restart)
    _phase(out, "steady", steady)
    out["steady_cpu_us_per_row"] = round(out["steady_cpu_ms"] * 1000 / (writes * rows), 2)
    holder["sink"].close()  # type: ignore[attr-defined]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kinds", default="sqlite,postgresql")
    ap.add_argument("--tables", type=int, default=200)
    ap.add_argument("--writes", type=int, default=20)
    ap.add_argument("--rows", type=int, default=1000)
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="tidewater-table-record-"))
    pg = PostgresServer(base / "pg").start() if "postgresql" in args.kinds else None
    try:
        for n, kind in enumerate(args.kinds.split(",")):
            if kind == "sqlite":
                uri = f"sqlite:///{base}/t{n}.db"
            else:
                assert pg is not None
                pg.create_database(f"t{n}")
                uri = pg.uri(f"t{n}")
            print(json.dumps({"kind": kind, **one_pass(uri, args.tables, args.writes, args.rows)}), flush=True)
    finally:
        if pg is not None:
            pg.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
