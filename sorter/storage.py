"""The LevelDB sorter's storage: one LevelDB database and one spill directory shared by every span sorter of a capture
(:class:`SorterStorage`), and how their failures become our errors (out of space -> ``DiskFull`` with the bytes
needed and free). The store (``sorter.leveldb``) opens and closes it; each span sorter (``sorter.leveldb_span``)
writes through it.

After an out-of-space error in a table or MANIFEST write, LevelDB refuses every further write until the database is
reopened (its background error is sticky, even once space is back): :meth:`SorterStorage.db_error` notes it and
:meth:`SorterStorage.reopen_if_needed` reopens the database (keeping its contents) at the next span start, once no
span thread is inside a LevelDB call (``sorter.gate``: plyvel releases the GIL inside LevelDB). A span sorter holding
the old handle sees it closed and takes :attr:`SorterStorage.db` again (``LevelDBSpanSorter``)."""

from __future__ import annotations

import errno
import itertools
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import plyvel

from cdc.errors import DiskFull, SorterError
from sorter.gate import Gate

log = logging.getLogger(__name__)

DELETE_BATCH_KEYS = 10_000
QUOTA_RECHECK_S = 0.25  # seconds between measurements of the disk use for the quota
_OUT_OF_SPACE = ("no space left", "disk quota exceeded", "file too large")
_OUT_OF_SPACE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}

# plyvel raises RuntimeError for operations on a closed database or iterator; spill files raise
# OSError, or ValueError when truncated.
DB_ERRORS = (plyvel.Error, RuntimeError, OSError, ValueError)


def storage_error(err: BaseException, path: Path, what: str, needed: int = 0) -> SorterError:
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


def delete_in_batches(db: Any, keys: Iterable[bytes]) -> None:
    """Delete ``keys`` in write batches of at most ``DELETE_BATCH_KEYS`` (plyvel has no range delete)."""
    wb = db.write_batch()
    for n, key in enumerate(keys, 1):
        wb.delete(key)
        if n % DELETE_BATCH_KEYS == 0:
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


class SorterStorage:
    """The LevelDB database at ``path`` and the spill directory ``path/spill`` (see the module docstring).

    What a span sorter uses: :attr:`db` (the current handle; every call on it inside ``gate.shared()``), :attr:`gate`,
    :meth:`db_error` for a failed LevelDB call, :meth:`check_quota` before a write that grows the disk use and
    :meth:`note_written` after it, :meth:`new_spill_path` / :meth:`remove_spill_files` for its spill files, and
    :attr:`compact_after_bytes`. Thread-safety: every method may be called from any thread.
    """

    def __init__(self, path: Path, db_options: dict[str, Any], *, disk_quota: int, compact_after_bytes: int,
                 fresh: bool, clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self.spill_dir = path / "spill"
        self.disk_quota = disk_quota
        self.compact_after_bytes = compact_after_bytes
        self.gate = Gate()  # every LevelDB call of a span runs inside gate.shared(); close/reopen exclusive
        self.closed = False
        self._db_options = db_options
        self._lock = threading.Lock()
        self._reopen_needed = False  # LevelDB ran out of space: its error is sticky until reopened
        self._clock = clock  # when the disk use was last measured for the quota (tests inject a fake one)
        self._quota_checked_at = float("-inf")
        self._disk_estimate = 0
        self._serials = itertools.count()
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            self.db = plyvel.DB(str(self.path), **db_options)
            if fresh:  # opened first: the lock keeps a second process off a directory in use
                self._wipe()
            self.spill_dir.mkdir(exist_ok=True)
        except DB_ERRORS as e:
            raise storage_error(e, self.path, "open") from e

    def _wipe(self) -> None:
        shutil.rmtree(self.spill_dir, ignore_errors=True)
        with self.db.iterator(include_value=False) as keys:
            delete_in_batches(self.db, keys)
        self.db.compact_range()

    def close(self) -> bool:
        """Close the database (idempotent), once no span is inside a LevelDB call; True if this call closed it."""
        with self._lock, self.gate.exclusive():
            self.closed = True
            if self.db.closed:
                return False
            self.db.close()
            return True

    def disk_bytes(self) -> int:
        return _dir_bytes(self.path) + _dir_bytes(self.spill_dir)

    def db_error(self, e: BaseException, what: str, needed: int = 0) -> SorterError:
        """Our error for a failed LevelDB call. Out of space: ``DiskFull``, and the database is reopened at
        the next span start (LevelDB's error is sticky). A handle left closed by a failed reopen: ``DiskFull``
        too (the span restarts); closed by :meth:`close`: ``SorterError``."""
        if isinstance(e, RuntimeError) and not self.closed:  # a failed reopen left it closed
            return DiskFull(f"sorter at {self.path} could not be reopened after running out of space "
                            f"({what}); the span restarts", cause=e)
        if isinstance(e, RuntimeError):
            return SorterError(f"sorter at {self.path} is closed ({what})", cause=e)
        err = storage_error(e, self.path, what, needed)
        if isinstance(err, DiskFull):
            self._reopen_needed = True
        return err

    def reopen_if_needed(self) -> None:
        """Reopen the database after an out-of-space error (what it holds is kept), once no span is inside a
        LevelDB call (``gate``); span sorters take the new handle at their next call. Raises ``DiskFull`` if
        the reopen itself fails (still no space; the spans then get ``DiskFull`` too), and is tried again
        at the next call."""
        with self._lock, self.gate.exclusive():
            if not self._reopen_needed or self.closed:
                return
            if not self.db.closed:
                self.db.close()
            try:
                self.db = plyvel.DB(str(self.path), **self._db_options)
            except DB_ERRORS as e:
                raise storage_error(e, self.path, "reopen after running out of space") from e
            self._reopen_needed = False
        log.warning("sorter at %s reopened after running out of space", self.path)

    def new_spill_path(self, uid: bytes) -> Path:
        """A fresh spill file path of the span with ``uid`` (``sorter.encoding.span_uid``)."""
        return self.spill_dir / f"{uid.hex()}-{next(self._serials)}.spill"

    def remove_spill_files(self, uid: bytes, what: str) -> None:
        """Every spill file of the span with ``uid`` (open and committed transactions, earlier runs)."""
        try:
            for f in self.spill_dir.glob(f"{uid.hex()}-*.spill"):
                f.unlink(missing_ok=True)
        except OSError as e:
            raise storage_error(e, self.spill_dir, what) from e

    def note_written(self, nbytes: int) -> None:
        self._disk_estimate += nbytes

    def check_quota(self, what: str) -> None:
        """Raise DiskFull when ``disk_quota`` is set and exceeded (file sizes, refreshed every 0.25 s)."""
        if self.disk_quota <= 0:
            return
        now = self._clock()
        if now - self._quota_checked_at >= QUOTA_RECHECK_S:
            self._disk_estimate = self.disk_bytes()
            self._quota_checked_at = now
        if self._disk_estimate > self.disk_quota:
            raise DiskFull(
                f"sorter at {self.path} uses {self._disk_estimate} bytes, over its disk quota of "
                f"{self.disk_quota} bytes ({what}); the sink must catch up, or a single transaction that large "
                "needs a higher sorter-disk-quota (the span's sorter data is removed while it waits)"
            )
