"""Logging for `cdc server` (docs/operations.md, "Logs").

* ``text`` (default): ``time LEVEL [logger] [capture=...] message``; under systemd (stderr is the journal,
  ``$JOURNAL_STREAM``) without ``--log-file`` the time is left to journald and each line starts with its
  syslog priority (``<4>``), so ``journalctl -p warning`` works.
* ``json``: one object per line with stable field names: ``time`` (UTC, ISO 8601), ``level``, ``logger``,
  ``msg``, ``capture`` (this process's capture id), and ``changefeed``, ``span``, ``capture`` when the message
  names them (``changefeed=orders``, ``span=orders/1``), ``exc`` for a traceback.
* Secrets never reach a log: every line (and traceback) goes through :func:`cdc.uri.scrub`.
* The same warning or error (same logger and text, numbers aside) is written at most once per
  ``warn_interval`` seconds; the next one says how many were suppressed.
* ``--log-file`` rotates by size (``max_bytes``, ``backups`` kept) when asked, else it is reopened when
  moved away (logrotate); without a log file, lines go to stderr (the journal under systemd).
"""

from __future__ import annotations

import json
import logging
import logging.handlers
import os
import re
import sys
import threading
import time
from collections import OrderedDict

from cdc.uri import scrub

_capture_id = ""
_FIELD = re.compile(r"\b(changefeed|span|capture)=([A-Za-z0-9_./:-]+)")
_NUMBERS = re.compile(r"\d+(\.\d+)?")
_SYSLOG_PRIORITY = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4, logging.ERROR: 3, logging.CRITICAL: 2}


def set_capture_id(capture_id: str) -> None:
    """The capture id written into every following line (a capture gets a new id per etcd session)."""
    global _capture_id
    _capture_id = capture_id


def fields_of(message: str) -> dict[str, str]:
    """``changefeed``/``span``/``capture`` named in a message (``changefeed=orders span=orders/1``)."""
    return {name: value for name, value in _FIELD.findall(message)}


class TextFormatter(logging.Formatter):
    def __init__(self, journald: bool = False) -> None:
        super().__init__("%(message)s" if journald else "%(asctime)s %(message)s")
        self._journald = journald

    def format(self, record: logging.LogRecord) -> str:
        capture = f" [capture={_capture_id[:8]}]" if _capture_id else ""
        text = scrub(super().format(_prefixed(record, f"{record.levelname} [{record.name}]{capture} ")))
        if self._journald:  # one journal entry per line: keep a traceback in the same entry
            return f"<{_SYSLOG_PRIORITY.get(record.levelno, 6)}>" + text.replace("\n", " | ")
        return text


def _prefixed(record: logging.LogRecord, prefix: str) -> logging.LogRecord:
    copy = logging.makeLogRecord(record.__dict__)
    copy.msg, copy.args = prefix + record.getMessage(), None
    return copy


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        message = scrub(record.getMessage())
        out: dict[str, object] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": message,
        }
        if _capture_id:
            out["capture"] = _capture_id
        for name in ("changefeed", "span", "capture"):
            value = getattr(record, name, None)  # logging.extra
            if value is not None:
                out[name] = str(value)
        for name, value in fields_of(message).items():
            out.setdefault(name, value)
        if name_of_span := out.get("span"):
            cf, sep, _ = str(name_of_span).partition("/")
            if sep:
                out.setdefault("changefeed", cf)
        if record.exc_info:
            out["exc"] = scrub(self.formatException(record.exc_info))
        return json.dumps(out, ensure_ascii=False)


class RepeatFilter(logging.Filter):
    """Lets the same warning/error through at most once per ``interval`` seconds (same logger, level,
    ``changefeed=``/``span=``/``capture=`` and text with its other numbers ignored); the next one that passes
    carries the number suppressed meanwhile."""

    def __init__(self, interval: float, clock: object = time.monotonic, max_keys: int = 1000) -> None:
        super().__init__()
        self._interval = interval
        self._clock = clock
        self._max = max_keys
        self._seen: OrderedDict[tuple[str, int, str, tuple[tuple[str, str], ...]], tuple[float, int]] = OrderedDict()
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING or self._interval <= 0:
            return True
        message = record.getMessage()
        # numbers aside (retry counts, lags, ports), but never two spans or changefeeds as one
        key = (record.name, record.levelno, _NUMBERS.sub("#", _FIELD.sub("", message)),
               tuple(sorted(fields_of(message).items())))
        now = self._clock()  # type: ignore[operator]
        with self._lock:
            last = self._seen.get(key)
            if last is not None and now - last[0] < self._interval:
                self._seen[key] = (last[0], last[1] + 1)
                return False
            self._seen[key] = (now, 0)
            self._seen.move_to_end(key)
            while len(self._seen) > self._max:
                self._seen.popitem(last=False)
        if last is not None and last[1]:
            record.msg = f"{record.getMessage()} ({last[1]} similar suppressed in the last {now - last[0]:.0f}s)"
            record.args = None
        return True


def setup_logging(level: str, log_file: str = "", capture_id: str = "", *, log_format: str = "text",
                  max_bytes: int = 0, backups: int = 5, warn_interval: float = 60.0) -> None:
    if capture_id:
        set_capture_id(capture_id)
    handler: logging.Handler
    if log_file and max_bytes > 0:
        handler = logging.handlers.RotatingFileHandler(log_file, maxBytes=max_bytes, backupCount=backups)
    elif log_file:
        handler = logging.handlers.WatchedFileHandler(log_file)
    else:
        handler = logging.StreamHandler(sys.stderr)
    journald = not log_file and bool(os.environ.get("JOURNAL_STREAM"))
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter(journald))
    handler.addFilter(RepeatFilter(warn_interval))
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper(), logging.INFO))
    for noisy in ("kafka", "urllib3", "grpc"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
