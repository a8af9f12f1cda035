"""Logging for `cdc server`: one line per event, capture id in every line."""

from __future__ import annotations

import logging
import sys


def setup_logging(level: str, log_file: str = "", capture_id: str = "") -> None:
    fmt = f"%(asctime)s %(levelname)s [%(name)s] [capture={capture_id[:8]}] %(message)s" if capture_id else \
        "%(asctime)s %(levelname)s [%(name)s] %(message)s"
    handler: logging.Handler = logging.FileHandler(log_file) if log_file else logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(fmt))
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper(), logging.INFO))
    for noisy in ("kafka", "urllib3", "grpc"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
