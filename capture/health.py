"""Liveness and readiness of one capture (``GET /livez``, ``GET /readyz``; Kubernetes probes, load balancers,
the systemd watchdog).

* **live**: the process's main loop has run within ``stall_after`` seconds (it ticks every 0.2 s, also while
  etcd is away or while draining). A dead loop is the only thing a restart fixes, so this is all liveness
  checks: an unreachable etcd must not make Kubernetes kill every capture at once.
* **ready**: the capture is registered under a live etcd session, etcd answered its last lease refresh
  recently (``etcd_stale_after``), and it is not draining (SIGTERM, ``cdc cli capture drain``), so a
  Service sends API requests only to captures that can serve them.

Each check returns the failing conditions by name (empty = healthy), which the endpoints return as JSON, so a
probe failure says why.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class Health:
    session_alive: Callable[[], bool]
    etcd_age: Callable[[], float | None]  # seconds since the last successful etcd lease refresh; None: no session
    draining: Callable[[], bool]
    stall_after: float = 30.0
    etcd_stale_after: float = 10.0
    clock: Callable[[], float] = time.monotonic
    _beat: float = field(default=0.0, init=False)

    def __post_init__(self) -> None:
        self._beat = self.clock()

    def beat(self) -> None:
        """Called by the main loop on every turn."""
        self._beat = self.clock()

    def liveness(self) -> dict[str, str]:
        stalled = self.clock() - self._beat
        if stalled > self.stall_after:
            return {"main_loop": f"no progress for {stalled:.0f}s (limit {self.stall_after:.0f}s)"}
        return {}

    def readiness(self) -> dict[str, str]:
        failing = dict(self.liveness())
        if not self.session_alive():
            failing["etcd_session"] = "not registered in etcd (no live session)"
        else:
            age = self.etcd_age()
            if age is not None and age > self.etcd_stale_after:
                failing["etcd"] = f"no successful etcd lease refresh for {age:.0f}s"
        if self.draining():
            failing["draining"] = "capture is draining: its spans are moving to other captures"
        return failing
