"""The owner's checkpoint publisher (owner.checkpoint_publish): latest value wins, only sinks that publish, failures
retried with backoff and shown as a notice once they persist, a real storage sink's ``metadata`` written by it."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from cdc.model import ChangefeedInfo, SpanInfo, WarningSeverity
from owner.checkpoint_publish import WARNING_CODE, CheckpointPublisher, publishes
from sinks.factory import SinkFactory
from sinks.testing import MemoryCheckpointSink
from upstream import open_upstream

pytestmark = pytest.mark.unit

SINKS = SinkFactory()  # what the capture hands to the owner


def info(sink_uri: str = "file:///tmp/lake?protocol=csv", cf: str = "cf") -> ChangefeedInfo:
    return ChangefeedInfo(id=cf, upstream_uri="postgresql://u@h/db", sink_uri=sink_uri, config={}, start_ts=100,
                          start_time=1.0, create_time=1.0, spans=(SpanInfo(0, "s0", "p0", 100),))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def publisher(log: list[int], fail: Callable[[], bool] = lambda: False, clock: Clock | None = None
              ) -> tuple[CheckpointPublisher, list[MemoryCheckpointSink]]:
    opened: list[MemoryCheckpointSink] = []

    def opener(_info: ChangefeedInfo) -> MemoryCheckpointSink:
        s = MemoryCheckpointSink(fail, log, "storage sink: no space left on the device writing /lake/metadata")
        opened.append(s)
        return s

    return CheckpointPublisher(SINKS, opener=opener, clock=clock or Clock(), retry_min=1.0, retry_max=8.0,
                               warn_after=30.0), opened


def test_latest_value_wins_and_nothing_twice() -> None:
    log: list[int] = []
    p, opened = publisher(log)
    for ts in (200, 300, 250):  # 250 after 300: an older value, ignored
        p.offer(info(), ts, float(ts))
    p.publish_due()
    p.offer(info(), 300, 300.0)
    p.publish_due()
    assert log == [300] and len(opened) == 1 and p.published("cf") == 300


def test_only_sinks_that_publish_checkpoints() -> None:
    assert publishes(SINKS, "file:///tmp/x?protocol=csv")
    assert not publishes(SINKS, "blackhole://") and not publishes(SINKS, "sqlite:///tmp/x.db") and not publishes(SINKS, "nonsense")
    log: list[int] = []
    p, opened = publisher(log)
    p.offer(info("blackhole://"), 200, 1.0)
    assert p.publish_due() is None and not opened


def test_failures_are_retried_with_backoff_and_shown_when_they_persist() -> None:
    log: list[int] = []
    failing = [True]
    clock = Clock()
    p, opened = publisher(log, lambda: failing[0], clock)
    p.offer(info(), 200, 1.0)
    delays = []
    for _ in range(7):
        delay = p.publish_due()
        assert delay is not None
        delays.append(delay)
        clock.now += delay
    assert delays == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0, 8.0]
    assert all(s.closed for s in opened), "a sink that failed is closed and reopened"
    (w,) = p.warnings("cf")  # 31 s of failures
    assert (w.code, w.severity) == (WARNING_CODE, WarningSeverity.NOTICE)
    assert "no space left" in w.message and "not updated since 31s" in w.message
    failing[0] = False
    p.offer(info(), 260, 2.0)
    clock.now += 8.0
    assert p.publish_due() is None
    assert log == [260]
    (w2,) = p.warnings("cf")
    assert "published again" in w2.message and w2.first_time == w.first_time and w2.last_time == clock.now


def test_a_short_failure_is_only_logged() -> None:
    log: list[int] = []
    calls = iter([True, False])
    clock = Clock()
    p, _ = publisher(log, lambda: next(calls), clock)
    p.offer(info(), 200, 1.0)
    clock.now += p.publish_due() or 0
    p.publish_due()
    assert log == [200] and p.warnings("cf") == []


def test_the_thread_publishes_and_closes_its_sinks_when_stopped() -> None:
    log: list[int] = []
    p, opened = publisher(log)
    stop = threading.Event()
    t = threading.Thread(target=p.run, args=(stop,), daemon=True)
    t.start()
    p.offer(info(), 500, 1.0)
    deadline = time.monotonic() + 5
    while not log and time.monotonic() < deadline:
        time.sleep(0.01)
    stop.set()
    p.stop_waiting()
    t.join(5)
    assert log == [500] and opened[0].closed and not t.is_alive()


def test_the_storage_sinks_metadata(tmp_path: Path) -> None:
    p = CheckpointPublisher(SINKS)
    p.offer(info(f"file://{tmp_path}/lake?protocol=parquet"), 12345, 1.0)
    p.publish_due()
    assert json.loads((tmp_path / "lake" / "metadata").read_text()) == {"checkpoint-ts": 12345}
    p.forget("cf")


def test_the_owner_offers_each_stored_checkpoint() -> None:
    from cdc.config import ServerConfig
    from cdc.meta.store import ClusterSnapshot, Versioned
    from cdc.model import ChangefeedStatus
    from owner.owner import Owner
    from owner.reconcile import PutStatus

    class Store:
        def put_status(self, cf: str, status: ChangefeedStatus, fence: object) -> int:
            return 7

    class Election:
        def fence(self) -> object:
            return object()

    owner = Owner(Store(), Election(), "c1", ServerConfig(), lambda: True,  # type: ignore[arg-type]
                  sinks=SINKS, open_upstream=open_upstream)
    log: list[int] = []
    owner.publisher, _ = publisher(log)
    snap = ClusterSnapshot(revision=1, changefeeds={"cf": Versioned(info(), 1)})
    owner.apply(PutStatus("cf", ChangefeedStatus(300, 3.0)), snap)
    owner.apply(PutStatus("cf", ChangefeedStatus(0, 0.0)), snap)  # no checkpoint yet (a span still copying)
    owner.publisher.publish_due()
    assert log == [300]


def test_the_owner_warns_after_the_servers_downstream_warn_after() -> None:
    """``downstream-warn-after`` (server config) reaches the publisher and the barrier coordinator of every term."""
    from cdc.config import ServerConfig
    from cdc.errors import InvalidConfig
    from owner.owner import Owner

    assert ServerConfig.from_toml("").downstream_warn_after == 30.0
    config = ServerConfig.from_toml("downstream-warn-after = 5.0\n")
    owner = Owner(object(), object(), "c1", config, lambda: True,  # type: ignore[arg-type]
                  sinks=SINKS, open_upstream=lambda *a, **k: None)
    assert owner.publisher.warn_after == owner.barriers.warn_after == 5.0
    with pytest.raises(InvalidConfig, match="downstream-warn-after"):
        ServerConfig.from_toml("downstream-warn-after = 0.0\n")


def test_a_resign_ends_the_leading_loops_wait_at_once() -> None:
    """``resign`` wakes the owner's loop (``wake``: its wait for status changes ends): the loop sees the request now,
    not at the next ``owner-tick`` (an API resign waited half a tick on average for nothing)."""
    from cdc.config import ServerConfig
    from owner.owner import Owner

    owner = Owner(object(), object(), "c1", ServerConfig(), lambda: True,  # type: ignore[arg-type]
                  sinks=SINKS, open_upstream=lambda *a, **k: None)
    woken: list[bool] = []
    owner.wake = lambda: woken.append(True)  # type: ignore[method-assign]
    assert owner.resign() is False and woken == []  # not leading: nothing to end
    owner.is_owner = True
    assert owner.resign() is True and woken == [True]
