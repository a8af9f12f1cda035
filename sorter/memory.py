"""In-memory sorter: the twin of ``sorter.leveldb`` with the same semantics, for tests of other components.

Nothing spills, so memory is *not* bounded; use it only where the data is small. Semantics (ordering,
aborts, visibility, validation, threading) are those of ``sorter.base``: the same contract tests run
against both implementations.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterator

from cdc.errors import SorterError
from sorter.base import SortedTxn, Sorter, SpanSorter
from sorter.encoding import U64_MAX, check_range, check_u64

_ROW_OVERHEAD = 64  # rough per-row bookkeeping, as in the LevelDB sorter


class _OpenTxn:
    __slots__ = ("entries", "nbytes")

    def __init__(self) -> None:
        self.entries: list[tuple[int, bytes]] = []
        self.nbytes = 0


class MemorySpanSorter(SpanSorter):
    """One span's sorter held in dicts and lists.

    Thread-safety: open transactions are touched only by the puller thread; the committed list is
    guarded by a lock, and ``read`` copies references to the transactions in range at the call.
    """

    def __init__(self, span_key: str) -> None:
        self.span_key = span_key
        self._open: dict[int, _OpenTxn] = {}
        self._open_bytes = 0
        self._last_commit_ts = -1
        self._lock = threading.Lock()
        # committed transactions, ascending commit_ts; _ts mirrors the commit_ts column for bisect
        self._ts: list[int] = []
        self._txns: list[SortedTxn] = []
        self._committed_bytes = 0

    def add(self, xid: int, subxid: int, payload: bytes) -> None:
        if not (0 <= xid <= U64_MAX and 0 <= subxid <= U64_MAX):
            check_u64("xid", xid)
            check_u64("subxid", subxid)
        txn = self._open.get(xid)
        if txn is None:
            txn = self._open[xid] = _OpenTxn()
        txn.entries.append((subxid, payload))
        n = len(payload) + _ROW_OVERHEAD
        txn.nbytes += n
        self._open_bytes += n

    def abort(self, xid: int, subxid: int) -> None:
        txn = self._open.get(xid)
        if txn is None:
            return
        if subxid == xid:
            del self._open[xid]
            self._open_bytes -= txn.nbytes
            self.aborted_rows += len(txn.entries)
            self.aborted_bytes += txn.nbytes - _ROW_OVERHEAD * len(txn.entries)
            return
        kept = [e for e in txn.entries if e[0] != subxid]
        if len(kept) != len(txn.entries):
            dropped = sum(len(p) + _ROW_OVERHEAD for s, p in txn.entries if s == subxid)
            self.aborted_rows += len(txn.entries) - len(kept)
            self.aborted_bytes += dropped - _ROW_OVERHEAD * (len(txn.entries) - len(kept))
            txn.entries = kept
            txn.nbytes -= dropped
            self._open_bytes -= dropped

    def commit(self, xid: int, commit_ts: int, commit_time: float) -> None:
        check_u64("commit_ts", commit_ts)
        if commit_ts <= self._last_commit_ts:
            raise SorterError(
                f"span {self.span_key}: commit_ts {commit_ts} does not follow {self._last_commit_ts}"
            )
        txn = self._open.pop(xid, None)
        self._last_commit_ts = commit_ts
        if txn is None:
            return
        self._open_bytes -= txn.nbytes
        if not txn.entries:
            return
        payloads = [p for _, p in txn.entries]
        nbytes = txn.nbytes - _ROW_OVERHEAD * len(payloads)
        self.in_rows += len(payloads)
        self.in_bytes += nbytes
        with self._lock:
            self._ts.append(commit_ts)
            self._txns.append(SortedTxn(commit_ts, float(commit_time), len(payloads), payloads, nbytes))
            self._committed_bytes += txn.nbytes

    def read_txns(self, after_ts: int, upto_ts: int) -> Iterator[SortedTxn]:
        if not check_range(after_ts, upto_ts):
            return iter(())
        with self._lock:
            lo = bisect.bisect_right(self._ts, after_ts)
            hi = bisect.bisect_right(self._ts, upto_ts)
            selected = self._txns[lo:hi]
        return iter(selected)

    def clean(self, upto_ts: int) -> None:
        check_u64("upto_ts", upto_ts)
        with self._lock:
            i = bisect.bisect_right(self._ts, upto_ts)
            if i:
                self._committed_bytes -= sum(
                    len(p) + _ROW_OVERHEAD for t in self._txns[:i] for p in t.payloads
                )
                del self._ts[:i]
                del self._txns[:i]

    def clear(self) -> None:
        self._open.clear()
        self._open_bytes = 0
        self._last_commit_ts = -1
        with self._lock:
            self._ts.clear()
            self._txns.clear()
            self._committed_bytes = 0

    def pending_txns(self) -> int:
        return len(self._open)

    def memory_bytes(self) -> int:
        return self._open_bytes + self._committed_bytes


class MemorySorter(Sorter):
    """Hands out ``MemorySpanSorter``s; thread-safe."""

    def __init__(self) -> None:
        self._spans: dict[str, MemorySpanSorter] = {}
        self._lock = threading.Lock()
        self._closed = False

    def span(self, span_key: str, memory_budget: int | None = None) -> MemorySpanSorter:  # nothing spills
        with self._lock:
            if self._closed:
                raise SorterError("memory sorter is closed")
            sp = self._spans.get(span_key)
            if sp is None:
                sp = self._spans[span_key] = MemorySpanSorter(span_key)
            return sp

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._spans.clear()

    def disk_bytes(self) -> int:
        return 0
