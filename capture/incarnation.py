"""A capture's claim on its data directory, and the etcd lease the directory's previous process left behind.

A capture restarted in place (systemd, a Kubernetes pod on its volume, a SIGKILL and start again) used to wait for the
session lease of its previous process to expire (``session-ttl``, 10 s by default) before anything moved: the dead
owner's election key stood in front of the new candidate, and the dead capture kept its spans, an initial copy
included, until then. A data directory is used by one process at a time, so the process that holds it now knows
that whoever wrote the directory's last lease is gone, and may revoke that lease at once: its keys vanish exactly as
at expiry, only earlier.

Guarantees:

- :class:`Incarnation` holds an exclusive ``flock`` on ``<data-dir>/capture.lock`` for the process's life (released
  by the kernel when the process ends, SIGKILL included; not inherited by child processes, whose descriptors Python
  opens non-inheritable). A second process on the same directory is refused with ``DataDirInUse`` before it touches
  etcd, so the recorded lease is never one a live process still uses.
- :meth:`previous_lease` returns the lease recorded by an earlier process only for the same cluster id and the same
  etcd endpoints (a lease id means nothing in another etcd cluster); :meth:`record` writes it atomically (a
  temporary file renamed), before the lease carries any key.
- Nothing here deletes a key itself: the caller revokes the lease (``EtcdClient.revoke_lease``; a lease gone already
  is not an error), which removes exactly the keys that expiry would have removed.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Sequence
from pathlib import Path

from cdc.errors import InvalidConfig

LOCK_FILE = "capture.lock"
LEASE_FILE = "capture-lease.json"


class DataDirInUse(InvalidConfig):
    code = "CDC:ErrDataDirInUse"


class Incarnation:
    """This process's exclusive use of ``data_dir`` (see the module docstring). Raises ``DataDirInUse`` when another
    live process holds it."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = Path(data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            raise DataDirInUse(f"data directory {self.data_dir} is in use by another cdc server (its "
                               f"{LOCK_FILE} is locked: {exc.strerror or exc}); give each server its own --data-dir"
                               ) from exc
        self._fd: int | None = fd

    def previous_lease(self, cluster_id: str, endpoints: Sequence[str]) -> int | None:
        """The lease the previous process of this directory recorded for ``cluster_id`` on ``endpoints``, or None."""
        try:
            rec = json.loads((self.data_dir / LEASE_FILE).read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(rec, dict) or rec.get("cluster_id") != cluster_id or \
                rec.get("etcd") != sorted(endpoints) or not isinstance(rec.get("lease"), int):
            return None
        return int(rec["lease"])

    def record(self, cluster_id: str, endpoints: Sequence[str], lease_id: int) -> None:
        """Remember ``lease_id`` as this directory's current lease (atomically)."""
        path = self.data_dir / LEASE_FILE
        tmp = path.with_name(f"{LEASE_FILE}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"cluster_id": cluster_id, "etcd": sorted(endpoints), "lease": lease_id}))
        os.replace(tmp, path)

    def close(self) -> None:
        """Release the directory (idempotent)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)  # (closing the descriptor releases the flock)
