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
from sorter.leveldb import LevelDBSorter
from sorter.storage import QUOTA_RECHECK_S, storage_error

pytestmark = pytest.mark.unit

MAX = enc.U64_MAX


def keys_with_prefix(s: LevelDBSorter, prefix: bytes) -> list[bytes]:
    return list(s.storage.db.iterator(prefix=prefix, include_value=False))


def c_keys(s: LevelDBSorter, span_key: str) -> list[bytes]:
    return keys_with_prefix(s, enc.committed_prefix(enc.span_uid(span_key)))


def spill_files(s: LevelDBSorter, span_key: str = "cf/0") -> list[Path]:
    return sorted(s.spill_dir.glob(f"{enc.span_uid(span_key).hex()}-*.spill"))


@pytest.fixture
def s(tmp_path: Path):  # type: ignore[no-untyped-def]
    sorter = LevelDBSorter(tmp_path / "sorter", spill_rows=4, batch_bytes=256)
    yield sorter
    sorter.close()


def test_small_transactions_stay_in_memory_while_the_sink_keeps_up(s: LevelDBSorter) -> None:
    sp = s.span("cf/0")
    sp.add(3, 3, b"a")
    sp.add(3, 4, b"b")
    sp.add(3, 3, b"c")
    sp.abort(3, 4)
    sp.commit(3, 500, 5.5)
    assert [(t.commit_ts, t.commit_time, list(t.payloads)) for t in sp.read_txns(-1, MAX)] == [
        (500, 5.5, [b"a", b"c"])]
    assert c_keys(s, "cf/0") == [] and spill_files(s) == []  # nothing touched the disk
    assert sp.memory_bytes() > 0
    sp.clean(500)
    assert sp.memory_bytes() == 0


def test_a_lagging_sink_moves_committed_segments_into_leveldb(tmp_path: Path) -> None:
    """Committed data beyond half of the memory budget is packed into LevelDB one segment at a time
    (a segment per ~batch_bytes, not a key per row), and comes back in order."""
    s = LevelDBSorter(tmp_path / "sorter", memory_budget=20_000, batch_bytes=2_000)
    sp = s.span("cf/0")
    payload = b"r" * 36  # 100 bytes a row with the bookkeeping overhead
    for t in range(1, 201):
        for i in range(5):
            sp.add(t, t, payload + b"%03d" % i)
        sp.commit(t, t, float(t))
        assert sp.memory_bytes() <= 10_000 + 2_000 + 500
    keys = c_keys(s, "cf/0")
    assert 30 <= len(keys) <= 100  # ~500 bytes a transaction, 4 per segment, the first ~20 in memory
    firsts = [enc.decode_segment_key(k)[1] for k in keys]
    assert firsts == sorted(firsts)
    got = [(t.commit_ts, p) for t in sp.read_txns(-1, MAX) for p in t.payloads]
    assert got == [(t, payload + b"%03d" % i) for t in range(1, 201) for i in range(5)]
    sp.clean(100)
    assert [t.commit_ts for t in sp.read_txns(-1, MAX)] == list(range(101, 201))
    assert len(c_keys(s, "cf/0")) < len(keys)
    sp.clean(200)
    assert c_keys(s, "cf/0") == [] and sp.memory_bytes() == 0
    s.close()


def test_a_spilled_transaction_is_committed_by_reference_to_its_file(s: LevelDBSorter) -> None:
    sp = s.span("cf/0")
    for i in range(10):
        sp.add(7, 7 if i % 2 else 8, b"p%d" % i)
    # two full buffers of 4 appended to one file, two rows still in memory
    (f,) = spill_files(s)
    assert sp.memory_bytes() > 0
    sp.abort(7, 8)  # rows 0..7 of subxid 8 are on disk: recorded with watermark 8
    sp.add(7, 8, b"late")
    sp.commit(7, 1000, 12.5)
    assert spill_files(s) == [f]  # no copy, the memory tail joined the file
    assert sp.memory_bytes() == 0
    (t,) = list(sp.read_txns(-1, MAX))
    assert (t.commit_ts, t.commit_time, t.rows) == (1000, 12.5, 10)  # 8 spilled + p9 + late; p8 dropped in memory
    assert list(t.payloads) == [b"p1", b"p3", b"p5", b"p7", b"p9", b"late"]
    assert c_keys(s, "cf/0") == []
    sp.clean(999)
    assert f.exists()
    sp.clean(1000)
    assert not f.exists()


def test_a_reused_xid_gets_a_new_spill_file(s: LevelDBSorter) -> None:
    sp = s.span("cf/0")
    for ts, xid in ((10, 1), (20, 2), (30, 1)):
        for i in range(5):
            sp.add(xid, xid, b"%d-%d" % (ts, i))
        sp.commit(xid, ts, 0.0)
    assert len(spill_files(s)) == 3
    assert [p for t in sp.read_txns(20, MAX) for p in t.payloads] == [b"30-%d" % i for i in range(5)]


