"""Parallel apply (``[sink] worker-count = 4``, sinks.sql.ops.parallel) against real MariaDB, PostgreSQL and SQLite
(one writer: the same writes take the one-connection path there): random bursts of conflicting and independent
transactions over a keyed table, a table with a second unique key, a table without a key and two tables linked by
a foreign key, ending in a row-by-row compare with a model; a crash between the workers' commits and the
position's (replayed without applying anything twice, also into the table without a key); a second writer of the
span (a zombie) refused."""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from cdc.config import SinkConfig
from cdc.errors import LeaseLost, SinkUnavailable
from cdc.events import ColumnSchema, OpType, RowChange, TableName, TableSchema
from sinks.factory import open_sink
from sinks.sql.sink import SQLSink
from tests.sql_targets import SqlTarget, make_target

pytestmark = pytest.mark.integration


def _cols(*names: str) -> tuple[ColumnSchema, ...]:
    return tuple(ColumnSchema(c, 0, "int4" if c in ("id", "pid", "a") else "text", nullable=c != "id",
                              is_key=c == "id") for c in names)


PLAIN = TableSchema(TableName("public", "pa_plain"), _cols("id", "v"), ("id",))
UNIQ = TableSchema(TableName("public", "pa_uniq"), _cols("id", "code", "v"), ("id",), replica_identity="f")
LOG = TableSchema(TableName("public", "pa_log"), _cols("a", "b"), ("a", "b"), replica_identity="f", has_key=False)
PARENT = TableSchema(TableName("public", "pa_parent"), _cols("id", "v"), ("id",))
CHILD = TableSchema(TableName("public", "pa_child"), _cols("id", "pid", "v"), ("id",))


class Target(SqlTarget):
    def sink(self, workers: int = 4, **config: Any) -> SQLSink:
        s = open_sink(self.uri, SinkConfig(worker_count=workers, **config))
        assert isinstance(s, SQLSink)
        s.check()
        return s

    def rows(self, name: str, cols: str) -> list[tuple[Any, ...]]:
        return sorted(self.execute(f"SELECT {cols} FROM {self.qualified(name)}"))


