"""Run `cdc server` processes and drive them, for the demo, the e2e tests and benchmarks."""

from __future__ import annotations

import json
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from playground.servers import free_port


class ApiError(RuntimeError):
    def __init__(self, status: int, body: dict[str, Any]) -> None:
        super().__init__(f"HTTP {status}: {body}")
        self.status = status
        self.body = body


class CdcServer:
    """One `cdc server` subprocess (python -m cli server ...) on 127.0.0.1."""

    def __init__(self, etcd_url: str, base_dir: Path, cluster_id: str = "default", port: int | None = None,
                 extra_args: list[str] | None = None, *, tls: ssl.SSLContext | None = None, token: str = "",
                 env: dict[str, str] | None = None) -> None:
        """``tls``: the server speaks HTTPS (give it ``--cert``/``--key`` in ``extra_args``) and this client
        context is used to reach it; ``token``: sent as ``Authorization: Bearer``; ``env``: added to the
        process environment (secrets that must not be on the command line)."""
        self.tls = tls
        self.token = token
        self.env = env or {}
        self.etcd_url = etcd_url
        self.base_dir = Path(base_dir)
        self.cluster_id = cluster_id
        self.port = port or free_port()
        self.extra_args = extra_args or []
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_file = self.base_dir / f"cdc-{self.port}.log"

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{'localhost' if self.tls else '127.0.0.1'}:{self.port}"

    def start(self, wait: bool = True, timeout: float = 30.0) -> CdcServer:
        self.base_dir.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "cli", "server", "--etcd", self.etcd_url, "--addr", f"127.0.0.1:{self.port}",
                "--data-dir", str(self.base_dir / f"data-{self.port}"), "--cluster-id", self.cluster_id,
                "--log-file", str(self.log_file), *self.extra_args]
        env = dict(os.environ, PYTHONUNBUFFERED="1", **self.env)
        with open(self.log_file, "ab") as err:
            # a session of its own, as the other servers' (playground.servers.base): a terminal's Ctrl-C reaches the
            # one who started it, who stops it in order; it used to reach the server too, which then went away
            # under the demo's next request (a traceback instead of "interrupted", exit 1 instead of 130)
            self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err, env=env,
                                         cwd=str(Path(__file__).resolve().parent.parent), start_new_session=True)
        if wait:
            self.wait_healthy(timeout)
        return self

    def wait_healthy(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"cdc server exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                self.get("/api/v2/health", timeout=1)
                return
            except (ApiError, OSError):
                time.sleep(0.05)
        raise RuntimeError(f"cdc server on port {self.port} not healthy after {timeout}s:\n{self.log_tail()}")

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def terminate(self, timeout: float = 30.0) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    # ---- API -------------------------------------------------------------------------------------
    def request(self, method: str, path: str, body: Any = None, timeout: float = 120.0) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=timeout, context=self.tls) as resp:
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            try:
                payload = json.loads(exc.read())
            except ValueError:
                payload = {"error_msg": str(exc)}
            raise ApiError(exc.code, payload) from None

    def get(self, path: str, timeout: float = 30.0) -> Any:
        return self.request("GET", path, timeout=timeout)

    def changefeed(self, cf: str) -> dict[str, Any]:
        return self.get(f"/api/v2/changefeeds/{cf}")

    def create_changefeed(self, cf: str, upstream: str, sink: str, config: str = "", *,
                          snapshot: str | None = None) -> dict[str, Any]:
        """``snapshot``: ``"initial"`` or ``"none"`` overrides the config's ``[snapshot] mode`` (``cdc cli changefeed
        create --snapshot``); ``None`` leaves it to the config (default: the initial copy)."""
        body = {"changefeed_id": cf, "upstream_uri": upstream, "sink_uri": sink, "config": config}
        if snapshot is not None:
            body["snapshot"] = snapshot
        return self.request("POST", "/api/v2/changefeeds", body)

    def wait_checkpoint(self, cf: str, lsn: int, timeout: float = 120.0) -> dict[str, Any]:
        """Wait until the changefeed's global checkpoint reaches ``lsn``; return the last query."""
        deadline = time.monotonic() + timeout
        info: dict[str, Any] = {}
        while time.monotonic() < deadline:
            info = self.changefeed(cf)
            if info["checkpoint_ts"] >= lsn:
                return info
            time.sleep(0.2)
        raise TimeoutError(f"changefeed {cf} checkpoint {info.get('checkpoint')} did not reach {lsn:X} in "
                           f"{timeout}s; state={info.get('state')} error={info.get('error')}\n{self.log_tail()}")


def current_lsn(pg_conn: Any) -> int:
    with pg_conn.cursor() as cur:
        cur.execute("SELECT pg_current_wal_insert_lsn()::text")  # write position lags with synchronous_commit=off
        hi, lo = cur.fetchone()[0].split("/")
    return (int(hi, 16) << 32) | int(lo, 16)