def test_top_level_abort_and_clear_remove_spill_files_and_segments(tmp_path: Path) -> None:
    s = LevelDBSorter(tmp_path / "sorter", spill_rows=4, memory_budget=2, batch_bytes=1)
    sp = s.span("cf/0")
    other = s.span("cf/1")
    other.add(1, 1, b"keep")
    other.commit(1, 5, 0.5)
    for i in range(10):
        sp.add(1, 1, b"a%d" % i)
        sp.add(2, 2, b"b%d" % i)
    assert len(spill_files(s)) == 2
    sp.abort(1, 1)
    assert len(spill_files(s)) == 1
    sp.add(3, 3, b"c")
    sp.commit(3, 10, 1.0)
    sp.commit(2, 20, 2.0)
    assert c_keys(s, "cf/0") != [] or spill_files(s) != []
    sp.clear()
    assert c_keys(s, "cf/0") == [] and spill_files(s) == [] and sp.memory_bytes() == 0
    assert [p for t in other.read_txns(-1, MAX) for p in t.payloads] == [b"keep"]
    s.close()


def test_memory_budget_spills_many_small_open_transactions(tmp_path: Path) -> None:
    s = LevelDBSorter(tmp_path / "sorter", spill_rows=1000, memory_budget=20_000)
    sp = s.span("cf/0")
    for xid in range(1, 201):  # 200 open transactions, 1 row each, ~164 bytes of budget per row
        sp.add(xid, xid, b"x" * 100)
        assert sp.memory_bytes() <= 10_000 + 164
    assert len(spill_files(s)) > 100
    for xid in range(1, 201):
        sp.commit(xid, xid, 0.0)
    assert [e.commit_ts for e in sp.read(-1, MAX)] == list(range(1, 201))
    sp.clean(MAX)
    assert spill_files(s) == [] and c_keys(s, "cf/0") == []
    s.close()


def test_fresh_open_wipes_what_a_previous_process_left(tmp_path: Path) -> None:
    path = tmp_path / "sorter"
    s = LevelDBSorter(path, spill_rows=2, memory_budget=300, batch_bytes=1)
    sp = s.span("cf/0")
    for i in range(5):
        sp.add(1, 1, b"c%d" % i)
    sp.commit(1, 10, 1.0)
    for t in range(20, 25):  # beyond half of the budget: packed into LevelDB
        sp.add(2, 2, b"small")
        sp.commit(2, t, 2.0)
    for i in range(5):
        sp.add(3, 3, b"stale%d" % i)  # spilled, never committed
    assert c_keys(s, "cf/0") and spill_files(s)
    s.close()
    with pytest.raises(SorterError):
        sp.commit(4, 40, 3.0)

    s = LevelDBSorter(path, fresh=True)
    assert c_keys(s, "cf/0") == [] and spill_files(s) == []
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
    now = [0.0]
    s = LevelDBSorter(tmp_path / "sorter", spill_rows=100, disk_quota=10_000_000, batch_bytes=1,
                      clock=lambda: now[0])
    sp = s.span("cf/0")
    sp.add(1, 1, b"ok")
    sp.commit(1, 10, 1.0)
    s.disk_quota = 1  # now over quota
    now[0] += QUOTA_RECHECK_S  # the next check measures the disk use again
    for i in range(99):
        sp.add(2, 2, b"%d" % i)  # buffering in memory needs no disk
    with pytest.raises(DiskFull, match="quota"):
        sp.add(2, 2, b"99")  # would spill
    assert sp.pending_txns() == 1 and spill_files(s) == []
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
    full = storage_error(
        plyvel.IOError("IO error: /data/sorter/000005.log: No space left on device"), path, "x"
    )
    assert isinstance(full, DiskFull) and "/data/sorter" in str(full)
    assert "free there" in str(full) and "--data-dir" in str(full)
    assert "needed 4096 bytes" in str(storage_error(OSError(28, "ENOSPC"), path, "x", 4096))
    assert isinstance(storage_error(OSError(28, "ENOSPC"), path, "x"), DiskFull)
    other = storage_error(plyvel.CorruptionError("Corruption: bad block"), path, "read")
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
    assert "the write needed" in out.stdout and "bytes free there" in out.stdout, out.stdout


def test_clean_gives_disk_space_back(tmp_path: Path) -> None:
    s = LevelDBSorter(tmp_path / "sorter", write_buffer_size=1 << 20, compact_after_bytes=1 << 20,
                      memory_budget=2 << 20)
    sp = s.span("cf/0")
    noise = random.Random(1).randbytes(1 << 20)  # incompressible 1 KB rows
    for ts in range(1, 21):
        for j in range(1000):
            sp.add(ts, ts, noise[j * 1000 : j * 1000 + 1000])
        sp.commit(ts, ts, float(ts))
    s.storage.db.compact_range()
    full = s.disk_bytes()
    assert full > 10 << 20
    sp.clean(20)
    assert s.disk_bytes() < full / 4
    assert list(sp.read(-1, MAX)) == []
    s.close()


