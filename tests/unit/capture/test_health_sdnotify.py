"""capture.health (liveness from the main loop's heartbeat, readiness from the etcd session, etcd freshness and
draining) with an injected clock; capture.sdnotify against a real datagram socket bound by the test; the
SIGHUP reload's split of changed keys."""

from __future__ import annotations

import os
import socket
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from capture.health import Health
from capture.sdnotify import Notifier
from capture.server import RELOADABLE, config_changes
from cdc.config import ServerConfig

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_liveness_follows_the_heartbeat_only() -> None:
    clock = Clock()
    h = Health(session_alive=lambda: False, etcd_age=lambda: None, draining=lambda: True, stall_after=30,
               clock=clock)
    assert h.liveness() == {}  # etcd away and draining: still live (a restart would not help)
    clock.now += 31
    assert "main_loop" in h.liveness()
    h.beat()
    assert h.liveness() == {}


def test_readiness_needs_session_fresh_etcd_and_no_drain() -> None:
    clock = Clock()
    state = {"alive": True, "age": 1.0, "draining": False}
    h = Health(session_alive=lambda: state["alive"], etcd_age=lambda: state["age"],
               draining=lambda: state["draining"], etcd_stale_after=5, clock=clock)
    assert h.readiness() == {}
    state["age"] = 6.0
    assert set(h.readiness()) == {"etcd"}
    state.update(alive=False)
    assert set(h.readiness()) == {"etcd_session"}
    state.update(alive=True, age=0.5, draining=True)
    assert set(h.readiness()) == {"draining"}
    clock.now += 60
    assert set(h.readiness()) == {"draining", "main_loop"}


@pytest.fixture
def notify_socket(tmp_path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(tmp_path / "notify.sock"))
    sock.settimeout(5)
    yield sock
    sock.close()


def test_notify_sends_one_datagram_per_message(notify_socket: socket.socket, tmp_path: Path) -> None:
    n = Notifier({"NOTIFY_SOCKET": str(tmp_path / "notify.sock")})
    assert n.enabled and n.watchdog_interval == 0
    assert n.notify("READY=1", "STATUS=registered")
    assert notify_socket.recv(4096) == b"READY=1\nSTATUS=registered"


def test_notify_abstract_socket() -> None:
    name = f"tidewater-test-{os.getpid()}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(b"\0" + name.encode())
    sock.settimeout(5)
    try:
        assert Notifier({"NOTIFY_SOCKET": "@" + name}).notify("STOPPING=1")
        assert sock.recv(100) == b"STOPPING=1"
    finally:
        sock.close()


def test_without_systemd_or_with_a_dead_socket_nothing_fails(tmp_path: Path) -> None:
    assert not Notifier({}).notify("READY=1")
    assert not Notifier({"NOTIFY_SOCKET": str(tmp_path / "nobody.sock")}).notify("READY=1")


def test_watchdog_pings_while_alive_and_respects_watchdog_pid(notify_socket: socket.socket, tmp_path: Path) -> None:
    env = {"NOTIFY_SOCKET": str(tmp_path / "notify.sock"), "WATCHDOG_USEC": "200000"}
    assert Notifier({**env, "WATCHDOG_PID": "1"}).watchdog_interval == 0  # meant for another process
    n = Notifier({**env, "WATCHDOG_PID": str(os.getpid())})
    assert n.watchdog_interval == pytest.approx(0.1)
    alive = [True, False, True]
    stop = threading.Event()
    sleeps: list[float] = []

    def sleep(s: float) -> bool:
        sleeps.append(s)
        if len(sleeps) == 3:
            stop.set()
        return stop.is_set()

    n.run_watchdog(lambda: alive[len(sleeps)], stop, sleep)
    got = [notify_socket.recv(100), notify_socket.recv(100)]
    assert got == [b"WATCHDOG=1", b"WATCHDOG=1"]  # the dead turn in the middle sent nothing
    notify_socket.settimeout(0.2)
    with pytest.raises(TimeoutError):
        notify_socket.recv(100)


def test_config_changes_split_reloadable_from_restart_only() -> None:
    old = ServerConfig()
    new = replace(old, gc_ttl=60.0, log_level="debug", session_ttl=12, etcd=("http://10.0.0.1:2379",))
    applied, ignored = config_changes(old, new)
    assert applied == {"gc_ttl": 60.0, "log_level": "debug"}
    assert ignored == {"session_ttl": 12, "etcd": ("http://10.0.0.1:2379",)}
    assert set(RELOADABLE) <= set(ServerConfig.__dataclass_fields__)


def test_a_reader_that_does_not_read_never_blocks_the_capture(notify_socket: socket.socket, tmp_path: Path) -> None:
    n = Notifier({"NOTIFY_SOCKET": str(tmp_path / "notify.sock")})
    results = [n.notify("WATCHDOG=1") for _ in range(2000)]  # far beyond the socket's queue
    assert results[0] and not results[-1]
    assert notify_socket.recv(100) == b"WATCHDOG=1"
    assert n.notify("STOPPING=1")  # room again: the next message goes through
