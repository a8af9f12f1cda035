"""spark_jobs.verify_hold.VerifyHoldSession against a scripted store: the two phases wait for every span, a span
past the point is refused, a span that stops moving fails the hold after ``timeout`` while one catching up is waited
for, and the hold is released (by its id) whatever happens."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest

from cdc.errors import VerifyHoldFailed
from cdc.meta.store import Versioned
from cdc.model import SpanStatus, VerifyHold
from spark_jobs.verify_hold import VerifyHoldSession

pytestmark = pytest.mark.unit


class Store:
    """Span statuses from a script: ``script(span, hold)`` -> SpanStatus, called on every read."""

    def __init__(self, script: Any) -> None:
        self.script = script
        self.hold: VerifyHold | None = None
        self.released: list[int] = []

    def put_hold(self, cf: str, hold: VerifyHold) -> bool:
        self.hold = hold
        return True

    def get_hold(self, cf: str) -> VerifyHold | None:
        return self.hold

    def release_hold(self, cf: str, hold_id: int) -> bool:
        self.released.append(hold_id)
        self.hold = None
        return True

    def get_span_status(self, cf: str, span: int) -> Versioned[SpanStatus] | None:
        return Versioned(self.script(span, self.hold), 1)


def obeying(points: dict[int, int]) -> Any:
    def script(span: int, hold: VerifyHold | None) -> SpanStatus:
        if hold is None:
            return SpanStatus("c", 1, checkpoint_ts=points[span], running=True)
        at = hold.ts or points[span]
        return SpanStatus("c", 1, checkpoint_ts=at, running=True, held_id=hold.id, held_ts=at)
    return script


def test_both_phases_then_release() -> None:
    store = Store(obeying({0: 100, 1: 90}))
    with VerifyHoldSession(store, "cf", [0, 1], ttl=5.0, timeout=2.0) as hold:  # type: ignore[arg-type]
        assert hold.freeze() == {0: 100, 1: 90}
        hold.hold_at(150)
        assert store.hold is not None and store.hold.ts == 150
    assert store.released == [hold.id] and store.hold is None


def test_a_span_past_the_point_is_refused() -> None:
    def script(span: int, hold: VerifyHold | None) -> SpanStatus:
        assert hold is not None
        return SpanStatus("c", 1, checkpoint_ts=200, running=True, held_id=hold.id, held_ts=200)
    store = Store(script)
    with VerifyHoldSession(store, "cf", [0], ttl=5.0, timeout=2.0) as hold:  # type: ignore[arg-type]
        hold.freeze()
        with pytest.raises(VerifyHoldFailed, match="applied past the verification point 150"):
            hold.hold_at(150)
    assert store.released == [hold.id]


def test_a_span_that_does_not_move_fails_one_catching_up_is_waited_for() -> None:
    stuck = Store(lambda span, hold: SpanStatus("c", 1, checkpoint_ts=100, running=True))
    with (VerifyHoldSession(stuck, "cf", [0], ttl=5.0, timeout=0.3) as hold,  # type: ignore[arg-type]
          pytest.raises(VerifyHoldFailed, match=r"span\(s\) \[0\] did not stop applying")):
        hold.freeze()
    steps: Iterator[int] = itertools.count(100, 1)

    def catching_up(span: int, hold: VerifyHold | None) -> SpanStatus:
        assert hold is not None
        ts = next(steps)
        if hold.ts == 0:
            return SpanStatus("c", 1, checkpoint_ts=100, running=True, held_id=hold.id, held_ts=100)
        done = ts >= 120  # ~20 polls of 0.1 s: longer than the timeout, moving all the time
        return SpanStatus("c", 1, checkpoint_ts=min(ts, 120), running=True, held_id=hold.id if done else 0,
                          held_ts=120 if done else 0)
    store = Store(catching_up)
    with VerifyHoldSession(store, "cf", [0], ttl=5.0, timeout=0.5) as hold:  # type: ignore[arg-type]
        hold.freeze()
        hold.hold_at(120)
