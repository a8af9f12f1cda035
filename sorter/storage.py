"""The LevelDB sorter's storage helpers: errors (out of space -> ``DiskFull`` with the bytes needed and free),
batched deletes and disk accounting, shared by the store (``sorter.leveldb``) and its span sorters
(``sorter.leveldb_span``)."""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Iterable
from operator import itemgetter
from pathlib import Path
from typing import Any

import plyvel

from cdc.errors import DiskFull, SorterError

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
