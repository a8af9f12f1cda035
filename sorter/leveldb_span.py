"""One span's part of the capture's LevelDB sorter (``sorter.leveldb`` describes the design): open transactions
buffered per xid or spilled, committed ones queued as segments in commit order (in memory, or packed into one
LevelDB value when the sink lags), read lazily in order and cleaned once checkpointed. It writes through the capture's
:class:`sorter.storage.SorterStorage` (the database, the spill directory, disk accounting)."""

from __future__ import annotations

import logging
import threading
from bisect import bisect_right
from collections.abc import Iterator
from itertools import repeat
from operator import itemgetter
from typing import Any

from cdc.errors import SorterError
from sorter.base import SortedTxn, SpanSorter
from sorter.encoding import (
    U64_MAX,
    check_range,
    check_u64,
    committed_prefix,
    pack_segment,
    prefix_end,
    segment_key,
    span_uid,
    unpack_segment,
)
from sorter.spillfile import SpillFile
from sorter.storage import DB_ERRORS, SorterStorage, delete_in_batches, storage_error

log = logging.getLogger(__name__)

_ROW_OVERHEAD = 64  # Python bookkeeping per buffered row (list slots, int refs), roughly
_TS = itemgetter(0)
_NO_ABORTS: dict[int, int] = {}  # an unspilled transaction's ``aborted``: never written (``_spill`` gives it its own)
_new_txn = tuple.__new__  # SortedTxn(...) without the Python frame of the namedtuple's __new__ (same object)


class _OpenTxn:
    """Buffer of one open transaction. Touched only by the puller thread."""

    __slots__ = ("subs", "payloads", "nbytes", "spill", "aborted", "spilled_bytes")

    def __init__(self, subs: list[int], payloads: list[bytes], nbytes: int) -> None:
        self.subs = subs
        self.payloads = payloads
        self.nbytes = nbytes
        self.spilled_bytes = 0  # payload bytes moved to the spill file (for metrics)
        self.spill: SpillFile | None = None  # once the transaction spilled
        # subxid -> spill record watermark: spilled records of that subxid below it are rolled back (a dict of its own
        # from the first spill on: only a spilled transaction records any)
        self.aborted: dict[int, int] = _NO_ABORTS


class _Segment:
    """A run of committed transactions in commit order, or one spilled transaction.

    Exactly one of ``txns`` (in memory: ``SortedTxn``s), ``key`` (packed in LevelDB) or ``spill`` is set.
    Mutable fields change under the span's lock; ``txns`` only grows while the segment is open.
    """

    __slots__ = ("first_ts", "last_ts", "txns", "key", "spill", "aborted", "rows", "nbytes", "closed",
                 "dropped", "spilled_bytes")

    def __init__(self, first_ts: int) -> None:
        self.first_ts = first_ts
        self.last_ts = first_ts
        self.txns: list[SortedTxn] | None = []
        self.key: bytes | None = None
        self.spill: tuple[SpillFile, float] | None = None  # (file, commit_time)
        self.aborted: dict[int, int] = {}
        self.rows = 0
        self.nbytes = 0  # bytes held in memory (0 once packed into LevelDB or for a spill file)
        self.closed = False
        self.dropped = False  # cleaned or cleared: whoever still holds it must not publish it
        self.spilled_bytes = 0  # a spilled transaction's payload bytes (for metrics)


