"""The capture's sorter: memory first, LevelDB (plyvel) and spill files when memory runs out.

PostgreSQL (and the MySQL binlog) send each transaction's changes in order and commit messages in
commit order, so the sorter never has to sort rows: it groups the changes of concurrently open
transactions by xid and releases whole transactions in commit order. Where the data lives:

- **Open transactions** buffer in memory, per xid. One that reaches ``spill_rows`` changes or
  ``spill_bytes`` (a big or streamed transaction), or all of them when the span's open buffers exceed
  half of ``memory_budget``, is appended to its own *spill file* (``sorter.spillfile``), chunk by
  chunk. A subtransaction abort drops its buffered changes and records a watermark for its spilled ones.
- **Committed transactions** join the span's queue of *segments* in commit order: runs of consecutive
  small transactions (up to ``batch_bytes`` each), or one spilled transaction committed *by reference*
  (its file, no copy: a commit costs O(spill_rows) whatever the transaction size). Segments stay in
  memory while the span's committed data is under half of ``memory_budget``; a segment closed beyond
  that (the sink lags) is packed into **one LevelDB value** (``sorter.encoding``) and dropped from
  memory. So a keeping-up sink reads straight from memory (no per-row put, read or delete: round 1's
  profile had those at a third of the capture's CPU), and a lagging one costs one put per ~1 MB.
- ``read_txns`` snapshots the queue under a lock and yields the transactions in range lazily (packed
  segments are fetched when reached, spill files read sequentially). ``clean`` drops checkpointed
  segments: memory, LevelDB values (compacted every ``compact_after_bytes``), spill files.

Memory: at most ~``memory_budget`` + ``batch_bytes`` + ``spill_bytes`` of change data per span, plus a
small object per committed segment in the queue. Spill files are read with ``read()`` into the process
(never mapped), so a spilled transaction of any size leaves the capture's RSS flat; LevelDB maps its
table files, which only packed segments of a lagging sink reach.

Durability: none (nothing is synced); the sorter is a cache rebuilt from the span's checkpoint, and
``fresh=True`` (what a capture uses) wipes what a previous process left.

Errors: LevelDB and file failures raise ``SorterError`` naming the path; out-of-space conditions and an
exceeded ``disk_quota`` raise ``DiskFull``. A quota refusal changes nothing and can be retried after a
back-off. After an out-of-space error in a table or MANIFEST write, LevelDB refuses every further write
until the database is reopened (its background error is sticky, even once space is back): the sorter
reopens it at the next span start or ``clear()`` (``reopen_if_needed``), keeping its contents, once no
span thread is inside a LevelDB call (``sorter.gate``: plyvel releases the GIL inside LevelDB). A DiskFull message says how many bytes the
failed write needed and how many are free there.
"""

from __future__ import annotations

import errno
import itertools
import logging
import os
import shutil
import threading
import time
from bisect import bisect_right
from collections.abc import Iterable, Iterator
from operator import itemgetter
from pathlib import Path
from typing import Any

import plyvel

from cdc.errors import DiskFull, SorterError
from sorter.base import SortedTxn, Sorter, SpanSorter
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
from sorter.gate import Gate
from sorter.spillfile import SpillFile

log = logging.getLogger(__name__)

_ROW_OVERHEAD = 64  # Python bookkeeping per buffered row (list slots, int refs), roughly
_DELETE_BATCH_KEYS = 10_000
_QUOTA_RECHECK_S = 0.25
_OUT_OF_SPACE = ("no space left", "disk quota exceeded", "file too large")
_OUT_OF_SPACE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
_TS = itemgetter(0)


def _storage_error(err: BaseException, path: Path, what: str, needed: int = 0) -> SorterError:
    """Our error for a storage failure at ``path``; out of space -> ``DiskFull`` saying how much the
    failed write needed (``needed`` bytes, 0 if unknown) and how much the file system has free."""
    msg = str(err)
    errno_ = getattr(err, "errno", None)
    if errno_ in _OUT_OF_SPACE_ERRNOS or any(s in msg.lower() for s in _OUT_OF_SPACE):
        need = f"the write needed {needed} bytes, " if needed else ""
        return DiskFull(
            f"sorter disk full at {path} ({what}): {msg}; {need}{_free_bytes(path)} free there. Free space "
            "in the capture's --data-dir (or give it a larger volume, or lower the changefeed's memory-quota "
            "and let the sink catch up); the span's sorter data was removed and the span retries",
            cause=err)
    return SorterError(f"sorter storage error at {path} ({what}): {msg}", cause=err)


