"""The SQL sink's per-row rendering alone, both implementations (sinks.sql.dialect.rowtext), thread CPU per row.

For 1,000-row groups of the bench_hotpath table ``t (id int, a text, b int, c numeric, d timestamptz)`` as the
mounter makes them (typed values and their upstream text), times: the MySQL parameter row function of the
INSERT plan (``binding.row_function`` with text paths: numeric check, timestamptz from its text), the MySQL
literal statements (``mysql_statements``) and PostgreSQL's COPY text (``copy_text``), each in Python and in C.

    PYTHONPATH=$PWD .venv/bin/python scripts/bench_rowtext.py [--repeat 200]
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import time
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pymysql  # noqa: E402

from cdc.events import ColumnSchema  # noqa: E402
from sinks.sql.dialect import rowtext  # noqa: E402
from sinks.sql.dialect.values import converter, mysql_literal_function  # noqa: E402
from sinks.sql.target.binding import row_function  # noqa: E402

COLUMNS = [("id", "int4"), ("a", "text"), ("b", "int4"), ("c", "numeric"), ("d", "timestamptz")]


def per_row(fn: Callable[[], Any], rows: int, repeat: int) -> float:
    c0 = time.thread_time()
    for _ in range(repeat):
        fn()
    return 1e6 * (time.thread_time() - c0) / repeat / rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=200)
    args = ap.parse_args()
    native = rowtext.native()
    if native is None:
        raise SystemExit("the C row renderer is not available here (see the log)")
    n = 1000
    rows = [(i, "5d41402abc4b2a76b9719d911017c592", i, Decimal(f"{i}.33"),
             dt.datetime(2026, 11, 22, 1, 2, 3, 500000, tzinfo=dt.UTC)) for i in range(n)]
    texts = [(str(i), "5d41402abc4b2a76b9719d911017c592", str(i), f"{i}.33", "2026-11-22 01:02:03.5+00")
             for i in range(n)]
    convs = {i: c for i, (name, typ) in enumerate(COLUMNS)
             if (c := converter(ColumnSchema(name, 0, typ), "mysql", table="t")) is not None}
    conn = SimpleNamespace(server_status=0, escape=lambda v: pymysql.converters.escape_item(v, "utf8mb4"))
    lit = mysql_literal_function(conn)
    head = "INSERT INTO `t` (`id`, `a`, `b`, `c`, `d`) VALUES "
    py_fn = _python_function(convs)
    c_fn = native.row_converter(len(COLUMNS), convs, True, py_fn)
    for impl in (rowtext.PYTHON, native, rowtext.PYTHON, native):
        fn = c_fn if impl is native else py_fn
        params = list(map(fn, rows, texts))
        conv_us = per_row(lambda fn=fn: list(map(fn, rows, texts)), n, args.repeat)
        stmt_us = per_row(lambda impl=impl, params=params: impl.mysql_statements(params, head, "", 1_000_000, lit),
                          n, args.repeat)
        copy_us = per_row(lambda impl=impl: impl.copy_text(texts), n, args.repeat)
        print(f"{impl.name:>6}: MySQL parameter rows {conv_us:.2f} us/row, MySQL literal statements {stmt_us:.2f} "
              f"us/row, COPY text {copy_us:.2f} us/row", flush=True)


def _python_function(convs: dict[int, Any]) -> Callable[..., Any]:
    """binding.row_function's generated Python function, whatever the environment chooses."""
    import os

    old = os.environ.get("TIDEWATER_ROWTEXT")
    os.environ["TIDEWATER_ROWTEXT"] = "python"
    try:
        fn = row_function(len(COLUMNS), convs, with_text=True)
    finally:
        if old is None:
            del os.environ["TIDEWATER_ROWTEXT"]
        else:
            os.environ["TIDEWATER_ROWTEXT"] = old
    assert fn is not None
    return fn  # type: ignore[no-any-return]


if __name__ == "__main__":
    main()
