"""The sorter contract (sorter/base.py), run against the memory twin and the LevelDB sorter.

``leveldb-spill`` uses tiny thresholds so that every transaction of more than two changes spills to a
spill file in several chunks; ``leveldb-overflow`` packs every committed transaction into LevelDB at
as soon as ~200 bytes are committed (its memory budget is 400 bytes), as when the sink lags far behind.
"""

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cdc.errors import SorterError
from sorter.base import SortedEntry, SortedTxn, Sorter, SpanSorter
from sorter.encoding import U64_MAX
from sorter.leveldb import LevelDBSorter
from sorter.memory import MemorySorter

pytestmark = pytest.mark.unit

MAX = U64_MAX


@pytest.fixture(params=["memory", "leveldb", "leveldb-spill", "leveldb-overflow"])
def sorter(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Sorter]:
    s: Sorter
    if request.param == "memory":
        s = MemorySorter()
    elif request.param == "leveldb":
        s = LevelDBSorter(tmp_path / "sorter")
    elif request.param == "leveldb-spill":
        s = LevelDBSorter(tmp_path / "sorter", spill_rows=3, memory_budget=2000, batch_bytes=200)
    else:
        s = LevelDBSorter(tmp_path / "sorter", memory_budget=400, batch_bytes=1)
    yield s
    s.close()


@pytest.fixture
def span(sorter: Sorter) -> SpanSorter:
    return sorter.span("cf-1/0")


def rows(sp: SpanSorter, after: int = -1, upto: int = MAX) -> list[tuple[int, float, bytes]]:
    return [tuple(e) for e in sp.read(after, upto)]  # type: ignore[misc]


def test_interleaved_transactions_come_out_in_commit_order(span: SpanSorter) -> None:
    span.add(10, 10, b"a1")
    span.add(11, 11, b"b1")
    span.add(10, 10, b"a2")
    span.add(12, 12, b"c1")
    span.add(11, 11, b"b2")
    span.add(10, 10, b"a3")
    span.add(10, 10, b"a4")
    assert span.pending_txns() == 3
    span.commit(11, 100, 1.5)
    span.commit(12, 200, 2.5)
    span.commit(10, 300, 3.5)
    assert span.pending_txns() == 0
    assert rows(span) == [
        (100, 1.5, b"b1"),
        (100, 1.5, b"b2"),
        (200, 2.5, b"c1"),
        (300, 3.5, b"a1"),
        (300, 3.5, b"a2"),
        (300, 3.5, b"a3"),
        (300, 3.5, b"a4"),
    ]
    assert all(isinstance(e, SortedEntry) for e in span.read(0, MAX))


def test_big_transaction_interleaved_with_small_ones(span: SpanSorter) -> None:
    n = 2000
    for i in range(n):
        span.add(7, 7, b"big-%d" % i)
        if i % 500 == 0:
            small = 1000 + i
            span.add(small, small, b"small-%d" % i)
            span.commit(small, 10 + i, float(i))
    span.commit(7, 5000, 9.0)
    got = rows(span)
    smalls = [r for r in got if r[2].startswith(b"small")]
    assert [r[0] for r in smalls] == [10, 510, 1010, 1510]
    assert [r[2] for r in got[len(smalls) :]] == [b"big-%d" % i for i in range(n)]
    assert {r[:2] for r in got[len(smalls) :]} == {(5000, 9.0)}


def test_subtransaction_abort_drops_only_that_subxid(span: SpanSorter) -> None:
    xid = 100
    expected = []
    for i in range(30):
        sub = (xid, 101, 102)[i % 3]
        span.add(xid, sub, b"%d-%d" % (sub, i))
        if sub != 101:
            expected.append(b"%d-%d" % (sub, i))
    span.abort(xid, 101)
    # entries of the aborted subxid added later (not done by PostgreSQL) are not affected
    span.add(xid, 101, b"late")
    span.add(xid, 102, b"tail")
    span.abort(xid, 999)  # unknown subxid: nothing happens
    span.abort(555, 556)  # unknown xid: nothing happens
    span.commit(xid, 10, 1.0)
    assert [r[2] for r in rows(span)] == [*expected, b"late", b"tail"]


def test_two_subtransactions_aborted_at_different_times(span: SpanSorter) -> None:
    for i in range(10):
        span.add(1, 2, b"s2-%d" % i)
    span.abort(1, 2)
    for i in range(10):
        span.add(1, 3, b"s3-%d" % i)
        span.add(1, 1, b"top-%d" % i)
    span.abort(1, 3)
    span.commit(1, 5, 0.0)
    assert [r[2] for r in rows(span)] == [b"top-%d" % i for i in range(10)]


