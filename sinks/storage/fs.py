"""Local-file primitives of the storage sink: atomic publication and errors that name the path.

Every visible file appears whole or not at all: its bytes go to a hidden temporary name in the same directory
(``.tw-...``), are fsynced, then the file is *linked* to its final name (``link(2)`` fails instead of replacing an
existing file, so a published file is never overwritten, even by a second writer) or, for the files that are
meant to be replaced (``metadata``, ``CDC.index``, position records), renamed over it; the directory is fsynced
after either. Readers that list a directory see only complete files (hidden names excepted).

:class:`LocalFS` is the one place that touches the disk; tests pass a subclass that fails (a full disk, a
read-only directory). Every ``OSError`` leaves as a :class:`cdc.errors.TidewaterError` naming the path
(:func:`storage_error`): ``ENOSPC``/``EDQUOT`` (a full disk), ``EACCES``/``EPERM``/``EROFS`` (not writable),
``EIO`` and the like are :class:`~cdc.errors.SinkUnavailable` (retryable: the changefeed shows ``warning`` and the
span retries from its checkpoint once the cause is fixed); a path that is not a directory is
:class:`~cdc.errors.SinkError`.
"""

from __future__ import annotations

import errno
import os
import uuid
from typing import BinaryIO

from cdc.errors import SinkError, SinkUnavailable, TidewaterError
from sinks.storage.layout import TEMP_PREFIX

_FULL = (errno.ENOSPC, errno.EDQUOT)
_READ_ONLY = (errno.EACCES, errno.EPERM, errno.EROFS)
_NOT_A_DIR = (errno.ENOTDIR, errno.EISDIR, errno.ENAMETOOLONG, errno.ELOOP)


def storage_error(exc: OSError, path: str, doing: str) -> TidewaterError:
    """The error to raise for ``exc`` met while ``doing`` (``"writing"``...) ``path`` (module docstring)."""
    why = exc.strerror or str(exc)
    if exc.errno in _FULL:
        return SinkUnavailable(f"storage sink: no space left on the device {doing} {path} ({why}): free space or "
                               f"move the sink; nothing after the last published flush is acknowledged", cause=exc)
    if exc.errno in _READ_ONLY:
        return SinkUnavailable(f"storage sink: {path} is not writable ({why}) while {doing} it: give the capture's "
                               f"user write access to the directory, or choose another one", cause=exc)
    if exc.errno in _NOT_A_DIR:
        return SinkError(f"storage sink: {path} cannot be used ({why}) while {doing} it: the sink URI must name a "
                         f"directory", cause=exc)
    return SinkUnavailable(f"storage sink: {doing} {path} failed: {why}", cause=exc)


