"""A Prometheus server (Debian's ``prometheus``) scraping the given targets."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Self

from playground.servers.base import (
    HOST,
    NO_PROXY,
    Server,
    free_port,
)

log = logging.getLogger(__name__)


class PrometheusServer(Server):
    """Prometheus (Debian package ``prometheus``) on 127.0.0.1 with ``config`` (a prometheus.yml as a dict:
    rule file paths in it must be absolute) and its TSDB under ``base_dir``. Never the system service: its
    own process, port and data. ``query``/``alerts`` use the HTTP API (``/api/v1``)."""

    def __init__(self, base_dir: Path, config: dict[str, Any], *, binary: str = "prometheus") -> None:
        self.dir = Path(base_dir)
        self.config_path = self.dir / "prometheus.yml"
        self.log_path = self.dir / "prometheus.log"
        self.config = config
        self._binary = binary
        self.port = free_port()

    def __repr__(self) -> str:
        return f"PrometheusServer({self.url})"

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def start(self, timeout: float = 30) -> Self:
        import yaml

        self.dir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(yaml.safe_dump(self.config, sort_keys=False))
        self._start_process(timeout)
        return self

    def _new_ports(self) -> None:
        self.port = free_port()

    def _launch(self) -> subprocess.Popen[bytes]:
        binary = shutil.which(self._binary) or self._binary
        return self._popen([binary, f"--config.file={self.config_path}", f"--storage.tsdb.path={self.dir / 'data'}",
                            f"--web.listen-address={HOST}:{self.port}", "--web.enable-lifecycle",
                            "--storage.tsdb.retention.time=1d", "--log.level=warn"])

    def _ready(self) -> bool:
        try:
            with NO_PROXY.open(f"{self.url}/-/ready", timeout=1) as resp:
                return resp.status == 200
        except (OSError, urllib.error.URLError):
            return False

    def api(self, path: str, **params: str) -> Any:
        """GET ``/api/v1/<path>`` with ``params``; the ``data`` of a success, else RuntimeError with the error."""
        from urllib.parse import urlencode

        url = f"{self.url}/api/v1/{path}" + (f"?{urlencode(params)}" if params else "")
        try:
            with NO_PROXY.open(url, timeout=10) as resp:
                body = json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            body = json.loads(exc.read() or b"{}")
        if body.get("status") != "success":
            raise RuntimeError(f"prometheus {path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """Instant query: the result vector (``[{metric: {...}, value: [t, "v"]}]``)."""
        return list(self.api("query", query=expr)["result"])

    def alerts(self) -> list[dict[str, Any]]:
        """Pending and firing alerts (``/api/v1/alerts``)."""
        return list(self.api("alerts")["alerts"])
