"""``changefeed create --wait`` / ``query --watch``: the copy's progress as plain lines (not a terminal) and as
bars (a terminal), until the changefeed streams; a failed changefeed ends the watch with its reason."""

from __future__ import annotations

import io
from typing import Any

import pytest

from cli.progress import WatchEnded, summary, watch
from tests.http_fakes import CannedHttp

pytestmark = pytest.mark.unit


def _q(done: int, phase: str = "snapshot", state: str = "normal", **extra: Any) -> dict[str, Any]:
    tables = [{"table": "0:public.t", "chunks_done": done, "chunks_total": 4, "rows_copied": done * 100,
               "rows_planned": 400, "rows_per_second": 50.0 if done else None, "eta_seconds": (4 - done) * 2.0}]
    return {"id": "cf", "state": state, "phase": phase, "error": extra.get("error"),
            "snapshot": {"chunks_done": done, "chunks_total": 4, "rows_copied": done * 100,
                         "rows_per_second": 50.0 if done else None, "eta_seconds": (4 - done) * 2.0 if done else None,
                         "tables": tables}}


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
    assert lines[0] == "cf: normal, snapshot: 0/4 chunks, 0 rows copied"  # no rate measured yet: no ETA


def _restarted() -> dict[str, Any]:
    """After a restart that dropped the table's plan: 350 rows written so far, 300 of them under the old plan."""
    q = _q(1)
    q["snapshot"].update(rows_copied=350, rows_redone=300, eta_seconds=0.2)
    q["snapshot"]["tables"][0].update(rows_copied=350, rows_redone=300, rows_done=50, eta_seconds=0.2)
    return q


def test_rows_redone_after_a_restart_are_shown_beside_the_rows_copied() -> None:
    assert summary(_restarted()) == ("cf: normal, snapshot: 1/4 chunks, 350 rows copied (300 redone), 50 rows/s, "
                                     "ETA 1 s")  # (an ETA under a second is never shown as 0 while chunks are left)
    out = io.StringIO()
    last = _restarted()
    last["phase"] = "streaming"  # (the bars' last drawing stays on the terminal)
    watch(_feed(_restarted(), last), out, tty=True, interval=0)
    text = " ".join(out.getvalue().split())
    assert "350 rows copied (300 redone)" in text and "50/400 rows (+300 redone)" in text


def test_bars_on_a_terminal() -> None:
    out = io.StringIO()
    watch(_feed(_q(0), _q(2), _q(4, "streaming")), out, tty=True, interval=0)
    text = out.getvalue()
    assert "0:public.t" in text and "4/4" in text and "400/400 rows" in text


def test_a_failed_changefeed_ends_the_watch_with_its_reason() -> None:
    with pytest.raises(WatchEnded, match="is failed: the copy job exited"):
        watch(_feed(_q(1), _q(1, state="failed", error={"message": "the copy job exited"})), io.StringIO(),
              tty=False, interval=0)


WARN = {"code": "CDC:ErrSinkUnavailable", "message": "MySQL target shop is unavailable:\nConnection refused",
        "retryable": True}


def test_a_changefeed_in_warning_shows_the_warnings_code_and_message_at_once() -> None:
    out = io.StringIO()
    # plain_every is long: a line that only changes progress waits, a warning that appears or goes is printed at once
    watch(_feed(_q(1), _q(1, state="warning", error=WARN), _q(1, state="warning", error=WARN), _q(2),
                _q(4, "streaming")), out, tty=False, interval=0, plain_every=3600)
    lines = out.getvalue().splitlines()
    assert lines[0] == summary(_q(1))
    assert lines[1] == ("cf: warning, snapshot: 1/4 chunks, 100 rows copied, 50 rows/s, ETA 6 s; warning, retrying: "
                        "[CDC:ErrSinkUnavailable] MySQL target shop is unavailable: Connection refused")
    assert lines[2] == summary(_q(2))  # the warning cleared: shown at once too
    assert lines[3] == summary(_q(4, "streaming")) and len(lines) == 4


