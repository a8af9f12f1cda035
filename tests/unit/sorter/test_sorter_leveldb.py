"""LevelDB-specific behaviour: on-disk layout, spilling, memory bound, reopening, quotas, I/O errors.

The shared contract is tested in test_sorter_contract.py against this sorter and the memory twin.
"""

import random
import subprocess
import sys
import textwrap
import tracemalloc
from pathlib import Path

import plyvel
import pytest

from cdc.errors import DiskFull, SorterError
from sorter import encoding as enc
from sorter.leveldb import LevelDBSorter, _storage_error

pytestmark = pytest.mark.unit

MAX = enc.U64_MAX


def keys_with_prefix(s: LevelDBSorter, prefix: bytes) -> list[bytes]:
    return list(s.db.iterator(prefix=prefix, include_value=False))


def u_keys(s: LevelDBSorter, span_key: str) -> list[bytes]:
    return keys_with_prefix(s, enc.spill_area_prefix(enc.span_uid(span_key)))


def s_keys(s: LevelDBSorter, span_key: str) -> list[bytes]:
    return keys_with_prefix(s, enc.spill_refs_prefix(enc.span_uid(span_key)))


def c_keys(s: LevelDBSorter, span_key: str) -> list[bytes]:
    return keys_with_prefix(s, enc.committed_prefix(enc.span_uid(span_key)))


@pytest.fixture
def s(tmp_path: Path):  # type: ignore[no-untyped-def]
    sorter = LevelDBSorter(tmp_path / "sorter", spill_rows=4, batch_bytes=256)
    yield sorter
    sorter.close()


def test_layout_of_a_small_transaction(s: LevelDBSorter) -> None:
    sp = s.span("cf/0")
    sp.add(3, 3, b"a")
    sp.add(3, 4, b"b")
    sp.add(3, 3, b"c")
    sp.abort(3, 4)
    sp.commit(3, 500, 5.5)
    sp.read(0, 1).close()  # writes the pending batch
    committed = c_keys(s, "cf/0")
    assert [enc.decode_committed_key(k)[1:] for k in committed] == [(500, 0), (500, 1), (500, 2)]
    assert enc.decode_header_value(s.db.get(committed[0])) == (5.5, 3, None, {})
    assert [s.db.get(k) for k in committed[1:]] == [b"a", b"c"]
    assert u_keys(s, "cf/0") == [] and s_keys(s, "cf/0") == []


def test_layout_of_a_spilled_transaction_committed_by_reference(s: LevelDBSorter) -> None:
    sp = s.span("cf/0")
    for i in range(10):
        sp.add(7, 7 if i % 2 else 8, b"p%d" % i)
    # two full buffers of 4 spilled under serial 0, two rows still in memory
    spilled = u_keys(s, "cf/0")
    assert [enc.decode_spill_key(k)[1:] for k in spilled] == [(0, i) for i in range(8)]
    assert enc.decode_spill_value(s.db.get(spilled[1])) == (7, b"p1")
    assert sp.memory_bytes() > 0
    sp.abort(7, 8)  # rows 0..7 of subxid 8 are on disk: recorded with watermark 8
    sp.add(7, 8, b"late")
    sp.commit(7, 1000, 12.5)
    assert sp.memory_bytes() > 0  # the header waits in the pending batch ...
    assert [e.payload for e in sp.read(-1, MAX)] == [b"p1", b"p3", b"p5", b"p7", b"p9", b"late"]
    assert sp.memory_bytes() == 0  # ... until the sink reads
    committed = c_keys(s, "cf/0")
    assert [enc.decode_committed_key(k)[1:] for k in committed] == [(1000, 0)]  # no copy
    assert enc.decode_header_value(s.db.get(committed[0])) == (12.5, 7, 0, {8: 8})
    assert len(u_keys(s, "cf/0")) == 10  # 8 spilled + the memory tail (p9, late) spilled at commit
    assert s_keys(s, "cf/0") == [enc.spill_ref_key(enc.span_uid("cf/0"), 1000)]
    sp.clean(999)
    assert len(u_keys(s, "cf/0")) == 10
    sp.clean(1000)
    assert c_keys(s, "cf/0") == [] and u_keys(s, "cf/0") == [] and s_keys(s, "cf/0") == []


