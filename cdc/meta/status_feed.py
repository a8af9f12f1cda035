"""Span and changefeed statuses followed by etcd watch, for the owner's prompt checkpoint aggregation.

The owner (and each processor) reads the whole cluster once per ``owner-tick``. Between two such snapshots, a ``StatusFeed``
watches the cluster prefix from the snapshot's revision + 1 and keeps the newest value of every span
status and changefeed status key changed since, so that the owner can recompute the changefeed
checkpoint as soon as a processor reports, without re-reading (and re-decoding) every key; ``wait``
also tells a loop that keys it acts on changed (changefeed info, captures, assignments), so that it can
run its next full cycle early.

Guarantees:
- ``overlay(snap)`` is ``snap`` with every span/changefeed status written after ``snap.revision`` (that
  this feed has seen) applied, newest revision wins; deleted keys are removed. It never returns a value
  older than the one in ``snap``.
- ``note_status`` records the owner's own status write with its revision, so an overlay taken right
  after the write never shows the older value even before the watch delivers the event.
- If the watch cannot be established or etcd compacted its start revision, the feed is ``broken``
  (``overlay`` returns ``snap`` unchanged and ``wait`` only times out) until the next ``follow`` starts a
  new watch: the owner falls back to its tick cadence, nothing is lost.
Thread-safety: the watch callback runs on the watch thread; every method may be called from another
(single) thread.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import replace

from cdc import serde
from cdc.errors import MetaStoreError
from cdc.meta import keys
from cdc.meta.etcd import Watch
from cdc.meta.keys import KeyKind
from cdc.meta.kv import WatchResponse
from cdc.meta.store import ClusterSnapshot, MetaStore
from cdc.model import ChangefeedStatus, SpanStatus

log = logging.getLogger(__name__)

_SpanKey = tuple[str, int]


class StatusFeed:
    """``wake_on``: the key kinds whose changes ``wait`` reports (default: span statuses)."""

    def __init__(self, store: MetaStore, wake_on: frozenset[KeyKind] = frozenset({KeyKind.SPAN_STATUS})) -> None:
        self._store = store
        self._wake_on = wake_on
        self._lock = threading.Lock()
        self._changed = threading.Event()
        self._kinds: set[KeyKind] = set()
        self._watch: Watch | None = None
        self._broken = True
        # key -> (mod revision, value or None when deleted)
        self._spans: dict[_SpanKey, tuple[int, SpanStatus | None]] = {}
        self._statuses: dict[str, tuple[int, ChangefeedStatus | None]] = {}

    @property
    def broken(self) -> bool:
        return self._broken

    def follow(self, snap: ClusterSnapshot) -> None:
        """``snap`` is the newest full read: forget what it already holds and make sure a watch runs
        that delivers every change after ``snap.revision``. Raises nothing: a watch that cannot be
        established is logged and retried at the next call."""
        with self._lock:
            self._spans = {k: v for k, v in self._spans.items() if v[0] > snap.revision}
            self._statuses = {k: v for k, v in self._statuses.items() if v[0] > snap.revision}
        if self._watch is not None and not self._broken:
            return
        self.close()
        try:
            self._watch = self._store.watch(snap.revision + 1, self.on_events, self._on_error)
            self._broken = False
        except MetaStoreError as exc:
            log.warning("status watch not established (checkpoints aggregate at owner-tick meanwhile): %s", exc)

    def wait(self, timeout: float) -> frozenset[KeyKind]:
        """Wait up to ``timeout`` seconds for a change of a ``wake_on`` kind; returns (and resets) the
        kinds that changed since the last call, empty after a timeout."""
        if not self._changed.wait(timeout):
            return frozenset()
        with self._lock:
            self._changed.clear()
            kinds, self._kinds = frozenset(self._kinds), set()
        return kinds

    def interrupt(self) -> None:
        """End a ``wait`` now (it returns what changed so far, possibly nothing): its caller is stopping."""
        self._changed.set()

    def note_status(self, cf: str, status: ChangefeedStatus, revision: int) -> None:
        """The owner stored ``status`` at ``revision``."""
        with self._lock:
            cur = self._statuses.get(cf)
            if cur is None or cur[0] < revision:
                self._statuses[cf] = (revision, status)

    def overlay(self, snap: ClusterSnapshot) -> ClusterSnapshot:
        """``snap`` with the newer statuses applied (a copy; ``snap`` is not modified)."""
        with self._lock:
            spans = [(k, v) for k, (rev, v) in self._spans.items() if rev > snap.revision]
            statuses = [(k, v) for k, (rev, v) in self._statuses.items() if rev > snap.revision]
        if not spans and not statuses:
            return snap
        span_statuses = {cf: dict(m) for cf, m in snap.span_statuses.items()}
        cf_statuses = dict(snap.statuses)
        for (cf, span), st in spans:
            if st is None:
                span_statuses.get(cf, {}).pop(span, None)
            else:
                span_statuses.setdefault(cf, {})[span] = st
        for cf, cs in statuses:
            if cs is None:
                cf_statuses.pop(cf, None)
            else:
                cf_statuses[cf] = cs
        return replace(snap, statuses=cf_statuses, span_statuses=span_statuses)

    def close(self) -> None:
        w, self._watch = self._watch, None
        self._broken = True
        if w is not None:
            w.cancel()

    # ---- watch thread ----------------------------------------------------------------------------
    def on_events(self, resp: WatchResponse) -> None:
        """The watch's callback (called on its thread; tests call it with the events a watch would deliver)."""
        woken: set[KeyKind] = set()
        for ev in resp.events:
            try:
                k = keys.parse_key(ev.kv.key)
            except ValueError:
                continue
            if k.kind in self._wake_on:
                woken.add(k.kind)
            if k.kind not in (KeyKind.SPAN_STATUS, KeyKind.CHANGEFEED_STATUS):
                continue
            rev = ev.kv.mod_revision
            try:
                if k.kind is KeyKind.SPAN_STATUS:
                    span_value = None if ev.type == "delete" else serde.from_json(SpanStatus, ev.kv.value)
                    with self._lock:
                        self._spans[(k.changefeed, k.span)] = (rev, span_value)
                else:
                    cf_value = None if ev.type == "delete" else serde.from_json(ChangefeedStatus, ev.kv.value)
                    with self._lock:
                        cur = self._statuses.get(k.changefeed)
                        if cur is None or cur[0] < rev:
                            self._statuses[k.changefeed] = (rev, cf_value)
            except (ValueError, TypeError, KeyError, AttributeError) as exc:
                # the owner's next snapshot reports (and refuses) the corrupt value
                log.debug("status watch: cannot decode %s: %s", ev.kv.key, exc)
        if woken:
            with self._lock:
                self._kinds |= woken
                self._changed.set()

    def _on_error(self, exc: MetaStoreError) -> None:
        log.warning("status watch ended (checkpoints aggregate at owner-tick until it is re-established): %s", exc)
        self._broken = True