def test_top_level_abort_drops_the_transaction(span: SpanSorter) -> None:
    for i in range(20):
        span.add(1, 1, b"x%d" % i)
        span.add(2, 2, b"y%d" % i)
    span.abort(1, 1)
    assert span.pending_txns() == 1
    span.commit(1, 10, 1.0)  # nothing left of xid 1
    span.commit(2, 20, 2.0)
    assert [r[2] for r in rows(span)] == [b"y%d" % i for i in range(20)]
    # the xid may be reused later for a new transaction
    span.add(1, 1, b"again")
    span.commit(1, 30, 3.0)
    assert [r[2] for r in rows(span, 20)] == [b"again"]


def test_transaction_with_everything_aborted_yields_nothing(span: SpanSorter) -> None:
    for i in range(10):
        span.add(1, 2, b"%d" % i)
    span.abort(1, 2)
    span.commit(1, 10, 1.0)
    span.commit(42, 20, 2.0)  # never seen
    assert rows(span) == []
    assert span.pending_txns() == 0


def test_read_range_bounds(span: SpanSorter) -> None:
    for ts in (10, 20, 30):
        span.add(ts, ts, b"r%d" % ts)
        span.commit(ts, ts, ts / 10)
    span.add(99, 99, b"open")  # uncommitted: never read

    def tss(after: int, upto: int) -> list[int]:
        return [r[0] for r in rows(span, after, upto)]

    assert tss(10, 30) == [20, 30]
    assert tss(0, 10) == [10]
    assert tss(-1, 9) == []
    assert tss(9, 10) == [10]
    assert tss(30, 30) == []
    assert tss(30, MAX) == []
    assert tss(25, 5) == []
    assert tss(-1, MAX) == [10, 20, 30]
    assert tss(0, 2**70) == [10, 20, 30]
    with pytest.raises(ValueError):
        span.read(-5, 10)


def test_read_is_a_snapshot_taken_at_the_call(span: SpanSorter) -> None:
    span.add(1, 1, b"one")
    span.commit(1, 10, 1.0)
    it = span.read(0, MAX)
    span.add(2, 2, b"two")
    span.commit(2, 20, 2.0)
    assert [r[2] for r in it] == [b"one"]
    span.clean(10)  # clean invalidates iterators over what it cleans: they are consumed first
    assert [r[2] for r in rows(span)] == [b"two"]


def test_clean_forgets_checkpointed_entries(span: SpanSorter) -> None:
    for ts in range(1, 11):
        for j in range(5):
            span.add(ts, ts, b"%d.%d" % (ts, j))
        span.commit(ts, ts * 10, float(ts))
    span.clean(35)
    assert sorted({r[0] for r in rows(span)}) == [40, 50, 60, 70, 80, 90, 100]
    span.clean(20)  # below what was cleaned: no-op
    span.clean(35)
    assert len(rows(span)) == 35
    span.add(11, 11, b"new")
    span.commit(11, 110, 11.0)
    span.clean(100)
    assert rows(span) == [(110, 11.0, b"new")]
    span.clean(MAX)
    assert rows(span) == []


def test_clear_forgets_everything_and_restarts_ts(span: SpanSorter) -> None:
    for i in range(20):
        span.add(1, 1, b"c%d" % i)
        span.add(2, 2, b"u%d" % i)
    span.commit(1, 100, 1.0)
    span.clear()
    assert span.pending_txns() == 0
    assert rows(span) == []
    # xid 2's buffered and spilled data are gone: committing it yields nothing
    span.commit(2, 50, 0.5)
    assert rows(span) == []
    span.add(3, 3, b"fresh")
    span.commit(3, 60, 0.6)
    assert rows(span) == [(60, 0.6, b"fresh")]


def test_commit_ts_must_increase(span: SpanSorter) -> None:
    span.add(1, 1, b"a")
    span.commit(1, 10, 1.0)
    span.add(2, 2, b"b")
    with pytest.raises(SorterError):
        span.commit(2, 10, 1.0)
    with pytest.raises(SorterError):
        span.commit(2, 9, 1.0)
    span.commit(77, 15, 1.0)  # an unknown xid still consumes its commit_ts
    with pytest.raises(SorterError):
        span.commit(2, 15, 1.0)
    span.commit(2, 16, 1.6)
    assert [r[:2] for r in rows(span)] == [(10, 1.0), (16, 1.6)]


@pytest.mark.parametrize("bad", [-1, 2**64])
def test_ids_must_be_unsigned_64_bit(span: SpanSorter, bad: int) -> None:
    with pytest.raises(ValueError):
        span.add(bad, 1, b"x")
    with pytest.raises(ValueError):
        span.add(1, bad, b"x")
    with pytest.raises(ValueError):
        span.commit(1, bad, 0.0)
    assert span.pending_txns() == 0