def test_spill_serials_are_never_reused(s: LevelDBSorter) -> None:
    sp = s.span("cf/0")
    for ts, xid in ((10, 1), (20, 2), (30, 1)):  # xid 1 twice: a reused xid gets a new range
        for i in range(5):
            sp.add(xid, xid, b"%d" % i)
        sp.commit(xid, ts, 0.0)
    assert sorted({enc.decode_spill_key(k)[1] for k in u_keys(s, "cf/0")}) == [0, 1, 2]


def test_top_level_abort_and_clear_remove_spilled_rows(s: LevelDBSorter) -> None:
    sp = s.span("cf/0")
    for i in range(10):
        sp.add(1, 1, b"a%d" % i)
        sp.add(2, 2, b"b%d" % i)
    assert len(u_keys(s, "cf/0")) == 16
    sp.abort(1, 1)
    assert {enc.decode_spill_key(k)[1] for k in u_keys(s, "cf/0")} == {1}  # xid 2 has serial 1
    sp.add(3, 3, b"c")
    sp.commit(3, 10, 1.0)
    for i in range(5):
        sp.add(4, 4, b"d%d" % i)
    sp.commit(4, 20, 2.0)
    sp.read(0, 1).close()
    assert s_keys(s, "cf/0") != []
    sp.clear()
    assert u_keys(s, "cf/0") == [] and c_keys(s, "cf/0") == [] and s_keys(s, "cf/0") == []
    assert sp.memory_bytes() == 0


def test_memory_budget_spills_many_small_open_transactions(tmp_path: Path) -> None:
    s = LevelDBSorter(tmp_path / "sorter", spill_rows=1000, memory_budget=10_000)
    sp = s.span("cf/0")
    for xid in range(1, 201):  # 200 open transactions, 1 row each, ~164 bytes of budget per row
        sp.add(xid, xid, b"x" * 100)
        assert sp.memory_bytes() <= 10_000 + 164
    assert len(u_keys(s, "cf/0")) > 100
    for xid in range(1, 201):
        sp.commit(xid, xid, 0.0)
    assert [e.commit_ts for e in sp.read(-1, MAX)] == list(range(1, 201))
    sp.clean(MAX)
    assert u_keys(s, "cf/0") == [] and c_keys(s, "cf/0") == [] and s_keys(s, "cf/0") == []
    s.close()


def test_changes_without_a_header_are_not_visible(s: LevelDBSorter) -> None:
    """A spilled commit writes its header last: a reader's snapshot taken in between must see
    nothing of that transaction (simulated by writing the changes only)."""
    sp = s.span("cf/0")
    sp.add(1, 1, b"whole")
    sp.commit(1, 10, 1.0)
    uid = enc.span_uid("cf/0")
    s.db.put(enc.committed_key(uid, 20, 1), b"partial-1")
    s.db.put(enc.committed_key(uid, 20, 2), b"partial-2")
    sp.add(3, 3, b"after")
    sp.commit(3, 30, 3.0)
    assert [e.payload for e in sp.read(-1, MAX)] == [b"whole", b"after"]


def test_small_commits_share_a_pending_batch_visible_to_read(tmp_path: Path) -> None:
    s = LevelDBSorter(tmp_path / "sorter", batch_bytes=1 << 20)
    sp = s.span("cf/0")
    sp.add(1, 1, b"one")
    sp.commit(1, 10, 1.0)
    assert c_keys(s, "cf/0") == []  # not yet written ...
    assert [e.payload for e in sp.read(0, 10)] == [b"one"]  # ... but read writes it out first
    assert len(c_keys(s, "cf/0")) == 2
    s.close()


