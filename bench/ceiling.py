"""Write ceilings: the rows a phase produced, bulk loaded into the same target server the fastest
ordinary way, into an empty copy of the table Tidewater's sink created there.

* PostgreSQL: ``COPY ... FROM STDIN`` (psycopg2 ``copy_expert``), one transaction;
* MariaDB: ``LOAD DATA LOCAL INFILE`` (PyMySQL ``local_infile=True``, server ``local_infile=ON``), one
  transaction; multi-row ``INSERT`` (PyMySQL ``executemany``) if the server refuses local files;
* SQLite: ``executemany`` of one ``INSERT`` per table in one transaction (each table's rows parsed before its
  load, untimed).

The row images are exported from the upstream with ``COPY (SELECT ...) TO STDOUT`` (text format) before
the clock starts; creating and dropping the copies is not timed either. Only the load and its commit are.
"""

from __future__ import annotations

import contextlib
import os
import re
import sqlite3
import time
from pathlib import Path
from typing import Any

from bench.consumers import Around, Measurement, RunCpu
from bench.env import BenchEnv
from bench.procstat import cpu_seconds
from bench.workloads import CeilingSource
from playground.servers import PostgresServer

_UNESCAPE = {"\\": "\\", "t": "\t", "n": "\n", "r": "\r", "b": "\b", "f": "\f", "v": "\v"}
_ESCAPE_RE = re.compile(r"\\(.)")


def export_rows(upstream: PostgresServer, db: str, src: CeilingSource, path: Path) -> int:
    """Write the row images of ``src`` in COPY text format to ``path``; return how many rows."""
    cols = ", ".join(src.columns)
    where = f" WHERE {src.where}" if src.where else ""
    conn = upstream.connect(db)
    try:
        with conn.cursor() as cur, open(path, "w", encoding="utf-8") as f:
            cur.copy_expert(f"COPY (SELECT {cols} FROM {src.table}{where}) TO STDOUT", f)
    finally:
        conn.close()
    with open(path, "rb") as f:
        return sum(1 for _ in f)


def _parse_copy_text(path: Path) -> list[tuple[Any, ...]]:
    def field(v: str) -> str | None:
        if v == "\\N":
            return None
        return _ESCAPE_RE.sub(lambda m: _UNESCAPE.get(m.group(1), m.group(1)), v) if "\\" in v else v

    with open(path, encoding="utf-8") as f:
        return [tuple(field(v) for v in line.rstrip("\n").split("\t")) for line in f]


def _clone_ddl(env: BenchEnv, kind: str, scenario: str, conn: Any, src: CeilingSource, name: str) -> str:
    if kind in src.ddl:
        return src.ddl[kind].format(name=name)
    if kind == "postgresql":
        return f"CREATE TABLE {name} (LIKE public.{src.table} INCLUDING ALL)"
    if kind == "mariadb":
        return f"CREATE TABLE `{name}` LIKE `{src.table}`"
    if kind == "sqlite":
        row = conn.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", (src.table,)).fetchone()
        if row is None:
            raise RuntimeError(f"table {src.table} does not exist in the SQLite target (did Tidewater create it?)")
        _head, paren, rest = str(row[0]).partition("(")
        return f'CREATE TABLE "{name}" {paren}{rest}'
    raise ValueError(kind)


def measure_ceiling(env: BenchEnv, kind: str, scenario: str, sources: list[tuple[CeilingSource, Path, int]]
                    ) -> Measurement:
    """Bulk load every exported file of ``sources`` ((source, file, rows)) into copies of its table on
    the ``kind`` target of ``scenario``; the measurement covers the loads and their commit."""
    rows = sum(n for _, _, n in sources)
    m = Measurement("write ceiling", kind, rows)
    names = [(src, path, f"ceil_{src.table}") for src, path, _ in sources]
    conn = env.target_connection(kind, scenario, **({"local_infile": True} if kind == "mariadb" else {}))
    try:
        _create_copies(env, kind, scenario, conn, names)
        if kind == "sqlite":  # rows parsed one table at a time, untimed (all at once would not fit in memory)
            m.seconds, m.cpu_s = _load_sqlite(conn, names)
            m.note = "executemany"
        else:
            cpu0 = cpu_seconds_self()
            servers = RunCpu(Around(target=env.target_server_pid(kind)))
            t0 = time.monotonic()
            m.note = _load(kind, conn, names)
            m.seconds = time.monotonic() - t0
            m.cpu_s = cpu_seconds_self() - cpu0
            servers.fill(m)
    except Exception as exc:  # noqa: BLE001 - reported in the table
        m.error = f"{type(exc).__name__}: {exc}"
    finally:
        with contextlib.suppress(Exception):
            _drop_copies(kind, conn, names)
        conn.close()
    return m


