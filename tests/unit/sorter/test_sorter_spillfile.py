"""Spill files: append in chunks, read back in order, skip rolled-back subtransactions, fail loudly
on truncation."""

from pathlib import Path

import pytest

from sorter.spillfile import SpillFile

pytestmark = pytest.mark.unit


def test_chunks_read_back_in_append_order(tmp_path: Path) -> None:
    f = SpillFile(tmp_path / "t.spill")
    f.append([], [])  # nothing to write: no file
    assert not f.path.exists()
    f.append([1, 1], [b"a", b"b"])
    f.append([1], [b"c" * 100_000])
    assert f.records == 3 and f.nbytes == f.path.stat().st_size
    assert list(f.read()) == [b"a", b"b", b"c" * 100_000]
    assert list(f.read({})) == list(f.read())  # readable again
    f.unlink()
    f.unlink()  # missing is fine
    assert not f.path.exists()


def test_rolled_back_subtransactions_are_skipped_below_their_watermark(tmp_path: Path) -> None:
    f = SpillFile(tmp_path / "t.spill")
    f.append([1, 2, 2, 3], [b"t0", b"s1", b"s2", b"u3"])
    watermark = f.records  # subxid 2 rolled back now: its 2 records so far are dropped
    f.append([2, 1, 3], [b"s4-later", b"t5", b"u6"])
    assert list(f.read({2: watermark})) == [b"t0", b"u3", b"s4-later", b"t5", b"u6"]
    assert list(f.read({2: watermark, 3: 7})) == [b"t0", b"s4-later", b"t5"]


@pytest.mark.parametrize("cut", [1, 5, 9, 30])
def test_a_truncated_file_raises(tmp_path: Path, cut: int) -> None:
    f = SpillFile(tmp_path / "t.spill")
    f.append([1, 1], [b"abc", b"defgh"])
    data = f.path.read_bytes()
    f.path.write_bytes(data[: len(data) - cut] if cut < len(data) else data[:1])
    with pytest.raises(ValueError, match="truncated"):
        list(f.read())