def test_reopen_keeps_committed_data_unless_fresh(tmp_path: Path) -> None:
    path = tmp_path / "sorter"
    s = LevelDBSorter(path, spill_rows=2)
    sp = s.span("cf/0")
    for i in range(5):
        sp.add(1, 1, b"c%d" % i)
    sp.commit(1, 10, 1.0)
    for i in range(5):
        sp.add(2, 2, b"stale%d" % i)  # spilled, never committed
    s.close()
    with pytest.raises(SorterError):
        sp.read(-1, MAX)

    s = LevelDBSorter(path, spill_rows=2)
    sp = s.span("cf/0")
    assert [e.payload for e in sp.read(-1, MAX)] == [b"c%d" % i for i in range(5)]
    # stale spilled rows of xid 2 from the previous process do not join a new xid 2
    for i in range(3):
        sp.add(2, 2, b"new%d" % i)
    sp.commit(2, 20, 2.0)
    assert [e.payload for e in sp.read(10, MAX)] == [b"new%d" % i for i in range(3)]
    s.close()

    s = LevelDBSorter(path, fresh=True)
    assert c_keys(s, "cf/0") == []
    assert list(s.span("cf/0").read(-1, MAX)) == []
    s.close()


def test_second_open_of_the_same_directory_fails_clearly(s: LevelDBSorter) -> None:
    with pytest.raises(SorterError, match=str(s.path)):
        LevelDBSorter(s.path)


def test_closed_sorter_refuses_work(s: LevelDBSorter) -> None:
    sp = s.span("cf/0")
    s.close()
    s.close()  # idempotent
    with pytest.raises(SorterError):
        s.span("cf/1")
    sp.add(1, 1, b"x")
    with pytest.raises(SorterError):
        sp.commit(1, 10, 1.0)
    with pytest.raises(SorterError):
        sp.read(-1, MAX)


def test_disk_quota_refuses_before_changing_anything(tmp_path: Path) -> None:
    s = LevelDBSorter(tmp_path / "sorter", spill_rows=100, disk_quota=10_000_000, batch_bytes=1)
    sp = s.span("cf/0")
    sp.add(1, 1, b"ok")
    sp.commit(1, 10, 1.0)
    s.disk_quota = 1  # now over quota
    s._quota_checked_at = float("-inf")
    for i in range(99):
        sp.add(2, 2, b"%d" % i)  # buffering in memory needs no disk
    with pytest.raises(DiskFull, match="quota"):
        sp.add(2, 2, b"99")  # would spill
    with pytest.raises(DiskFull):
        sp.commit(2, 20, 2.0)
    assert sp.pending_txns() == 1
    assert [e.payload for e in sp.read(-1, MAX)] == [b"ok"]  # reading and cleaning still work
    sp.clean(10)
    s.disk_quota = 0  # the sink caught up; the puller retries the same calls
    sp.add(2, 2, b"99")
    sp.commit(2, 20, 2.0)
    assert [e.payload for e in sp.read(-1, MAX)] == [b"%d" % i for i in range(100)]
    assert DiskFull.retryable
    s.close()


def test_storage_errors_are_translated_with_the_path() -> None:
    path = Path("/data/sorter")
    full = _storage_error(
        plyvel.IOError("IO error: /data/sorter/000005.log: No space left on device"), path, "x"
    )
    assert isinstance(full, DiskFull) and "/data/sorter" in str(full)
    assert isinstance(_storage_error(OSError(28, "ENOSPC"), path, "x"), DiskFull)
    other = _storage_error(plyvel.CorruptionError("Corruption: bad block"), path, "read")
    assert type(other) is SorterError and "/data/sorter" in str(other) and "bad block" in str(other)


