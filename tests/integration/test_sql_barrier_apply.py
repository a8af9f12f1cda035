"""``[consistency] mode = "snapshot"`` in SQLite, MariaDB and PostgreSQL targets (sinks.sql.ops.barrier): spans stage
their transactions (exactly once, invisible), one coordinator makes each barrier visible in one transaction with its
syncpoint row; a coordinator that dies or fails mid-apply leaves the previous barrier, and the next one completes it.

The workload is the bank transfer of issue 25: accounts in three tables, one per span; each upstream transaction moves
money between accounts of two spans, so each span stages half of it."""

from __future__ import annotations

import dataclasses
import os
import pickle
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from cdc.config import SinkConfig
from cdc.errors import LeaseLost, SinkError, SinkUnavailable
from cdc.events import ColumnSchema, DdlChange, DdlEvent, DdlKind, OpType, RowChange, TableName, TableSchema
from cdc.model import ChangefeedInfo, SpanInfo
from playground.compare import sqlalchemy_url
from sinks.factory import open_sink
from sinks.sql.sink import SQLSink
from spark_jobs.verify import VerifyJob, wait_for_barrier

pytestmark = pytest.mark.integration

SPANS = 3
ACCOUNTS = 10  # per table
START = 1000  # each account's balance
TOTAL = SPANS * ACCOUNTS * START
ORIGIN = 5


def schema(span: int) -> TableSchema:
    return TableSchema(TableName("public", f"acct{span}"),
                       (ColumnSchema("id", 23, "int4", nullable=False, is_key=True),
                        ColumnSchema("balance", 20, "int8", nullable=False)), ("id",))


SCHEMAS = [schema(i) for i in range(SPANS)]


@dataclass
class Target:
    kind: str
    uri: str

    def sink(self) -> SQLSink:
        s = open_sink(self.uri, SinkConfig())
        assert isinstance(s, SQLSink)
        s.check()
        return s

    def query(self, sql: str) -> list[tuple[Any, ...]]:
        engine = sa.create_engine(sqlalchemy_url(self.uri))
        try:
            with engine.connect() as conn:
                return [tuple(r) for r in conn.exec_driver_sql(sql)]
        finally:
            engine.dispose()

    def own(self, table: str) -> str:
        return f"tidewater.{table}" if self.kind == "postgresql" else table

    def table(self, span: int) -> str:
        return f"public.acct{span}" if self.kind == "postgresql" else f"acct{span}"

    def balances(self) -> dict[tuple[int, int], int]:
        out: dict[tuple[int, int], int] = {}
        for span in range(SPANS):
            try:
                rows = self.query(f"SELECT id, balance FROM {self.table(span)}")
            except sa.exc.DBAPIError:
                rows = []  # not created yet: nothing applied
            out.update({(span, int(i)): int(b) for i, b in rows})
        return out

    def syncpoints(self) -> list[int]:
        return [int(r[0]) for r in self.query(
            f"SELECT barrier_ts FROM {self.own('tidewater_syncpoint')} WHERE changefeed = 'cf' ORDER BY barrier_ts")]

    def staged(self) -> list[tuple[int, int]]:
        return sorted((int(r[0]), int(r[1])) for r in self.query(
            f"SELECT commit_ts, span FROM {self.own('tidewater_stage')} WHERE changefeed = 'cf'"))


