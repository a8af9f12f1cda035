"""The owner's publisher of changefeed checkpoints to sinks that show them downstream (``sinks.base.CheckpointSink``:
the storage sink's ``metadata`` file; the Kafka sink's watermarks).

The owner *offers* each changefeed's checkpoint (the minimum over its spans, stored in its ``ChangefeedStatus``) as it
computes it; a thread of its own publishes, so a slow or unreachable sink never delays the owner's loop.

Guarantees:

- Latest value wins: an offer replaces the one not yet published; a value at or below the last one published by
  this owner term is not published again (the sink itself never moves backwards either).
- Only changefeeds whose sink class is a ``CheckpointSink`` are published; the class is looked up by URI scheme
  without opening a sink.
- One sink instance per changefeed, opened on first use and reopened after a failure or a change of sink URI.
- A failure is logged (the first, then every tenth) and retried with exponential backoff (``retry_min`` ..
  ``retry_max`` seconds); when the checkpoint could not be published for ``warn_after`` seconds it is shown as a
  ``notice`` data warning ``CDC:WarnCheckpointNotPublished`` of the changefeed (:meth:`warnings`; the owner merges it
  into the changefeed's status), whose message says so again once publishing works.
- ``run`` returns when its stop event is set and closes its sinks; ``forget`` drops a removed changefeed.
- Sinks come from the capture's factory (``sinks.base.SinkOpener``); time and sink opening are injectable (tests
  never sleep on a real clock beyond short waits).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from cdc.model import ChangefeedInfo, DataWarning, WarningSeverity
from cdc.uri import scrub
from owner.sink_worker import FeedMap, SinkHandle, open_as, retry_delay
from sinks.base import CheckpointSink, SinkOpener

log = logging.getLogger(__name__)

WARNING_CODE = "CDC:WarnCheckpointNotPublished"
WARNING_TABLE = "*"


def publishes(sinks: SinkOpener, sink_uri: str) -> bool:
    """The sink class of ``sink_uri`` publishes checkpoints (no sink is opened); False for an unusable URI."""
    try:
        return sinks.supports(sink_uri, CheckpointSink)
    except Exception:  # noqa: BLE001 - an unusable URI publishes nothing; its changefeed fails elsewhere
        return False


@dataclass
class _Feed:
    info: ChangefeedInfo
    ts: int = 0  # the latest offer
    time: float = 0.0
    published: int = 0  # the highest value published this term
    sink: SinkHandle[CheckpointSink] = field(default_factory=SinkHandle)
    failing_since: float = 0.0
    failures: int = 0
    error: str = ""
    next_try: float = 0.0
    warning: DataWarning | None = None


class CheckpointPublisher:
    """See the module docstring."""

    def __init__(self, sinks: SinkOpener, *, opener: Callable[[ChangefeedInfo], CheckpointSink] | None = None,
                 clock: Callable[[], float] = time.time, retry_min: float = 1.0, retry_max: float = 30.0,
                 warn_after: float = 30.0) -> None:
        self._sinks = sinks
        self._opener = opener or (  # (offer asked the class first)
            lambda info: open_as(sinks, info, CheckpointSink, "publishes no checkpoints"))
        self._clock = clock
        self.retry_min, self.retry_max, self.warn_after = retry_min, retry_max, warn_after
        self._feeds: FeedMap[_Feed] = FeedMap()
        self._publishes: dict[str, bool] = {}  # sink URI -> its class publishes checkpoints

    def offer(self, info: ChangefeedInfo, ts: int, commit_time: float) -> None:
        """The checkpoint of ``info`` is ``ts`` now (cheap; publishing happens in :meth:`run`)."""
        if ts <= 0:
            return
        does = self._publishes.get(info.sink_uri)
        if does is None:
            does = self._publishes[info.sink_uri] = publishes(self._sinks, info.sink_uri)
        if not does:
            return
        with self._feeds.lock:
            feed = self._feeds.get(info.id)
            if feed is None:
                feed = _Feed(info)
                self._feeds.put(info.id, feed)
            feed.info = info
            if ts <= feed.ts:
                return
            feed.ts, feed.time = ts, commit_time
        self._feeds.wake.set()

    def forget(self, changefeed: str) -> None:
        self._feeds.forget(changefeed)

    def warnings(self, changefeed: str) -> list[DataWarning]:
        """The changefeed's publishing warning, if publishing failed for ``warn_after`` seconds (see the module
        docstring)."""
        with self._feeds.lock:
            feed = self._feeds.get(changefeed)
            return [feed.warning] if feed is not None and feed.warning is not None else []

    def published(self, changefeed: str) -> int:
        with self._feeds.lock:
            feed = self._feeds.get(changefeed)
            return feed.published if feed is not None else 0

    # ---- the thread ---------------------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        """Publish until ``stop`` is set (a thread target; never raises), then close the sinks."""
        self._feeds.run(stop, self.publish_due)

    def stop_waiting(self) -> None:
        self._feeds.stop_waiting()

    def publish_due(self) -> float | None:
        """Publish every offer that is due now; return the seconds until the next retry (None: nothing waits)."""
        now = self._clock()
        with self._feeds.lock:
            due = [f for f in self._feeds.values() if f.ts > f.published and f.next_try <= now]
        for feed in due:
            self._publish_one(feed)
        with self._feeds.lock:
            waiting = [f.next_try - now for f in self._feeds.values() if f.ts > f.published]
        return max(0.0, min(waiting)) if waiting else None

    def _publish_one(self, feed: _Feed) -> None:
        ts, when, info = feed.ts, feed.time, feed.info
        try:
            feed.sink.get(info, self._opener).publish_checkpoint(ts, when)
        except Exception as exc:  # noqa: BLE001 - logged, retried, shown when it persists
            self._failed(feed, exc)
            return
        now = self._clock()
        with self._feeds.lock:
            feed.published = max(feed.published, ts)
            if feed.failures:
                log.info("changefeed=%s checkpoint %d published again after %d failure(s)", info.id, ts,
                         feed.failures)
                if feed.warning is not None:
                    feed.warning = DataWarning(
                        WARNING_CODE, WARNING_TABLE,
                        f"the sink's published checkpoint was not updated for {now - feed.failing_since:.0f}s "
                        f"({feed.error}); it is published again since then", WarningSeverity.NOTICE,
                        first_time=feed.warning.first_time, last_time=now)
                feed.failures, feed.failing_since, feed.error, feed.next_try = 0, 0.0, "", 0.0

    def _failed(self, feed: _Feed, exc: BaseException) -> None:
        now = self._clock()
        feed.sink.close()
        message = scrub(getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}")
        with self._feeds.lock:
            if not feed.failures:
                feed.failing_since = now
            feed.failures += 1
            feed.error = message
            feed.next_try = now + retry_delay(feed.failures, self.retry_min, self.retry_max)
            if now - feed.failing_since >= self.warn_after:
                first = feed.warning.first_time if feed.warning is not None and "again" not in feed.warning.message \
                    else feed.failing_since
                feed.warning = DataWarning(
                    WARNING_CODE, WARNING_TABLE,
                    f"the sink's published checkpoint is not updated since {now - feed.failing_since:.0f}s: "
                    f"{message}; retrying (consumers of the sink see an older checkpoint meanwhile)",
                    WarningSeverity.NOTICE, first_time=first, last_time=now)
        if feed.failures == 1 or feed.failures % 10 == 0:
            log.warning("changefeed=%s publishing checkpoint %d to the sink failed (attempt %d, retrying): %s",
                        feed.info.id, feed.ts, feed.failures, message)
