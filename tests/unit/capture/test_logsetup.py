"""Logs (issue 12, item 8): JSON lines with stable field names, no secret in any line, the same warning
rate-limited, size-based rotation, syslog priorities for journald."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from capture import logsetup
from capture.logsetup import JsonFormatter, RepeatFilter, TextFormatter, setup_logging

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for h in list(root.handlers):
        root.removeHandler(h)
        h.close()
    for h in handlers:
        root.addHandler(h)
    root.setLevel(level)
    logsetup.set_capture_id("")


def record(msg: str, *args: object, level: int = logging.INFO, name: str = "owner.owner") -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, msg, args, None)


def test_json_lines_have_stable_fields_and_no_secrets() -> None:
    logsetup.set_capture_id("2f0c1b6e-aaaa")
    line = JsonFormatter().format(record("changefeed=%s state %s -> %s: sink %s", "orders", "normal", "warning",
                                         "mysql://app:pa@ss@db2/shop?sslpassword=zz-top-1"))
    obj = json.loads(line)
    assert set(obj) == {"time", "level", "logger", "msg", "capture", "changefeed"}
    assert obj["changefeed"] == "orders" and obj["capture"] == "2f0c1b6e-aaaa" and obj["level"] == "info"
    assert obj["time"].endswith("Z") and obj["logger"] == "owner.owner"
    assert "pa@ss" not in line and "zz-top-1" not in line and "mysql://app:***@db2/shop" in obj["msg"]
    span = json.loads(JsonFormatter().format(record("span=orders/1 restarting in 10s")))
    assert (span["span"], span["changefeed"]) == ("orders/1", "orders")
    try:
        raise ValueError("could not connect to postgresql://repl:hunter22@db1/shop")
    except ValueError:
        import sys

        rec = record("failed", level=logging.ERROR)
        rec.exc_info = sys.exc_info()
    out = JsonFormatter().format(rec)
    assert "hunter22" not in out and "Traceback" in json.loads(out)["exc"]


def test_text_lines_scrubbed_and_journald_priorities() -> None:
    text = TextFormatter().format(record("bad URI %s", "postgresql://u:s3cret-pw@h/db", level=logging.WARNING))
    assert "s3cret-pw" not in text and "WARNING [owner.owner] bad URI postgresql://u:***@h/db" in text
    journal = TextFormatter(journald=True).format(record("lag high", level=logging.WARNING))
    assert journal.startswith("<4>WARNING [owner.owner] lag high")


def test_repeated_warnings_are_rate_limited() -> None:
    now = [100.0]
    f = RepeatFilter(60.0, clock=lambda: now[0])
    first = record("span=orders/0 failed: sink unavailable after %d retries", 3, level=logging.WARNING)
    assert f.filter(first)
    for i in range(5):
        now[0] += 1
        assert not f.filter(record("span=orders/0 failed: sink unavailable after %d retries", 4 + i,
                                   level=logging.WARNING))
    assert f.filter(record("span=orders/1 failed: other", level=logging.WARNING))  # another text passes
    # the same text about another span is another warning
    assert f.filter(record("span=orders/1 failed: sink unavailable after %d retries", 3, level=logging.WARNING))
    assert f.filter(record("span=orders2/0 failed: sink unavailable after %d retries", 3, level=logging.WARNING))
    assert f.filter(record("info lines are never limited", level=logging.INFO))
    assert f.filter(record("info lines are never limited", level=logging.INFO))
    now[0] += 60
    again = record("span=orders/0 failed: sink unavailable after %d retries", 99, level=logging.WARNING)
    assert f.filter(again)
    assert again.getMessage().endswith("(5 similar suppressed in the last 65s)")


def test_size_based_rotation(tmp_path: Path) -> None:
    log_file = tmp_path / "cdc.log"
    setup_logging("info", str(log_file), log_format="json", max_bytes=2000, backups=2, warn_interval=0)
    log = logging.getLogger("capture.server")
    for i in range(100):
        log.info("changefeed=cf%d checkpoint advanced", i)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["cdc.log", "cdc.log.1", "cdc.log.2"], files
    for p in tmp_path.iterdir():
        assert p.stat().st_size <= 2000
        for line in p.read_text().splitlines():
            assert json.loads(line)["logger"] == "capture.server"
