"""TxnBatcher: whole transactions per batch, at least max_rows rows unless the stream ends, ``last`` is the
watermark of the last transaction handed out."""

from __future__ import annotations

from typing import Any

import pytest

from cdc.ts import Watermark
from processor.span import TxnBatcher
from sorter.base import SortedTxn

pytestmark = pytest.mark.unit


def entries(sizes: list[int]) -> list[SortedTxn]:
    out = []
    for i, n in enumerate(sizes):
        ts = 100 + 10 * i
        out.append(SortedTxn(ts, ts / 10, n, [f"{ts}:{j}".encode() for j in range(n)]))
    return out


def payload(p: bytes, ts: int, time: float) -> bytes:
    return p


def drain(b: TxnBatcher) -> tuple[list[Any], Watermark | None, bool]:
    rows = list(b.next_batch())
    return rows, b.last, b.batch_complete


def test_batches_are_whole_transactions() -> None:
    es = entries([3, 1, 4, 2, 5])
    b = TxnBatcher(es, payload, max_rows=4)
    got = []
    while b.has_more():
        rows, last, complete = drain(b)
        assert complete and last is not None
        got.append((rows, last))
    # 3+1 reach 4 rows; 4 alone; 2+5 (the 5-row transaction is never split)
    assert [len(r) for r, _ in got] == [4, 4, 7]
    assert [w for _, w in got] == [Watermark(110, 11.0), Watermark(120, 12.0), Watermark(140, 14.0)]
    assert [p for r, _ in got for p in r] == [p for t in es for p in t.payloads]


def test_one_huge_transaction_is_one_batch() -> None:
    b = TxnBatcher(entries([50]), lambda p, ts, tm: ts, max_rows=1)
    rows, last, complete = drain(b)
    assert len(rows) == 50 and last == Watermark(100, 10.0) and complete and not b.has_more()


def test_partially_consumed_batch_is_not_complete() -> None:
    b = TxnBatcher(entries([2, 2]), payload, max_rows=10)
    it = b.next_batch()
    next(it)
    assert not b.batch_complete and b.last == Watermark(100, 10.0)
    assert len(list(it)) == 3 and b.batch_complete and b.last == Watermark(110, 11.0)


def test_empty_stream() -> None:
    b = TxnBatcher([], payload, max_rows=10)
    assert not b.has_more()
    assert drain(b) == ([], None, True)


def test_lazy_payloads_of_a_spilled_transaction_are_consumed_in_order() -> None:
    """A transaction read from disk gives a one-shot iterator and an upper bound of its rows."""
    txns = [SortedTxn(100, 1.0, 5, iter([b"a", b"b", b"c"])), SortedTxn(200, 2.0, 1, [b"d"])]
    b = TxnBatcher(txns, lambda p, ts, tm: (ts, tm, p), max_rows=4)
    assert drain(b) == ([(100, 1.0, b"a"), (100, 1.0, b"b"), (100, 1.0, b"c")], Watermark(100, 1.0), True)
    assert drain(b) == ([(200, 2.0, b"d")], Watermark(200, 2.0), True)
