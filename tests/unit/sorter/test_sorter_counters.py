"""The sorter's metric counters (in/aborted rows and payload bytes, spill files) on both implementations,
including a transaction that spilled to its file, and the bytes read back through read_txns."""

from __future__ import annotations

from pathlib import Path

import pytest

from sorter.base import Sorter
from sorter.leveldb import LevelDBSorter
from sorter.memory import MemorySorter

pytestmark = pytest.mark.unit


@pytest.fixture(params=["memory", "leveldb"])
def sorter(request: pytest.FixtureRequest, tmp_path: Path) -> Sorter:
    if request.param == "memory":
        return MemorySorter()
    s = LevelDBSorter(tmp_path / "db", spill_rows=4, memory_budget=1 << 20)
    request.addfinalizer(s.close)
    return s


def test_counters_follow_commits_aborts_and_spills(sorter: Sorter) -> None:
    sp = sorter.span("cf/0")
    for i in range(10):  # 10 rows of 10 bytes: spills on LevelDB (spill_rows=4)
        sp.add(1, 1, b"%010d" % i)
    if isinstance(sorter, LevelDBSorter):
        assert sp.spill_files() == 1
    sp.add(2, 2, b"abc")
    sp.add(2, 3, b"defg")
    sp.abort(2, 3)  # subtransaction rolled back: 1 row, 4 bytes
    sp.commit(2, 10, 1.0)
    sp.commit(1, 20, 2.0)
    sp.add(3, 3, b"12345")
    sp.abort(3, 3)
    assert (sp.in_rows, sp.in_bytes) == (11, 103)
    assert (sp.aborted_rows, sp.aborted_bytes) == (2, 9)
    txns = list(sp.read_txns(-1, 100))
    assert [(t.rows, t.nbytes) for t in txns] == [(1, 3), (10, 100)]
    sp.clean(100)
    assert sp.spill_files() == 0
    sp.clear()
    assert sp.in_rows == 11  # cumulative across clear()


def test_bytes_read_back_from_packed_segments(tmp_path: Path) -> None:
    s = LevelDBSorter(tmp_path / "db", memory_budget=2, batch_bytes=1)  # every commit packed into LevelDB
    try:
        sp = s.span("cf/0")
        for ts in range(1, 4):
            sp.add(ts, ts, b"x" * ts)
            sp.add(ts, ts, b"y")
            sp.commit(ts, ts, float(ts))
        assert [(t.rows, t.nbytes) for t in sp.read_txns(-1, 10)] == [(2, 2), (2, 3), (2, 4)]
        assert sp.memory_bytes() == 0  # really packed
    finally:
        s.close()
