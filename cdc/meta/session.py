"""A liveness session: one etcd lease kept alive by a daemon thread.

Keys written under ``session.lease_id`` (a capture's registration, an election candidate) live exactly
as long as the session. The session is *lost* — once, for good — when etcd says the lease has expired,
or when no refresh has succeeded for ``ttl`` seconds (measured from the sending of the last refresh that
succeeded, so the lease may already be gone at etcd even if we could not hear it). After loss, every
``on_lost`` callback runs once on the refresher thread; a new session must be created to continue.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable

from cdc.errors import MetaStoreError
from cdc.meta.etcd import EtcdClient

log = logging.getLogger(__name__)

LostCallback = Callable[[str], None]


class Session:
    """Grants a lease of ``ttl`` seconds and refreshes it every ``ttl / 3`` seconds.

    ``alive`` is set while the lease is believed valid (cleared first on loss or close); ``lost`` is set
    once it is lost, after every ``on_lost`` callback has run (not on a deliberate :meth:`close`). ``clock`` (monotonic seconds) is injectable for tests.
    Thread-safe: ``add_on_lost``, ``close`` and the events may be used from any thread.
    """

    def __init__(self, client: EtcdClient, ttl: int, *, on_lost: LostCallback | Iterable[LostCallback] = (),
                 clock: Callable[[], float] = time.monotonic, refresh_interval: float | None = None) -> None:
        if ttl < 1:
            raise ValueError(f"session ttl must be >= 1 s, got {ttl}")
        self._client = client
        self._clock = clock
        self.ttl = int(ttl)
        self._interval = refresh_interval if refresh_interval is not None else max(self.ttl / 3.0, 0.1)
        self._lock = threading.Lock()
        self._callbacks: list[LostCallback] = [on_lost] if callable(on_lost) else list(on_lost)
        self.alive = threading.Event()
        self.lost = threading.Event()
        self.lost_reason = ""
        self._lost = False
        self._stop = threading.Event()
        sent = clock()
        self.lease_id = client.grant_lease(self.ttl)
        self._last_ok = sent
        self.alive.set()
        self._thread = threading.Thread(target=self._run, name=f"etcd-session {self.lease_id:x}", daemon=True)
        self._thread.start()
        log.info("etcd session started: lease %x, ttl %ss", self.lease_id, self.ttl)

    @property
    def deadline(self) -> float:
        """Clock time until which the lease is certainly still valid (given what we have heard)."""
        return self._last_ok + self.ttl

    def add_on_lost(self, callback: LostCallback) -> None:
        """Register ``callback(reason)``; it runs at once (on this thread) if the session is already lost."""
        with self._lock:
            if not self._lost:
                self._callbacks.append(callback)
                return
        self._invoke(callback, self.lost_reason)

    def _invoke(self, callback: LostCallback, reason: str) -> None:
        try:
            callback(reason)
        except Exception:
            log.exception("session on_lost callback failed")

    def _mark_lost(self, reason: str) -> None:
        with self._lock:
            if self._lost or self._stop.is_set():
                return
            self._lost = True
            self.lost_reason = reason
            self.alive.clear()
            callbacks = list(self._callbacks)
        log.warning("etcd session lease %x lost: %s", self.lease_id, reason)
        for cb in callbacks:
            self._invoke(cb, reason)
        self.lost.set()

    def _run(self) -> None:
        wait = self._interval
        while not self._stop.wait(wait):
            sent = self._clock()
            remaining_time = self.deadline - sent
            if remaining_time <= 0:
                self._mark_lost(f"no successful refresh for {sent - self._last_ok:.1f}s (ttl {self.ttl}s)")
                return
            try:
                ttl = self._client.refresh_lease(
                    self.lease_id, timeout=max(0.05, min(self._client.timeout, remaining_time)))
            except MetaStoreError as e:
                if self._stop.is_set():
                    return
                self._count_refresh(False)
                now = self._clock()
                if now >= self.deadline:
                    self._mark_lost(f"no successful refresh for {now - self._last_ok:.1f}s "
                                    f"(ttl {self.ttl}s): {e}")
                    return
                log.warning("etcd session lease %x refresh failed (%.1fs left): %s",
                            self.lease_id, self.deadline - now, e)
                wait = min(self._interval, 0.5, max(self.deadline - now, 0.0))
                continue
            self._count_refresh(ttl > 0)
            if ttl <= 0:
                self._mark_lost("lease expired or was revoked")
                return
            self._last_ok = sent
            wait = self._interval

    @property
    def refresh_age(self) -> float:
        """Seconds since the sending of the last refresh that succeeded (or since the grant)."""
        return self._clock() - self._last_ok

    @property
    def refresh_interval(self) -> float:
        return self._interval

    def _count_refresh(self, ok: bool) -> None:
        stats = getattr(self._client, "stats", None)  # test doubles of the client may have none
        if stats is not None:
            stats.lease_refresh(ok)

    def close(self, revoke: bool = True) -> None:
        """Stop refreshing; with ``revoke`` also revoke the lease now (its keys vanish at once), else the
        lease expires by itself after its TTL. Does not run ``on_lost`` callbacks. Idempotent."""
        with self._lock:
            already = self._stop.is_set()
            self._stop.set()
            self.alive.clear()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=self._client.timeout + 1)
        if already or not revoke or self._lost:
            return
        try:
            self._client.revoke_lease(self.lease_id)
            log.info("etcd session lease %x revoked", self.lease_id)
        except MetaStoreError as e:
            log.warning("etcd session lease %x: revoke failed, it expires by itself in %ss: %s",
                        self.lease_id, self.ttl, e)

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