def cpu_seconds_self() -> float:
    """CPU seconds of this process (the loading client)."""
    return cpu_seconds(os.getpid()) or 0.0


def _create_copies(env: BenchEnv, kind: str, scenario: str, conn: Any, names: list[tuple[CeilingSource, Path, str]]
                   ) -> None:
    _drop_copies(kind, conn, names)
    if kind == "sqlite":
        conn.execute("BEGIN")
        for src, _, name in names:
            conn.execute(_clone_ddl(env, kind, scenario, conn, src, name))
        conn.execute("COMMIT")
        return
    with conn.cursor() as cur:
        for src, _, name in names:
            cur.execute(_clone_ddl(env, kind, scenario, conn, src, name))
    conn.commit()


def _drop_copies(kind: str, conn: Any, names: list[tuple[CeilingSource, Path, str]]) -> None:
    if kind == "sqlite":
        for _, _, name in names:
            conn.execute(f'DROP TABLE IF EXISTS "{name}"')
        return
    q = "`" if kind == "mariadb" else '"'
    with conn.cursor() as cur:
        for _, _, name in names:
            cur.execute(f"DROP TABLE IF EXISTS {q}{name}{q}")
    conn.commit()


def _load_sqlite(conn: sqlite3.Connection, names: list[tuple[CeilingSource, Path, str]]) -> tuple[float, float]:
    """One ``executemany`` per table in one transaction; (seconds, CPU seconds) of the loads and the commit,
    without parsing the exported files."""
    seconds = cpu = 0.0

    def timed(fn: Any, *args: Any) -> None:
        nonlocal seconds, cpu
        c0, t0 = cpu_seconds_self(), time.monotonic()
        fn(*args)
        seconds += time.monotonic() - t0
        cpu += cpu_seconds_self() - c0

    timed(conn.execute, "BEGIN")
    for src, path, name in names:
        rows = _parse_copy_text(path)
        sql = f'INSERT INTO "{name}" ({", ".join(src.columns)}) VALUES ({", ".join("?" * len(src.columns))})'
        timed(conn.executemany, sql, rows)
        del rows
    timed(conn.execute, "COMMIT")
    return seconds, cpu


def _load(kind: str, conn: Any, names: list[tuple[CeilingSource, Path, str]]) -> str:
    if kind == "postgresql":
        conn.autocommit = False
        with conn.cursor() as cur:
            for src, path, name in names:
                with open(path, encoding="utf-8") as f:
                    cur.copy_expert(f"COPY {name} ({', '.join(src.columns)}) FROM STDIN", f)
        conn.commit()
        return "COPY"
    if kind == "mariadb":
        try:
            with conn.cursor() as cur:
                for src, path, name in names:
                    cur.execute(f"LOAD DATA LOCAL INFILE %s INTO TABLE `{name}` CHARACTER SET utf8mb4 "
                                f"({', '.join(f'`{c}`' for c in src.columns)})", (str(path),))
            conn.commit()
            return "LOAD DATA LOCAL INFILE"
        except Exception as exc:  # noqa: BLE001 - e.g. local_infile disabled: fall back to INSERT
            conn.rollback()
            if "local" not in str(exc).lower() and "1148" not in str(exc):
                raise
        with conn.cursor() as cur:
            for src, path, name in names:
                rows = _parse_copy_text(path)
                sql = (f"INSERT INTO `{name}` ({', '.join(f'`{c}`' for c in src.columns)}) VALUES "
                       f"({', '.join(['%s'] * len(src.columns))})")
                for i in range(0, len(rows), 1000):
                    cur.executemany(sql, rows[i : i + 1000])
        conn.commit()
        return "multi-row INSERT (1000 rows)"
    raise ValueError(kind)
