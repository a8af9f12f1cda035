"""``[consistency] mode = "snapshot"`` with ``[sink] worker-count = 4`` (sinks.sql.ops.barrier ``Stager``, through
sinks.sql.ops.parallel): a span's write is staged by 4 workers, each in its own downstream transaction with its
transactions' applied rows; against real MariaDB and PostgreSQL targets (SQLite has one writer: worker-count is
ignored there). A crash between the workers' commits keeps the pieces of the transactions that were staged (the
reopen must not clear them) and the replay stages only the rest; a zombie writer racing its successor is refused; in
both cases the barrier applied afterwards leaves the real tables equal to the upstream row by row.

The workload is test_sql_barrier_apply's bank (accounts in three tables, one per span; every transfer moves money
between two spans)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from cdc.config import SinkConfig
from cdc.errors import LeaseLost, SinkUnavailable
from cdc.events import RowChange
from sinks.factory import open_sink
from sinks.sql.sink import SQLSink
from tests.integration.test_sql_barrier_apply import ORIGIN, SPANS, TOTAL, Bank
from tests.integration.test_sql_barrier_apply import Target as BankTarget
from tests.integration.test_sql_parallel_apply import lose_on_caller

pytestmark = pytest.mark.integration

WORKERS = 4


@dataclass
class Target(BankTarget):
    def sink(self, workers: int = WORKERS) -> SQLSink:
        s = open_sink(self.uri, SinkConfig(worker_count=workers))
        assert isinstance(s, SQLSink)
        s.check()
        return s

    def stager(self, span: int) -> SQLSink:
        """A span's staging sink with its position open."""
        s = self.sink()
        s.stage_barriers(ORIGIN)
        s.open_position("cf", span, origin=ORIGIN)
        return s

    def staged_of(self, span: int) -> list[tuple[int, int]]:
        """(commit Ts, seq) of the span's staged pieces."""
        return sorted((int(r[0]), int(r[1])) for r in self.query(
            f"SELECT commit_ts, seq FROM {self.own('tidewater_stage')} WHERE changefeed = 'cf' AND span = {span}"))

    def applied_rows(self, span: int) -> list[int]:
        return sorted(int(r[0]) for r in self.query(
            f"SELECT commit_ts FROM {self.own('tidewater_checkpoint_applied')} WHERE changefeed = 'cf' "
            f"AND span = {span}"))

    def position(self, span: int) -> int:
        return int(self.query(f"SELECT commit_ts FROM {self.own('tidewater_checkpoint')} WHERE changefeed = 'cf' "
                              f"AND span = {span}")[0][0])


