"""Probing a failed span's dependencies while it backs off, so that it restarts within about a second
of their return instead of at its next backoff step (``error-backoff-min`` .. ``error-backoff-max``).

A ``DependencyProbe`` watches one waiting span from its own daemon thread: at once and then every
``interval`` seconds it calls each probe in turn (``name -> callable`` that raises while that dependency
is away: the sink's ``probe()``, the upstream's ``Upstream.probe``; each opens one connection
and runs ``SELECT 1``).

Guarantees:
- ``ready`` is set only once every probe passed *after at least one had failed*: the span died because a
  dependency was away, and it is back. A failure that no probe shows (a full disk, a rejected row, a
  lost lease, a dependency already back before the first probe) never sets it; such a span keeps its
  exponential backoff, so probing never turns a persistent error into a restart loop.
- At most one round of probes per ``interval``; the thread ends once ``ready`` is set, after
  ``healthy_rounds`` passing rounds without any failure (the error was not a dependency being away:
  nothing to wait for), or on ``close()``. It never touches the span itself (the processor reads
  ``ready`` on its tick).
- ``down`` is the latest failing probe as ``"name: message"`` (None before the first failure).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping

log = logging.getLogger(__name__)

Probe = Callable[[], None]


class DependencyProbe:
    def __init__(self, label: str, probes: Mapping[str, Probe], interval: float = 1.0,
                 healthy_rounds: int = 5) -> None:
        self.label = label
        self.probes = dict(probes)
        self.interval = interval
        self.healthy_rounds = healthy_rounds
        self.ready = threading.Event()
        self.down: str | None = None
        self.rounds = 0
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"probe-{label}", daemon=True)

    def start(self) -> DependencyProbe:
        self._thread.start()
        return self

    @property
    def probing(self) -> bool:
        """True while the probe's thread runs (it ends on close(), once ready, or after healthy_rounds)."""
        return self._thread.is_alive()

    def close(self) -> None:
        """Stop probing (returns at once; a probe in progress finishes in its own thread)."""
        self._closed.set()

    def probe_once(self) -> bool:
        """One round: True if every probe passed. Records ``down`` and returns False at the first failure."""
        self.rounds += 1
        for name, probe in self.probes.items():
            try:
                probe()
            except Exception as exc:  # noqa: BLE001 - any failure means: that dependency is still away
                self.down = f"{name}: {exc}"
                return False
        return True

    def _run(self) -> None:
        seen_down = False
        while not self._closed.is_set():
            if self.probe_once():
                if not seen_down and self.rounds >= self.healthy_rounds:
                    return  # every dependency answered from the start: the span keeps its backoff
                if seen_down:
                    log.info("span=%s: %s is back; restarting the span now", self.label,
                             (self.down or "dependency").split(":", 1)[0])
                    self.ready.set()
                    return
            elif not seen_down:
                seen_down = True
                log.info("span=%s: waiting for %s (probing every %.1fs)", self.label, self.down, self.interval)
            if self._closed.wait(self.interval):
                return
