"""The capture's sorter on LevelDB (plyvel): one database per capture, one key range per span.

Layout (see ``sorter.encoding``): committed changes under ``C + span_uid + commit_ts + seq`` (seq 0 is
the transaction header), changes of transactions that outgrew memory under ``U + span_uid + serial +
seq``, and ``S + span_uid + commit_ts -> serial`` references for cleaning. Byte order is replay order, as
in TiCDC's pebble sorter.

Data path of one transaction:
- ``add`` appends to a per-xid buffer in memory. When the buffer reaches ``spill_rows`` changes or
  ``spill_bytes``, or all buffers of the span together exceed ``memory_budget``, buffers are written to
  the U area in one write batch each. Memory therefore stays bounded whatever the transaction size.
- ``commit`` of a transaction that never spilled puts its changes and header into the span's pending
  write batch (shared by consecutive small transactions, written when it reaches ``batch_bytes`` or when
  the sink calls ``read``/``clean``). A spilled transaction is committed *by reference*: its memory tail
  is spilled too, then one header naming its spill serial and its rolled-back subtransactions goes into
  the pending batch, so a commit costs O(spill_rows) whatever the transaction size (no copy, and the
  puller never stalls long enough to miss upstream keepalives).
- ``read`` writes the pending batch, takes a LevelDB snapshot and iterates the C range lazily, following
  the headers of spilled transactions into their U ranges. A header is written with or after its
  changes, so a transaction is visible whole or not at all.
- ``clean`` deletes checkpointed C entries and the U ranges their S references name, in write batches
  (plyvel has no range delete), and compacts the cleaned ranges every ``compact_after_bytes`` so that
  the disk space comes back.

Memory: LevelDB keeps the (decompressed) index block of every open table file on the heap, one entry of
~45 bytes per data block, for up to ``max_open_files`` (1000) files. With LevelDB's default 4 KiB blocks
the heap grew with the size of a spilled transaction: ~9 MB per GB spilled (sorter alone; ~13 MB/GB in the
capture). ``block_size`` = 16 KiB cuts it to ~3 MB/GB (at most ~45 MB with 1000 open tables of 16 MB) at
no measurable CPU cost; 64 KiB would cut it further but cost up to 2x the CPU per row written.
LevelDB also maps its table files read-only (mmap): reading a range makes those clean file pages resident
and counted in the process's RSS (``RssFile``) until ``clean`` and compaction delete the files; they are
page cache that the kernel can drop at any time, not process memory (docs/benchmarks.md).

Durability: none (writes are not synced); the sorter is a cache rebuilt from the span's checkpoint, and
``fresh=True`` wipes what a previous process left.

Errors: LevelDB failures raise ``SorterError`` naming the path; out-of-space conditions and an exceeded
``disk_quota`` raise ``DiskFull``. A quota refusal changes nothing and can be retried after a back-off.
After a LevelDB write error, LevelDB refuses every further write until the database is reopened (its
background error is sticky): close this sorter and open a new one.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Iterator
from itertools import islice
from pathlib import Path
from typing import Any

import plyvel

from cdc.errors import DiskFull, SorterError
from sorter.base import SortedEntry, Sorter, SpanSorter
from sorter.encoding import (
    HEADER,
    HEADER_SEQ,
    PREFIX_LEN,
    SPILLED_HEADER,
    TS_END,
    U64,
    U64_MAX,
    U64_PAIR,
    check_u64,
    committed_prefix,
    committed_range,
    header_value,
    prefix_end,
    span_uid,
    spill_area_prefix,
    spill_range_prefix,
    spill_refs_prefix,
    ts_range,
)

log = logging.getLogger(__name__)

_ROW_OVERHEAD = 64  # Python bookkeeping per buffered row (list slots, int refs), roughly
_DELETE_BATCH_KEYS = 10_000
_SEQS = [U64.pack(i) for i in range(4097)]  # packed seqs of in-memory transactions (spill_rows default 4096)
_QUOTA_RECHECK_S = 0.25
_OUT_OF_SPACE = ("no space left", "disk quota exceeded", "file too large")
_OUT_OF_SPACE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


def _storage_error(err: BaseException, path: Path, what: str) -> SorterError:
    msg = str(err)
    errno_ = getattr(err, "errno", None)
    if errno_ in _OUT_OF_SPACE_ERRNOS or any(s in msg.lower() for s in _OUT_OF_SPACE):
        return DiskFull(f"sorter disk full at {path} ({what}): {msg}", cause=err)
    return SorterError(f"sorter storage error at {path} ({what}): {msg}", cause=err)


# plyvel raises RuntimeError for operations on a closed database or iterator.
_DB_ERRORS = (plyvel.Error, RuntimeError, OSError)


class _OpenTxn:
    """Buffer of one open transaction. Touched only by the puller thread."""

    __slots__ = ("subs", "payloads", "nbytes", "serial", "next_seq", "aborted")

    def __init__(self) -> None:
        self.subs: list[int] = []
        self.payloads: list[bytes] = []
        self.nbytes = 0
        self.serial: int | None = None  # spill serial once the transaction spilled
        self.next_seq = 0  # next seq in the U area
        # subxid -> U seq watermark: spilled entries of that subxid below it are rolled back
        self.aborted: dict[int, int] = {}


class LevelDBSorter(Sorter):
    """One LevelDB database (a directory) shared by every span of this capture.

    Thread-safety: ``span``/``close``/``disk_bytes`` may be called from any thread; each span sorter
    follows the threading rule of ``sorter.base``. Different spans may be used from different threads.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        write_buffer_size: int = 16 << 20,
        spill_rows: int = 4096,
        spill_bytes: int = 4 << 20,
        memory_budget: int = 32 << 20,
        batch_bytes: int = 1 << 20,
        disk_quota: int = 0,
        compact_after_bytes: int = 64 << 20,
        lru_cache_size: int = 8 << 20,
        block_size: int = 16 << 10,
        fresh: bool = False,
    ) -> None:
        if spill_rows < 1 or spill_bytes < 1 or batch_bytes < 1 or memory_budget < 1:
            raise ValueError("spill_rows, spill_bytes, batch_bytes and memory_budget must be positive")
        self.path = Path(path)
        self.spill_rows = spill_rows
        self.spill_bytes = spill_bytes
        self.memory_budget = memory_budget
        self.batch_bytes = batch_bytes
        self.disk_quota = disk_quota
        self.compact_after_bytes = compact_after_bytes
        self._lock = threading.Lock()
        self._spans: dict[str, LevelDBSpanSorter] = {}
        self._quota_checked_at = float("-inf")
        self._disk_estimate = 0
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            if fresh:
                plyvel.destroy_db(str(self.path))
            self.db = plyvel.DB(
                str(self.path),
                create_if_missing=True,
                write_buffer_size=write_buffer_size,
                lru_cache_size=lru_cache_size,
                block_size=block_size,
                compression="snappy",
            )
        except _DB_ERRORS as e:
            raise _storage_error(e, self.path, "open") from e
        log.info("sorter opened at %s (fresh=%s, disk_quota=%d)", self.path, fresh, disk_quota)

    def span(self, span_key: str) -> LevelDBSpanSorter:
        with self._lock:
            if self.db.closed:
                raise SorterError(f"sorter at {self.path} is closed")
            sp = self._spans.get(span_key)
            if sp is None:
                sp = self._spans[span_key] = LevelDBSpanSorter(self, span_key)
            return sp

    def close(self) -> None:
        """Write what the spans still hold in pending batches, then close the database (idempotent)."""
        with self._lock:
            spans = list(self._spans.values())
            self._spans.clear()
            if not self.db.closed:
                try:
                    for sp in spans:
                        sp.flush()
                finally:
                    self.db.close()
                    log.info("sorter at %s closed", self.path)

    def disk_bytes(self) -> int:
        total = 0
        try:
            with os.scandir(self.path) as it:
                for entry in it:
                    try:
                        if entry.is_file(follow_symlinks=False):
                            total += entry.stat(follow_symlinks=False).st_size
                    except FileNotFoundError:  # compaction removed it meanwhile
                        pass
        except FileNotFoundError:
            return 0
        return total

    # -- internal, used by the span sorters --------------------------------------------------------
    def note_written(self, nbytes: int) -> None:
        self._disk_estimate += nbytes

    def check_quota(self, what: str) -> None:
        """Raise DiskFull when ``disk_quota`` is set and exceeded (file sizes, refreshed every 0.25 s)."""
        if self.disk_quota <= 0:
            return
        now = time.monotonic()
        if now - self._quota_checked_at >= _QUOTA_RECHECK_S:
            self._disk_estimate = self.disk_bytes()
            self._quota_checked_at = now
        if self._disk_estimate > self.disk_quota:
            raise DiskFull(
                f"sorter at {self.path} uses {self._disk_estimate} bytes, over its disk quota of "
                f"{self.disk_quota} bytes ({what}); the sink must catch up"
            )