def test_memory_stays_bounded_for_a_huge_streamed_transaction(tmp_path: Path) -> None:
    """~100 MB in one transaction, with a subtransaction abort, must not grow the Python heap
    (it holds a few MB at most with these settings; without spilling it would hold > 100 MB)."""
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
    assert c_keys(s, "cf/0") == []  # a spill file, not LevelDB
    sp.clean(100)
    assert spill_files(s) == []
    s.close()


def test_clear_deletes_segments_in_bounded_batches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sorter.storage as mod

    monkeypatch.setattr(mod, "DELETE_BATCH_KEYS", 3)
    s = LevelDBSorter(tmp_path / "sorter", memory_budget=300, batch_bytes=1)  # pack from the 3rd commit
    sp, other = s.span("cf/0"), s.span("cf/1")
    for t in range(1, 11):
        sp.add(t, t, b"p%d" % t)
        sp.commit(t, 10 * t, float(t))
    other.add(1, 1, b"other")
    other.commit(1, 10, 1.0)
    assert len(c_keys(s, "cf/0")) >= 7
    sp.clear()
    assert c_keys(s, "cf/0") == [] and list(sp.read(-1, MAX)) == []
    assert [p for t in other.read_txns(-1, MAX) for p in t.payloads] == [b"other"]
    s.close()


def test_span_memory_budget_comes_from_the_caller_and_can_change(tmp_path: Path) -> None:
    """The processor passes memory-quota / span-count: a span with a small budget packs its committed
    transactions into LevelDB, one with a large budget keeps them in memory."""
    s = LevelDBSorter(tmp_path / "sorter", batch_bytes=1_000)
    small, large = s.span("cf/0", memory_budget=4_000), s.span("cf/1", memory_budget=10 << 20)
    for sp in (small, large):
        for t in range(1, 101):
            sp.add(t, t, b"z" * 100)
            sp.commit(t, t, float(t))
    assert len(c_keys(s, "cf/0")) > 5 and c_keys(s, "cf/1") == []
    assert small.memory_bytes() < 4_000 and large.memory_bytes() > 10_000
    assert s.span("cf/1", memory_budget=2_000) is large  # same object, new budget
    for t in range(101, 201):
        large.add(t, t, b"z" * 100)
        large.commit(t, t, float(t))
    assert c_keys(s, "cf/1") != []
    assert [t.commit_ts for t in large.read_txns(-1, MAX)] == list(range(1, 201))
    with pytest.raises(ValueError):
        s.span("cf/2", memory_budget=0)
    s.close()


def test_leveldb_recovers_from_running_out_of_space_at_the_next_span_start(tmp_path: Path) -> None:
    """LevelDB's out-of-space error is sticky (every later write fails, even once space is back): the
    sorter reopens the database at the next span start, keeping what it holds. The file size limit
    stands in for a full disk; child process because the limit applies to the whole process."""
    code = textwrap.dedent(
        f"""
        import os, resource, signal, sys
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        from cdc.errors import DiskFull
        from sorter.leveldb import LevelDBSorter
        s = LevelDBSorter({str(tmp_path / "sorter")!r}, memory_budget=1 << 16, batch_bytes=1,
                          write_buffer_size=1 << 16)
        other = s.span("cf/1")
        other.add(1, 1, b"kept")
        other.commit(1, 5, 1.0)  # another span of the capture: a reopen must not disturb it
        sp = s.span("cf/0")
        # above the 64 KB write-ahead logs (a failed log append is not sticky), so the first failure is a
        # MANIFEST or table file write: LevelDB's sticky background error
        resource.setrlimit(resource.RLIMIT_FSIZE, (70_000, resource.RLIM_INFINITY))
        ts = 10
        try:
            for i in range(1_000_000):
                sp.add(i, i, os.urandom(1000))
                sp.commit(i, ts, 1.0)
                ts += 1
            print("NO ERROR"); sys.exit(1)
        except DiskFull as e:
            print("DISKFULL", e)
        resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        sp = s.span("cf/0")  # the span restarts: reopen, then clear
        sp.clear()
        for i in range(200):
            sp.add(i, i, b"y" * 1000)
            sp.commit(i, 100 + i, 1.0)
        assert sum(1 for _ in sp.read(-1, 2**64 - 1)) == 200
        assert [e.payload for e in s.span("cf/1").read(-1, 2**64 - 1)] == [b"kept"]
        print("RECOVERED")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).parents[3])
    assert out.returncode == 0 and "DISKFULL" in out.stdout and "RECOVERED" in out.stdout, out.stdout + out.stderr
