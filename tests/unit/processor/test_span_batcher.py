"""TxnBatcher: whole transactions per batch, at least max_rows rows unless the stream ends, ``last`` is the
watermark of the last transaction handed out."""

from __future__ import annotations

from typing import Any

import pytest

from cdc.ts import Watermark
from processor.span import TxnBatcher
from sorter.base import SortedEntry

pytestmark = pytest.mark.unit


def entries(sizes: list[int]) -> list[SortedEntry]:
    out = []
    for i, n in enumerate(sizes):
        ts = 100 + 10 * i
        out += [SortedEntry(ts, ts / 10, f"{ts}:{j}".encode()) for j in range(n)]
    return out


def drain(b: TxnBatcher) -> tuple[list[Any], Watermark | None, bool]:
    rows = list(b.next_batch())
    return rows, b.last, b.batch_complete


def test_batches_are_whole_transactions() -> None:
    es = entries([3, 1, 4, 2, 5])
    b = TxnBatcher(es, lambda e: e.payload, max_rows=4)
    got = []
    while b.has_more():
        rows, last, complete = drain(b)
        assert complete and last is not None
        got.append((rows, last))
    # 3+1 reach 4 rows; 4 alone; 2+5 (the 5-row transaction is never split)
    assert [len(r) for r, _ in got] == [4, 4, 7]
    assert [w for _, w in got] == [Watermark(110, 11.0), Watermark(120, 12.0), Watermark(140, 14.0)]
    assert [p for r, _ in got for p in r] == [e.payload for e in es]


def test_one_huge_transaction_is_one_batch() -> None:
    b = TxnBatcher(entries([50]), lambda e: e.commit_ts, max_rows=1)
    rows, last, complete = drain(b)
    assert len(rows) == 50 and last == Watermark(100, 10.0) and complete and not b.has_more()


def test_partially_consumed_batch_is_not_complete() -> None:
    b = TxnBatcher(entries([2, 2]), lambda e: e.payload, max_rows=10)
    it = b.next_batch()
    next(it)
    assert not b.batch_complete and b.last == Watermark(100, 10.0)
    assert len(list(it)) == 3 and b.batch_complete and b.last == Watermark(110, 11.0)


def test_empty_stream() -> None:
    b = TxnBatcher([], lambda e: e, max_rows=10)
    assert not b.has_more()
    assert drain(b) == ([], None, True)