class LevelDBSpanSorter(SpanSorter):
    """The sorter of one span (see the module docstring).

    Thread-safety: open-transaction buffers belong to the puller thread (``add``/``abort``/``commit``/
    ``clear``); the segment queue is guarded by a lock shared with the sink thread's ``read_txns``/
    ``clean``. LevelDB itself is safe for concurrent writes and reads.
    """

    def __init__(self, storage: SorterStorage, span_key: str, memory_budget: int, *, spill_rows: int,
                 spill_bytes: int, batch_bytes: int) -> None:
        self.span_key = span_key
        self._storage = storage
        self._db = storage.db  # the handle as of the last call: taken again once closed (a reopen, _handle)
        self._gate = storage.gate
        self._path = storage.path
        self._uid = span_uid(span_key)
        self._cprefix = committed_prefix(self._uid)
        self._spill_rows = spill_rows
        self._spill_bytes = spill_bytes
        self._half_budget = max(1, memory_budget // 2)
        self._batch_bytes = batch_bytes
        # puller-thread state
        self._txns: dict[int, _OpenTxn] = {}
        self._buffered = 0
        self._last_commit_ts = -1
        # shared state, under _lock
        self._lock = threading.Lock()
        self._segments: list[_Segment] = []
        self._open: _Segment | None = None  # the segment small commits join
        self._committed_bytes = 0
        self._clean_floor = -1  # everything with commit_ts <= floor is forgotten (also in kept segments)
        # sink-thread state
        self._deleted_since_compact = 0

    def set_memory_budget(self, memory_budget: int) -> None:
        """Applies from the next add/commit on (an int assignment: safe from any thread)."""
        self._half_budget = max(1, memory_budget // 2)

    # -- puller thread ------------------------------------------------------------------------------
    def _open_txn(self, xid: int, subxid: int) -> _OpenTxn:
        """Transaction ``xid``'s buffer (created at its first change); both ids checked as unsigned 64-bit."""
        if not (0 <= xid <= U64_MAX and 0 <= subxid <= U64_MAX):
            check_u64("xid", xid)
            check_u64("subxid", subxid)
        txn = self._txns.get(xid)
        if txn is None:
            txn = self._txns[xid] = _OpenTxn([], [], 0)
        return txn

    def add(self, xid: int, subxid: int, payload: bytes) -> None:
        txn = self._open_txn(xid, subxid)
        n = len(payload) + _ROW_OVERHEAD
        spill_txn = len(txn.payloads) + 1 >= self._spill_rows or txn.nbytes + n >= self._spill_bytes
        spill_all = not spill_txn and self._buffered + n > self._half_budget
        if (spill_txn or spill_all) and self._storage.disk_quota > 0:
            self._storage.check_quota(f"span {self.span_key}: spilling transaction {xid}")
        txn.subs.append(subxid)
        txn.payloads.append(payload)
        txn.nbytes += n
        self._buffered += n
        if spill_txn:
            self._spill(txn)
        elif spill_all:
            for other in list(self._txns.values()):
                if other.payloads:
                    self._spill(other)

    def add_many(self, xid: int, subxid: int, payloads: list[bytes]) -> None:
        """As ``add`` per payload; a run that spills nowhere (the common case) is appended in one step: no
        threshold of ``add`` is reached by its last payload, hence by none (rows and bytes only grow)."""
        if not payloads:
            return
        n = len(payloads)
        nbytes = sum(map(len, payloads)) + _ROW_OVERHEAD * n
        txn = self._txns.get(xid)
        if txn is None:  # a new transaction (per transaction: one object, its lists built here)
            if (n < self._spill_rows and nbytes < self._spill_bytes and self._buffered + nbytes <= self._half_budget
                    and 0 <= xid <= U64_MAX and 0 <= subxid <= U64_MAX):
                self._txns[xid] = _OpenTxn([subxid] * n, payloads[:], nbytes)
                self._buffered += nbytes
                return
            txn = self._open_txn(xid, subxid)
        elif not 0 <= subxid <= U64_MAX:
            check_u64("subxid", subxid)
        if (len(txn.payloads) + n < self._spill_rows and txn.nbytes + nbytes < self._spill_bytes
                and self._buffered + nbytes <= self._half_budget):
            txn.subs.extend(repeat(subxid, n))
            txn.payloads.extend(payloads)
            txn.nbytes += nbytes
            self._buffered += nbytes
            return
        add = self.add
        for p in payloads:
            add(xid, subxid, p)

    def abort(self, xid: int, subxid: int) -> None:
        txn = self._txns.get(xid)
        if txn is None:
            return
        if subxid == xid:
            del self._txns[xid]
            self._buffered -= txn.nbytes
            self.aborted_rows += len(txn.payloads)
            self.aborted_bytes += txn.nbytes - _ROW_OVERHEAD * len(txn.payloads) + txn.spilled_bytes
            if txn.spill is not None:
                self.aborted_rows += txn.spill.records
                self._unlink(txn.spill, "abort")
            return
        if txn.spill is not None:
            txn.aborted[subxid] = txn.spill.records
        if subxid in txn.subs:
            subs: list[int] = []
            payloads: list[bytes] = []
            dropped = 0
            for s, p in zip(txn.subs, txn.payloads, strict=True):
                if s == subxid:
                    dropped += len(p) + _ROW_OVERHEAD
                else:
                    subs.append(s)
                    payloads.append(p)
            self.aborted_rows += len(txn.payloads) - len(payloads)
            self.aborted_bytes += dropped - _ROW_OVERHEAD * (len(txn.payloads) - len(payloads))
            txn.subs, txn.payloads = subs, payloads
            txn.nbytes -= dropped
            self._buffered -= dropped

    def commit(self, xid: int, commit_ts: int, commit_time: float) -> None:
        if not 0 <= commit_ts <= U64_MAX:
            check_u64("commit_ts", commit_ts)
        if commit_ts <= self._last_commit_ts:
            raise SorterError(
                f"span {self.span_key}: commit_ts {commit_ts} does not follow {self._last_commit_ts}"
            )
        if self._db.closed and self._handle().closed:
            raise self._storage.db_error(RuntimeError("Database is closed"), f"use of span {self.span_key}")
        txn = self._txns.get(xid)
        if txn is None or (txn.spill is None and not txn.payloads):
            self._txns.pop(xid, None)
            self._last_commit_ts = commit_ts
            return
        if txn.spill is None:  # (per transaction: locals only, the record built without the namedtuple's frame)
            nbytes = txn.nbytes
            payloads = txn.payloads
            rows = len(payloads)
            data = nbytes - _ROW_OVERHEAD * rows
            rec = _new_txn(SortedTxn, (commit_ts, commit_time, rows, payloads, data))
            self.in_rows += rows
            self.in_bytes += data
            with self._lock:
                seg = self._open
                if seg is None or seg.closed:
                    seg = self._open = _Segment(commit_ts)
                    self._segments.append(seg)
                assert seg.txns is not None  # (an open segment is in memory)
                seg.txns.append(rec)
                seg.last_ts = commit_ts
                seg.rows += rows
                seg.nbytes += nbytes
                self._committed_bytes += nbytes
                full = seg.nbytes >= self._batch_bytes
            if full:
                self._close(seg)
        else:
            if txn.payloads:
                self._spill(txn)  # the tail joins the file
            seg = _Segment(commit_ts)
            seg.txns = None
            seg.spill = (txn.spill, commit_time)
            seg.aborted = txn.aborted
            seg.rows = txn.spill.records
            seg.spilled_bytes = txn.spilled_bytes
            seg.closed = True
            self.in_rows += seg.rows
            self.in_bytes += seg.spilled_bytes
            with self._lock:
                prev, self._open = self._open, None
                if prev is not None:
                    prev.closed = True  # later small commits start a segment after this one
                self._segments.append(seg)
            if prev is not None:
                self._maybe_pack(prev)
        del self._txns[xid]
        self._buffered -= txn.nbytes
        self._last_commit_ts = commit_ts

    def _close(self, seg: _Segment) -> None:
        with self._lock:
            if seg.closed:
                return
            seg.closed = True
            if self._open is seg:
                self._open = None
        self._maybe_pack(seg)

    def _maybe_pack(self, seg: _Segment) -> None:
        """Move a closed in-memory segment into LevelDB when the span's committed data is over budget."""
        if self._committed_bytes <= self._half_budget:
            return
        txns = seg.txns
        if txns is None:
            return
        if self._storage.disk_quota > 0:
            self._storage.check_quota(f"span {self.span_key}: storing committed transactions")
        key = segment_key(self._uid, seg.first_ts)
        value = pack_segment([(t.commit_ts, t.commit_time, t.payloads) for t in txns])
        try:
            with self._gate.shared():
                self._handle().put(key, value)
        except DB_ERRORS as e:
            raise self._storage.db_error(e, f"write of span {self.span_key}", len(value)) from e
        self._storage.note_written(len(value))
        with self._lock:
            published = not seg.dropped
            if published:
                seg.key = key
                seg.txns = None
                self._committed_bytes -= seg.nbytes
                seg.nbytes = 0
        if not published:  # cleaned while it was being written
            self._delete_keys([key], "clean")

    def clear(self) -> None:
        self._storage.reopen_if_needed()
        self._txns.clear()
        self._buffered = 0
        self._last_commit_ts = -1
        with self._lock:
            for seg in self._segments:
                seg.dropped = True
            self._segments, self._open = [], None
            self._committed_bytes = 0
            self._clean_floor = -1
        # spill files first: removing them needs no free space, while LevelDB's deletes are writes
        self._storage.remove_spill_files(self._uid, f"clear of span {self.span_key}")
        prefix = self._cprefix
        size = self._approximate_size(prefix, prefix_end(prefix))
        self._delete_range(prefix, "clear")
        if self._add_deleted(size):
            self._compact(prefix, prefix_end(prefix))

    def pending_txns(self) -> int:
        return len(self._txns)

    def memory_bytes(self) -> int:
        return self._buffered + self._committed_bytes

    def spill_files(self) -> int:
        try:  # the puller thread may change the dict meanwhile: a scrape then counts 0 open ones
            open_txns = sum(1 for t in list(self._txns.values()) if t.spill is not None)
        except RuntimeError:
            open_txns = 0
        with self._lock:
            return open_txns + sum(1 for seg in self._segments if seg.spill is not None and not seg.dropped)

    # -- sink thread --------------------------------------------------------------------------------
    def read_txns(self, after_ts: int, upto_ts: int) -> Iterator[SortedTxn]:
        if not check_range(after_ts, upto_ts):
            return iter(())
        if self._db.closed and self._handle().closed:
            raise self._storage.db_error(RuntimeError("Database is closed"), f"use of span {self.span_key}")
        picked: list[tuple[_Segment, list[SortedTxn] | None, bytes | None]] = []
        with self._lock:
            after_ts = max(after_ts, self._clean_floor)
            for seg in self._segments:
                if seg.last_ts <= after_ts:
                    continue
                if seg.first_ts > upto_ts:
                    break
                txns = seg.txns
                if txns is not None:  # copy the part in range: the puller may still append
                    lo = bisect_right(txns, after_ts, key=_TS) if seg.first_ts <= after_ts else 0
                    hi = bisect_right(txns, upto_ts, key=_TS) if seg.last_ts > upto_ts else len(txns)
                    picked.append((seg, txns[lo:hi], None))
                else:
                    picked.append((seg, None, seg.key))
        if not picked:
            return iter(())
        return self._txns_of(picked, after_ts, upto_ts)

    def _txns_of(self, picked: list[tuple[_Segment, list[SortedTxn] | None, bytes | None]],
                 after_ts: int, upto_ts: int) -> Iterator[SortedTxn]:
        for seg, txns, key in picked:
            if txns is not None:
                yield from txns
            elif key is not None:
                try:
                    with self._gate.shared():
                        value = self._handle().get(key)
                    if value is None:
                        raise SorterError(f"sorter at {self._path}: segment {key.hex()} of span "
                                          f"{self.span_key} is missing")
                    unpacked = unpack_segment(value)
                except DB_ERRORS as e:
                    raise self._storage.db_error(e, f"read of span {self.span_key}") from e
                del value
                for ts, tm, payloads in unpacked:
                    if after_ts < ts <= upto_ts:  # one C-level sum per transaction, for metrics
                        yield SortedTxn(ts, tm, len(payloads), payloads, sum(map(len, payloads)))
            else:
                assert seg.spill is not None
                spill, commit_time = seg.spill
                yield SortedTxn(seg.first_ts, commit_time, seg.rows, self._spilled(spill, seg.aborted),
                                seg.spilled_bytes)

    def _spilled(self, spill: SpillFile, aborted: dict[int, int]) -> Iterator[bytes]:
        try:
            yield from spill.read(aborted)
        except DB_ERRORS as e:
            raise storage_error(e, spill.path, f"read of span {self.span_key}") from e

    def clean(self, upto_ts: int) -> None:
        check_u64("upto_ts", upto_ts)
        with self._lock:
            self._clean_floor = max(self._clean_floor, upto_ts)
            n = 0
            for seg in self._segments:
                if seg.last_ts > upto_ts:
                    break
                n += 1
            gone = self._segments[:n]
            del self._segments[:n]
            for seg in gone:
                seg.dropped = True
                seg.closed = True
                self._committed_bytes -= seg.nbytes
                if seg is self._open:
                    self._open = None
        keys = [seg.key for seg in gone if seg.key is not None]
        for seg in gone:
            if seg.spill is not None:
                self._unlink(seg.spill[0], "clean")
        if keys:
            size = self._approximate_size(keys[0], prefix_end(keys[-1]))
            self._delete_keys(keys, "clean")
            if self._add_deleted(size):
                self._compact(self._cprefix, prefix_end(keys[-1]))

    # -- helpers --------------------------------------------------------------------------------------
    def _spill(self, txn: _OpenTxn) -> None:
        """Append the buffer of ``txn`` to its spill file and empty it."""
        if txn.spill is None:
            txn.spill = SpillFile(self._storage.new_spill_path(self._uid))
            txn.aborted = {}
        try:
            txn.spill.append(txn.subs, txn.payloads)
        except DB_ERRORS as e:
            raise storage_error(e, txn.spill.path, f"spill of span {self.span_key}", txn.nbytes) from e
        self._storage.note_written(txn.nbytes)
        self._buffered -= txn.nbytes
        txn.spilled_bytes += txn.nbytes - _ROW_OVERHEAD * len(txn.payloads)
        txn.nbytes = 0
        txn.subs = []
        txn.payloads = []

    def _handle(self) -> Any:
        """The database handle: the one last used, or the storage's current one once that is closed (reopened
        after running out of space; when the storage itself is closed, the closed one, which then raises)."""
        if self._db.closed:
            self._db = self._storage.db
        return self._db

    def _unlink(self, spill: SpillFile, what: str) -> None:
        try:
            spill.unlink()
        except OSError as e:
            raise storage_error(e, spill.path, f"{what} of span {self.span_key}") from e

    def _delete_keys(self, keys: list[bytes], what: str) -> None:
        try:
            with self._gate.shared():
                delete_in_batches(self._handle(), keys)
        except DB_ERRORS as e:
            raise self._storage.db_error(e, f"{what} of span {self.span_key}") from e

    def _delete_range(self, prefix: bytes, what: str) -> None:
        """Delete every key starting with ``prefix``."""
        try:
            with self._gate.shared():
                db = self._handle()
                with db.iterator(prefix=prefix, include_value=False) as keys:
                    delete_in_batches(db, keys)  # the iterator is a snapshot: safe to delete
        except DB_ERRORS as e:
            raise self._storage.db_error(e, f"{what} of span {self.span_key}") from e

    def _approximate_size(self, start: bytes, stop: bytes | None) -> int:
        """On-disk (table file) bytes of ``[start, stop)``; data still in the memtable counts 0."""
        if self._storage.compact_after_bytes <= 0:
            return 0
        try:
            with self._gate.shared():
                return int(self._handle().approximate_size(start, stop or b"\xff"))
        except DB_ERRORS as e:
            raise self._storage.db_error(e, f"size estimate of span {self.span_key}") from e

    def _add_deleted(self, nbytes: int) -> bool:
        """Account deleted bytes; True when enough accumulated to compact (and resets the count)."""
        threshold = self._storage.compact_after_bytes
        if threshold <= 0:
            return False
        self._deleted_since_compact += nbytes
        if self._deleted_since_compact < threshold:
            return False
        self._deleted_since_compact = 0
        return True

    def _compact(self, start: bytes, stop: bytes | None) -> None:
        """Compact ``[start, stop)`` so that the space of deleted entries returns to the disk."""
        try:
            with self._gate.shared():
                self._handle().compact_range(start=start, stop=stop)
        except DB_ERRORS as e:
            raise self._storage.db_error(e, f"compaction of span {self.span_key}") from e
