"""The sorter contract (see DESIGN.md section 3.2).

A ``SpanSorter`` buffers the raw changes of one span's upstream stream, keyed by transaction, and
exposes committed changes in replay order: ascending ``commit_ts``, then the order in which the changes
were added within their transaction. Payloads are opaque bytes (the puller's encoding).

Guarantees:
- Ordering: ``read_txns`` yields committed transactions in ascending ``commit_ts``, each with its
  payloads in add order; ``read`` is the same flattened into one entry per change.
- Aborts: ``abort(xid, xid)`` drops the whole transaction; ``abort(xid, subxid)`` drops only the
  entries added with that ``subxid``.
- Memory: bounded regardless of transaction size and of how far the sink lags (open transactions that
  outgrow their buffer spill to disk, and so do committed ones beyond the memory budget).
- Durability: none required. The sorter is a cache that the span rebuilds from its checkpoint after a
  restart (``clear()`` on span start).
- Threading: ``add``/``abort``/``commit``/``clear`` are called from one thread (the puller);
  ``read``/``clean`` from one other thread (the sink); both may run concurrently.

Details every implementation shares (``sorter.memory`` and ``sorter.leveldb``):
- ``xid``, ``subxid`` and ``commit_ts`` are unsigned 64-bit integers (ValueError otherwise); ``commit_ts``
  must increase strictly within a span between two ``clear()`` calls (SorterError otherwise).
- ``abort(xid, subxid)`` with ``subxid != xid`` drops the entries of ``subxid`` added so far; aborting or
  committing an unknown ``xid`` is a no-op (a commit still consumes its ``commit_ts``). A transaction
  with no surviving entries yields nothing.
- ``read``/``read_txns`` see every transaction whose ``commit`` returned before the call (a snapshot
  taken at the call); a transaction is visible whole or not at all. The payloads of a transaction read
  from disk are produced lazily and may be iterated once. ``clean`` invalidates unfinished iterators
  over the range it cleans (the sink thread consumes or drops them before it cleans).
- Errors: storage failures raise ``cdc.errors.SorterError``; a full disk or an exceeded disk quota raises
  ``cdc.errors.DiskFull`` (retryable). A quota refusal happens before the call changes anything.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from typing import NamedTuple


class SortedEntry(NamedTuple):
    commit_ts: int
    commit_time: float  # upstream commit time, unix seconds
    payload: bytes


class SortedTxn(NamedTuple):
    """One committed transaction: its payloads in add order (a list, or a one-shot iterator when read
    from disk). ``rows`` is their number, or an upper bound when rolled-back subtransactions are
    skipped while reading. ``nbytes``: the payloads' total length (for metrics; 0 when unknown)."""

    commit_ts: int
    commit_time: float  # upstream commit time, unix seconds
    rows: int
    payloads: Iterable[bytes]
    nbytes: int = 0


class SpanSorter(ABC):
    """Counters for metrics (``capture.metrics``), cumulative over the object's life (also across
    ``clear()``), kept per transaction at ``commit``/``abort``, never per ``add``: ``in_rows``/``in_bytes``
    committed changes (payload bytes), ``aborted_rows``/``aborted_bytes`` dropped by ``abort`` (rolled-back
    subtransactions and whole transactions, also those below a restart's start)."""

    in_rows = 0
    in_bytes = 0
    aborted_rows = 0
    aborted_bytes = 0

    @abstractmethod
    def add(self, xid: int, subxid: int, payload: bytes) -> None:
        """Buffer one change of (sub)transaction ``subxid`` of top-level transaction ``xid``."""

    def add_many(self, xid: int, subxid: int, payloads: list[bytes]) -> None:
        """``add(xid, subxid, p)`` for each of ``payloads`` in order, with the same effect (spills included); one
        call for a run of changes of one (sub)transaction. Default: a loop of ``add``."""
        add = self.add
        for p in payloads:
            add(xid, subxid, p)

    @abstractmethod
    def abort(self, xid: int, subxid: int) -> None:
        """Drop a rolled-back subtransaction (``subxid != xid``) or the whole transaction."""

    @abstractmethod
    def commit(self, xid: int, commit_ts: int, commit_time: float) -> None:
        """Make transaction ``xid`` visible to ``read`` at ``commit_ts`` (strictly increasing)."""

    @abstractmethod
    def read_txns(self, after_ts: int, upto_ts: int) -> Iterator[SortedTxn]:
        """Committed transactions with ``after_ts < commit_ts <= upto_ts``, in replay order (lazy).

        ``after_ts`` may be -1 and ``upto_ts`` beyond the u64 range; ValueError for a malformed range."""

    def read(self, after_ts: int, upto_ts: int) -> Iterator[SortedEntry]:
        """``read_txns`` flattened: one entry per change, in replay order (lazy)."""
        txns = self.read_txns(after_ts, upto_ts)
        return (SortedEntry(t.commit_ts, t.commit_time, p) for t in txns for p in t.payloads)

    @abstractmethod
    def clean(self, upto_ts: int) -> None:
        """Forget committed entries with ``commit_ts <= upto_ts`` (they are checkpointed downstream)."""

    @abstractmethod
    def clear(self) -> None:
        """Forget everything of this span, committed or not."""

    def pending_txns(self) -> int:
        """Number of open (uncommitted) transactions buffered."""
        return 0

    def memory_bytes(self) -> int:
        """Approximate bytes of change data this span holds in process memory (for memory quotas)."""
        return 0

    def spill_files(self) -> int:
        """Spill files this span holds now (open and committed transactions that outgrew memory)."""
        return 0


class Sorter(ABC):
    """One per capture. Hands out span sorters; ``close`` releases the storage."""

    @abstractmethod
    def span(self, span_key: str, memory_budget: int | None = None) -> SpanSorter:
        """The span sorter of ``span_key`` (e.g. ``'changefeed-id/3'``); the same object for the same key.

        ``memory_budget``: bytes of change data this span may hold in memory from now on (the
        changefeed's ``memory-quota`` over its spans); None keeps the current or default budget."""

    @abstractmethod
    def close(self) -> None:
        """Release the storage; the span sorters handed out must not be used afterwards."""

    def disk_bytes(self) -> int:
        """Approximate bytes the sorter occupies on disk."""
        return 0