def test_a_warning_is_shown_above_the_bars_on_a_terminal() -> None:
    out = io.StringIO()
    watch(_feed(_q(1), _q(1, state="warning", error=WARN), _q(4, "streaming")), out, tty=True, interval=0)
    text = " ".join(out.getvalue().split())
    assert "cf: warning, retrying: [CDC:ErrSinkUnavailable] MySQL target shop is unavailable: Connection refused" in text
    assert "cf: warning cleared" in text


def test_a_table_without_a_key_is_labelled_as_one_chunk_on_a_terminal() -> None:
    q = _q(0)
    q["snapshot"]["tables"].append({"table": "0:public.bag", "chunks_done": 0, "chunks_total": 1, "rows_copied": 0,
                                    "rows_planned": 300, "rows_per_second": None, "eta_seconds": None,
                                    "chunking": "whole table (no key)"})
    out = io.StringIO()
    watch(_feed(q, _q(4, "streaming")), out, tty=True, interval=0)
    assert "0:public.bag (one chunk: no key)" in out.getvalue()


# ---- the CLI's flags, against a canned server whose answers change from one request to the next --------------
Sequenced = CannedHttp


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Any:
    import time
    from types import SimpleNamespace

    from cli import progress

    monkeypatch.setattr(progress, "time", SimpleNamespace(sleep=lambda s: None, monotonic=time.monotonic))
    s = Sequenced({})
    yield s
    s.close()


def test_create_wait_watches_the_copy_until_the_changefeed_streams(server: Sequenced,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from cli.main import main

    server.answers[("POST", "/api/v2/changefeeds")] = [(200, _q(0))]
    server.answers[("GET", "/api/v2/changefeeds/cf")] = [
        (200, _q(0)), (200, _q(1, state="warning", error=WARN)), (200, _q(4, "streaming"))]
    rc = main(["cli", "--server", server.url, "changefeed", "create", "-c", "cf", "--upstream", "postgresql://u@h/db",
               "--sink-uri", "sqlite:///t.db", "--wait"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert json.loads(out)["phase"] == "streaming"  # the last query is printed
    assert "[CDC:ErrSinkUnavailable] MySQL target shop is unavailable" in err  # progress lines on stderr
    assert [r[:2] for r in server.requests] == [("POST", "/api/v2/changefeeds")] + [
        ("GET", "/api/v2/changefeeds/cf")] * 3


def test_create_without_wait_returns_at_once(server: Sequenced, capsys: pytest.CaptureFixture[str]) -> None:
    from cli.main import main

    server.answers[("POST", "/api/v2/changefeeds")] = [(200, _q(0))]
    assert main(["cli", "--server", server.url, "changefeed", "create", "-c", "cf", "--upstream",
                 "postgresql://u@h/db", "--sink-uri", "sqlite:///t.db"]) == 0
    assert [r[0] for r in server.requests] == ["POST"]


def test_query_watch_ends_with_exit_code_1_and_the_reason_when_the_changefeed_fails(
        server: Sequenced, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from cli.main import main

    failed = {"code": "CDC:ErrSinkDataRejected", "message": "table public.orders: the target refused the row with key "
              "id=3777", "retryable": False}
    server.answers[("GET", "/api/v2/changefeeds/cf")] = [(200, _q(1)), (200, _q(1, state="failed", error=failed))]
    rc = main(["cli", "--server", server.url, "changefeed", "query", "-c", "cf", "--watch"])
    out, err = capsys.readouterr()
    assert rc == 1 and out == ""
    body = json.loads(err[err.index("\n{") + 1:])  # after the progress lines: the error
    assert body["error_code"] == "CDC:ErrChangefeedNotStreaming"
    assert "is failed: table public.orders: the target refused the row with key id=3777" in body["error_msg"]
    assert len(server.requests) == 2
    # without --watch: one request, the query as it is
    assert main(["cli", "--server", server.url, "changefeed", "query", "-c", "cf"]) == 0
    assert json.loads(capsys.readouterr().out)["state"] == "failed" and len(server.requests) == 3
