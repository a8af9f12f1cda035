"""systemd's notify protocol in pure Python (``sd_notify(3)``): one datagram per message to ``$NOTIFY_SOCKET``.

Used by `cdc server` under ``Type=notify``: ``READY=1`` once the capture is registered in etcd, ``STATUS=...``
lines, ``RELOADING=1``/``READY=1`` around a SIGHUP reload, ``STOPPING=1`` on shutdown, and ``WATCHDOG=1``
every half ``WatchdogSec`` while the capture's main loop is alive (``Notifier.watchdog_interval``). Without
``$NOTIFY_SOCKET`` (not started by systemd) every call is a no-op returning False. The socket may be a path
or an abstract name (``@name``).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping

log = logging.getLogger(__name__)


class Notifier:
    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        addr = env.get("NOTIFY_SOCKET", "")
        self.address: str | bytes | None = None
        if addr.startswith("@"):
            self.address = b"\0" + addr[1:].encode()
        elif addr.startswith("/"):
            self.address = addr
        self.watchdog_interval = 0.0  # seconds between WATCHDOG=1 messages; 0: no watchdog requested
        usec = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        if usec.isdigit() and int(usec) > 0 and (not pid or pid == str(os.getpid())):
            self.watchdog_interval = int(usec) / 1e6 / 2
        self._lock = threading.Lock()
        self._failing = False  # the last send failed (logged once per run of failures)

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def notify(self, *fields: str) -> bool:
        """Send ``fields`` (``"READY=1"``, ``"STATUS=..."``) as one message; False if not under systemd or
        the send failed (logged: systemd must never be able to stop the capture through this)."""
        if self.address is None:
            return False
        msg = "\n".join(fields).encode()
        try:  # never blocks: a reader that does not read (full queue) costs a message, never a stuck capture
            with self._lock, socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
                s.setblocking(False)
                s.connect(self.address)
                s.send(msg)
            self._failing = False
            return True
        except OSError as exc:
            if not self._failing:
                log.warning("sd_notify %s failed: %s (further failures are not logged until one succeeds)",
                            fields[0] if fields else "", exc)
            self._failing = True
            return False

    def run_watchdog(self, alive: Callable[[], bool], stop: threading.Event,
                     sleep: Callable[[float], bool] | None = None) -> None:
        """Send ``WATCHDOG=1`` every ``watchdog_interval`` while ``alive()``; a capture whose main loop is
        stuck stops pinging and systemd restarts it (``WatchdogSec``). Returns when ``stop`` is set."""
        if not self.enabled or self.watchdog_interval <= 0:
            return
        wait = sleep if sleep is not None else stop.wait
        while not stop.is_set():
            if alive():
                self.notify("WATCHDOG=1")
            else:
                log.warning("capture main loop not alive: withholding the systemd watchdog ping")
            wait(self.watchdog_interval)

    @staticmethod
    def monotonic_usec() -> int:
        return int(time.monotonic() * 1e6)
