"""The owner's barrier coordinator (``[consistency] mode = "snapshot"``, docs/consistency.md): makes each changefeed's
staged changes visible downstream in whole barriers.

The spans of a snapshot-mode changefeed stage their transactions in the target (``sinks.base.BarrierSink``): a
span's checkpoint means "everything of this span up to here is staged". The changefeed checkpoint (the minimum over
its spans, as the owner stores it in ``ChangefeedStatus``, held at ``hold_ts`` during a table copy) is therefore a
point every span has staged up to: a barrier. The owner *offers* each stored checkpoint; a thread of its own applies
the latest one, at most once per ``[consistency] interval``, through ``BarrierSink.apply_barrier`` (one downstream
transaction per barrier). The owner's capture is the coordinator: there is one owner at a time, and a deposed owner
that still applies cannot do harm (the target's barrier head is a compare-and-set: a barrier is applied once, and
never one older than the target shows).

Guarantees:

- Latest value wins: an offer replaces the one not yet applied; a barrier at or below the one applied is skipped.
  Between two applies of a changefeed at least its ``interval`` passes (the first apply of a term is immediate).
- Only changefeeds whose config says ``mode = "snapshot"`` are coordinated; offers of others are ignored.
- A stopped, failed or finished changefeed's staged changes are still applied up to its checkpoint (they are final);
  a removed one is forgotten (``forget``) before its rows go.
- One sink instance per changefeed, opened on first use and reopened after a failure or a change of sink URI.
- A failure is logged (the first, then every tenth) and retried with exponential backoff (``retry_min`` ..
  ``retry_max`` seconds); when no barrier could be applied for ``warn_after`` seconds the changefeed gets the
  ``divergence`` data warning ``CDC:WarnBarrierNotApplied`` (the target stays at an older state than the changefeed
  checkpoint says: :meth:`warnings`, merged by the owner into the changefeed's status), naming the barrier the target
  shows and the error; once a barrier is applied again its message says so (the state stays ``warning`` until the
  operator resumes the changefeed, as for every divergence warning). Warnings the apply itself raised (``take_warnings``: a row missing downstream, a value that
  cannot be stored exactly) are kept for the term and shown the same way.
- ``run`` returns when its stop event is set and closes its sinks. Time and sink opening are injectable.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cdc.config import ChangefeedConfig, ConsistencyConfig
from cdc.model import ChangefeedInfo, DataWarning, WarningSeverity, merge_warnings
from cdc.uri import scrub
from owner.sink_worker import FeedMap, SinkHandle, open_as, retry_delay
from sinks.base import BarrierSink, SinkOpener

log = logging.getLogger(__name__)

WARNING_CODE = "CDC:WarnBarrierNotApplied"
WARNING_TABLE = "*"


def consistency(info: ChangefeedInfo) -> ConsistencyConfig | None:
    """The changefeed's ``[consistency]`` when it is snapshot mode, else None (also for a config this version
    cannot read: its changefeed fails elsewhere)."""
    try:
        c = ChangefeedConfig.from_dict(info.config).consistency
    except Exception:  # noqa: BLE001 - see the docstring
        return None
    return c if c.snapshot else None


@dataclass
class BarrierFeed:
    """One changefeed's barrier bookkeeping (pure state; :func:`due` decides)."""

    info: ChangefeedInfo
    config: ConsistencyConfig
    ts: int = 0  # the latest offer: every span staged up to it
    time: float = 0.0
    applied: int = 0  # the barrier the target shows, as this owner last saw it (0: not read yet)
    applied_time: float = 0.0  # its upstream commit time
    last_apply: float | None = None  # the clock when the last barrier was applied (None: none this term)
    next_try: float = 0.0
    failures: int = 0
    failing_since: float = 0.0
    error: str = ""
    warning: DataWarning | None = None
    found: tuple[DataWarning, ...] = ()  # raised by the applies of this term
    sink: SinkHandle[BarrierSink] = field(default_factory=SinkHandle)
    applies: int = 0
    changes: int = field(default=0)


def due(feed: BarrierFeed, now: float) -> float | None:
    """0 when ``feed`` has a barrier to apply now, the seconds until it may be applied, or None when there is
    nothing to apply (no offer above what the target shows)."""
    if feed.ts <= feed.applied:
        return None
    at = feed.next_try
    if feed.last_apply is not None:
        at = max(at, feed.last_apply + feed.config.interval)
    return max(0.0, at - now)


