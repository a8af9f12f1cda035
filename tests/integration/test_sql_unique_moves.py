"""Values of a second unique key (not the primary key) that move between rows inside one window of the SQL sink's
writer (sinks.sql.ops.writer, "unique moves"), against real MariaDB, PostgreSQL and SQLite: a value freed by one
transaction and taken by another row in a later one, a swap of two rows' values through a temporary value across
three transactions, and random shuffles of unique values across transactions, with REPLICA IDENTITY DEFAULT and
FULL, on one connection and (PostgreSQL, MariaDB) with four apply workers. Every test ends in a row-by-row compare
with the upstream's rows; none may fail or lose a row."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest

from cdc.config import SinkConfig
from cdc.events import ColumnSchema, OpType, RowChange, TableName, TableSchema
from sinks.factory import open_sink
from sinks.sql.sink import SQLSink
from tests.sql_targets import SqlTarget, make_target

pytestmark = pytest.mark.integration


def _schema(identity: str) -> TableSchema:
    cols = (ColumnSchema("id", 0, "int4", nullable=False, is_key=True), ColumnSchema("code", 0, "text"),
            ColumnSchema("v", 0, "text"))
    return TableSchema(TableName("public", "um_u"), cols, ("id",), replica_identity=identity)


class Target(SqlTarget):
    def sink(self, workers: int = 1, **config: Any) -> SQLSink:
        s = open_sink(self.uri, SinkConfig(worker_count=workers, **config))
        assert isinstance(s, SQLSink)
        s.check()
        return s

    def rows(self) -> list[tuple[Any, ...]]:
        return sorted(self.execute(f"SELECT id, code, v FROM {self.qualified('um_u')}"))


@pytest.fixture(params=["mariadb", "postgresql", "sqlite"])
def target(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[Target]:
    t = make_target(Target, request, tmp_path)
    t.execute("CREATE TABLE um_u (id int PRIMARY KEY, code varchar(40) NOT NULL UNIQUE, v varchar(40))")
    yield t
    if t.kind == "postgresql":
        t.execute("DROP SCHEMA IF EXISTS tidewater CASCADE")
    for name in ("um_u", "tidewater_checkpoint", "tidewater_checkpoint_applied"):
        if t.kind != "postgresql" or not name.startswith("tidewater"):
            t.execute(f"DROP TABLE IF EXISTS {name}")


class Upstream:
    """The upstream table ``um_u`` (id -> (code, v)) and the changes pgoutput sends for its statements."""

    def __init__(self, identity: str, rows: dict[int, tuple[str, str]] | None = None) -> None:
        self.s = _schema(identity)
        self.rows: dict[int, tuple[str, str]] = dict(rows or {})
        self.ts = 100

    def commit(self) -> None:
        self.ts += 10

    def _old(self, k: int) -> dict[str, Any]:
        code, v = self.rows[k]
        return {"id": k, "code": code, "v": v} if self.s.replica_identity == "f" else {"id": k}

    def insert(self, k: int, code: str, v: str) -> RowChange:
        assert k not in self.rows and code not in {c for c, _ in self.rows.values()}
        self.rows[k] = (code, v)
        return RowChange(OpType.INSERT, self.s, self.ts, float(self.ts), values={"id": k, "code": code, "v": v})

    def update(self, k: int, code: str, v: str | None = None) -> RowChange:
        assert all(c != code for j, (c, _) in self.rows.items() if j != k), "a unique violation upstream"
        old = self._old(k) if self.s.replica_identity == "f" else None
        v = self.rows[k][1] if v is None else v
        self.rows[k] = (code, v)
        return RowChange(OpType.UPDATE, self.s, self.ts, float(self.ts), values={"id": k, "code": code, "v": v},
                         old_values=old)

    def move(self, k: int, n: int) -> RowChange:
        """``UPDATE um_u SET id = n WHERE id = k``."""
        assert n not in self.rows
        old = self._old(k)
        code, v = self.rows.pop(k)
        self.rows[n] = (code, v)
        return RowChange(OpType.UPDATE, self.s, self.ts, float(self.ts), values={"id": n, "code": code, "v": v},
                         old_values=old)

    def delete(self, k: int) -> RowChange:
        old = self._old(k)
        del self.rows[k]
        return RowChange(OpType.DELETE, self.s, self.ts, float(self.ts), old_values=old)

    def expected(self) -> list[tuple[Any, ...]]:
        return sorted((k, c, v) for k, (c, v) in self.rows.items())


def _seed(target: Target, sink: SQLSink, up: Upstream) -> None:
    sink.write([RowChange(OpType.INSERT, up.s, 10, 10.0, values={"id": k, "code": c, "v": v})
                for k, (c, v) in sorted(up.rows.items())])
    assert target.rows() == up.expected()


@pytest.mark.parametrize("identity", ["d", "f"])
def test_a_freed_value_taken_by_a_new_row_in_a_later_transaction(target: Target, identity: str) -> None:
    # T0 touches row 2 first (so the window's net effect lists it before row 1), T1 UPDATE u SET code='c9'
    # WHERE id=1 (frees 'c1'), T2 UPDATE u SET code='c1' WHERE id=2, T3 INSERT INTO u VALUES (3, 'c2')
    up = Upstream(identity, {1: ("c1", "a"), 2: ("c2", "b")})
    sink = target.sink()
    try:
        _seed(target, sink, up)
        changes = [up.update(2, "c2", "b0")]
        up.commit()
        changes.append(up.update(1, "c9"))
        up.commit()
        changes.append(up.update(2, "c1"))
        up.commit()
        changes.append(up.insert(3, "c2", "c"))
        sink.write(changes)
        assert target.rows() == up.expected() == [(1, "c9", "a"), (2, "c1", "b0"), (3, "c2", "c")]
        assert sink.take_warnings() == []
    finally:
        sink.close()


def _positional(ch: RowChange) -> RowChange:
    """``ch`` as the mounter sends INSERTs and UPDATEs without an old row: positional (the writer's fast path)."""
    assert ch.old_values is None and ch.values is not None
    return RowChange(ch.op, ch.schema, ch.commit_ts, ch.commit_time, row=tuple(ch.values[c] for c in ("id", "code", "v")))


def test_positional_rows_an_update_frees_and_a_row_and_an_insert_take(target: Target) -> None:
    # T0 UPDATE u SET v='a0' WHERE id=1, T1 UPDATE u SET code='c9' WHERE id=2 (frees 'c2'), T2 UPDATE u SET code='c2'
    # WHERE id=1 (frees 'c1'), T3 INSERT INTO u VALUES (3, 'c1'): whole rows, one upsert statement as a net effect
    up = Upstream("d", {1: ("c1", "a"), 2: ("c2", "b")})
    sink = target.sink()
    try:
        _seed(target, sink, up)
        changes = [up.update(1, "c1", "a0")]
        up.commit()
        changes.append(up.update(2, "c9"))
        up.commit()
        changes.append(up.update(1, "c2"))
        up.commit()
        changes.append(up.insert(3, "c1", "c"))
        sink.write([_positional(c) for c in changes])
        assert target.rows() == up.expected() == [(1, "c2", "a0"), (2, "c9", "b"), (3, "c1", "c")]
    finally:
        sink.close()


@pytest.mark.parametrize("identity", ["d", "f"])
def test_a_swap_of_unique_values_across_three_transactions(target: Target, identity: str) -> None:
    # T1: id1 c1 -> tmp, T2: id2 c2 -> c1, T3: id1 tmp -> c2
    up = Upstream(identity, {1: ("c1", "a"), 2: ("c2", "b")})
    sink = target.sink()
    try:
        _seed(target, sink, up)
        changes = [up.update(1, "tmp")]
        up.commit()
        changes.append(up.update(2, "c1"))
        up.commit()
        changes.append(up.update(1, "c2"))
        sink.write(changes)
        assert target.rows() == up.expected() == [(1, "c2", "a"), (2, "c1", "b")]
    finally:
        sink.close()


@pytest.mark.parametrize("identity", ["d", "f"])
def test_a_swap_inside_one_transaction_with_a_key_move(target: Target, identity: str) -> None:
    # one transaction: id1 c1 -> tmp, id2 -> id3 (primary key move), id3 c2 -> c1, id1 tmp -> c2
    up = Upstream(identity, {1: ("c1", "a"), 2: ("c2", "b")})
    sink = target.sink()
    try:
        _seed(target, sink, up)
        sink.write([up.update(1, "tmp"), up.move(2, 3), up.update(3, "c1"), up.update(1, "c2")])
        assert target.rows() == up.expected() == [(1, "c2", "a"), (3, "c1", "b")]
    finally:
        sink.close()


def test_a_deferred_key_swap_next_to_a_unique_move(target: Target) -> None:
    # FULL identity, DEFERRABLE key upstream: T1 UPDATE u SET id = 3 - id WHERE id IN (1, 2) (codes stay with their
    # rows), T2 UPDATE u SET code = 'c9' WHERE id = 3, T3 INSERT INTO u VALUES (4, 'c3'): the window is applied in
    # upstream order, T1 as its own net effect
    up = Upstream("f", {1: ("c1", "a"), 2: ("c2", "b"), 3: ("c3", "c")})
    sink = target.sink()
    try:
        _seed(target, sink, up)
        s, ts = up.s, up.ts
        swap = [RowChange(OpType.UPDATE, s, ts, float(ts), values={"id": 2, "code": "c1", "v": "a"},
                          old_values={"id": 1, "code": "c1", "v": "a"}),
                RowChange(OpType.UPDATE, s, ts, float(ts), values={"id": 1, "code": "c2", "v": "b"},
                          old_values={"id": 2, "code": "c2", "v": "b"})]
        up.rows[1], up.rows[2] = ("c2", "b"), ("c1", "a")
        up.commit()
        changes = [*swap, up.update(3, "c9")]
        up.commit()
        changes.append(up.insert(4, "c3", "d"))
        sink.write(changes)
        assert target.rows() == up.expected() == [(1, "c2", "b"), (2, "c1", "a"), (3, "c9", "c"), (4, "c3", "d")]
    finally:
        sink.close()


def shuffle_txn(up: Upstream, rnd: random.Random, codes: list[str]) -> list[RowChange]:
    """One random upstream transaction over ids 0..11 and a pool of codes: moves of a code to a row (through a
    free code when taken), swaps through a temporary code, inserts that reuse freed codes, deletes, key moves."""
    out: list[RowChange] = []
    for _ in range(rnd.randint(1, 4)):
        held = {c: k for k, (c, _) in up.rows.items()}
        free = [c for c in codes if c not in held]
        pick = rnd.random()
        ids = sorted(up.rows)
        if pick < 0.35 and len(ids) >= 2:  # swap the codes of two rows through a temporary code
            a, b = rnd.sample(ids, 2)
            ca, cb = up.rows[a][0], up.rows[b][0]
            tmp = rnd.choice(free)
            out += [up.update(a, tmp), up.update(b, ca), up.update(a, cb, f"s{up.ts}")]
        elif pick < 0.6 and ids and free:  # a row takes a free code (maybe one freed just before)
            out.append(up.update(rnd.choice(ids), rnd.choice(free), f"u{up.ts}"))
        elif pick < 0.8 and free:
            k = rnd.randrange(12)
            if k not in up.rows:
                out.append(up.insert(k, rnd.choice(free), f"i{up.ts}"))
        elif pick < 0.9 and ids:
            out.append(up.delete(rnd.choice(ids)))
        elif ids:
            n = rnd.randrange(12)
            if n not in up.rows:
                out.append(up.move(rnd.choice(ids), n))
    up.commit()
    return out


@pytest.mark.parametrize("identity", ["d", "f"])
@pytest.mark.parametrize("workers", [1, 4])
@pytest.mark.parametrize("seed", [1, 2])
def test_random_unique_value_shuffles(target: Target, identity: str, workers: int, seed: int) -> None:
    if workers > 1 and target.kind == "sqlite":
        pytest.skip("one writer per file: no parallel apply")
    rnd = random.Random(seed * 10 + (identity == "f"))
    codes = [f"k{i}" for i in range(16)]
    up = Upstream(identity, {i: (codes[i], f"r{i}") for i in range(8)})

    def open_sink() -> SQLSink:
        s = target.sink(workers, batch_rows=5, txn_rows=20)
        if workers > 1:
            s.open_position("cf", 0, origin=5)
        return s

    sink = open_sink()
    try:
        _seed(target, sink, up)
        for _ in range(30):
            batch = [c for _ in range(rnd.randint(1, 12)) for c in shuffle_txn(up, rnd, codes)]
            # (InnoDB may pick a worker's transaction as a deadlock victim: the sink runs it again itself,
            # sinks.sql.ops.parallel DEADLOCK_RETRIES, so no write fails here)
            sink.write(batch)
            assert target.rows() == up.expected()
        assert sink.take_warnings() == []
    finally:
        sink.close()
