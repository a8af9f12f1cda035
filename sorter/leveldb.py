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

import itertools
import logging
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import plyvel

from cdc.errors import DiskFull, SorterError
from sorter.base import Sorter
from sorter.gate import Gate
from sorter.leveldb_span import LevelDBSpanSorter
from sorter.storage import (
    _DB_ERRORS,
    _QUOTA_RECHECK_S,
    _delete_in_batches,
    _dir_bytes,
    _storage_error,
)

log = logging.getLogger(__name__)

__all__ = ["LevelDBSorter", "LevelDBSpanSorter", "_storage_error"]


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