@pytest.fixture(params=["mariadb", "postgresql", "sqlite"])
def target(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[Target]:
    t = make_target(Target, request, tmp_path)
    t.execute("CREATE TABLE pa_plain (id int PRIMARY KEY, v varchar(40))")
    t.execute("CREATE TABLE pa_uniq (id int PRIMARY KEY, code varchar(40) NOT NULL UNIQUE, v varchar(40))")
    t.execute("CREATE TABLE pa_log (a int, b varchar(40))")
    t.execute("CREATE TABLE pa_parent (id int PRIMARY KEY, v varchar(40))")
    t.execute("CREATE TABLE pa_child (id int PRIMARY KEY, pid int NOT NULL, v varchar(40), "
              "FOREIGN KEY (pid) REFERENCES pa_parent (id))")
    yield t
    if t.kind == "postgresql":
        t.execute("DROP SCHEMA IF EXISTS tidewater CASCADE")
    for name in ("pa_child", "pa_parent", "pa_log", "pa_uniq", "pa_plain", "tidewater_checkpoint",
                 "tidewater_checkpoint_applied"):
        if t.kind != "postgresql" or not name.startswith("tidewater"):
            t.execute(f"DROP TABLE IF EXISTS {name}")


class Model:
    """The upstream: random transactions and the rows they leave."""

    def __init__(self, seed: int) -> None:
        self.rnd = random.Random(seed)
        self.plain: dict[int, str] = {}
        self.uniq: dict[int, tuple[str, str]] = {}
        self.log: list[tuple[int, str]] = []
        self.parent: dict[int, str] = {}
        self.child: dict[int, tuple[int, str]] = {}
        self.ts = 100
        self.free_codes: list[str] = []
        self.codes = 0

    def fresh_code(self) -> str:
        self.codes += 1
        return f"c{self.codes}"

    def independent(self) -> list[RowChange]:
        """Transactions that surely split over several workers: inserts of new keys, one per transaction, and
        inserts into the table without a key (one component)."""
        out = []
        for i in range(6):
            self.ts += 10
            k = 1000 + self.ts
            self.plain[k] = f"i{i}"
            out.append(RowChange(OpType.INSERT, PLAIN, self.ts, float(self.ts), values={"id": k, "v": f"i{i}"}))
            self.ts += 10
            self.log.append((i, "x"))
            out.append(RowChange(OpType.INSERT, LOG, self.ts, float(self.ts), values={"a": i, "b": "x"}))
        return out

    def txn(self) -> list[RowChange]:
        self.ts += 10
        ts, rnd, out = self.ts, self.rnd, []

        def ch(op: OpType, s: TableSchema, values: dict[str, Any] | None = None,
               old: dict[str, Any] | None = None) -> None:
            out.append(RowChange(op, s, ts, float(ts), values=values, old_values=old))

        for _ in range(rnd.randint(1, 4)):
            pick = rnd.random()
            v = f"v{ts}-{len(out)}"
            if pick < 0.3:  # plain: insert / update / delete / key move, 30 keys: many conflicts
                k = rnd.randrange(30)
                if k not in self.plain:
                    self.plain[k] = v
                    ch(OpType.INSERT, PLAIN, {"id": k, "v": v})
                elif rnd.random() < 0.4:
                    self.plain[k] = v
                    ch(OpType.UPDATE, PLAIN, {"id": k, "v": v})
                elif rnd.random() < 0.5:
                    del self.plain[k]
                    ch(OpType.DELETE, PLAIN, old={"id": k})
                else:
                    n = rnd.randrange(30)
                    if n not in self.plain:
                        del self.plain[k]
                        self.plain[n] = v
                        ch(OpType.UPDATE, PLAIN, {"id": n, "v": v}, {"id": k})
            elif pick < 0.55:  # a second unique key: codes freed by a delete or an UPDATE are taken by later inserts
                # (a value moving between rows in one window: sinks.sql.dialect.unique_moves)
                k = rnd.randrange(20)
                if k not in self.uniq:
                    if self.free_codes and rnd.random() < 0.7:
                        code = self.free_codes.pop(rnd.randrange(len(self.free_codes)))
                    else:
                        code = self.fresh_code()
                    self.uniq[k] = (code, v)
                    ch(OpType.INSERT, UNIQ, {"id": k, "code": code, "v": v})
                elif rnd.random() < 0.5:
                    code, old_v = self.uniq[k]
                    new = self.fresh_code()
                    self.uniq[k] = (new, v)
                    self.free_codes.append(code)
                    ch(OpType.UPDATE, UNIQ, {"id": k, "code": new, "v": v}, {"id": k, "code": code, "v": old_v})
                else:
                    code, old_v = self.uniq.pop(k)
                    self.free_codes.append(code)
                    ch(OpType.DELETE, UNIQ, old={"id": k, "code": code, "v": old_v})
            elif pick < 0.7:  # no key
                if self.log and rnd.random() < 0.3:
                    row = self.log.pop(rnd.randrange(len(self.log)))
                    ch(OpType.DELETE, LOG, old={"a": row[0], "b": row[1]})
                else:
                    row = (rnd.randrange(5), f"b{rnd.randrange(3)}")  # duplicates on purpose
                    self.log.append(row)
                    ch(OpType.INSERT, LOG, {"a": row[0], "b": row[1]})
            elif pick < 0.97:  # foreign key: children only of existing parents, parents only without children
                if rnd.random() < 0.5:
                    k = rnd.randrange(10)
                    if k not in self.parent:
                        self.parent[k] = v
                        ch(OpType.INSERT, PARENT, {"id": k, "v": v})
                    elif all(p != k for p, _ in self.child.values()):
                        del self.parent[k]
                        ch(OpType.DELETE, PARENT, old={"id": k})
                elif self.parent:
                    k = rnd.randrange(40)
                    if k in self.child and rnd.random() < 0.4:
                        del self.child[k]
                        ch(OpType.DELETE, CHILD, old={"id": k})
                    else:
                        p = rnd.choice(sorted(self.parent))
                        op = OpType.UPDATE if k in self.child else OpType.INSERT
                        self.child[k] = (p, v)
                        ch(op, CHILD, {"id": k, "pid": p, "v": v})
            else:
                self.plain.clear()
                ch(OpType.TRUNCATE, PLAIN)
        return out

    def batch(self) -> list[RowChange]:
        return [c for _ in range(self.rnd.randint(1, 40)) for c in self.txn()]

    def check(self, target: Target) -> None:
        assert target.rows("pa_plain", "id, v") == sorted(self.plain.items())
        assert target.rows("pa_uniq", "id, code, v") == sorted((k, c, v) for k, (c, v) in self.uniq.items())
        assert target.rows("pa_log", "a, b") == sorted(self.log)
        assert target.rows("pa_parent", "id, v") == sorted(self.parent.items())
        assert target.rows("pa_child", "id, pid, v") == sorted((k, p, v) for k, (p, v) in self.child.items())


@pytest.mark.parametrize("workers", [4, 1])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_bursts(target: Target, seed: int, workers: int) -> None:
    model = Model(seed)
    sink = target.sink(workers, batch_rows=7, txn_rows=60)
    sink.open_position("cf", 0, origin=5)
    try:
        for _ in range(25):
            sink.write(model.batch())
        assert sink.take_warnings() == []
        parallel = sink.parallel_writes
    finally:
        sink.close()
    model.check(target)
    if target.kind == "sqlite" or workers == 1:
        assert parallel == 0  # (SQLite: one writer per file)
    else:
        assert parallel > 0
    if parallel:
        assert target.execute(f"SELECT commit_ts FROM {_applied(target)}") == []  # compacted up to the position


def _applied(target: Target) -> str:
    return "tidewater.tidewater_checkpoint_applied" if target.kind == "postgresql" else "tidewater_checkpoint_applied"


def lose_on_caller() -> None:
    """A fence that fails in the caller's thread only: the workers commit, the position does not move."""
    if threading.current_thread() is threading.main_thread():
        raise LeaseLost("fenced")


def test_crash_between_the_workers_and_the_position(target: Target) -> None:
    """The workers committed, the position did not move (the lease was lost right before): a restart replays the
    same write and applies none of it again (the table without a key would show a duplicate)."""
    if target.kind == "sqlite":
        pytest.skip("one writer per file: no parallel apply")
    model = Model(7)
    sink = target.sink()
    sink.open_position("cf", 0, origin=5)
    first = model.batch() + model.batch()
    sink.write(first)
    before = sink.parallel_writes
    batch = model.independent()
    with pytest.raises(LeaseLost):
        sink.write(batch, lose_on_caller)
    assert sink.parallel_writes == before + 1  # the workers committed
    sink.close()
    assert target.execute(f"SELECT count(*) FROM {_applied(target)}")[0][0] > 0
    sink = target.sink()
    # the highest commit Ts the target holds: above the position (first[-1]), the workers' last commit, so that a
    # source that cannot replay under the same Ts (MySQL after a move to another server) sees it
    assert sink.open_position("cf", 0, origin=5) == max(c.commit_ts for c in batch) > first[-1].commit_ts
    try:
        assert sink.write(batch) == 0  # every transaction is in the applied table
        after = model.batch()
        sink.write(after)
    finally:
        sink.close()
    model.check(target)
    assert target.execute(f"SELECT commit_ts FROM {_applied(target)}") == []


def test_a_zombie_writer_applies_nothing_twice(target: Target) -> None:
    """Two writers of one span: the successor applied a write (position unmoved, as if it died before that), the
    frozen one then writes the same transactions: refused by the applied table; after the successor moved the
    position, refused by the position check."""
    if target.kind == "sqlite":
        pytest.skip("one writer per file: no parallel apply")
    model = Model(11)
    old, new = target.sink(), target.sink()
    try:
        old.open_position("cf", 0, origin=5)
        new.open_position("cf", 0, origin=5)
        batch = model.batch() + model.independent()
        with pytest.raises(LeaseLost):
            new.write(batch, lose_on_caller)
        with pytest.raises(SinkUnavailable, match="another writer applied it|no longer"):
            old.write(batch)
        new.close()
        new = target.sink()
        new.open_position("cf", 0, origin=5)
        later = model.independent()
        new.write(later)
        with pytest.raises(SinkUnavailable, match="no longer|another writer"):
            old.write(later)
    finally:
        old.close()
        new.close()
    model.check(target)


def test_one_worker_refused_the_others_committed(target: Target) -> None:
    """The fence refuses one worker's commit (a crash between the workers' commits): the others' transactions are
    downstream and recorded; the replay applies exactly the refused ones."""
    if target.kind == "sqlite":
        pytest.skip("one writer per file: no parallel apply")
    model = Model(13)
    sink = target.sink()
    sink.open_position("cf", 0, origin=5)
    sink.write(model.independent())  # (binds the tables: a write that binds one ends its round there first)
    batch = model.independent()
    calls: list[int] = []

    def refuse_first_worker() -> None:
        if threading.current_thread() is threading.main_thread():
            return
        calls.append(1)
        if len(calls) == 1:
            raise LeaseLost("fenced")

    with pytest.raises(LeaseLost):
        sink.write(batch, refuse_first_worker)
    sink.close()
    recorded = target.execute(f"SELECT count(*) FROM {_applied(target)}")[0][0]
    assert 0 < recorded < len({c.commit_ts for c in batch})
    sink = target.sink()
    sink.open_position("cf", 0, origin=5)
    try:
        applied = sink.write(batch)
        assert 0 < applied < len(batch)
        sink.write(model.batch())
    finally:
        sink.close()
    model.check(target)


def test_updates_of_random_keys_end_rounds_where_workers_conflict(target: Target) -> None:
    """Transactions updating random keys keep bridging the workers' keys: a streamed write ends its round (every
    worker commits) before a transaction whose keys two workers hold, at most ``MAX_CUTS`` times, then applies its
    rest on one worker; on several connections, and the rows end equal."""
    rnd = random.Random(3)
    rows = {k: 0 for k in range(300)}
    sink = target.sink()
    sink.open_position("cf", 0, origin=5)
    try:
        sink.write([RowChange(OpType.INSERT, PLAIN, 10, 10.0, values={"id": k, "v": "0"}) for k in rows])
        ts = 10
        for _ in range(4):
            batch = []
            for _ in range(60):
                ts += 10
                for k in rnd.sample(sorted(rows), 10):
                    rows[k] += 1
                    batch.append(RowChange(OpType.UPDATE, PLAIN, ts, float(ts), values={"id": k, "v": str(rows[k])}))
            sink.write(batch)
        parallel = sink.parallel_writes
    finally:
        sink.close()
    assert target.rows("pa_plain", "id, v") == sorted((k, str(n)) for k, n in rows.items())
    assert (parallel == 0) if target.kind == "sqlite" else (parallel > 0)


def test_worker_count_one_is_the_one_connection_path(target: Target) -> None:
    model = Model(5)
    sink = target.sink(workers=1)
    sink.open_position("cf", 0, origin=5)
    try:
        for _ in range(5):
            sink.write(model.batch())
        assert sink.parallel_writes == 0
    finally:
        sink.close()
    model.check(target)


def _end_sink_sessions(target: Target) -> int:
    """End, server-side, every session of this process's sinks on the test database (as an administrator, a
    server-side idle timeout or a restarted proxy would): returns how many."""
    if target.kind == "postgresql":
        rows = target.execute(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = "
                              f"current_database() AND application_name = 'tidewater-sink-{os.getpid()}'")
        return len(rows)
    ids = target.execute("SELECT id FROM information_schema.processlist WHERE db = DATABASE() "
                         "AND id <> CONNECTION_ID()")
    for (i,) in ids:
        target.execute(f"KILL CONNECTION {int(i)}")
    return len(ids)


def test_worker_connections_broken_between_writes_are_replaced(target: Target) -> None:
    """Each worker keeps its connection from one write to the next (no pre-ping any more): when the server ends
    those sessions between two writes, the next write's workers notice it on their first statement, run their
    transaction again once on a new connection, and the write commits; the next writes go on; row-by-row equal."""
    if target.kind == "sqlite":
        pytest.skip("one writer per file: no parallel apply")
    model = Model(17)
    sink = target.sink()
    sink.open_position("cf", 0, origin=5)
    try:
        sink.write(model.batch() + model.independent())
        assert sink.parallel_writes == 1
        assert _end_sink_sessions(target) >= 2  # the workers' held connections (and the position mover's)
        sink.write(model.independent())  # on new connections
        assert sink.parallel_writes == 2
        for _ in range(3):
            sink.write(model.batch() + model.independent())
        assert sink.parallel_writes == 5
        assert sink.take_warnings() == []
    finally:
        sink.close()
    model.check(target)
    assert target.execute(f"SELECT commit_ts FROM {_applied(target)}") == []


def test_a_zombie_behind_the_position_applies_none_of_its_new_rows(target: Target) -> None:
    """A frozen writer wakes up after its successor moved the position, with transactions nobody applied yet (so
    no applied row of its own collides): each of its workers is refused by the position check before any row (on
    PostgreSQL the check and the applied rows are one statement), nothing of them is downstream; the successor
    then applies them exactly once."""
    if target.kind == "sqlite":
        pytest.skip("one writer per file: no parallel apply")
    model = Model(19)
    old, new = target.sink(), target.sink()
    try:
        old.open_position("cf", 0, origin=5)
        new.open_position("cf", 0, origin=5)
        new.write(model.batch() + model.independent())  # the position moves past what ``old`` read
        fresh = model.independent()
        first_key = min(c.values["id"] for c in fresh if c.schema is PLAIN and c.values)
        with pytest.raises(SinkUnavailable, match="no longer"):
            old.write(fresh)
        assert target.execute(f"SELECT count(*) FROM {target.qualified('pa_plain')} WHERE id >= {first_key}") \
            == [(0,)]
        new.write(fresh)
        assert new.parallel_writes == 2
    finally:
        old.close()
        new.close()
    model.check(target)


def test_writes_of_hot_rows_stream_unplanned_after_a_few(target: Target) -> None:
    """Writes whose transactions all update one row (pgbench's branches) go to one connection anyway: after
    SERIAL_AFTER of them in a row the next ones are streamed without being read and keyed, backing off 1, 2, 4...;
    a write planned after that which splits goes to several connections again; row-by-row equal."""
    if target.kind == "sqlite":
        pytest.skip("one writer per file: no parallel apply")
    rows: dict[int, str] = {}
    sink = target.sink()
    sink.open_position("cf", 0, origin=5)
    ts = 10
    try:
        for w in range(12):
            batch = []
            for _ in range(5):
                ts += 10
                rows[1] = f"w{w}-{ts}"
                batch.append(RowChange(OpType.INSERT if ts == 20 else OpType.UPDATE, PLAIN, ts, float(ts),
                                       values={"id": 1, "v": rows[1]}))
            sink.write(batch)
        # 3 planned (one list each), 1 streamed, 1 planned, 2 streamed, 1 planned, 4 streamed
        assert sink.unplanned_writes == 7
        assert sink.parallel_writes == 0
        for _ in range(8):  # independent inserts: once a planned write splits, the backoff is reset
            batch = []
            for i in range(6):
                ts += 10
                rows[ts] = f"i{i}"
                batch.append(RowChange(OpType.INSERT, PLAIN, ts, float(ts), values={"id": ts, "v": f"i{i}"}))
            sink.write(batch)
        assert sink.parallel_writes >= 5
    finally:
        sink.close()
    assert target.rows("pa_plain", "id, v") == sorted(rows.items())


def _uncommitted_writes(target: Target) -> int:
    """Sessions that changed rows of ``pa_plain`` in a transaction still open (seen from another session)."""
    if target.kind == "postgresql":
        sql = ("SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation WHERE c.relname = 'pa_plain' "
               "AND l.mode = 'RowExclusiveLock' AND l.pid <> pg_backend_pid()")
    else:
        sql = "SELECT count(*) FROM information_schema.innodb_trx WHERE trx_rows_modified > 0"
    return int(target.execute(sql)[0][0])


def test_workers_apply_while_the_write_is_still_read(target: Target) -> None:
    """A write's transactions go to the workers as they are read: while the caller still reads the write (the
    changes come from a generator that stops in the middle of the second transaction), a worker already holds the
    first transaction's rows in its open downstream transaction; the write then commits whole and equal. (Before,
    the workers started only once the whole write was read: the generator waited in vain.)"""
    if target.kind == "sqlite":
        pytest.skip("one writer per file: no parallel apply")
    sink = target.sink(batch_rows=2)
    sink.open_position("cf", 0, origin=5)
    seen: list[bool] = []

    def changes() -> Iterator[RowChange]:
        for k in range(4):
            yield RowChange(OpType.INSERT, PLAIN, 20, 20.0, values={"id": k, "v": "a"})
        yield RowChange(OpType.INSERT, PLAIN, 30, 30.0, values={"id": 10, "v": "b"})
        # the caller has read the first transaction whole (it saw the second begin) and handed it to a worker
        deadline = time.monotonic() + 60
        while not _uncommitted_writes(target) and time.monotonic() < deadline:
            time.sleep(0.05)
        seen.append(_uncommitted_writes(target) > 0)
        yield RowChange(OpType.INSERT, PLAIN, 30, 30.0, values={"id": 11, "v": "b"})

    try:
        sink.write([RowChange(OpType.INSERT, PLAIN, 10, 10.0, values={"id": 100, "v": "x"})])  # binds the table
        assert sink.write(changes()) == 6
    finally:
        sink.close()
    assert seen == [True]
    assert target.rows("pa_plain", "id, v") == [(0, "a"), (1, "a"), (2, "a"), (3, "a"), (10, "b"), (11, "b"),
                                                 (100, "x")]
