"""bench.states (``python -m bench --states DIR``): the /proc and process-title parsing, and one sampling run of this
very process."""

from __future__ import annotations

import os
import time
from pathlib import Path

from bench.states import TITLE, StateSampler, state_ticks, state_word


def test_stat_line_with_spaces_and_parentheses_in_the_name() -> None:
    line = "1234 (sql (sink) exec) S 1 2 3 4 5 6 7 8 9 10 250 40 0 0 20 0 3 0 100 2000 300"
    assert state_ticks(line) == ("S", 290)


def test_postgres_titles() -> None:
    m = TITLE.match("postgres: postgres tw_ab 127.0.0.1(41234) idle in transaction")
    assert m is not None and m.groups() == (None, "postgres", "tw_ab", "idle in transaction")
    m = TITLE.match("postgres: walsender postgres 127.0.0.1(41240) START_REPLICATION")
    assert m is not None and m.group(1) == "walsender" and m.group(4) == "START_REPLICATION"
    assert TITLE.match("postgres: checkpointer") is None  # a background process
    assert state_word("INSERT waiting") == "INSERT"
    assert state_word("idle in transaction") == "idle in transaction"
    assert state_word("") == "(none)"


def test_sampling_this_process(tmp_path: Path) -> None:
    """The sampler's report names this process's threads with their CPU and the joint shares."""
    sampler = StateSampler(tmp_path, lambda: {}, interval=0.005)
    stop = sampler.start(os.getpid(), "self")
    end = time.monotonic() + 0.3
    while time.monotonic() < end:  # some CPU of our own to see
        sum(range(10_000))
    stop()
    text = (tmp_path / "self.states.txt").read_text()
    assert text.startswith("self: ")
    assert "capture thread" in text
    assert "sink side only" in text and "host busy" in text