def test_large_ids_and_empty_payloads(span: SpanSorter) -> None:
    xid = 2**64 - 1
    span.add(xid, xid, b"")
    span.add(xid, 2**40, b"\x00\xff")
    span.add(xid, xid, b"z" * 10_000)
    span.commit(xid, 2**63, 1e9)
    assert rows(span) == [(2**63, 1e9, b""), (2**63, 1e9, b"\x00\xff"), (2**63, 1e9, b"z" * 10_000)]


def test_spans_are_isolated(sorter: Sorter) -> None:
    a = sorter.span("cf-1/0")
    b = sorter.span("cf-1/1")
    assert sorter.span("cf-1/0") is a
    for i in range(10):
        a.add(5, 5, b"a%d" % i)
        b.add(5, 5, b"b%d" % i)
    a.commit(5, 100, 1.0)
    assert rows(b) == []
    b.commit(5, 50, 0.5)
    assert [r[2] for r in rows(a)] == [b"a%d" % i for i in range(10)]
    assert [r[2] for r in rows(b)] == [b"b%d" % i for i in range(10)]
    a.clean(MAX)
    assert len(rows(b)) == 10
    b.add(6, 6, b"open")
    a.clear()
    assert b.pending_txns() == 1
    assert len(rows(b)) == 10
    assert rows(a) == []


def test_concurrent_read_and_clean_while_puller_adds_and_commits(span: SpanSorter) -> None:
    """Puller thread: interleaved transactions of varying size; sink thread: reads up to the
    published resolved ts and cleans behind itself. Every transaction must arrive whole, in order."""
    n_txns = 300
    resolved = [0]  # last commit_ts whose commit() returned
    done = threading.Event()
    errors: list[BaseException] = []
    expected: dict[int, list[bytes]] = {}

    def puller() -> None:
        try:
            open_xids: list[int] = []
            ts = 0
            for xid in range(1, n_txns + 1):
                size = 1 + (xid * 7) % 23
                for j in range(size):
                    span.add(xid, xid, b"%d:%d" % (xid, j))
                open_xids.append(xid)
                if len(open_xids) == 3 or xid == n_txns:  # commit in reverse start order
                    for x in reversed(open_xids):
                        ts += 10
                        span.commit(x, ts, ts / 1000)
                        expected[ts] = [b"%d:%d" % (x, j) for j in range(1 + (x * 7) % 23)]
                        resolved[0] = ts
                    open_xids.clear()
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)
        finally:
            done.set()

    got: list[tuple[int, float, bytes]] = []

    def sink() -> None:
        try:
            after = 0
            while True:
                finished = done.is_set()
                upto = resolved[0]
                if upto > after:
                    got.extend(tuple(e) for e in span.read(after, upto))  # type: ignore[misc]
                    span.clean(upto)
                    after = upto
                elif finished:
                    return
                else:
                    time.sleep(0.0005)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=puller), threading.Thread(target=sink)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    want = [(ts, ts / 1000, p) for ts in sorted(expected) for p in expected[ts]]
    assert got == want
    assert rows(span) == []


def test_read_txns_groups_each_transaction_with_its_row_count(span: SpanSorter) -> None:
    for i in range(5):
        span.add(1, 1, b"a%d" % i)
    span.add(2, 2, b"b0")
    span.commit(2, 10, 1.0)
    span.commit(1, 20, 2.0)
    span.add(3, 3, b"c0")
    span.commit(3, 30, 3.0)
    got = [(t.commit_ts, t.commit_time, t.rows, list(t.payloads)) for t in span.read_txns(-1, MAX)]
    assert got == [(10, 1.0, 1, [b"b0"]), (20, 2.0, 5, [b"a%d" % i for i in range(5)]), (30, 3.0, 1, [b"c0"])]
    assert all(isinstance(t, SortedTxn) for t in span.read_txns(10, 30))
    assert [t.commit_ts for t in span.read_txns(10, 20)] == [20]
    span.clean(20)
    assert [t.commit_ts for t in span.read_txns(-1, MAX)] == [30]
    assert span.memory_bytes() >= 0


def test_many_transactions_across_segments_read_in_any_window(span: SpanSorter) -> None:
    """Hundreds of transactions (several segments in memory or LevelDB) read in windows and cleaned
    in steps come out exactly once, in order."""
    for t in range(1, 301):
        for i in range(t % 4 + 1):
            span.add(t, t, b"%d-%d-" % (t, i) + b"x" * 50)
        span.commit(t, t * 10, float(t))
    seen: list[bytes] = []
    after = -1
    for upto in (5, 95, 1000, 1005, 2222, 3000):
        for t in span.read_txns(after, upto):
            seen.extend(t.payloads)
        span.clean(after if after >= 0 else 0)
        after = upto
    expected = [b"%d-%d-" % (t, i) + b"x" * 50 for t in range(1, 301) for i in range(t % 4 + 1)]
    assert seen == expected
    span.clean(3000)
    assert list(span.read_txns(-1, MAX)) == []