@pytest.fixture(params=["sqlite", "mariadb", "postgresql"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Target]:
    if request.param == "sqlite":
        yield Target("sqlite", f"sqlite:///{tmp_path / 'target.db'}")
    elif request.param == "mariadb":
        server = request.getfixturevalue("mariadb_server")
        yield Target("mariadb", server.uri(request.getfixturevalue("mariadb_database")))
    else:
        server = request.getfixturevalue("pg_server")
        db = request.getfixturevalue("pg_database")
        yield Target("postgresql", server.uri(db))
        server.execute("DROP SCHEMA IF EXISTS tidewater CASCADE", db=db)


class Bank:
    """The upstream: balances after each commit, and each span's share of each transaction."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.balance = {(s, i): START for s in range(SPANS) for i in range(ACCOUNTS)}
        self.ts = 100
        self.history: list[tuple[int, dict[tuple[int, int], int]]] = []  # (commit Ts, balances after it)
        self.txns: list[list[list[RowChange]]] = [[] for _ in range(SPANS)]  # per span: its transactions

    def opening(self) -> None:
        """One upstream transaction inserting every account (each span stages its table's part)."""
        self.ts += 10
        for s in range(SPANS):
            self.txns[s].append([RowChange(OpType.INSERT, SCHEMAS[s], self.ts, float(self.ts),
                                           values={"id": i, "balance": START}) for i in range(ACCOUNTS)])
        self.history.append((self.ts, dict(self.balance)))

    def transfer(self) -> None:
        self.ts += 10
        a, b = self.rng.sample(range(SPANS), 2)
        src, dst = (a, self.rng.randrange(ACCOUNTS)), (b, self.rng.randrange(ACCOUNTS))
        amount = self.rng.randrange(1, 50)
        self.balance[src] -= amount
        self.balance[dst] += amount
        for (s, i) in (src, dst):
            self.txns[s].append([RowChange(OpType.UPDATE, SCHEMAS[s], self.ts, float(self.ts),
                                           values={"id": i, "balance": self.balance[(s, i)]})])
        self.history.append((self.ts, dict(self.balance)))

    def at(self, barrier: int) -> dict[tuple[int, int], int]:
        """The upstream state at ``barrier`` (the last commit at or below it)."""
        state: dict[tuple[int, int], int] = {}
        for ts, balances in self.history:
            if ts <= barrier:
                state = balances
        return state

    def up_to(self, span: int, lo: int, hi: int) -> list[RowChange]:
        return [ch for t in self.txns[span] if lo < t[0].commit_ts <= hi for ch in t]


def stage_all(target: Target, bank: Bank, lo: int, hi: int) -> None:
    for span in range(SPANS):
        sink = target.sink()
        sink.stage_barriers()
        sink.open_position("cf", span, origin=ORIGIN)
        sink.write(bank.up_to(span, lo, hi))
        sink.close()


def test_a_barrier_becomes_visible_at_once(target: Target) -> None:
    bank = Bank(1)
    bank.opening()
    for _ in range(30):
        bank.transfer()
    mid = bank.history[15][0]
    stage_all(target, bank, 0, mid)
    assert target.balances() == {}  # staged: nothing visible
    coordinator = target.sink()
    assert coordinator.applied_barrier("cf", ORIGIN) == 0
    done = coordinator.apply_barrier("cf", ORIGIN, mid, float(mid), history=True)
    assert (done.barrier_ts, done.changes) == (mid, 3 * ACCOUNTS + 2 * 15)
    assert target.balances() == bank.at(mid)  # row by row: the upstream state at the barrier
    assert sum(target.balances().values()) == TOTAL
    assert target.syncpoints() == [mid]
    assert target.staged() == []
    # the rest: staged by every span, the later barrier applies it; a barrier applied already does nothing
    end = bank.ts
    stage_all(target, bank, mid, end)
    assert target.balances() == bank.at(mid)
    assert coordinator.apply_barrier("cf", ORIGIN, mid, float(mid), history=True).changes == 0
    coordinator.apply_barrier("cf", ORIGIN, end, float(end), history=True)
    coordinator.close()
    assert target.balances() == bank.at(end)
    assert target.syncpoints() == [mid, end]
    assert target.staged() == []


def test_staging_is_exactly_once(target: Target) -> None:
    """A span that restarts from an older checkpoint stages nothing twice (its position moved with the pieces)."""
    bank = Bank(2)
    bank.opening()
    for _ in range(10):
        bank.transfer()
    stage_all(target, bank, 0, bank.ts)
    staged = target.staged()
    stage_all(target, bank, 0, bank.ts)  # replay from the start
    assert target.staged() == staged
    sink = target.sink()
    sink.apply_barrier("cf", ORIGIN, bank.ts, float(bank.ts), history=False)
    sink.close()
    assert target.balances() == bank.at(bank.ts)


def test_a_failed_apply_leaves_the_previous_barrier(target: Target) -> None:
    bank = Bank(3)
    bank.opening()
    for _ in range(20):
        bank.transfer()
    first = bank.history[5][0]
    stage_all(target, bank, 0, bank.ts)
    coordinator = target.sink()
    coordinator.apply_barrier("cf", ORIGIN, first, float(first), history=False)

    def refuse() -> None:
        raise LeaseLost("the owner lost its term")

    with pytest.raises(LeaseLost):
        coordinator.apply_barrier("cf", ORIGIN, bank.ts, float(bank.ts), history=False, fence=refuse)
    assert target.balances() == bank.at(first)
    assert target.syncpoints() == [first]
    assert coordinator.applied_barrier("cf", ORIGIN) == first
    other = target.sink()  # the next coordinator finishes it
    other.apply_barrier("cf", ORIGIN, bank.ts, float(bank.ts), history=False)
    assert target.balances() == bank.at(bank.ts)
    assert target.syncpoints() == [bank.ts]  # history = false: the latest only
    # the first coordinator's view of the head is stale: it is refused, never applies twice
    with pytest.raises(SinkUnavailable):
        coordinator.apply_barrier("cf", ORIGIN, bank.ts + 5, float(bank.ts), history=False)
    assert coordinator.applied_barrier("cf", ORIGIN) == bank.ts
    coordinator.close()
    other.close()
    assert target.balances() == bank.at(bank.ts)


def test_a_foreign_staged_row_is_refused(target: Target) -> None:
    bank = Bank(4)
    bank.opening()
    stage_all(target, bank, 0, bank.ts)
    evil = pickle.dumps([os.system])  # names posix.system
    engine = sa.create_engine(sqlalchemy_url(target.uri))
    p = "?" if target.kind == "sqlite" else "%s"
    with engine.begin() as conn:
        conn.exec_driver_sql(f"INSERT INTO {target.own('tidewater_stage')} (changefeed, commit_ts, span, seq, "
                             f"commit_time, payload) VALUES ({p}, {p}, {p}, {p}, {p}, {p})",
                             ("cf", bank.ts, 7, 0, 0.0, evil))
    engine.dispose()
    sink = target.sink()
    with pytest.raises(SinkError, match="not a row change value"):
        sink.apply_barrier("cf", ORIGIN, bank.ts, float(bank.ts), history=False)
    sink.close()
    assert target.balances() == {}


_KILLED_APPLY = """
import sys, time
from cdc.config import SinkConfig
from sinks.factory import open_sink
uri, barrier = sys.argv[1], int(sys.argv[2])
sink = open_sink(uri, SinkConfig())
def hang():
    print("applied, not committed", flush=True)
    time.sleep(600)
sink.apply_barrier("cf", 5, barrier, float(barrier), history=True, fence=hang)
"""


def test_a_coordinator_killed_mid_apply(target: Target, tmp_path: Path) -> None:
    """SIGKILL of a coordinator process whose barrier's rows are all written but not committed: the target shows the
    previous barrier (readers never saw a part of the new one) and the next coordinator applies it whole."""
    bank = Bank(5)
    bank.opening()
    for _ in range(40):
        bank.transfer()
    first = bank.history[10][0]
    stage_all(target, bank, 0, bank.ts)
    coordinator = target.sink()
    coordinator.apply_barrier("cf", ORIGIN, first, float(first), history=True)
    coordinator.close()
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_APPLY, target.uri, str(bank.ts)], env=env,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "applied, not committed"
        if target.kind != "sqlite":  # (SQLite: the writer holds the file's lock; a reader would wait or fail)
            assert target.balances() == bank.at(first)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    assert target.balances() == bank.at(first)
    assert target.syncpoints() == [first]
    deadline = time.monotonic() + 30
    nxt = target.sink()
    while True:  # (MariaDB/PostgreSQL end the killed client's session, and free its row lock, on its EOF)
        try:
            nxt.apply_barrier("cf", ORIGIN, bank.ts, float(bank.ts), history=True)
            break
        except SinkUnavailable:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    nxt.close()
    assert target.balances() == bank.at(bank.ts)
    assert target.syncpoints() == [first, bank.ts]
    assert target.staged() == []


NEW = TableSchema(TableName("public", "opened"), (ColumnSchema("id", 23, "int4", nullable=False, is_key=True),
                                                  ColumnSchema("note", 25, "text")), ("id",))


def test_a_new_table_mid_transaction_and_a_refused_schema_change(target: Target) -> None:
    """A CREATE TABLE changes no staged row's shape: applied at once, and the rest of its transaction (split at it)
    is staged after the first part and applied with it in one barrier. An ADD COLUMN before the target shows the
    barrier just before its transaction would reach the real table before staged rows of the old shape: refused,
    loudly (the span waits for that barrier first: tests/integration/test_sql_barrier_ddl.py)."""
    bank = Bank(6)
    bank.opening()
    stage_all(target, bank, 0, bank.ts)
    ts = bank.ts + 10
    sink = target.sink()
    sink.stage_barriers(ORIGIN)
    sink.open_position("cf", 0, origin=ORIGIN)
    before = [RowChange(OpType.UPDATE, SCHEMAS[0], ts, float(ts), values={"id": 1, "balance": 900})]
    sink.write(before)  # the transaction's rows before its DDL
    create = DdlEvent(ts, float(ts), NEW.name, (DdlChange(DdlKind.CREATE_TABLE),), None, NEW,
                      query="CREATE TABLE opened (id int PRIMARY KEY, note text)")
    assert sink.apply_ddl(create)
    after = [RowChange(OpType.INSERT, NEW, ts, float(ts), values={"id": i, "note": f"n{i}"}) for i in range(3)]
    assert sink.write(after) == 3  # the rest of the same transaction, staged after its first part
    assert sink.write(after) == 0  # (a replay: skipped)
    add = DdlEvent(ts + 10, float(ts + 10), SCHEMAS[0].name, (DdlChange(DdlKind.ADD_COLUMN, "memo"),), SCHEMAS[0],
                   SCHEMAS[0], query="ALTER TABLE acct0 ADD COLUMN memo text")
    with pytest.raises(SinkError, match=f"only when the target shows barrier {ts + 9}.* it shows 0"):
        sink.apply_ddl(add)
    sink.close()
    new = "public.opened" if target.kind == "postgresql" else "opened"
    assert target.query(f"SELECT count(*) FROM {new}") == [(0,)]  # the table exists, its rows wait for the barrier
    coordinator = target.sink()
    coordinator.apply_barrier("cf", ORIGIN, ts, float(ts), history=False)
    coordinator.close()
    assert sorted(target.query(f"SELECT id, note FROM {new}")) == [(i, f"n{i}") for i in range(3)]
    expected = bank.at(bank.ts)
    expected[(0, 1)] = 900
    assert target.balances() == expected
    assert target.staged() == []


def test_verify_waits_for_the_barrier_of_its_hold(target: Target) -> None:
    """``changefeed verify`` holds the spans at a point; in snapshot mode they have only *staged* up to it: the job
    compares once the target shows that barrier, and says so when it does not come."""
    bank = Bank(7)
    bank.opening()
    stage_all(target, bank, 0, bank.ts)
    info = ChangefeedInfo("cf", "postgresql://u@h/db", target.uri, {"consistency": {"mode": "snapshot"}}, ORIGIN,
                          0.0, 0.0, spans=tuple(SpanInfo(i, f"s{i}", f"p{i}", ORIGIN) for i in range(SPANS)))
    job = VerifyJob(upstream="postgresql://u@h/db", sink=target.uri, tables=(), changefeed="cf", hold_timeout=0.5)
    with pytest.raises(SinkUnavailable, match="not yet the held point"):
        wait_for_barrier(job, info, bank.ts)
    coordinator = target.sink()
    coordinator.apply_barrier("cf", ORIGIN, bank.ts, float(bank.ts), history=False)
    coordinator.close()
    wait_for_barrier(job, info, bank.ts)  # returns at once
    wait_for_barrier(job, dataclasses.replace(info, config={}), bank.ts + 100)  # the default mode: nothing to wait for
