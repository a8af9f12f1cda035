"""spark_jobs.verify.verdict: one table's verdict from its chunks. A row read in another key range downstream (a
target whose key order differs) is no difference; a key missing from one range and extra in another with other
values is one different key; target rows no range read make a note (never equal); the listed keys are capped."""

from __future__ import annotations

import pytest

from cdc.verify import DIFFERENT, EXTRA, MISSING, ChunkSum, RowDiff
from spark_jobs.verify import verdict
from spark_jobs.verify_chunk import ChunkDrill

pytestmark = pytest.mark.unit


def sums(*rows: tuple[int, int]) -> list[ChunkSum]:
    return [ChunkSum("public.t", i, s, 1, t, 2 if s != t else 1) for i, (s, t) in enumerate(rows)]


def test_a_row_in_another_range_is_matched_by_its_hash() -> None:
    drills = [ChunkDrill("public.t", 0, (RowDiff(MISSING, ("b",), (), 11),)),
              ChunkDrill("public.t", 1, (RowDiff(EXTRA, ("b",), (), 11),))]
    v = verdict("public.t", sums((2, 1), (1, 2)), drills, 3, cap=10)
    assert v.equal and (v.source_rows, v.target_rows, v.chunks_differing) == (3, 3, 2)


def test_the_same_key_with_other_values_in_another_range_is_different() -> None:
    drills = [ChunkDrill("public.t", 0, (RowDiff(MISSING, ("b",), (), 11),)),
              ChunkDrill("public.t", 1, (RowDiff(EXTRA, ("b",), (), 12),))]
    v = verdict("public.t", sums((2, 1), (1, 2)), drills, 3, cap=10)
    assert [(d.kind, d.key) for d in v.diffs] == [(DIFFERENT, ("b",))] and v.different == 1 and not v.equal


def test_target_rows_no_range_read_are_a_note() -> None:
    v = verdict("public.t", [ChunkSum("public.t", 0, 5, 9, 5, 9)], [], 6, cap=10)
    assert not v.equal and "holds 6 rows but its key ranges read 5" in v.note


def test_keys_beyond_the_cap_are_counted() -> None:
    drills = [ChunkDrill("public.t", 0, tuple(RowDiff(MISSING, (str(i),), (), i) for i in range(7)))]
    v = verdict("public.t", [ChunkSum("public.t", 0, 7, 1, 0, 0)], drills, 0, cap=3)
    assert (v.missing, len(v.diffs), v.more) == (7, 3, 4)
