"""bench.threadclock: per-thread CPU and state of a live process from /proc (Linux): a thread that burns CPU is seen
with (at least most of) the CPU it measured itself, a thread blocked on an event sleeps in futex."""

from __future__ import annotations

import os
import threading
import time

import pytest

from bench.threadclock import ThreadClock, thread_state

pytestmark = pytest.mark.unit


def test_a_busy_thread_is_seen_with_its_cpu_and_a_waiting_one_in_futex() -> None:
    ready, release, done = threading.Event(), threading.Event(), threading.Event()
    tids: dict[str, int] = {}
    burnt: list[float] = []

    def burn() -> None:
        tids["busy"] = threading.get_native_id()
        ready.wait()
        t0 = time.thread_time()
        while time.thread_time() - t0 < 0.05:  # 50 ms of this thread's own CPU, however long that takes
            pass
        burnt.append(time.thread_time() - t0)
        done.set()
        release.wait()  # alive at the last sample (an ended thread's last CPU is not seen)

    def idle() -> None:
        tids["idle"] = threading.get_native_id()
        release.wait()

    threads = [threading.Thread(target=burn), threading.Thread(target=idle)]
    for t in threads:
        t.start()
    try:
        while len(tids) < 2:
            time.sleep(0.001)
        clock = ThreadClock({"me": os.getpid()}, interval=0.002).start()
        t0 = time.monotonic()
        ready.set()
        done.wait()
        clock.stop()
        t1 = time.monotonic()
        assert thread_state(os.getpid(), tids["idle"]) == "futex"
        seen = {s.tid: (cpu, wait) for s, cpu, wait in clock.busiest(t0, t1, least=0.0)}
        cpu, _wait = seen[tids["busy"]]
        assert cpu >= burnt[0] * 0.8, (cpu, burnt)  # (the first and last sample bracket the window)
        assert clock.series[("me", tids["idle"])].state_shares(t0, t1).get("futex", 0) > 0.5
    finally:
        release.set()
        ready.set()
        for t in threads:
            t.join()