def test_real_write_failure_raises_disk_full(tmp_path: Path) -> None:
    """LevelDB hitting a file size limit (EFBIG, like a full disk) surfaces as DiskFull naming the path.
    Runs in a child process because the limit applies to the whole process."""
    code = textwrap.dedent(
        f"""
        import resource, signal, sys
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        from cdc.errors import DiskFull
        from sorter.leveldb import LevelDBSorter
        s = LevelDBSorter({str(tmp_path / "sorter")!r}, spill_rows=64)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
        sp = s.span("cf/0")
        try:
            for i in range(100_000):
                sp.add(1, 1, b"x" * 1000)
        except DiskFull as e:
            print("DISKFULL", e)
            sys.exit(0)
        print("NO ERROR")
        sys.exit(1)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).parents[3],
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "DISKFULL" in out.stdout and str(tmp_path / "sorter") in out.stdout


def test_clean_gives_disk_space_back(tmp_path: Path) -> None:
    s = LevelDBSorter(tmp_path / "sorter", write_buffer_size=1 << 20, compact_after_bytes=1 << 20)
    sp = s.span("cf/0")
    noise = random.Random(1).randbytes(1 << 20)  # incompressible 1 KB rows
    for ts in range(1, 21):
        for j in range(1000):
            sp.add(ts, ts, noise[j * 1000 : j * 1000 + 1000])
        sp.commit(ts, ts, float(ts))
    sp.read(0, 1).close()  # write the pending batch
    s.db.compact_range()
    full = s.disk_bytes()
    assert full > 10 << 20
    sp.clean(20)
    assert s.disk_bytes() < full / 4
    assert list(sp.read(-1, MAX)) == []
    s.close()


def test_memory_stays_bounded_for_a_huge_streamed_transaction(tmp_path: Path) -> None:
    """~100 MB in one transaction, with a subtransaction abort, must not grow the Python heap
    (it holds 0.5 MB at most with these settings; without spilling it would hold > 100 MB)."""
    n, size = 100_000, 1000
    s = LevelDBSorter(tmp_path / "sorter", spill_rows=512, batch_bytes=1 << 20, write_buffer_size=4 << 20)
    sp = s.span("cf/0")
    chunk = b"y" * (size - 8)
    tracemalloc.start()
    try:
        for i in range(n):
            sub = 1 if i % 10 else 2  # every tenth row belongs to subtransaction 2
            sp.add(1, sub, b"%08d" % i + chunk)
        sp.abort(1, 2)
        sp.commit(1, 100, 1.0)
        count = 0
        last = -1
        for e in sp.read(-1, MAX):
            i = int(e.payload[:8])
            assert i > last and i % 10
            last = i
            count += 1
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert count == n - n // 10
    assert peak < 20 << 20, f"peak Python heap {peak / 1e6:.1f} MB"
    sp.clean(100)
    assert u_keys(s, "cf/0") == []
    s.close()


@pytest.mark.parametrize("txn_rows", [1, 2, 3, 4, 7])
def test_clean_deletes_ranges_in_bounded_batches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 txn_rows: int) -> None:
    """Ranges shorter than, equal to and longer than one delete batch are removed whole; later ones stay."""
    import sorter.leveldb as mod

    monkeypatch.setattr(mod, "_DELETE_BATCH_KEYS", 3)
    s = LevelDBSorter(tmp_path / "sorter")
    sp = s.span("cf/0")
    for t in range(1, 4):  # three transactions of txn_rows rows each, Ts 10, 20, 30
        for i in range(txn_rows):
            sp.add(t, t, b"p%d-%d" % (t, i))
        sp.commit(t, 10 * t, float(t))
    sp.clean(20)
    assert [e.payload for e in sp.read(0, MAX)] == [b"p3-%d" % i for i in range(txn_rows)]
    assert len(c_keys(s, "cf/0")) == txn_rows + 1  # the rows and the header of Ts 30
    sp.clean(30)
    assert c_keys(s, "cf/0") == [] and list(sp.read(0, MAX)) == []
    s.close()
