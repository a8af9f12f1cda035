"""Helpers for failure drills against several `cdc server` processes (e2e tests, failover benchmark)."""

from __future__ import annotations

import time
from typing import Any

from playground.cluster import CdcServer


def live(servers: list[CdcServer]) -> list[CdcServer]:
    return [s for s in servers if s.proc is not None and s.proc.poll() is None]


def captures(servers: list[CdcServer]) -> list[dict[str, Any]]:
    for s in live(servers):
        try:
            return s.get("/api/v2/captures", timeout=5)
        except Exception:  # noqa: BLE001 - try the next live server
            continue
    raise AssertionError("no live cdc server answers")


def owner_of(servers: list[CdcServer], timeout: float = 30.0) -> CdcServer:
    """The live server that is the owner (waits for an election to settle)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        by_addr = {f"127.0.0.1:{s.port}": s for s in live(servers)}
        owners = [c for c in captures(servers) if c["is_owner"] and c["address"] in by_addr]
        if len(owners) == 1:
            return by_addr[owners[0]["address"]]
        time.sleep(0.2)
    raise AssertionError(f"no owner among {[s.port for s in live(servers)]}")


def checkpoint_of(servers: list[CdcServer], cf: str) -> int:
    return live(servers)[0].changefeed(cf)["checkpoint_ts"]


def wait_recovery(servers: list[CdcServer], cf: str, before: int, since: float, timeout: float = 120.0) -> float:
    """Seconds from ``since`` (monotonic) until the global checkpoint moved past ``before``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if checkpoint_of(servers, cf) > before:
                return time.monotonic() - since
        except Exception:  # noqa: BLE001 - a server may be restarting
            pass
        time.sleep(0.05)
    raise AssertionError(f"checkpoint did not advance within {timeout}s")
