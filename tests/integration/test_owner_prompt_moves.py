"""The owner runs a move's second phase on the holder's confirmation (etcd watch), not at its next tick.

A real etcd, a real election and ``Owner.run``; ``owner-tick`` is set to 60 s so that a reaction that waited for
the tick could not happen while the test waits (10 s): the owner's first cycle runs at once, every later one only
because the watch woke it. No timing of how fast it reacts is asserted.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from cdc.config import ServerConfig
from cdc.meta.election import Election
from cdc.meta.etcd import EtcdClient
from cdc.meta.session import Session
from cdc.meta.store import MetaStore
from cdc.model import (
    CaptureInfo,
    ChangefeedInfo,
    ChangefeedStatus,
    FeedState,
    SpanAssignment,
    SpanInfo,
    SpanStatus,
)
from owner.owner import Owner
from playground.servers import EtcdServer
from sinks.testing import MemorySinks
from upstream import open_upstream

pytestmark = pytest.mark.integration

TICK = 60.0
CAP = "cap-a"


def wait_until(cond: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what} (owner-tick is {TICK}s)")
        time.sleep(0.02)


@pytest.fixture
def store(etcd_server: EtcdServer, cluster_id: str) -> Iterator[MetaStore]:
    client = EtcdClient([etcd_server.url], timeout=3.0)
    yield MetaStore(client, cluster_id)
    client.close()


@contextlib.contextmanager
def leading(store: MetaStore) -> Iterator[Owner]:
    """An owner leading with ``owner-tick`` = TICK (capture CAP registered under its session's lease), once its
    first cycle ran: it has seen what the test stored before."""
    session = Session(store.client, 120)
    store.register_capture(CaptureInfo(CAP, "127.0.0.1:1", "test", time.time()), session.lease_id)
    config = ServerConfig(owner_tick=TICK, session_ttl=120)
    o = Owner(store, Election(store.client, session, store.owner_election_prefix), CAP, config,
              session_alive=lambda: True, sinks=MemorySinks(), open_upstream=open_upstream)
    stop = threading.Event()
    t = threading.Thread(target=o.run, args=(stop,), name="test-owner", daemon=True)
    t.start()
    try:
        wait_until(lambda: o.cycles >= 1, 10, "the owner's first cycle")
        yield o
    finally:
        stop.set()
        o.wake()
        t.join(10)
        session.close()


def info(cf: str, state: FeedState = FeedState.NORMAL) -> ChangefeedInfo:
    return ChangefeedInfo(id=cf, upstream_uri="postgresql://u@127.0.0.1:1/db", sink_uri="blackhole://", config={},
                          start_ts=100, start_time=1.0, create_time=1.0, spans=(SpanInfo(0, "slot_0", "pub_0", 100),),
                          state=state)


def test_confirmed_stop_is_reassigned_without_waiting_for_the_tick(store: MetaStore) -> None:
    # a span the owner asked its holder to stop (a move, or a pause followed by a resume): the holder has not
    # confirmed yet, so the owner's cycles leave it alone
    store.create_changefeed(info("cf-move"), ChangefeedStatus())
    store.put_assignment("cf-move", 0, SpanAssignment(CAP, 1, stopping=True))
    with leading(store) as owner:
        assert store.get_assignments("cf-move") == {0: SpanAssignment(CAP, 1, stopping=True)}
        # the holder confirms (what the processor stores once the span's threads are joined)
        assert store.put_span_status("cf-move", 0, SpanStatus(CAP, 1, 100, 1.0, 100, 1.0, running=False))
        wait_until(lambda: store.get_assignments("cf-move").get(0) == SpanAssignment(CAP, 2), 10,
                   "the span reassigned with epoch 2")
        # the owner counts a cycle after committing its writes: the reassignment can be visible just before the count
        wait_until(lambda: owner.cycles >= 2, 5, "the reassigning cycle counted (a second cycle, woken by the watch)")


def test_confirmed_stop_of_a_paused_changefeed_is_unassigned_without_the_tick(store: MetaStore) -> None:
    store.create_changefeed(info("cf-pause", FeedState.STOPPED), ChangefeedStatus())
    store.put_assignment("cf-pause", 0, SpanAssignment(CAP, 3, stopping=True))
    with leading(store):
        assert store.get_assignments("cf-pause") == {0: SpanAssignment(CAP, 3, stopping=True)}
        assert store.put_span_status("cf-pause", 0, SpanStatus(CAP, 3, 100, 1.0, 100, 1.0, running=False))
        wait_until(lambda: not store.get_assignments("cf-pause"), 10, "the span unassigned")