class LocalFS:
    """Files under one root directory; every path argument is relative to it (``/``-separated)."""

    def __init__(self, root: str) -> None:
        self.root = root

    def abs(self, rel: str) -> str:
        return os.path.join(self.root, rel) if rel else self.root

    # ---- primitives (a fake overrides these) --------------------------------------------------------------
    def _open_new(self, path: str) -> BinaryIO:
        return open(path, "xb")  # noqa: SIM115 - the caller owns it

    def _fsync(self, f: BinaryIO) -> None:
        f.flush()
        os.fsync(f.fileno())

    def _link(self, src: str, dst: str) -> None:
        os.link(src, dst)

    def _rename(self, src: str, dst: str) -> None:
        os.rename(src, dst)

    def _fsync_dir(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _makedirs(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)

    # ---- operations ---------------------------------------------------------------------------------------
    def makedirs(self, rel: str) -> None:
        path = self.abs(rel)
        try:
            self._makedirs(path)
        except OSError as exc:
            raise storage_error(exc, path, "creating") from exc
        if not os.path.isdir(path):
            raise SinkError(f"storage sink: {path} is not a directory: the sink URI must name a directory")

    def temp_path(self, rel_dir: str, tag: str) -> str:
        """A new hidden temporary name in ``rel_dir`` (relative), ``tag`` telling whose it is."""
        return f"{rel_dir}/{TEMP_PREFIX}{tag}-{uuid.uuid4().hex}.tmp" if rel_dir else \
            f"{TEMP_PREFIX}{tag}-{uuid.uuid4().hex}.tmp"

    def create(self, rel: str) -> BinaryIO:
        """Open a new file for writing (its directory is created)."""
        path = self.abs(rel)
        self.makedirs(os.path.dirname(rel))
        try:
            return self._open_new(path)
        except OSError as exc:
            raise storage_error(exc, path, "creating") from exc

    def sync(self, f: BinaryIO, rel: str) -> None:
        """Flush and fsync an open file, then close it."""
        try:
            self._fsync(f)
            f.close()
        except OSError as exc:
            try:
                f.close()
            except OSError:
                pass
            raise storage_error(exc, self.abs(rel), "writing") from exc

    def publish(self, temp_rel: str, final_rel: str) -> bool:
        """Give the complete, synced file ``temp_rel`` its final name, never replacing a file: True when linked,
        False when ``final_rel`` exists already (then it is left alone). The temporary name stays (remove it)."""
        src, dst = self.abs(temp_rel), self.abs(final_rel)
        try:
            self._link(src, dst)
        except FileExistsError:
            return False
        except OSError as exc:
            raise storage_error(exc, dst, "publishing") from exc
        return True

    def sync_dir(self, rel_dir: str) -> None:
        path = self.abs(rel_dir)
        try:
            self._fsync_dir(path)
        except OSError as exc:
            raise storage_error(exc, path, "syncing the directory") from exc

    def write_atomic(self, rel: str, data: bytes, *, replace: bool = True) -> bool:
        """Write ``data`` as ``rel`` atomically (temporary file, fsync, rename or link, directory fsync). With
        ``replace=False`` an existing file is left as it is and False returned."""
        rel_dir = os.path.dirname(rel)
        temp = self.temp_path(rel_dir, "w")
        f = self.create(temp)
        try:
            try:
                f.write(data)
            except OSError as exc:
                raise storage_error(exc, self.abs(rel), "writing") from exc
            self.sync(f, rel)
            if replace:
                try:
                    self._rename(self.abs(temp), self.abs(rel))
                except OSError as exc:
                    raise storage_error(exc, self.abs(rel), "publishing") from exc
                done = True
            else:
                done = self.publish(temp, rel)
            self.sync_dir(rel_dir)
            return done
        finally:
            f.close()
            self.remove(temp)

    def read(self, rel: str) -> bytes | None:
        """The file's bytes, None when it does not exist."""
        path = self.abs(rel)
        try:
            with open(path, "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise storage_error(exc, path, "reading") from exc

    def exists(self, rel: str) -> bool:
        return os.path.exists(self.abs(rel))

    def same_file(self, a_rel: str, b_rel: str) -> bool:
        try:
            return os.path.samefile(self.abs(a_rel), self.abs(b_rel))
        except OSError:
            return False

    def links(self, rel: str) -> int:
        """How many names the file has (2 for a temporary file already published under its final name)."""
        try:
            return os.stat(self.abs(rel)).st_nlink
        except OSError:
            return 0

    def listdir(self, rel: str) -> list[str]:
        """Names in a directory (sorted), empty when it does not exist."""
        path = self.abs(rel)
        try:
            return sorted(os.listdir(path))
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError as exc:
            raise storage_error(exc, path, "listing") from exc

    def remove(self, rel: str) -> None:
        """Best effort (a temporary file)."""
        try:
            os.unlink(self.abs(rel))
        except OSError:
            pass

    def size(self, rel: str) -> int:
        try:
            return os.path.getsize(self.abs(rel))
        except OSError:
            return 0

    def check_writable(self) -> None:
        """Create the root and prove it writable (a synced temporary file, removed again)."""
        self.makedirs("")
        temp = self.temp_path("", "probe")
        f = self.create(temp)
        try:
            try:
                f.write(b"tidewater")
            except OSError as exc:
                raise storage_error(exc, self.root, "writing") from exc
            self.sync(f, temp)
            self.sync_dir("")
        finally:
            f.close()
            self.remove(temp)
