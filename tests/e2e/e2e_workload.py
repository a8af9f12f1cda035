"""Write workloads and checks shared by the end-to-end tests."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from playground.cluster import CdcServer, current_lsn
from playground.compare import compare_tables
from playground.compare_schema import assert_schemas_equal

# Faster retries than production (10 s .. 10 min) so that recovery tests finish quickly.
TEST_SERVER_CONFIG = "error-backoff-min = 1.0\nerror-backoff-max = 5.0\n"
# A short etcd session for tests that SIGKILL a capture: the restarted one (or the others) takes its spans over
# once the dead one's lease expires, after session-ttl (10 s by default)
FAST_LEASE = "session-ttl = 3\netcd-timeout = 1.0\nowner-tick = 0.2\n"


def server_config(tmp_path: Path, extra: str = "", *, base: str = TEST_SERVER_CONFIG,
                  name: str = "server.toml") -> list[str]:
    """`--config` arguments for a test `cdc server`: ``base`` (the tests' short backoff) + ``extra``, written
    to ``tmp_path / name``."""
    path = tmp_path / name
    path.write_text(base + extra)
    return ["--config", str(path)]


SCHEMA = """
CREATE TABLE accounts (id int PRIMARY KEY, owner text NOT NULL, balance numeric(14,2), active boolean,
                       opened timestamptz, note varchar(200), data jsonb, tags int[]);
CREATE TABLE "Ledger Entries" ("EntryId" bigint PRIMARY KEY, account int, amount numeric, memo text, "Ünïcode" text);
CREATE TABLE events (id bigserial PRIMARY KEY, kind text, payload bytea, at timestamp, day date, t time,
                     uid uuid, f4 real, f8 double precision, small smallint);
"""
TABLES = ["public.accounts", "public.Ledger Entries", "public.events"]


def run_sql(conn: Any, *statements: str) -> None:
    """Run ``statements`` in order on ``conn`` (autocommit: each its own transaction, unless one is BEGIN)."""
    with conn.cursor() as cur:
        for stmt in statements:
            cur.execute(stmt)


def run_on_target(sink_uri: str, *statements: str) -> None:
    """Run ``statements`` on an SQL target (any kind: SQLAlchemy), in one transaction."""
    import sqlalchemy as sa

    from playground.compare import sqlalchemy_url

    engine = sa.create_engine(sqlalchemy_url(sink_uri))
    try:
        with engine.begin() as conn:
            for stmt in statements:
                conn.exec_driver_sql(stmt)
    finally:
        engine.dispose()


def mixed_workload(conn: Any, txns: int, seed: int = 7, start: int = 0) -> None:
    """Many small transactions of inserts, updates and deletes over several tables."""
    rnd = random.Random(seed)
    conn.autocommit = False
    cur = conn.cursor()
    for t in range(start, start + txns):
        for i in range(t * 5, t * 5 + 5):
            cur.execute(
                "INSERT INTO accounts VALUES (%s,%s,%s,%s,now(),%s,%s,%s) ON CONFLICT (id) DO UPDATE SET balance = 0",
                (
                    i,
                    f"owner {i}",
                    rnd.randint(-(10**6), 10**6) / 100,
                    rnd.random() < 0.5,
                    f"note {i}",
                    f'{{"k": {i}, "s": "v{i}"}}',
                    [i, i + 1],
                ),
            )
            cur.execute(
                'INSERT INTO "Ledger Entries" VALUES (%s,%s,%s,%s,%s)',
                (t * 1000 + i, i, rnd.randint(1, 10**7) / 1000, "memo", "ä€𝄞"),
            )
        cur.execute(
            "INSERT INTO events (kind, payload, at, day, t, uid, f4, f8, small) VALUES "
            "(%s, %s, now()::timestamp, current_date, '12:34:56.789', gen_random_uuid(), 1.5, %s, %s)",
            (f"kind{t}", bytes(range(t % 256)), rnd.random(), t % 30000),
        )
        if t % 3 == 0 and t > 2:
            cur.execute(
                "UPDATE accounts SET balance = balance * 2, active = NOT active WHERE id BETWEEN %s AND %s",
                ((t - 2) * 5, (t - 2) * 5 + 2),
            )
        if t % 4 == 0 and t > 4:
            cur.execute("DELETE FROM accounts WHERE id = %s", ((t - 4) * 5 + 1,))
            cur.execute('DELETE FROM "Ledger Entries" WHERE "EntryId" = %s', ((t - 4) * 1000 + (t - 4) * 5,))
        if t % 5 == 0:
            cur.execute("SAVEPOINT sp")
            cur.execute("INSERT INTO accounts VALUES (%s, 'rolled back')", (10**8 + t,))
            cur.execute("ROLLBACK TO SAVEPOINT sp")
        conn.commit()
    conn.autocommit = True


def big_transaction(conn: Any, rows: int, base: int = 10**7) -> None:
    """One transaction much larger than logical_decoding_work_mem (64kB in tests): streamed."""
    conn.autocommit = False
    with conn.cursor() as cur:
        cur.execute(
            'INSERT INTO "Ledger Entries" SELECT g, g %% 100, g / 7.0, repeat(md5(g::text), 4), NULL '
            "FROM generate_series(%s, %s) g",
            (base, base + rows - 1),
        )
        cur.execute("UPDATE accounts SET note = 'touched by big txn' WHERE id % 7 = 0")
    conn.commit()
    conn.autocommit = True


def aborted_big_transaction(conn: Any, rows: int) -> None:
    """A streamed transaction that rolls back, with a savepoint rolled back inside it too."""
    conn.autocommit = False
    with conn.cursor() as cur:
        cur.execute(
            "INSERT INTO \"Ledger Entries\" SELECT g, 0, 0, repeat('a', 100), NULL "
            "FROM generate_series(%s, %s) g",
            (5 * 10**8, 5 * 10**8 + rows),
        )
        cur.execute("SAVEPOINT s")
        cur.execute("DELETE FROM accounts")
        cur.execute("ROLLBACK TO SAVEPOINT s")
    conn.rollback()
    conn.autocommit = True


def streamed_with_rolled_back_savepoint(conn: Any, rows: int) -> None:
    """A committed streamed transaction whose middle savepoint (also big) is rolled back."""
    conn.autocommit = False
    with conn.cursor() as cur:
        cur.execute(
            "INSERT INTO \"Ledger Entries\" SELECT g, 1, 1, 'kept', NULL FROM generate_series(%s, %s) g",
            (6 * 10**8, 6 * 10**8 + rows),
        )
        cur.execute("SAVEPOINT s")
        cur.execute(
            "INSERT INTO \"Ledger Entries\" SELECT g, 2, 2, 'dropped', NULL FROM generate_series(%s, %s) g",
            (7 * 10**8, 7 * 10**8 + rows),
        )
        cur.execute("UPDATE \"Ledger Entries\" SET memo = 'dropped too' WHERE account = 1")
        cur.execute("ROLLBACK TO SAVEPOINT s")
        cur.execute("INSERT INTO \"Ledger Entries\" VALUES (%s, 3, 3, 'after rollback', NULL)", (8 * 10**8,))
    conn.commit()
    conn.autocommit = True


def assert_converged(
    cdc: CdcServer, cf: str, conn: Any, sink_uri: str, tables: list[str] = TABLES, timeout: float = 180.0,
    *, schemas: bool = False,
) -> dict[str, Any]:
    """Wait for the checkpoint to pass the upstream's current WAL position, then compare row by row; with
    ``schemas`` (every DDL test) also each downstream table's shape with the upstream's current schema as the
    sink maps it (columns, types, nullability, no defaults, key: playground/compare_schema.py)."""
    info = cdc.wait_checkpoint(cf, current_lsn(conn), timeout=timeout)
    diffs = compare_tables(conn, tables, sink_uri)
    bad = [d for d in diffs if not d.equal]
    assert not bad, f"downstream differs from upstream: {bad}"
    assert all(d.source_rows > 0 for d in diffs if d.table != "public.events" or d.source_rows), diffs
    if schemas:
        assert_schemas_equal(conn, tables, sink_uri)
    return info


def wait_for(cdc: CdcServer, cf: str, pred: Any, what: str, timeout: float = 60.0) -> dict[str, Any]:
    """Poll the changefeed until ``pred(query)`` holds; fail with the last query and the server log."""
    import time

    deadline = time.monotonic() + timeout
    q: dict[str, Any] = {}
    while time.monotonic() < deadline:
        q = cdc.changefeed(cf)
        if pred(q):
            return q
        time.sleep(0.2)
    raise AssertionError(f"changefeed {cf}: {what} not reached in {timeout}s: {q}\n{cdc.log_tail()}")


def wait_state(cdc: CdcServer, cf: str, state: str, timeout: float = 60.0) -> dict[str, Any]:
    return wait_for(cdc, cf, lambda q: q["state"] == state, f"state {state}", timeout)


def make_sink_uri(kind: str, request: Any, tmp_path: Path, pg_server: Any) -> str:
    """A fresh, empty target of the given kind: sqlite file, MariaDB database or PostgreSQL database."""
    import uuid

    if kind == "sqlite":
        return f"sqlite:///{tmp_path / 'target.db'}"
    db = f"target_{uuid.uuid4().hex[:10]}"
    server = request.getfixturevalue("mariadb_server") if kind == "mariadb" else pg_server
    server.start()  # (a no-op unless an earlier test stopped the session's server)
    server.create_database(db)
    return str(server.uri(db))


class BackgroundWriter:
    """Calls ``step(conn, n)`` (n = transactions so far; it returns how many it committed) in a loop from a
    background thread on its own connection, ``pause`` seconds apart, until :meth:`finish` or the end of the
    ``with`` block. ``finish`` re-raises the thread's error; leaving the block closes the connection."""

    def __init__(self, conn: Any, step: Callable[[Any, int], int], start: int = 0, pause: float = 0.0) -> None:
        self.conn = conn
        self.txns = start
        self._step = step
        self._pause = pause
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            while not self.stop.is_set():
                self.txns += self._step(self.conn, self.txns)
                if self._pause:
                    time.sleep(self._pause)
        except BaseException as exc:  # noqa: BLE001 - re-raised by finish()
            self.error = exc

    def start(self) -> BackgroundWriter:
        self.thread.start()
        return self

    def __enter__(self) -> BackgroundWriter:
        return self.start()

    def finish(self) -> None:
        self.stop.set()
        self.thread.join(30)
        if self.error is not None:
            raise self.error

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(30)
        self.conn.close()


def mixed_steps(per_step: int) -> Callable[[Any, int], int]:
    """A :class:`BackgroundWriter` step: ``per_step`` transactions of :func:`mixed_workload`."""
    def step(conn: Any, n: int) -> int:
        mixed_workload(conn, per_step, seed=n, start=n)
        return per_step
    return step


TARGETS = ("sqlite", "mariadb", "postgresql")


def targets_in_make_test(*kept: str) -> list[Any]:
    """``sink_uri`` parameters for a test whose behaviour is not the target's (the processor's, the upstream's):
    the targets in ``kept`` run in ``make test``, the others are marked ``slow`` (``pytest -m slow`` runs them).
    Use with ``@pytest.mark.parametrize("sink_uri", targets_in_make_test("postgresql"), indirect=True)``."""
    return [t if t in kept else pytest.param(t, marks=pytest.mark.slow) for t in TARGETS]


def cdc_cli(url: str, *args: str) -> Any:
    """``cdc cli --server url ARGS`` (JSON output); fails the test unless it exits 0. Returns the parsed output."""
    proc = subprocess.run([sys.executable, "-m", "cli", "cli", "--server", url, *args], capture_output=True,
                          text=True, timeout=60, cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 0, proc
    return json.loads(proc.stdout)


def kafka_consumer(sink: str, target: str, upstream: str, until: int, *extra: str) -> tuple[dict[str, Any], str]:
    """``cdc cli kafka-consumer`` from the changefeed's own sink URI into ``target`` up to ``until``, with the
    upstream's schemas (and ``extra`` flags); fails the test unless it exits 0 having applied ``until``. Returns its
    JSON summary and its stderr."""
    out = subprocess.run(
        [sys.executable, "-m", "cli", "cli", "kafka-consumer", "--kafka-uri", sink, "--sink-uri", target,
         "--upstream", upstream, "--until-ts", str(until), "--timeout", "90", *extra],
        capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout)
    assert summary["applied_ts"] >= until, summary
    return summary, out.stderr
