"""What the owner's per-changefeed sink workers share (``owner.checkpoint_publish``: published checkpoints;
``owner.barrier_apply``: snapshot-mode barriers): each keeps one sink per changefeed, drives it from a thread of its
own that wakes on offers, and retries a failing sink with exponential backoff.

Guarantees:

- :class:`SinkHandle`: one sink per changefeed, opened on first use and reopened after :meth:`SinkHandle.close` (a
  failure closes it: a sink that failed is never reused) or when the changefeed's sink URI changed; closing never
  raises.
- :func:`open_as`: the changefeed's sink opened by the capture's factory, refused (closed, ``SinkError`` naming the
  sink without its password) when it does not play the worker's role.
- :func:`retry_delay`: ``retry_min * 2 ** (failures - 1)`` capped at ``retry_max`` seconds.
- :func:`run_worker`: calls ``step`` until ``stop`` is set, sleeping until the delay ``step`` returns (at most 1 s;
  None: nothing waits) or until ``wake`` is set; ``on_exit`` runs once at the end, whatever happened.
- :class:`FeedMap`: the worker's feeds by changefeed id under one lock, and the event that wakes its thread; a feed
  forgotten, replaced or left when the worker's thread ends has its sink closed (outside the lock).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

from cdc.config import ChangefeedConfig
from cdc.errors import SinkError
from cdc.model import ChangefeedInfo
from cdc.uri import parse_sink_uri
from sinks.base import SinkOpener

S = TypeVar("S")  # the sink role the worker drives (every sink the factory opens has close())


class SinkHandle(Generic[S]):
    """One changefeed's sink (module docstring)."""

    __slots__ = ("sink", "uri")

    def __init__(self) -> None:
        self.sink: S | None = None
        self.uri = ""

    def get(self, info: ChangefeedInfo, opener: Callable[[ChangefeedInfo], S]) -> S:
        """The open sink of ``info``'s sink URI (opened now when there is none or the URI changed)."""
        if self.sink is None or self.uri != info.sink_uri:
            self.close()
            self.sink = opener(info)
            self.uri = info.sink_uri
        return self.sink

    def close(self) -> None:
        sink, self.sink = self.sink, None
        if sink is not None:
            try:
                sink.close()  # type: ignore[attr-defined]
            except Exception:  # noqa: BLE001 - closing a sink that failed
                pass


def open_as(sinks: SinkOpener, info: ChangefeedInfo, role: type[S], lacks: str) -> S:
    """``info``'s sink, which must be a ``role``; else ``SinkError``: "the sink URI ``lacks``"."""
    sink = sinks.open(info.sink_uri, ChangefeedConfig.from_dict(info.config).sink)
    if not isinstance(sink, role):
        sink.close()
        raise SinkError(f"the sink {parse_sink_uri(info.sink_uri).redacted()} {lacks}")
    return sink


def retry_delay(failures: int, retry_min: float, retry_max: float) -> float:
    """Seconds before the next try after ``failures`` failures in a row (module docstring)."""
    return min(retry_max, retry_min * 2 ** min(failures - 1, 16))


def run_worker(stop: threading.Event, wake: threading.Event, step: Callable[[], float | None],
               on_exit: Callable[[], None]) -> None:
    """The worker thread's loop (module docstring)."""
    try:
        while not stop.is_set():
            delay = step()
            wake.wait(min(delay, 1.0) if delay is not None else 1.0)
            wake.clear()
    finally:
        on_exit()


class Feed(Protocol):
    """What :class:`FeedMap` needs of a feed: its sink handle."""

    @property
    def sink(self) -> SinkHandle: ...  # type: ignore[type-arg]


F = TypeVar("F", bound=Feed)


class FeedMap(Generic[F]):
    """A worker's feeds by changefeed id (module docstring). Read and change feeds, and the map itself through
    :meth:`get`, :meth:`put` and :meth:`values`, only while holding :attr:`lock`."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.wake = threading.Event()  # set by offers: the worker's thread looks at its feeds at once
        self._feeds: dict[str, F] = {}

    def get(self, changefeed: str) -> F | None:
        return self._feeds.get(changefeed)

    def put(self, changefeed: str, feed: F) -> None:
        """Hold ``feed`` for ``changefeed``; a feed it replaces has its sink closed (under the lock: closing a
        handle never raises and a replaced feed's sink is idle)."""
        old = self._feeds.get(changefeed)
        if old is not None and old is not feed:
            old.sink.close()
        self._feeds[changefeed] = feed

    def values(self) -> list[F]:
        return list(self._feeds.values())

    def forget(self, changefeed: str) -> F | None:
        """Drop ``changefeed``'s feed and close its sink (takes the lock itself); returns the feed dropped."""
        with self.lock:
            feed = self._feeds.pop(changefeed, None)
        if feed is not None:
            feed.sink.close()
        return feed

    def run(self, stop: threading.Event, step: Callable[[], float | None]) -> None:
        """:func:`run_worker` with this map's wake event; at the end every feed is dropped and its sink closed."""
        run_worker(stop, self.wake, step, self._close_all)

    def stop_waiting(self) -> None:
        """Wake the worker's thread now (its stop event was set)."""
        self.wake.set()

    def _close_all(self) -> None:
        with self.lock:
            feeds = list(self._feeds.values())
            self._feeds.clear()
        for feed in feeds:
            feed.sink.close()
