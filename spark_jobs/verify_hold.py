"""The verifier's side of the verify hold (docs/verify.md, "The hold"): make a running changefeed's target stand
still at exactly the upstream position ``Y`` of an exported snapshot, for as short as possible.

:class:`VerifyHoldSession`:

1. :meth:`~VerifyHoldSession.freeze`: store ``VerifyHold(id, ts=0)``: every span stops applying where it is; wait
   until every span reports it in ``SpanStatus.held_id`` (its checkpoint ``W_i`` is then final).
2. The caller exports the upstream snapshot now: its ``Y`` is at or above every ``W_i`` (each span applied only
   commits that existed before the export).
3. :meth:`~VerifyHoldSession.hold_at` ``(Y)``: every span applies everything up to ``Y``, nothing after it, and
   reports ``held_ts == Y``; a span that reports more went past ``Y`` (it cannot be compared at ``Y``): refused.
4. The caller opens its read of the target (PostgreSQL: one exported repeatable-read snapshot, after which
   :meth:`~VerifyHoldSession.release` at once; other targets: the hold lasts while their chunks are read).

The hold has a deadline (``ttl`` seconds); a thread renews it every ``ttl / 3`` while the session lives, so a
verifier killed by SIGKILL stops the changefeed for at most ``ttl`` seconds: processors ignore an expired hold.
:meth:`~VerifyHoldSession.release` (also on leaving the ``with`` block, Ctrl-C included) deletes it at once.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Sequence

from cdc.errors import VerifyHoldFailed
from cdc.meta.store import MetaStore
from cdc.model import SpanStatus, VerifyHold

log = logging.getLogger(__name__)

POLL = 0.1
"""Seconds between two reads of the span statuses while waiting for the spans to hold."""


class VerifyHoldSession:
    """One verification's hold of changefeed ``cf`` whose spans are ``spans`` (see the module docstring)."""

    def __init__(self, store: MetaStore, cf: str, spans: Sequence[int], *, ttl: float = 30.0,
                 timeout: float = 60.0) -> None:
        if ttl <= 1:
            raise ValueError(f"hold ttl must exceed 1 s, got {ttl}")
        self.store = store
        self.cf = cf
        self.spans = tuple(spans)
        self.ttl = ttl
        self.timeout = timeout
        self.id = uuid.uuid4().int >> 65  # positive, fits a JSON integer everywhere
        self.holder = f"{socket.gethostname()}:{os.getpid()}"
        self.ts = 0
        self.created = time.time()
        self.held_since: float | None = None
        self.held_seconds = 0.0
        self._lock = threading.Lock()
        self._released = threading.Event()
        self._renewer: threading.Thread | None = None

    # ---- the hold in etcd -------------------------------------------------------------------------------
    def _put(self) -> None:
        hold = VerifyHold(self.id, time.time() + self.ttl, self.ts, self.holder, self.created)
        with self._lock:
            if self._released.is_set():
                return
            if not self.store.put_hold(self.cf, hold):
                present = self.store.get_hold(self.cf)
                raise VerifyHoldFailed(f"changefeed {self.cf}: cannot hold it: "
                                 + (f"another verification holds it ({present.holder}, until {present.deadline:.0f})"
                                    if present is not None else "the changefeed no longer exists"))

    def _renew(self) -> None:
        while not self._released.wait(self.ttl / 3):
            try:
                self._put()
            except Exception as exc:  # noqa: BLE001 - the hold then expires by its deadline; the caller sees it
                log.warning("changefeed=%s verify hold %d not renewed: %s", self.cf, self.id, exc)

    def _wait(self, what: str, done: Callable[[SpanStatus], bool]) -> dict[int, SpanStatus]:
        """Poll the span statuses until ``done`` holds for every span; VerifyHoldFailed after ``timeout`` seconds
        in which no span's checkpoint moved (a lagging changefeed catching up to the point is waited for)."""
        deadline = time.monotonic() + self.timeout
        statuses: dict[int, SpanStatus] = {}
        seen: dict[int, int] = {}
        while True:
            statuses = {}
            for span in self.spans:
                entry = self.store.get_span_status(self.cf, span)
                if entry is not None:
                    statuses[span] = entry.value
            late = [s for s in self.spans if s not in statuses or not done(statuses[s])]
            if not late:
                return statuses
            moved = {s: statuses[s].checkpoint_ts for s in late if s in statuses}
            if any(ts > seen.get(s, ts) for s, ts in moved.items()):
                deadline = time.monotonic() + self.timeout  # catching up: wait on
            seen.update(moved)
            if time.monotonic() >= deadline:
                raise VerifyHoldFailed(f"changefeed {self.cf}: span(s) {late} did not {what} (no progress for "
                                       f"{self.timeout:.0f} s) "
                                 "(a span that is not running, retries an error or waits at a DDL barrier cannot "
                                 "hold): nothing was compared")
            time.sleep(POLL)

    # ---- the protocol -----------------------------------------------------------------------------------
    def freeze(self) -> dict[int, int]:
        """Phase 1: every span stops applying where it is; returns each span's checkpoint then."""
        self.ts = 0
        self._put()
        self.held_since = time.monotonic()
        if self._renewer is None:
            self._renewer = threading.Thread(target=self._renew, name=f"verify-hold-{self.cf}", daemon=True)
            self._renewer.start()
        st = self._wait("stop applying", lambda s: s.running and s.held_id == self.id)
        points = {i: s.held_ts for i, s in st.items()}
        log.info("changefeed=%s verify hold %d: spans stopped at %s", self.cf, self.id, points)
        return points

    def hold_at(self, ts: int) -> None:
        """Phase 2: every span applies everything up to ``ts`` and waits there; VerifyHoldFailed if one went past it."""
        self.ts = ts
        self._put()
        st = self._wait(f"reach {ts}", lambda s: s.running and s.held_id == self.id and s.held_ts >= ts)
        past = {i: s.held_ts for i, s in st.items() if s.held_ts != ts}
        if past:
            raise VerifyHoldFailed(f"changefeed {self.cf}: span(s) {past} applied past the verification point {ts}: "
                             "nothing was compared; run verify again")
        log.info("changefeed=%s verify hold %d: every span holds at %d", self.cf, self.id, ts)

    def release(self) -> None:
        """Delete the hold (idempotent; the spans go on at once)."""
        with self._lock:
            if self._released.is_set():
                return
            self._released.set()
        if self.held_since is not None:
            self.held_seconds = time.monotonic() - self.held_since
        try:
            self.store.release_hold(self.cf, self.id)
            log.info("changefeed=%s verify hold %d released after %.3f s", self.cf, self.id, self.held_seconds)
        except Exception as exc:  # noqa: BLE001 - the hold expires by its deadline
            log.warning("changefeed=%s verify hold %d not released (it expires in at most %.0f s): %s", self.cf,
                        self.id, self.ttl, exc)

    def __enter__(self) -> VerifyHoldSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