class LevelDBSpanSorter(SpanSorter):
    """The sorter of one span inside the capture's LevelDB (see the module docstring).

    Thread-safety: open-transaction buffers belong to the puller thread (``add``/``abort``/``commit``/
    ``clear``); the pending write batch is guarded by a lock so that the sink thread's ``read``/``clean``
    can write it out first. LevelDB itself is safe for concurrent writes, snapshots and iterators.
    """

    def __init__(self, owner: LevelDBSorter, span_key: str) -> None:
        self.span_key = span_key
        self._owner = owner
        self._db = owner.db
        self._path = owner.path
        uid = span_uid(span_key)
        self._uid = uid
        self._cprefix = committed_prefix(uid)
        self._uprefix = spill_area_prefix(uid)
        self._sprefix = spill_refs_prefix(uid)
        self._spill_rows = owner.spill_rows
        self._spill_bytes = owner.spill_bytes
        self._memory_budget = owner.memory_budget
        self._batch_bytes = owner.batch_bytes
        # puller-thread state
        self._txns: dict[int, _OpenTxn] = {}
        self._buffered = 0
        self._last_commit_ts = -1
        self._next_serial = self._first_free_serial()
        # shared state, under _lock
        self._lock = threading.Lock()
        self._pending = self._db.write_batch()
        self._pending_bytes = 0
        # sink-thread state
        self._clean_floor = -1  # every C and S entry with commit_ts <= floor is deleted
        self._deleted_since_compact = 0

    def _first_free_serial(self) -> int:
        """One past the highest spill serial on disk: serials are never reused, also across restarts."""
        try:
            with self._db.iterator(prefix=self._uprefix, reverse=True, include_value=False) as it:
                last = next(it, None)
        except _DB_ERRORS as e:
            raise _storage_error(e, self._path, f"open of span {self.span_key}") from e
        return 0 if last is None else U64.unpack_from(last, PREFIX_LEN)[0] + 1

    # -- puller thread ------------------------------------------------------------------------------
    def add(self, xid: int, subxid: int, payload: bytes) -> None:
        if not (0 <= xid <= U64_MAX and 0 <= subxid <= U64_MAX):
            check_u64("xid", xid)
            check_u64("subxid", subxid)
        txn = self._txns.get(xid)
        if txn is None:
            txn = self._txns[xid] = _OpenTxn()
        n = len(payload) + _ROW_OVERHEAD
        spill_txn = len(txn.payloads) + 1 >= self._spill_rows or txn.nbytes + n >= self._spill_bytes
        spill_all = not spill_txn and self._buffered + n > self._memory_budget
        if (spill_txn or spill_all) and self._owner.disk_quota > 0:
            self._owner.check_quota(f"span {self.span_key}: spilling transaction {xid}")
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

    def abort(self, xid: int, subxid: int) -> None:
        txn = self._txns.get(xid)
        if txn is None:
            return
        if subxid == xid:
            del self._txns[xid]
            self._buffered -= txn.nbytes
            if txn.serial is not None:
                self._delete_range(spill_range_prefix(self._uid, txn.serial), "abort")
            return
        if txn.serial is not None:
            txn.aborted[subxid] = txn.next_seq
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
        if self._db.closed:
            raise SorterError(f"sorter at {self._path} is closed (span {self.span_key})")
        txn = self._txns.get(xid)
        if txn is None or (txn.serial is None and not txn.payloads):
            self._txns.pop(xid, None)
            self._last_commit_ts = commit_ts
            return
        if self._owner.disk_quota > 0:
            self._owner.check_quota(f"span {self.span_key}: committing transaction {xid}")
        ts = U64.pack(commit_ts)
        base = self._cprefix + ts
        if txn.serial is None:
            header = HEADER.pack(commit_time, xid)
            payloads = txn.payloads
            seqs = _SEQS if len(payloads) < len(_SEQS) else [U64.pack(i) for i in range(len(payloads) + 1)]
            with self._lock:
                put = self._pending.put
                # seq 1..n: the per-row loop runs in C (map over the packed seqs, deque drains it)
                deque(map(put, map(base.__add__, seqs[1:len(payloads) + 1]), payloads), maxlen=0)
                put(base + HEADER_SEQ, header)
                self._pending_bytes += txn.nbytes + 32
                if self._pending_bytes >= self._batch_bytes:
                    self._flush_locked()
        else:
            if txn.payloads:
                self._spill(txn)  # the tail joins the spilled part; written before the header
            header = header_value(commit_time, xid, txn.serial, txn.aborted)
            with self._lock:
                self._pending.put(self._sprefix + ts, U64.pack(txn.serial))
                self._pending.put(base + HEADER_SEQ, header)
                self._pending_bytes += len(header) + 64
                if self._pending_bytes >= self._batch_bytes:
                    self._flush_locked()
        del self._txns[xid]
        self._buffered -= txn.nbytes
        self._last_commit_ts = commit_ts

    def clear(self) -> None:
        self._txns.clear()
        self._buffered = 0
        self._last_commit_ts = -1
        with self._lock:
            self._pending.clear()
            self._pending_bytes = 0
            self._clean_floor = -1
        areas = [(prefix, prefix_end(prefix)) for prefix in (self._cprefix, self._sprefix, self._uprefix)]
        size = sum(self._approximate_size(start, stop) for start, stop in areas)
        for start, _ in areas:
            self._delete_range(start, "clear")
        if self._add_deleted(size):
            for start, stop in areas:
                self._compact(start, stop)

    def pending_txns(self) -> int:
        return len(self._txns)

    def memory_bytes(self) -> int:
        return self._buffered + self._pending_bytes

    # -- sink thread --------------------------------------------------------------------------------
    def read(self, after_ts: int, upto_ts: int) -> Iterator[SortedEntry]:
        rng = committed_range(self._uid, after_ts, upto_ts)
        if rng is None:
            return iter(())
        self.flush()
        try:
            snap = self._db.snapshot()
            it = snap.iterator(start=rng[0], stop=rng[1])
        except _DB_ERRORS as e:
            raise _storage_error(e, self._path, f"read of span {self.span_key}") from e
        return self._entries(snap, it)

    def _entries(self, snap: Any, it: Any) -> Iterator[SortedEntry]:
        cur = b"\xff"  # prefix (area, uid, commit_ts) of the transaction whose header was seen
        cur_ts = 0
        cur_time = 0.0
        try:
            for key, value in it:
                if key.startswith(cur):
                    yield SortedEntry(cur_ts, cur_time, value)
                elif key.endswith(HEADER_SEQ):
                    cur = key[:TS_END]
                    cur_ts = U64.unpack_from(key, PREFIX_LEN)[0]
                    cur_time = HEADER.unpack_from(value)[0]
                    if len(value) > HEADER.size:
                        yield from self._spilled_entries(snap, cur_ts, cur_time, value)
                # else: a change whose header is not in this snapshot: skip (not written by this code)
        except _DB_ERRORS as e:
            raise _storage_error(e, self._path, f"read of span {self.span_key}") from e
        finally:
            it.close()
            snap.close()

    def _spilled_entries(
        self, snap: Any, commit_ts: int, commit_time: float, header: bytes
    ) -> Iterator[SortedEntry]:
        serial = SPILLED_HEADER.unpack_from(header)[2]
        aborted = dict(U64_PAIR.iter_unpack(header[SPILLED_HEADER.size :]))
        prefix = self._uprefix + U64.pack(serial)
        if not aborted:
            with snap.iterator(prefix=prefix, include_key=False) as values:
                for value in values:
                    yield SortedEntry(commit_ts, commit_time, value[8:])
            return
        unpack_from = U64.unpack_from
        with snap.iterator(prefix=prefix) as it:
            for key, value in it:
                watermark = aborted.get(unpack_from(value)[0])
                if watermark is not None and unpack_from(key, TS_END)[0] < watermark:
                    continue
                yield SortedEntry(commit_ts, commit_time, value[8:])

    def clean(self, upto_ts: int) -> None:
        check_u64("upto_ts", upto_ts)
        with self._lock:
            floor = self._clean_floor
            if upto_ts <= floor:
                return
            self._flush_locked()
        rng = committed_range(self._uid, floor, upto_ts)
        if rng is None:
            return
        size = self._approximate_size(rng[0], rng[1])
        self._delete_range(rng[0], "clean", rng[1])
        refs = ts_range(self._sprefix, floor, upto_ts)
        assert refs is not None
        lo, hi = U64_MAX, -1  # serials of the deleted spill ranges
        try:
            # the iterator's implicit snapshot makes deleting while iterating safe
            with self._db.iterator(start=refs[0], stop=refs[1]) as it:
                for ref_key, serial in it:
                    prefix = self._uprefix + serial
                    size += self._approximate_size(prefix, prefix_end(prefix))
                    self._delete_range(prefix, "clean")
                    self._db.delete(ref_key)
                    n = U64.unpack(serial)[0]
                    lo, hi = min(lo, n), max(hi, n)
        except _DB_ERRORS as e:
            raise _storage_error(e, self._path, f"clean of span {self.span_key}") from e
        with self._lock:
            self._clean_floor = max(self._clean_floor, upto_ts)
        if self._add_deleted(size):
            self._compact(self._cprefix, rng[1])
            if hi >= 0:
                self._compact(self._uprefix + U64.pack(lo), prefix_end(self._uprefix + U64.pack(hi)))

    # -- helpers --------------------------------------------------------------------------------------
    def flush(self) -> None:
        """Write the pending batch of committed small transactions (``read``/``clean`` do it first)."""
        with self._lock:
            self._flush_locked()

    def _flush_locked(self) -> None:
        if not self._pending_bytes:
            return
        try:
            self._pending.write()
        except _DB_ERRORS as e:
            raise _storage_error(e, self._path, f"write of span {self.span_key}") from e
        self._pending.clear()
        self._owner.note_written(self._pending_bytes)
        self._pending_bytes = 0

    def _spill(self, txn: _OpenTxn) -> None:
        """Write the buffer of ``txn`` to its U range (one write batch) and empty it."""
        if txn.serial is None:
            txn.serial = self._next_serial
            self._next_serial += 1
        prefix = self._uprefix + U64.pack(txn.serial)
        pack = U64.pack
        seq = txn.next_seq
        try:
            wb = self._db.write_batch()
            put = wb.put
            for s, p in zip(txn.subs, txn.payloads, strict=True):
                put(prefix + pack(seq), pack(s) + p)
                seq += 1
            wb.write()
        except _DB_ERRORS as e:
            raise _storage_error(e, self._path, f"spill of span {self.span_key}") from e
        txn.next_seq = seq
        self._owner.note_written(txn.nbytes)
        self._buffered -= txn.nbytes
        txn.nbytes = 0
        txn.subs = []
        txn.payloads = []

    def _delete_range(self, start: bytes, what: str, stop: bytes | None = None) -> int:
        """Delete every key in ``[start, stop)`` (or with prefix ``start``) in bounded write batches."""
        db = self._db
        n = 0
        try:
            if stop is None:
                it = db.iterator(prefix=start, include_value=False)
            else:
                it = db.iterator(start=start, stop=stop, include_value=False)
            with it:
                wb = db.write_batch()
                delete = wb.delete
                while True:  # bounded batches; the per-key loop runs in C (list, map, deque)
                    keys = list(islice(it, _DELETE_BATCH_KEYS))
                    if not keys:
                        break
                    deque(map(delete, keys), maxlen=0)
                    wb.write()
                    wb.clear()
                    n += len(keys)
                    if len(keys) < _DELETE_BATCH_KEYS:
                        break
        except _DB_ERRORS as e:
            raise _storage_error(e, self._path, f"{what} of span {self.span_key}") from e
        return n

    def _approximate_size(self, start: bytes, stop: bytes | None) -> int:
        """On-disk (table file) bytes of ``[start, stop)``; data still in the memtable counts 0."""
        if self._owner.compact_after_bytes <= 0:
            return 0
        try:
            return int(self._db.approximate_size(start, stop or b"\xff"))
        except _DB_ERRORS as e:
            raise _storage_error(e, self._path, f"size estimate of span {self.span_key}") from e

    def _add_deleted(self, nbytes: int) -> bool:
        """Account deleted bytes; True when enough accumulated to compact (and resets the count)."""
        threshold = self._owner.compact_after_bytes
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
            self._db.compact_range(start=start, stop=stop)
        except _DB_ERRORS as e:
            raise _storage_error(e, self._path, f"compaction of span {self.span_key}") from e