@pytest.fixture(params=["mariadb", "postgresql"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Target]:
    if request.param == "mariadb":
        server = request.getfixturevalue("mariadb_server")
        yield Target("mariadb", server.uri(request.getfixturevalue("mariadb_database")))
    else:
        server = request.getfixturevalue("pg_server")
        db = request.getfixturevalue("pg_database")
        yield Target("postgresql", server.uri(db))
        server.execute("DROP SCHEMA IF EXISTS tidewater CASCADE", db=db)


def bank(seed: int, transfers: int = 40) -> Bank:
    b = Bank(seed)
    b.opening()
    for _ in range(transfers):
        b.transfer()
    return b


def commits(changes: list[RowChange]) -> list[int]:
    return sorted({ch.commit_ts for ch in changes})


def apply_and_check(target: Target, b: Bank) -> None:
    """One barrier at the bank's last commit: the real tables equal the upstream's row by row, nothing staged."""
    coordinator = target.sink()
    try:
        done = coordinator.apply_barrier("cf", ORIGIN, b.ts, float(b.ts), history=False)
    finally:
        coordinator.close()
    assert done.barrier_ts == b.ts
    assert target.balances() == b.at(b.ts)  # row by row
    assert sum(target.balances().values()) == TOTAL
    assert target.staged() == []


def test_a_write_is_staged_by_several_workers(target: Target) -> None:
    """Each span's write goes to 4 connections; its pieces are numbered per transaction from 0; the barrier applies
    them whole."""
    b = bank(1)
    for span in range(SPANS):
        sink = target.stager(span)
        try:
            changes = b.up_to(span, 0, b.ts)
            assert sink.write(changes) == len(changes)
            assert sink.parallel_writes == 1
        finally:
            sink.close()
        assert target.staged_of(span) == [(ts, 0) for ts in commits(changes)]  # one piece per (small) transaction
        assert target.position(span) == commits(changes)[-1]
        assert target.applied_rows(span) == []  # compacted by the position's move
    apply_and_check(target, b)


def test_a_crash_between_the_workers_keeps_the_staged_transactions(target: Target) -> None:
    """One worker's commit is refused (a crash between the workers' commits): the others' transactions are staged
    and recorded above the unmoved position; the reopen keeps their pieces (deleting them would lose them: the replay
    skips them) and the replay stages exactly the rest; the barrier then applies every transaction once."""
    b = bank(2)
    changes = b.up_to(0, 0, b.ts)
    calls: list[int] = []

    def refuse_one_worker() -> None:
        if threading.current_thread() is threading.main_thread():
            return
        calls.append(1)
        if len(calls) == 2:
            raise LeaseLost("fenced")

    sink = target.stager(0)
    with pytest.raises(LeaseLost):
        sink.write(changes, refuse_one_worker)
    sink.close()
    assert target.position(0) == 0
    recorded = target.applied_rows(0)
    assert 0 < len(recorded) < len(commits(changes))
    staged = target.staged_of(0)
    assert [ts for ts, _ in staged] == recorded  # pieces and applied rows committed together

    sink = target.stager(0)  # the restart: reopen, then the same write again
    try:
        assert target.staged_of(0) == staged  # kept: done transactions, the replay skips them
        rest = [ch for ch in changes if ch.commit_ts not in set(recorded)]
        assert sink.write(changes) == len(rest)
    finally:
        sink.close()
    assert target.staged_of(0) == [(ts, 0) for ts in commits(changes)]
    # the position moves to the replay's last transaction; done ones above it stay recorded (as with parallel apply)
    assert target.position(0) == commits(rest)[-1]
    assert target.applied_rows(0) == [ts for ts in recorded if ts > commits(rest)[-1]]
    for span in range(1, SPANS):
        sink = target.stager(span)
        sink.write(b.up_to(span, 0, b.ts))
        sink.close()
    apply_and_check(target, b)


def test_a_zombie_stager_stages_nothing_twice(target: Target) -> None:
    """Two writers of one span: the successor's workers staged a write (its position unmoved, as if it died right
    after), then the frozen one stages the same transactions, on one connection or on its workers: refused; after the successor moved the position,
    refused by the position check. The barrier applies each transaction once."""
    b = bank(3)
    half = b.history[20][0]
    first, later = b.up_to(0, 0, half), b.up_to(0, half, b.ts)
    old, new = target.stager(0), target.stager(0)
    try:
        with pytest.raises(LeaseLost):
            new.write(first, lose_on_caller)  # every worker committed, the position did not move
        assert new.parallel_writes == 1
        opening = [ch for ch in first if ch.commit_ts == first[0].commit_ts]
        with pytest.raises(SinkUnavailable, match="staged in .* already"):  # one transaction: the one-connection
            old.write(opening)  # path, refused by the staged piece's key
        with pytest.raises(SinkUnavailable, match="another writer|no longer"):
            old.write(first)
        new.close()
        new = target.stager(0)
        new.write(first)  # stages nothing again, moves the position
        new.write(later)
        with pytest.raises(SinkUnavailable, match="no longer|another writer"):
            old.write(later)
    finally:
        old.close()
        new.close()
    assert target.staged_of(0) == [(ts, 0) for ts in commits(first + later)]
    for span in range(1, SPANS):
        sink = target.stager(span)
        sink.write(b.up_to(span, 0, b.ts))
        sink.close()
    apply_and_check(target, b)
