"""cli/verify_progress.py: the line shown while ``changefeed verify`` waits (phase, chunks, rate and ETA from the rows
planned), and the plain output's pace (a changed line at most every ``plain_every`` seconds)."""

from __future__ import annotations

import io

import pytest

from cli.verify_progress import VerifyProgress

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_line_has_the_phase_chunks_rate_and_eta() -> None:
    clock = Clock()
    p = VerifyProgress(io.StringIO(), tty=False, clock=clock)
    assert p.line({"id": "abcdef0123", "phase": "holding"}) == "verify abcdef01: holding"
    assert p.line({"id": "abcdef0123", "phase": "checksums", "chunks": 10, "chunks_done": 0, "rows": 1000}) == (
        "verify abcdef01: checksums 0/10 chunks")
    clock.now += 2.0  # 4 of 10 chunks of 1000 rows in 2 s: 200 rows/s, 600 rows left: 3 s
    assert p.line({"id": "abcdef0123", "phase": "checksums", "chunks": 10, "chunks_done": 4, "rows": 1000}) == (
        "verify abcdef01: checksums 4/10 chunks, ~200 rows/s, ETA 3 s")
    assert p.line({"id": "abcdef0123", "phase": "checksums", "chunks": 10, "chunks_done": 10, "rows": 1000}) == (
        "verify abcdef01: checksums 10/10 chunks, ~500 rows/s")


def test_plain_output_prints_a_changed_line_at_most_every_interval() -> None:
    clock, out = Clock(), io.StringIO()
    p = VerifyProgress(out, tty=False, plain_every=5.0, clock=clock)
    run = {"id": "r1", "phase": "checksums", "chunks": 4, "chunks_done": 0}
    p.show(run)
    p.show(run)
    clock.now += 1.0
    p.show({**run, "chunks_done": 1})  # changed, but too soon
    clock.now += 5.0
    p.show({**run, "chunks_done": 2})
    assert out.getvalue().splitlines() == ["verify r1: checksums 0/4 chunks", "verify r1: checksums 2/4 chunks"]
