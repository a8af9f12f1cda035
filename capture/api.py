"""HTTP API ``/api/v2`` served by every capture (the CLI's only way in), plus ``/metrics``.

Every capture answers every request by reading or writing etcd, so there is no forwarding to the
owner. Bodies are JSON; errors are ``{"error_code": ..., "error_msg": ...}`` with a 4xx/5xx status.
Thread-safety: requests are served on their own threads (ThreadingHTTPServer); handlers only touch
etcd through the thread-safe MetaStore.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from capture.changefeeds import ChangefeedService, CreateRequest
from cdc.errors import InvalidArgument, TidewaterError

log = logging.getLogger(__name__)

Route = tuple[str, re.Pattern[str], Callable[..., Any]]


class ApiServer:
    def __init__(self, addr: str, service: ChangefeedService, status: Callable[[], dict[str, Any]],
                 captures: Callable[[], list[dict[str, Any]]], metrics: Callable[[], bytes],
                 healthy: Callable[[], bool]) -> None:
        host, _, port = addr.rpartition(":")
        self.service = service
        self._status = status
        self._captures = captures
        self._metrics = metrics
        self._healthy = healthy
        self.routes: list[Route] = [
            ("GET", re.compile(r"/api/v2/health"), self._health),
            ("GET", re.compile(r"/api/v2/status"), lambda body: self._status()),
            ("GET", re.compile(r"/api/v2/captures"), lambda body: self._captures()),
            ("GET", re.compile(r"/api/v2/changefeeds"), lambda body: {"items": service.list()}),
            ("POST", re.compile(r"/api/v2/changefeeds"), self._create),
            ("GET", re.compile(r"/api/v2/changefeeds/([^/]+)"), lambda body, cf: service.describe(cf)),
            ("DELETE", re.compile(r"/api/v2/changefeeds/([^/]+)"), lambda body, cf: service.remove(cf)),
            ("POST", re.compile(r"/api/v2/changefeeds/([^/]+)/pause"), lambda body, cf: service.pause(cf)),
            ("POST", re.compile(r"/api/v2/changefeeds/([^/]+)/resume"), lambda body, cf: service.resume(cf)),
        ]
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, fmt: str, *args: Any) -> None:
                log.debug("http %s", fmt % args)

            def do_GET(self) -> None:  # noqa: N802
                api._handle(self, "GET")

            def do_POST(self) -> None:  # noqa: N802
                api._handle(self, "POST")

            def do_DELETE(self) -> None:  # noqa: N802
                api._handle(self, "DELETE")

        self.httpd = ThreadingHTTPServer((host or "127.0.0.1", int(port)), Handler)
        self.httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="http-api", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    # ---- handlers --------------------------------------------------------------------------------
    def _health(self, body: Any) -> dict[str, Any]:
        if not self._healthy():
            raise TidewaterError("capture is not registered in etcd (session lost or not started)")
        return {"status": "ok"}

    def _create(self, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise InvalidArgument("request body must be a JSON object")
        try:
            req = CreateRequest(
                changefeed_id=str(body.get("changefeed_id", "")),
                upstream_uri=str(body.get("upstream_uri", "")),
                sink_uri=str(body.get("sink_uri", "")),
                config=str(body.get("config") or ""),
                target_ts=int(body.get("target_ts") or 0),
            )
        except (TypeError, ValueError) as exc:
            raise InvalidArgument(f"bad create request: {exc}") from exc
        return self.service.create(req)

    def _handle(self, h: BaseHTTPRequestHandler, method: str) -> None:
        path = h.path.split("?", 1)[0].rstrip("/")
        try:
            if path == "/metrics" and method == "GET":
                self._send(h, 200, self._metrics(), "text/plain; version=0.0.4")
                return
            length = int(h.headers.get("Content-Length") or 0)
            raw = h.rfile.read(length) if length else b""
            try:
                body = json.loads(raw) if raw else {}
            except json.JSONDecodeError as exc:
                raise InvalidArgument(f"request body is not JSON: {exc}") from exc
            for m, pattern, fn in self.routes:
                match = pattern.fullmatch(path)
                if m == method and match:
                    result = fn(body, *match.groups())
                    self._send_json(h, 200, result)
                    return
            self._send_json(h, 404, {"error_code": "CDC:ErrNotFound", "error_msg": f"no route {method} {path}"})
        except TidewaterError as exc:
            self._send_json(h, exc.http_status, exc.to_dict())
        except Exception as exc:  # noqa: BLE001 - report, never kill the server thread silently
            log.exception("http %s %s failed", method, path)
            self._send_json(h, 500, {"error_code": "CDC:ErrInternal", "error_msg": f"{type(exc).__name__}: {exc}"})

    @staticmethod
    def _send_json(h: BaseHTTPRequestHandler, code: int, obj: Any) -> None:
        ApiServer._send(h, code, json.dumps(obj, indent=2, default=str).encode(), "application/json")

    @staticmethod
    def _send(h: BaseHTTPRequestHandler, code: int, data: bytes, ctype: str) -> None:
        h.send_response(code)
        h.send_header("Content-Type", ctype)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)
