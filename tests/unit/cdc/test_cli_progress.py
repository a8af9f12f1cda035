"""``changefeed create --wait`` / ``query --watch``: the copy's progress as plain lines (not a terminal) and as
bars (a terminal), until the changefeed streams; a failed changefeed ends the watch with its reason."""

from __future__ import annotations

import io
from typing import Any

import pytest

from cdc.cli.progress import WatchEnded, summary, watch

pytestmark = pytest.mark.unit


def _q(done: int, phase: str = "snapshot", state: str = "normal", **extra: Any) -> dict[str, Any]:
    tables = [{"table": "0:public.t", "chunks_done": done, "chunks_total": 4, "rows_copied": done * 100,
               "rows_planned": 400, "rows_per_second": 50.0 if done else None, "eta_seconds": (4 - done) * 2.0}]
    return {"id": "cf", "state": state, "phase": phase, "error": extra.get("error"),
            "snapshot": {"chunks_done": done, "chunks_total": 4, "rows_copied": done * 100, "tables": tables}}


def _feed(*queries: dict[str, Any]) -> Any:
    it = iter(queries)
    return lambda: next(it)


def test_plain_lines_until_streaming() -> None:
    out = io.StringIO()
    q = watch(_feed(_q(0), _q(1), _q(1), _q(4, "streaming")), out, tty=False, interval=0, plain_every=0)
    lines = out.getvalue().splitlines()
    assert q["phase"] == "streaming"
    assert lines == [summary(_q(0)), summary(_q(1)), summary(_q(4, "streaming"))]  # unchanged lines once
    assert lines[1] == "cf: normal, snapshot: 1/4 chunks, 100 rows copied, 50 rows/s, ETA 6 s"


def test_bars_on_a_terminal() -> None:
    out = io.StringIO()
    watch(_feed(_q(0), _q(2), _q(4, "streaming")), out, tty=True, interval=0)
    text = out.getvalue()
    assert "0:public.t" in text and "4/4" in text and "400/400 rows" in text


def test_a_failed_changefeed_ends_the_watch_with_its_reason() -> None:
    with pytest.raises(WatchEnded, match="is failed: the copy job exited"):
        watch(_feed(_q(1), _q(1, state="failed", error={"message": "the copy job exited"})), io.StringIO(),
              tty=False, interval=0)