class BarrierCoordinator:
    """See the module docstring."""

    def __init__(self, sinks: SinkOpener, *, opener: Callable[[ChangefeedInfo], BarrierSink] | None = None,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time,
                 retry_min: float = 1.0, retry_max: float = 30.0, warn_after: float = 30.0) -> None:
        self._opener = opener or (lambda info: open_as(
            sinks, info, BarrierSink, 'cannot apply whole barriers ([consistency] mode = "snapshot")'))
        self._clock = clock
        self._wall = wall
        self.retry_min, self.retry_max, self.warn_after = retry_min, retry_max, warn_after
        self._feeds: FeedMap[BarrierFeed] = FeedMap()
        # changefeed -> (its config as stored, parsed): offers are frequent, a config rarely changes
        self._configs: dict[str, tuple[dict[str, Any], ConsistencyConfig | None]] = {}

    def offer(self, info: ChangefeedInfo, ts: int, commit_time: float) -> None:
        """Every span of ``info`` staged up to ``ts`` (cheap; applying happens in :meth:`run`)."""
        if ts <= 0:
            return
        cached = self._configs.get(info.id)
        if cached is None or (cached[0] is not info.config and cached[0] != info.config):
            cached = self._configs[info.id] = (info.config, consistency(info))
        config = cached[1]
        if config is None:
            return
        with self._feeds.lock:
            feed = self._feeds.get(info.id)
            if feed is None or feed.info.start_ts != info.start_ts:  # (a changefeed recreated under this id)
                feed = BarrierFeed(info, config)
                self._feeds.put(info.id, feed)
            feed.info, feed.config = info, config
            if ts <= feed.ts:
                return
            feed.ts, feed.time = ts, commit_time
        self._feeds.wake.set()

    def forget(self, changefeed: str) -> None:
        self._feeds.forget(changefeed)
        self._configs.pop(changefeed, None)

    def warnings(self, changefeed: str) -> list[DataWarning]:
        """The changefeed's coordinator warnings (module docstring)."""
        with self._feeds.lock:
            feed = self._feeds.get(changefeed)
            if feed is None:
                return []
            return list(feed.found) + ([feed.warning] if feed.warning is not None else [])

    def applied(self, changefeed: str) -> int:
        """The barrier the target shows, as this owner last applied or read it (0: unknown)."""
        return self.applied_point(changefeed)[0]

    def applied_point(self, changefeed: str) -> tuple[int, float]:
        """(barrier, its upstream commit time) the target shows as this owner last applied it ((0, 0.0): unknown)."""
        with self._feeds.lock:
            feed = self._feeds.get(changefeed)
            return (feed.applied, feed.applied_time) if feed is not None else (0, 0.0)

    # ---- the thread ---------------------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        """Apply until ``stop`` is set (a thread target; never raises), then close the sinks."""
        self._feeds.run(stop, self.apply_due)

    def stop_waiting(self) -> None:
        self._feeds.stop_waiting()

    def apply_due(self) -> float | None:
        """Apply every barrier that is due now; return the seconds until the next one may be (None: none waits)."""
        now = self._clock()
        with self._feeds.lock:
            ready = [f for f in self._feeds.values() if due(f, now) == 0.0]
        for feed in ready:
            self._apply_one(feed)
        now = self._clock()
        with self._feeds.lock:
            waits = [w for w in (due(f, now) for f in self._feeds.values()) if w is not None]
        return min(waits) if waits else None

    def _apply_one(self, feed: BarrierFeed) -> None:
        with self._feeds.lock:
            ts, when, info, config = feed.ts, feed.time, feed.info, feed.config
        try:
            sink = feed.sink.get(info, self._opener)
            done = sink.apply_barrier(info.id, info.start_ts, ts, when, history=config.syncpoint)
            found = sink.take_warnings()
        except Exception as exc:  # noqa: BLE001 - logged, retried, shown when it persists
            self._failed(feed, exc)
            return
        now = self._clock()
        with self._feeds.lock:
            if done.barrier_ts > feed.applied:
                feed.applied, feed.applied_time = done.barrier_ts, when if done.barrier_ts == ts else 0.0
            feed.last_apply = now
            feed.applies += 1
            feed.changes += done.changes
            if found:
                feed.found = tuple(merge_warnings(feed.found, found))
            if feed.failures:
                log.info("changefeed=%s barrier %d applied again after %d failure(s)", info.id, done.barrier_ts,
                         feed.failures)
                if feed.warning is not None:  # (the owner keeps the stored one: it must say that it ended)
                    feed.warning = DataWarning(
                        WARNING_CODE, WARNING_TABLE,
                        f"no barrier was applied downstream for {now - feed.failing_since:.0f}s ({feed.error}); "
                        f"barriers are applied again since then (barrier {done.barrier_ts})",
                        WarningSeverity.DIVERGENCE, first_time=feed.warning.first_time, last_time=self._wall())
                feed.failures, feed.failing_since, feed.error, feed.next_try = 0, 0.0, "", 0.0

    def _failed(self, feed: BarrierFeed, exc: BaseException) -> None:
        now = self._clock()
        feed.sink.close()
        message = scrub(getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}")
        with self._feeds.lock:
            if not feed.failures:
                feed.failing_since = now
                if feed.warning is not None and "again since" in feed.warning.message:
                    feed.warning = None  # (a new outage: its own warning, counted from now)
            feed.failures += 1
            feed.error = message
            feed.next_try = now + retry_delay(feed.failures, self.retry_min, self.retry_max)
            if now - feed.failing_since >= self.warn_after:
                wall = self._wall()
                first = feed.warning.first_time if feed.warning is not None else wall
                feed.warning = DataWarning(
                    WARNING_CODE, WARNING_TABLE,
                    f"no barrier applied downstream for {now - feed.failing_since:.0f}s: the target shows barrier "
                    f"{feed.applied or 'unknown'} while every span has staged up to {feed.ts} ({message}); retrying, "
                    "readers see the older state meanwhile", WarningSeverity.DIVERGENCE,
                    first_time=first, last_time=wall)
        if feed.failures == 1 or feed.failures % 10 == 0:
            log.warning("changefeed=%s applying barrier %d downstream failed (attempt %d, retrying): %s",
                        feed.info.id, feed.ts, feed.failures, message)
