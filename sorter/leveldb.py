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
reopens it at the next span start or ``clear()``, keeping its contents (``sorter.storage``). A DiskFull message says
how many bytes the failed write needed and how many are free there.

Modules: this one is the store (settings, the span sorters by span); ``sorter.storage`` the database and spill
directory every span writes through (:class:`sorter.storage.SorterStorage`); ``sorter.leveldb_span`` one span's part.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cdc.errors import SorterError
from sorter.base import Sorter
from sorter.leveldb_span import LevelDBSpanSorter
from sorter.storage import SorterStorage

log = logging.getLogger(__name__)


class LevelDBSorter(Sorter):
    """One LevelDB database (a directory) and one spill directory shared by every span of this capture
    (:attr:`storage`).

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
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if spill_rows < 1 or spill_bytes < 1 or batch_bytes < 1 or memory_budget < 1:
            raise ValueError("spill_rows, spill_bytes, batch_bytes and memory_budget must be positive")
        self.path = Path(path)
        self.spill_rows = spill_rows
        self.spill_bytes = spill_bytes
        self.memory_budget = memory_budget
        self.batch_bytes = batch_bytes
        self._lock = threading.Lock()
        self._spans: dict[str, LevelDBSpanSorter] = {}
        db_options: dict[str, Any] = {
            "create_if_missing": True, "write_buffer_size": write_buffer_size, "lru_cache_size": lru_cache_size,
            "block_size": block_size, "compression": "snappy"}
        self.storage = SorterStorage(self.path, db_options, disk_quota=disk_quota,
                                     compact_after_bytes=compact_after_bytes, fresh=fresh, clock=clock)
        self.spill_dir = self.storage.spill_dir
        log.info("sorter opened at %s (fresh=%s, disk_quota=%d)", self.path, fresh, disk_quota)

    def span(self, span_key: str, memory_budget: int | None = None) -> LevelDBSpanSorter:
        if memory_budget is not None and memory_budget < 1:
            raise ValueError("memory_budget must be positive")
        self.storage.reopen_if_needed()
        with self._lock:
            if self.storage.db.closed:
                raise SorterError(f"sorter at {self.path} is closed")
            sp = self._spans.get(span_key)
            if sp is None:
                sp = self._spans[span_key] = LevelDBSpanSorter(
                    self.storage, span_key, memory_budget or self.memory_budget, spill_rows=self.spill_rows,
                    spill_bytes=self.spill_bytes, batch_bytes=self.batch_bytes)
            elif memory_budget is not None:
                sp.set_memory_budget(memory_budget)
            return sp

    def close(self) -> None:
        """Close the database (idempotent). Data still held by the spans is dropped."""
        with self._lock:
            self._spans.clear()
            if self.storage.close():
                log.info("sorter at %s closed", self.path)

    def disk_bytes(self) -> int:
        return self.storage.disk_bytes()

    @property
    def disk_quota(self) -> int:
        """Bytes the sorter may use on disk (0: no limit); may be changed while it runs (a config reload)."""
        return self.storage.disk_quota

    @disk_quota.setter
    def disk_quota(self, value: int) -> None:
        self.storage.disk_quota = value
