"""Operations surface of a real `cdc server` process: systemd's notify protocol (READY=1 at registration,
WATCHDOG=1 while live, RELOADING=1/READY=1 around SIGHUP, STOPPING=1) on a NOTIFY_SOCKET the test binds;
SIGHUP applies the reloadable keys of the re-read config file and refuses an invalid one; /livez and /readyz
(readiness false while draining - `cdc cli capture drain --self --wait`, the Kubernetes preStop hook - and while
etcd is unreachable; liveness true throughout)."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from e2e_workload import TEST_SERVER_CONFIG

from playground.cluster import CdcServer
from playground.servers import EtcdServer

pytestmark = pytest.mark.e2e

BASE = TEST_SERVER_CONFIG + "session-ttl = 3\netcd-timeout = 1.0\n"


def _probe(cdc: CdcServer, path: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(cdc.url + path, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _until(what: str, check: Callable[[], Any], timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.2)


class NotifySocket:
    """The test's end of NOTIFY_SOCKET, read continuously (as systemd does) into ``seen``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.2)
        self.seen: list[str] = []
        self._read = 0
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._closed.is_set():
            try:
                self.seen.append(self.sock.recv(4096).decode())
            except TimeoutError:
                continue

    def close(self) -> None:
        self._closed.set()
        self._thread.join(5)
        self.sock.close()

    def expect(self, field: str, timeout: float = 15.0) -> list[str]:
        """Messages since the last ``expect`` up to and including the first one holding ``field`` (a line)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for i in range(self._read, len(self.seen)):
                if field in self.seen[i].split("\n"):
                    got, self._read = self.seen[self._read:i + 1], i + 1
                    return got
            time.sleep(0.05)
        raise AssertionError(f"no {field} on NOTIFY_SOCKET within {timeout}s; got {self.seen[self._read:]}")


def _metric(cdc: CdcServer, name: str) -> float:
    with urllib.request.urlopen(cdc.url + "/metrics", timeout=5) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise AssertionError(f"{name} not exported")


def test_notify_reload_probes_drain_and_etcd_outage(cluster_id: str, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    etcd = EtcdServer(tmp_path, "etcd-ops").start()
    config = tmp_path / "server.toml"
    config.write_text(BASE)
    notify_a = NotifySocket(tmp_path / "a.sock")
    monkeypatch.setenv("NOTIFY_SOCKET", str(notify_a.path))
    monkeypatch.setenv("WATCHDOG_USEC", "600000")  # WatchdogSec=0.6: a ping every 0.3 s
    a = CdcServer(etcd.url, tmp_path / "cdc", cluster_id=cluster_id, extra_args=["--config", str(config)]).start()
    b = None
    try:
        ready = notify_a.expect("READY=1")
        assert any(line.startswith("STATUS=capture ") for line in ready[-1].split("\n"))
        notify_a.expect("WATCHDOG=1", timeout=3)
        assert _probe(a, "/livez") == (200, {"status": "ok"})
        assert _probe(a, "/readyz") == (200, {"status": "ok"})

        # SIGHUP: reloadable keys applied, a restart-only key reported, nothing else happens
        assert _metric(a, "tidewater_sorter_disk_quota_bytes") == 0
        config.write_text(BASE.replace("session-ttl = 3", "session-ttl = 4")
                          + 'gc-ttl = 120.0\nsorter-disk-quota = 5000000\nlog-level = "debug"\n')
        assert a.proc is not None
        a.proc.send_signal(signal.SIGHUP)
        msgs = notify_a.expect("READY=1", timeout=10)
        assert any("RELOADING=1" in m.split("\n") for m in msgs), msgs
        _until("the reload applied", lambda: _metric(a, "tidewater_sorter_disk_quota_bytes") == 5000000, 5)
        log = a.log_file.read_text()
        assert "SIGHUP: config reloaded; applied gc-ttl=120.0, log-level='debug', sorter-disk-quota=5000000" in log
        assert "session-ttl=4 changed in the config file but need a restart" in log
        # an invalid file changes nothing
        config.write_text("this is = = not toml\n")
        a.proc.send_signal(signal.SIGHUP)
        notify_a.expect("READY=1", timeout=10)
        _until("the refusal logged", lambda: "config not reloaded, keeping the running one" in a.log_file.read_text(), 5)
        assert _metric(a, "tidewater_sorter_disk_quota_bytes") == 5000000
        assert _probe(a, "/readyz")[0] == 200

        # a second capture; drain the first as a preStop hook would
        monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "b-nobody.sock"))  # b's messages go nowhere
        monkeypatch.delenv("WATCHDOG_USEC")
        b = CdcServer(etcd.url, tmp_path / "cdc", cluster_id=cluster_id, extra_args=["--config", str(config)])
        config.write_text(BASE)
        b.start()
        r = subprocess.run([sys.executable, "-m", "cli", "cli", "--server", a.url, "capture", "drain", "--self",
                            "--wait", "10"], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["draining"] is True
        status, body = _until("a not ready while draining", lambda: (p := _probe(a, "/readyz"))[0] == 503 and p, 5)
        assert set(body["checks"]) == {"draining"}
        assert _probe(a, "/livez")[0] == 200
        assert _probe(b, "/readyz")[0] == 200

        # etcd away: not ready (live all along), ready again once it is back
        etcd.stop()
        status, body = _until("b not ready without etcd", lambda: (p := _probe(b, "/readyz"))[0] == 503 and p, 10)
        assert {"etcd", "etcd_session"} & set(body["checks"]), body
        assert _probe(b, "/livez")[0] == 200
        etcd.start()
        _until("b ready again", lambda: _probe(b, "/readyz")[0] == 200, 30)
        assert _probe(b, "/livez")[0] == 200
        assert a.terminate() == 0
        notify_a.expect("STOPPING=1", timeout=5)
    finally:
        if b is not None:
            b.terminate()
        a.terminate()
        etcd.stop()
        notify_a.close()
