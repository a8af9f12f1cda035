"""sorter.gate: a reopen (exclusive) waits for LevelDB calls in progress (shared) and holds new ones back."""

from __future__ import annotations

import threading
import time

import pytest

from sorter.gate import Gate

pytestmark = pytest.mark.unit


def test_exclusive_waits_for_shared_users_and_blocks_new_ones() -> None:
    gate = Gate()
    events: list[str] = []
    inside = threading.Event()
    release = threading.Event()

    def user() -> None:
        with gate.shared():
            inside.set()
            release.wait(5)
            events.append("user done")

    def reopen() -> None:
        with gate.exclusive():
            events.append("reopen")
            time.sleep(0.05)
            events.append("reopen done")

    def late_user() -> None:
        with gate.shared():
            events.append("late user")

    t1 = threading.Thread(target=user)
    t1.start()
    assert inside.wait(5)
    t2 = threading.Thread(target=reopen)
    t2.start()
    time.sleep(0.05)
    t3 = threading.Thread(target=late_user)
    t3.start()
    time.sleep(0.05)
    assert events == [], "the reopen must wait for the call in progress, and the late call for the reopen"
    release.set()
    for t in (t1, t2, t3):
        t.join(5)
    assert events == ["user done", "reopen", "reopen done", "late user"]
