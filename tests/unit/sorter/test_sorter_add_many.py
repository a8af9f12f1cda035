"""SpanSorter.add_many (the puller hands a transaction's plain changes over in runs) has the effect of add per
payload: the same spills at the same rows, the same memory accounting, counters and replay."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from sorter import encoding as enc
from sorter.base import SpanSorter
from sorter.leveldb import LevelDBSorter
from sorter.memory import MemorySorter

pytestmark = pytest.mark.unit


def state(sp: SpanSorter, sorter: LevelDBSorter | MemorySorter) -> tuple[object, ...]:
    spills = len(list(sorter.spill_dir.glob("*.spill"))) if isinstance(sorter, LevelDBSorter) else 0
    return (sp.memory_bytes(), sp.pending_txns(), sp.spill_files(), spills, sp.in_rows, sp.in_bytes, sp.aborted_rows,
            sp.aborted_bytes)


@pytest.mark.parametrize("kind", ["leveldb", "memory"])
@pytest.mark.parametrize("seed", range(6))
def test_runs_equal_single_adds(tmp_path: Path, kind: str, seed: int) -> None:
    rng = random.Random(seed)

    def open_sorter(name: str) -> LevelDBSorter | MemorySorter:
        if kind == "memory":
            return MemorySorter()
        # small thresholds: runs cross the per-transaction row and byte limits and the memory budget
        return LevelDBSorter(tmp_path / name, spill_rows=rng.choice([3, 7, 50]), spill_bytes=rng.choice(
            [300, 2_000, 4 << 20]), memory_budget=rng.choice([600, 4_000, 1 << 20]),
            batch_bytes=rng.choice([1, 500, 1 << 16]))

    state_rng = rng.getstate()
    one = open_sorter("one")
    rng.setstate(state_rng)  # the same thresholds for both
    many = open_sorter("many")
    a, b = one.span("cf/0"), many.span("cf/0")
    ts = 0
    open_xids: list[int] = []
    try:
        for _ in range(300):
            op = rng.random()
            if op < 0.6 or not open_xids:
                xid = rng.choice(open_xids) if open_xids and rng.random() < 0.8 else rng.randrange(1, 10**6)
                if xid not in open_xids:
                    open_xids.append(xid)
                sub = xid if rng.random() < 0.8 else xid + rng.randrange(1, 4)
                run = [bytes([rng.randrange(256)]) * rng.randrange(0, 90) for _ in range(rng.randrange(0, 12))]
                for p in run:
                    a.add(xid, sub, p)
                b.add_many(xid, sub, run)
            elif op < 0.7:
                xid = rng.choice(open_xids)
                sub = xid if rng.random() < 0.5 else xid + rng.randrange(1, 4)
                a.abort(xid, sub)
                b.abort(xid, sub)
                if sub == xid:
                    open_xids.remove(xid)
            else:
                xid = rng.choice(open_xids)
                open_xids.remove(xid)
                ts += rng.randrange(1, 5)
                a.commit(xid, ts, ts / 10)
                b.commit(xid, ts, ts / 10)
            assert state(a, one) == state(b, many)
        got_a = [(t.commit_ts, t.commit_time, list(t.payloads)) for t in a.read_txns(-1, enc.U64_MAX)]
        got_b = [(t.commit_ts, t.commit_time, list(t.payloads)) for t in b.read_txns(-1, enc.U64_MAX)]
        assert got_a == got_b and got_a
    finally:
        one.close()
        many.close()


def test_an_empty_run_opens_no_transaction(tmp_path: Path) -> None:
    s = LevelDBSorter(tmp_path / "s")
    try:
        sp = s.span("cf/0")
        sp.add_many(5, 5, [])
        assert sp.pending_txns() == 0 and sp.memory_bytes() == 0
        with pytest.raises(ValueError):
            sp.add_many(-1, 1, [b"x"])
    finally:
        s.close()
