"""Leader election on etcd: lowest create revision under a prefix wins (etcd's concurrency recipe).

Each candidate puts ``prefix + f"{lease:x}"`` under its session lease and waits until no key under the
prefix has a lower create revision. Candidates queue in creation order; a leader stays leader until its
key is deleted (resign, lease expiry, or an operator), and no later key can ever precede it. Hence
:meth:`Election.fence` — "my key still exists with my create revision" — holds exactly while this
candidate is the leader, and every owner write carries it: a deposed owner's writes fail atomically
even if it has not noticed yet.
"""

from __future__ import annotations

import logging
import threading

from cdc.errors import MetaStoreError, NotOwner
from cdc.meta.etcd import EtcdClient
from cdc.meta.kv import KV, Compare, Op, WatchResponse
from cdc.meta.session import Session

log = logging.getLogger(__name__)


class Election:
    """One candidate (this session) in the election under ``prefix`` (which must end with '/').

    Thread-safety: ``campaign`` runs on one thread at a time; the other methods may be called from any
    thread. ``is_leader``/``leader`` read etcd (linearizable), they do not trust local state.
    """

    def __init__(self, client: EtcdClient, session: Session, prefix: str, *, poll_interval: float = 0.5) -> None:
        if not prefix.endswith("/"):
            raise ValueError(f"election prefix must end with '/': {prefix!r}")
        self._client = client
        self._session = session
        self.prefix = prefix
        self.key = f"{prefix}{session.lease_id:x}"
        self._poll = poll_interval
        self._create_rev = 0
        self._elected = False

    def _should_stop(self, stop: threading.Event) -> bool:
        return stop.is_set() or not self._session.alive.is_set()

    def campaign(self, value: bytes, stop: threading.Event) -> bool:
        """Become a candidate with ``value`` (e.g. the capture id) and block until elected.

        Returns True once this candidate is the leader; False if ``stop`` was set or the session was lost
        (or closed) first. Transient etcd errors are retried; they never escape.
        """
        while not self._should_stop(stop):
            try:
                if self._create_rev == 0:
                    self._client.put(self.key, value, lease=self._session.lease_id)
                    kv = self._client.get(self.key)
                    if kv is None or kv.lease != self._session.lease_id:
                        log.warning("election %s: candidate key vanished right after creation", self.key)
                        return False
                    self._create_rev = kv.create_revision
                    log.info("election %s: candidate at create revision %d", self.key, self._create_rev)
                revision, kvs = self._client.get_prefix(self.prefix)
                mine = next((kv for kv in kvs if kv.key == self.key), None)
                if mine is None or mine.create_revision != self._create_rev:
                    log.warning("election %s: candidate key is gone (lease expired?)", self.key)
                    self._create_rev = 0
                    return False
                predecessors = [kv for kv in kvs if kv.create_revision < self._create_rev]
                if not predecessors:
                    log.info("election %s: elected", self.key)
                    self._elected = True
                    return True
                pred = max(predecessors, key=lambda kv: kv.create_revision)
                self._wait_deleted(pred, revision, stop)
            except MetaStoreError as e:
                log.warning("election %s: %s; retrying", self.key, e)
                stop.wait(self._poll)
        return False

    def _wait_deleted(self, pred: KV, revision: int, stop: threading.Event) -> None:
        """Wait until ``pred`` is deleted (or something changed that warrants re-checking)."""
        changed = threading.Event()

        def on_events(resp: WatchResponse) -> None:
            if any(ev.kv.key == pred.key and ev.type == "delete" for ev in resp.events):
                changed.set()

        watch = self._client.watch_prefix(pred.key, revision + 1, on_events,
                                          on_error=lambda _e: changed.set())
        try:
            while not changed.wait(self._poll):
                if self._should_stop(stop):
                    return
        finally:
            watch.cancel()

    def is_leader(self) -> bool:
        """True if this candidate's key currently has the lowest create revision (read from etcd)."""
        if self._create_rev == 0:
            return False
        first = self._first()
        return first is not None and first.key == self.key and first.create_revision == self._create_rev

    def _first(self) -> KV | None:
        _, kvs = self._client.get_prefix(self.prefix)
        return min(kvs, key=lambda kv: kv.create_revision, default=None)

    def leader(self) -> tuple[str, bytes] | None:
        """The current leader's ``(key, value)``, or None if there is no candidate."""
        first = self._first()
        return (first.key, first.value) if first is not None else None

    def resign(self) -> None:
        """Withdraw: delete our key if it is still ours (the next candidate becomes leader)."""
        self._elected = False
        if self._create_rev == 0:
            return
        rev, self._create_rev = self._create_rev, 0
        self._client.txn([Compare(self.key, "create", "=", rev)], [Op.delete(self.key)])
        log.info("election %s: resigned", self.key)

    def fence(self) -> list[Compare]:
        """Compares that hold only while this candidate is still the leader; include them in every write
        made as leader. Raises ``NotOwner`` unless :meth:`campaign` has returned True (and no resign since).

        Once false, the fence never holds again (a re-created key gets a new create revision)."""
        if not self._elected or self._create_rev == 0:
            raise NotOwner(f"election {self.key}: not elected")
        return [Compare(self.key, "create", "=", self._create_rev)]
