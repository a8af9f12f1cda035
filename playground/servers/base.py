"""What every launcher shares: ports, logs, the process bookkeeping of :class:`Server` and the stop at exit
(the guarantees are listed in :mod:`playground.servers`)."""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

log = logging.getLogger(__name__)

HOST = "127.0.0.1"
PG_USER = "tidewater-pg"
_LOG_TAIL_LINES = 40
_ADDR_IN_USE = re.compile(r"address already in use|could not bind|Can't start server: Bind|AddrInUse", re.IGNORECASE)


NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))
"""An HTTP opener that ignores ``*_proxy`` variables: the servers listen on 127.0.0.1."""


class ServerStartError(RuntimeError):
    """A server did not become ready; the message carries the tail of its log."""


# ---- ports ------------------------------------------------------------------------------------------------
_port_lock = threading.Lock()
_ports_handed_out: set[int] = set()


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that is free now and was not returned before by this process.

    Thread-safe.  The port is not reserved: another process may take it before the caller binds it, which
    the launchers handle by retrying with a fresh port.
    """
    with _port_lock:
        for _ in range(100):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind((HOST, 0))
                port = s.getsockname()[1]
            if port not in _ports_handed_out:
                _ports_handed_out.add(port)
                return int(port)
    raise RuntimeError("could not find a free TCP port on 127.0.0.1")


# ---- shared helpers ---------------------------------------------------------------------------------------
_live: set[Server] = set()
_live_lock = threading.Lock()
_private_dirs: set[Path] = set()  # removed at interpreter exit, after every server has stopped


def _stop_all_at_exit() -> None:
    with _live_lock:
        servers = list(_live)
    for server in servers:
        try:
            server._atexit()
        except Exception:  # best effort at interpreter exit
            log.exception("failed to stop %r at exit", server)
    for d in list(_private_dirs):
        shutil.rmtree(d, ignore_errors=True)
        _private_dirs.discard(d)


atexit.register(_stop_all_at_exit)


def remove_at_exit(path: Path) -> None:
    """Remove the directory ``path`` at interpreter exit, after every server has stopped."""
    _private_dirs.add(path)


def _tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as e:
        return f"<no log at {path}: {e}>"
    return "\n".join(text.splitlines()[-lines:])


def package_dir(module: str, hint: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"Python package {module!r} is not installed; run `make deps` ({hint})")
    return Path(next(iter(spec.submodule_search_locations)))


def port_open(port: int) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=0.5):
            return True
    except OSError:
        return False


class Server:
    """Process bookkeeping shared by the launchers (subclasses implement ``_launch`` and ``_ready``)."""

    log_path: Path
    _proc: subprocess.Popen[bytes] | None = None
    _started_once = False

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        """True while the server process started by this object is alive."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        """PID of the server process (the postmaster for PostgreSQL), or None when not running."""
        return self._proc.pid if self.running and self._proc is not None else None

    # subclass hooks
    def start(self, timeout: float = 30) -> Self:
        raise NotImplementedError

    def _launch(self) -> subprocess.Popen[bytes]:
        raise NotImplementedError

    def _ready(self) -> bool:
        raise NotImplementedError

    def _new_ports(self) -> None:
        raise NotImplementedError

    def _popen(self, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as out:
            out.write(f"\n==== {time.strftime('%Y-%m-%d %H:%M:%S')} starting: {' '.join(argv)}\n".encode())
            out.flush()
            return subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                **kwargs,
            )

    def _start_process(self, timeout: float) -> None:
        if self.running:
            return
        attempts = 1 if self._started_once else 3
        for attempt in range(attempts):
            log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
            self._proc = self._launch()
            with _live_lock:
                _live.add(self)
            try:
                self._wait_ready(timeout)
            except ServerStartError:
                self._terminate(signal.SIGKILL, 10)
                new_output = self._log_since(log_offset)
                if attempt + 1 < attempts and _ADDR_IN_USE.search(new_output):
                    log.info("%s: port taken, retrying with fresh ports", type(self).__name__)
                    self._new_ports()
                    continue
                raise
            self._started_once = True
            return

    def _log_since(self, offset: int) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(offset)
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def _wait_ready(self, timeout: float) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + timeout
        while True:
            if self._proc.poll() is not None:
                self._fail(f"exited with code {self._proc.returncode} during startup")
            if self._ready():
                return
            if time.monotonic() > deadline:
                self._fail(f"not ready after {timeout:.0f} s")
            time.sleep(0.05)

    def _fail(self, what: str) -> None:
        raise ServerStartError(
            f"{type(self).__name__} {what}; log {self.log_path}, last lines:\n{_tail(self.log_path)}"
        )

    def _terminate(self, sig: signal.Signals, timeout: float) -> None:
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(sig)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                log.warning("%s did not exit within %.0f s after %s; killing", self, timeout, sig.name)
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                proc.wait()
        # The server ran in its own session: take down any helper process it left behind.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        self._proc = None
        with _live_lock:
            _live.discard(self)

    def stop(self) -> None:
        """Graceful shutdown (SIGTERM) and wait for exit; no-op when not running."""
        self._terminate(signal.SIGTERM, 60)

    def kill(self) -> None:
        """SIGKILL the server (crash simulation) and wait for it; no-op when not running."""
        self._terminate(signal.SIGKILL, 10)

    def _atexit(self) -> None:
        self.stop()