def _free_bytes(path: Path) -> str:
    """Free bytes of the file system holding ``path`` (the nearest existing parent), as text."""
    for p in (path, *path.parents):
        try:
            return f"{shutil.disk_usage(p).free} bytes"
        except OSError:
            continue
    return "unknown bytes"


# plyvel raises RuntimeError for operations on a closed database or iterator; spill files raise
# OSError, or ValueError when truncated.
_DB_ERRORS = (plyvel.Error, RuntimeError, OSError, ValueError)


class _OpenTxn:
    """Buffer of one open transaction. Touched only by the puller thread."""

    __slots__ = ("subs", "payloads", "nbytes", "spill", "aborted")

    def __init__(self) -> None:
        self.subs: list[int] = []
        self.payloads: list[bytes] = []
        self.nbytes = 0
        self.spill: SpillFile | None = None  # once the transaction spilled
        # subxid -> spill record watermark: spilled records of that subxid below it are rolled back
        self.aborted: dict[int, int] = {}


class _Segment:
    """A run of committed transactions in commit order, or one spilled transaction.

    Exactly one of ``txns`` (in memory: ``SortedTxn``s), ``key`` (packed in LevelDB) or ``spill`` is set.
    Mutable fields change under the span's lock; ``txns`` only grows while the segment is open.
    """

    __slots__ = ("first_ts", "last_ts", "txns", "key", "spill", "aborted", "rows", "nbytes", "closed",
                 "dropped")

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


class LevelDBSorter(Sorter):
    """One LevelDB database (a directory) and one spill directory shared by every span of this capture.

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
        memory_budget: int = 64 << 20,
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
        self.spill_dir = self.path / "spill"
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
        self._serials = itertools.count()
        self._db_options: dict[str, Any] = {
            "create_if_missing": True, "write_buffer_size": write_buffer_size, "lru_cache_size": lru_cache_size,
            "block_size": block_size, "compression": "snappy"}
        self._reopen_needed = False  # LevelDB ran out of space: its error is sticky until reopened
        self.closed = False
        self.gate = Gate()  # every LevelDB call of a span runs inside gate.shared(); close/reopen exclusive
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            self.db = plyvel.DB(str(self.path), **self._db_options)
            if fresh:  # opened first: the lock keeps a second process off a directory in use
                self._wipe()
            self.spill_dir.mkdir(exist_ok=True)
        except _DB_ERRORS as e:
            raise _storage_error(e, self.path, "open") from e
        log.info("sorter opened at %s (fresh=%s, disk_quota=%d)", self.path, fresh, disk_quota)

    def _wipe(self) -> None:
        shutil.rmtree(self.spill_dir, ignore_errors=True)
        with self.db.iterator(include_value=False) as keys:
            _delete_in_batches(self.db, keys)
        self.db.compact_range()

    def span(self, span_key: str, memory_budget: int | None = None) -> LevelDBSpanSorter:
        if memory_budget is not None and memory_budget < 1:
            raise ValueError("memory_budget must be positive")
        self.reopen_if_needed()
        with self._lock:
            if self.db.closed:
                raise SorterError(f"sorter at {self.path} is closed")
            sp = self._spans.get(span_key)
            if sp is None:
                sp = self._spans[span_key] = LevelDBSpanSorter(self, span_key, memory_budget or self.memory_budget)
            elif memory_budget is not None:
                sp.set_memory_budget(memory_budget)
            return sp

    def close(self) -> None:
        """Close the database (idempotent). Data still held by the spans is dropped."""
        with self._lock, self.gate.exclusive():
            self.closed = True
            self._spans.clear()
            if not self.db.closed:
                self.db.close()
                log.info("sorter at %s closed", self.path)

    def disk_bytes(self) -> int:
        return _dir_bytes(self.path) + _dir_bytes(self.spill_dir)

    # -- internal, used by the span sorters --------------------------------------------------------
    def note_out_of_space(self) -> None:
        """LevelDB reported out of space. Its error is sticky (every later write fails with it, even once
        space is back) until the database is reopened: the next span start does that (``reopen_if_needed``)."""
        self._reopen_needed = True

    def reopen_if_needed(self) -> None:
        """Reopen the database after ``note_out_of_space`` (what it holds is kept), once no span is inside a
        LevelDB call (``gate``); the spans use the new handle from their next call. Raises ``DiskFull`` if
        the reopen itself fails (still no space; the spans then get ``DiskFull`` too), and is tried again
        at the next call."""
        with self._lock, self.gate.exclusive():
            if not self._reopen_needed or self.closed:
                return
            if not self.db.closed:
                self.db.close()
            try:
                self.db = plyvel.DB(str(self.path), **self._db_options)
            except _DB_ERRORS as e:
                raise _storage_error(e, self.path, "reopen after running out of space") from e
            self._reopen_needed = False
            for sp in self._spans.values():
                sp._db = self.db
        log.warning("sorter at %s reopened after running out of space", self.path)

    def next_spill_path(self, uid: bytes) -> Path:
        return self.spill_dir / f"{uid.hex()}-{next(self._serials)}.spill"

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
                f"{self.disk_quota} bytes ({what}); the sink must catch up, or a single transaction that large "
                "needs a higher sorter-disk-quota (the span's sorter data is removed while it waits)"
            )


def _delete_in_batches(db: Any, keys: Iterable[bytes]) -> None:
    """Delete ``keys`` in write batches of at most ``_DELETE_BATCH_KEYS`` (plyvel has no range delete)."""
    wb = db.write_batch()
    for n, key in enumerate(keys, 1):
        wb.delete(key)
        if n % _DELETE_BATCH_KEYS == 0:
            wb.write()
            wb.clear()
    wb.write()


def _dir_bytes(path: Path) -> int:
    total = 0
    try:
        with os.scandir(path) as it:
            for entry in it:
                try:
                    if entry.is_file(follow_symlinks=False):
                        total += entry.stat(follow_symlinks=False).st_size
                except FileNotFoundError:  # compaction or clean removed it meanwhile
                    pass
    except FileNotFoundError:
        return 0
    return total


class LevelDBSpanSorter(SpanSorter):
    """The sorter of one span (see the module docstring).

    Thread-safety: open-transaction buffers belong to the puller thread (``add``/``abort``/``commit``/
    ``clear``); the segment queue is guarded by a lock shared with the sink thread's ``read_txns``/
    ``clean``. LevelDB itself is safe for concurrent writes and reads.
    """

    def __init__(self, owner: LevelDBSorter, span_key: str, memory_budget: int) -> None:
        self.span_key = span_key
        self._owner = owner
        self._db = owner.db
        self._path = owner.path
        self._uid = span_uid(span_key)
        self._cprefix = committed_prefix(self._uid)
        self._spill_rows = owner.spill_rows
        self._spill_bytes = owner.spill_bytes
        self._half_budget = max(1, memory_budget // 2)
        self._batch_bytes = owner.batch_bytes
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
    def add(self, xid: int, subxid: int, payload: bytes) -> None:
        if not (0 <= xid <= U64_MAX and 0 <= subxid <= U64_MAX):
            check_u64("xid", xid)
            check_u64("subxid", subxid)
        txn = self._txns.get(xid)
        if txn is None:
            txn = self._txns[xid] = _OpenTxn()
        n = len(payload) + _ROW_OVERHEAD
        spill_txn = len(txn.payloads) + 1 >= self._spill_rows or txn.nbytes + n >= self._spill_bytes
        spill_all = not spill_txn and self._buffered + n > self._half_budget
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
            if txn.spill is not None:
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
            raise self._db_error(RuntimeError("Database is closed"), f"use of span {self.span_key}")
        txn = self._txns.get(xid)
        if txn is None or (txn.spill is None and not txn.payloads):
            self._txns.pop(xid, None)
            self._last_commit_ts = commit_ts
            return
        if txn.spill is None:
            nbytes = txn.nbytes
            rec = SortedTxn(commit_ts, commit_time, len(txn.payloads), txn.payloads)
            with self._lock:
                seg = self._open
                if seg is None or seg.closed:
                    seg = self._open = _Segment(commit_ts)
                    self._segments.append(seg)
                assert seg.txns is not None
                seg.txns.append(rec)
                seg.last_ts = commit_ts
                seg.rows += rec.rows
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
            seg.closed = True
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
        if self._owner.disk_quota > 0:
            self._owner.check_quota(f"span {self.span_key}: storing committed transactions")
        key = segment_key(self._uid, seg.first_ts)
        value = pack_segment([(t.commit_ts, t.commit_time, t.payloads) for t in txns])
        try:
            with self._owner.gate.shared():
                self._db.put(key, value)
        except _DB_ERRORS as e:
            raise self._db_error(e, f"write of span {self.span_key}", len(value)) from e
        self._owner.note_written(len(value))
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
        self._owner.reopen_if_needed()
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
        try:  # every spill file of this span: open and committed transactions, earlier runs
            for f in self._owner.spill_dir.glob(f"{self._uid.hex()}-*.spill"):
                f.unlink(missing_ok=True)
        except OSError as e:
            raise _storage_error(e, self._owner.spill_dir, f"clear of span {self.span_key}") from e
        prefix = self._cprefix
        size = self._approximate_size(prefix, prefix_end(prefix))
        self._delete_range(prefix, "clear")
        if self._add_deleted(size):
            self._compact(prefix, prefix_end(prefix))

    def pending_txns(self) -> int:
        return len(self._txns)

    def memory_bytes(self) -> int:
        return self._buffered + self._committed_bytes

    # -- sink thread --------------------------------------------------------------------------------
    def read_txns(self, after_ts: int, upto_ts: int) -> Iterator[SortedTxn]:
        if not check_range(after_ts, upto_ts):
            return iter(())
        if self._db.closed:
            raise self._db_error(RuntimeError("Database is closed"), f"use of span {self.span_key}")
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
                    with self._owner.gate.shared():
                        value = self._db.get(key)
                    if value is None:
                        raise SorterError(f"sorter at {self._path}: segment {key.hex()} of span "
                                          f"{self.span_key} is missing")
                    unpacked = unpack_segment(value)
                except _DB_ERRORS as e:
                    raise self._db_error(e, f"read of span {self.span_key}") from e
                del value
                for ts, tm, payloads in unpacked:
                    if after_ts < ts <= upto_ts:
                        yield SortedTxn(ts, tm, len(payloads), payloads)
            else:
                assert seg.spill is not None
                spill, commit_time = seg.spill
                yield SortedTxn(seg.first_ts, commit_time, seg.rows, self._spilled(spill, seg.aborted))

    def _spilled(self, spill: SpillFile, aborted: dict[int, int]) -> Iterator[bytes]:
        try:
            yield from spill.read(aborted)
        except _DB_ERRORS as e:
            raise _storage_error(e, spill.path, f"read of span {self.span_key}") from e

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
            txn.spill = SpillFile(self._owner.next_spill_path(self._uid))
        try:
            txn.spill.append(txn.subs, txn.payloads)
        except _DB_ERRORS as e:
            raise _storage_error(e, txn.spill.path, f"spill of span {self.span_key}", txn.nbytes) from e
        self._owner.note_written(txn.nbytes)
        self._buffered -= txn.nbytes
        txn.nbytes = 0
        txn.subs = []
        txn.payloads = []

    def _db_error(self, e: BaseException, what: str, needed: int = 0) -> SorterError:
        """Our error for a failed LevelDB call. Out of space: ``DiskFull``, and the database is reopened at
        the next span start (LevelDB's error is sticky). A handle left closed by a failed reopen: ``DiskFull``
        too (the span restarts); closed by ``close()``: ``SorterError``."""
        if isinstance(e, RuntimeError) and not self._owner.closed:  # a failed reopen left it closed
            return DiskFull(f"sorter at {self._path} could not be reopened after running out of space "
                            f"({what}); the span restarts", cause=e)
        if isinstance(e, RuntimeError):
            return SorterError(f"sorter at {self._path} is closed ({what})", cause=e)
        err = _storage_error(e, self._path, what, needed)
        if isinstance(err, DiskFull):
            self._owner.note_out_of_space()
        return err

    def _unlink(self, spill: SpillFile, what: str) -> None:
        try:
            spill.unlink()
        except OSError as e:
            raise _storage_error(e, spill.path, f"{what} of span {self.span_key}") from e

    def _delete_keys(self, keys: list[bytes], what: str) -> None:
        try:
            with self._owner.gate.shared():
                _delete_in_batches(self._db, keys)
        except _DB_ERRORS as e:
            raise self._db_error(e, f"{what} of span {self.span_key}") from e

    def _delete_range(self, prefix: bytes, what: str) -> None:
        """Delete every key starting with ``prefix``."""
        try:
            with self._owner.gate.shared(), self._db.iterator(prefix=prefix, include_value=False) as keys:
                _delete_in_batches(self._db, keys)  # the iterator is a snapshot: safe to delete
        except _DB_ERRORS as e:
            raise self._db_error(e, f"{what} of span {self.span_key}") from e

    def _approximate_size(self, start: bytes, stop: bytes | None) -> int:
        """On-disk (table file) bytes of ``[start, stop)``; data still in the memtable counts 0."""
        if self._owner.compact_after_bytes <= 0:
            return 0
        try:
            with self._owner.gate.shared():
                return int(self._db.approximate_size(start, stop or b"\xff"))
        except _DB_ERRORS as e:
            raise self._db_error(e, f"size estimate of span {self.span_key}") from e

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
            with self._owner.gate.shared():
                self._db.compact_range(start=start, stop=stop)
        except _DB_ERRORS as e:
            raise self._db_error(e, f"compaction of span {self.span_key}") from e
