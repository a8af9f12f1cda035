"""HTTP API ``/api/v2`` served by every capture (the CLI's only way in), plus ``/metrics``.

Every capture answers every request by reading or writing etcd, so any capture can take any request;
the one exception is ``POST /api/v2/owner/resign``, which only the owner can carry out: another capture
forwards it to the owner's advertised address (once; a forwarded request is never forwarded again).

Routes are declared once in :attr:`ApiServer.routes` with their OpenAPI path template
(``/api/v2/changefeeds/{changefeed_id}``); ``capture/openapi.py`` documents the same set, and
``GET /api/v2/openapi.json`` serves that document. Bodies are JSON; every error is
``{"error_code": ..., "error_msg": ...}`` with a 4xx/5xx status (404 unknown route or object, 405 a
known path with another method, 400 bad input, 409 state conflict, 5xx server-side trouble).

Thread-safety: requests are served on their own threads (ThreadingHTTPServer); handlers only touch
etcd through the thread-safe MetaStore and call the capture's callbacks, which must be thread-safe.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from capture.changefeeds import ChangefeedService, CreateRequest, UpdateRequest
from capture.openapi import openapi_document
from cdc.errors import InvalidArgument, NotOwner, TidewaterError
from cdc.stats import RequestStats

log = logging.getLogger(__name__)

FORWARDED_HEADER = "X-Tidewater-Forwarded-By"
_PARAM_RE = re.compile(r"\{([a-z_]+)\}")


class RouteNotFound(TidewaterError):
    code = "CDC:ErrNotFound"
    http_status = 404


class MethodNotAllowed(TidewaterError):
    code = "CDC:ErrMethodNotAllowed"
    http_status = 405


class OwnerUnreachable(TidewaterError):
    """The request had to go to the owner capture, which did not answer."""

    code = "CDC:ErrOwnerUnreachable"
    http_status = 502


class NotWired(TidewaterError):
    code = "CDC:ErrNotImplemented"
    http_status = 501


@dataclass(frozen=True)
class ApiRequest:
    method: str
    path: str
    body: Any
    headers: dict[str, str] = field(default_factory=dict)  # lower-case names


@dataclass(frozen=True)
class Route:
    """One endpoint. ``template`` is the OpenAPI path (``{name}`` = one path segment); the handler is
    called as ``handler(request, *segments)`` and returns a JSON-able object sent with ``status``."""

    method: str
    template: str
    handler: Callable[..., Any]
    status: int = 200

    @property
    def pattern(self) -> re.Pattern[str]:
        return re.compile(_PARAM_RE.sub(r"([^/]+)", re.escape(self.template).replace(r"\{", "{").replace(r"\}", "}")))


class ApiServer:
    """The HTTP API of one capture.

    ``status`` returns this capture's status (must include its capture ``id``); ``captures`` is
    accepted for backward compatibility and no longer used (the capture list is read from etcd by
    ``service.captures()``, including ``draining``); ``owner_resign``, when this capture is the owner,
    makes it give up ownership (True if it did, False if it was not the owner) and campaign again.
    """

    def __init__(self, addr: str, service: ChangefeedService, status: Callable[[], dict[str, Any]],
                 captures: Callable[[], list[dict[str, Any]]] | None, metrics: Callable[[], bytes],
                 healthy: Callable[[], bool], owner_resign: Callable[[], bool] | None = None,
                 resign_wait: float = 30.0) -> None:
        host, _, port = addr.rpartition(":")
        self.service = service
        self._status = status
        self._metrics = metrics
        self._healthy = healthy
        self._owner_resign = owner_resign
        self._resign_wait = resign_wait
        s = service
        self.routes: list[Route] = [
            Route("GET", "/api/v2/health", self._health),
            Route("GET", "/api/v2/status", lambda r: self._status()),
            Route("GET", "/api/v2/openapi.json", lambda r: openapi_document()),
            Route("GET", "/api/v2/changefeeds", lambda r: _items(s.list())),
            Route("POST", "/api/v2/changefeeds", self._create, 201),
            Route("GET", "/api/v2/changefeeds/{changefeed_id}", lambda r, cf: s.describe(cf)),
            Route("PUT", "/api/v2/changefeeds/{changefeed_id}", self._update),
            Route("DELETE", "/api/v2/changefeeds/{changefeed_id}", lambda r, cf: s.remove(cf), 202),
            Route("POST", "/api/v2/changefeeds/{changefeed_id}/pause", lambda r, cf: s.pause(cf)),
            Route("POST", "/api/v2/changefeeds/{changefeed_id}/resume", lambda r, cf: s.resume(cf)),
            Route("GET", "/api/v2/captures", lambda r: s.captures()),
            Route("POST", "/api/v2/captures/{capture_id}/drain", lambda r, cid: s.drain_capture(cid), 202),
            Route("GET", "/api/v2/processors", lambda r: _items(s.processors())),
            Route("GET", "/api/v2/processors/{changefeed_id}/{capture_id}",
                  lambda r, cf, cid: s.processor(cf, cid)),
            Route("POST", "/api/v2/owner/resign", self._resign),
        ]
        self._compiled = [(r, r.pattern) for r in self.routes]
        self.stats = RequestStats()
        # plain-text probes outside /api/v2 (Kubernetes, load balancers): path -> handler(h, method)
        self._plain: dict[str, Callable[[BaseHTTPRequestHandler, str], None]] = {}
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, fmt: str, *args: Any) -> None:
                log.debug("http %s", fmt % args)

            def do_GET(self) -> None:  # noqa: N802
                api._handle(self, "GET")

            def do_POST(self) -> None:  # noqa: N802
                api._handle(self, "POST")

            def do_PUT(self) -> None:  # noqa: N802
                api._handle(self, "PUT")

            def do_DELETE(self) -> None:  # noqa: N802
                api._handle(self, "DELETE")

        self.httpd = ThreadingHTTPServer((host or "127.0.0.1", int(port)), Handler)
        self.httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    def add_probe(self, path: str, failing: Callable[[], dict[str, str]]) -> None:
        """Serve ``GET path`` outside ``/api/v2`` (``/livez``, ``/readyz``): 200 ``{"status": "ok"}`` when
        ``failing()`` is empty, else 503 ``{"status": "fail", "checks": {name: why}}``."""
        def handle(h: BaseHTTPRequestHandler, method: str) -> None:
            if method != "GET":
                raise MethodNotAllowed(f"{method} is not allowed on {path}; allowed: GET")
            bad = failing()
            self._send_json(h, 503 if bad else 200, {"status": "fail", "checks": bad} if bad else {"status": "ok"})
        self._plain[path] = handle

    def start(self) -> None:
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="http-api", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    # ---- handlers --------------------------------------------------------------------------------
    def _health(self, req: ApiRequest) -> dict[str, Any]:
        if not self._healthy():
            raise TidewaterError("capture is not registered in etcd (session lost or not started)")
        return {"status": "ok"}

    def _create(self, req: ApiRequest) -> dict[str, Any]:
        body = _object(req.body)
        _no_unknown(body, {"changefeed_id", "upstream_uri", "sink_uri", "config", "target_ts", "snapshot"})
        try:
            create = CreateRequest(
                changefeed_id=str(body.get("changefeed_id", "")),
                upstream_uri=str(body.get("upstream_uri", "")),
                sink_uri=str(body.get("sink_uri", "")),
                config=str(body.get("config") or ""),
                target_ts=int(body.get("target_ts") or 0),
                snapshot=str(body["snapshot"]) if body.get("snapshot") is not None else None,
            )
        except (TypeError, ValueError) as exc:
            raise InvalidArgument(f"bad create request: {exc}") from exc
        return self.service.create(create)

    def _update(self, req: ApiRequest, cf: str) -> dict[str, Any]:
        body = _object(req.body)
        _no_unknown(body, {"sink_uri", "upstream_uri", "config", "target_ts", "skip_ddl_ts"})
        for key in ("sink_uri", "upstream_uri", "config"):
            if key in body and not isinstance(body[key], str):
                raise InvalidArgument(f"{key} must be a string")
        target = body.get("target_ts")
        if target is not None and (not isinstance(target, int) or isinstance(target, bool)):
            raise InvalidArgument("target_ts must be an integer")
        skip = body.get("skip_ddl_ts")
        if skip is not None and (not isinstance(skip, int) or isinstance(skip, bool)):
            raise InvalidArgument("skip_ddl_ts must be an integer (the commit Ts named in the DDL error)")
        return self.service.update(cf, UpdateRequest(sink_uri=body.get("sink_uri"),
                                                     upstream_uri=body.get("upstream_uri"),
                                                     config=body.get("config"), target_ts=target,
                                                     skip_ddl_ts=skip))

    def _resign(self, req: ApiRequest) -> dict[str, Any]:
        """Make the owner resign. On the owner: call ``owner_resign`` and wait until a new owner is
        elected (possibly this capture again, with a new election key); elsewhere: forward to the owner."""
        snap = self.service.store.snapshot()
        owner = snap.owner
        if owner is None:
            raise NotOwner("no owner is elected right now; retry in a few seconds")
        my_id = str(self._status().get("id", ""))
        if owner.capture_id != my_id:
            if req.headers.get(FORWARDED_HEADER.lower()):
                raise NotOwner(f"capture {my_id} received a forwarded resign but is not the owner "
                               f"(the owner is {owner.capture_id}); retry")
            cap = snap.captures.get(owner.capture_id)
            if cap is None:
                raise NotOwner(f"the owner {owner.capture_id} is not registered any more; retry")
            return self._forward(cap.advertise_addr, req, my_id)
        if self._owner_resign is None:
            raise NotWired("this capture cannot resign its ownership (no resign hook is wired in)")
        if not self._owner_resign():
            raise NotOwner(f"capture {my_id} is no longer the owner; retry")
        log.info("capture=%s resigned ownership (API)", my_id)
        deadline = time.monotonic() + self._resign_wait
        new = None
        while time.monotonic() < deadline:
            cand = self.service.store.snapshot().owner
            if cand is not None and (cand.lease, cand.create_revision) != (owner.lease, owner.create_revision):
                new = cand
                break
            time.sleep(0.1)
        return {"resigned": True, "previous_owner": owner.capture_id,
                "owner": new.capture_id if new else None,
                "same_capture": bool(new and new.capture_id == owner.capture_id),
                "message": (f"capture {owner.capture_id} resigned; capture {new.capture_id} "
                            f"{'won the election again' if new.capture_id == owner.capture_id else 'is the new owner'}")
                if new else f"capture {owner.capture_id} resigned; no new owner within {self._resign_wait:.0f}s"}

    @staticmethod
    def _forward(addr: str, req: ApiRequest, my_id: str) -> Any:
        url = f"http://{addr}{req.path}"
        data = json.dumps(req.body).encode()
        fwd = urllib.request.Request(url, data=data, method=req.method,
                                     headers={"Content-Type": "application/json", FORWARDED_HEADER: my_id})
        try:
            with urllib.request.urlopen(fwd, timeout=60) as resp:
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                err = json.loads(raw)
            except ValueError:
                err = {}
            raise _Relayed(exc.code, err.get("error_code", "CDC:ErrOwnerUnreachable"),
                           err.get("error_msg", f"HTTP {exc.code} from the owner at {addr}")) from exc
        except (urllib.error.URLError, OSError) as exc:
            raise OwnerUnreachable(f"cannot reach the owner at {addr}: {getattr(exc, 'reason', exc)}") from exc

    # ---- dispatch --------------------------------------------------------------------------------
    def _handle(self, h: BaseHTTPRequestHandler, method: str) -> None:
        """``_dispatch``, counted in ``stats`` by method, route template and status (metrics)."""
        began = time.monotonic()
        route: list[str] = []
        try:
            self._dispatch(h, method, route)
        finally:
            self.stats.observe(method, route[0] if route else "unmatched", getattr(h, "tw_status", 0),
                               time.monotonic() - began)

    def _dispatch(self, h: BaseHTTPRequestHandler, method: str, route_out: list[str]) -> None:
        path = h.path.split("?", 1)[0].rstrip("/")
        try:
            if path in self._plain:
                route_out.append(path)
                self._plain[path](h, method)
                return
            if path == "/metrics" and method == "GET":
                route_out.append("/metrics")
                self._send(h, 200, self._metrics(), "text/plain; version=0.0.4")
                return
            length = int(h.headers.get("Content-Length") or 0)
            raw = h.rfile.read(length) if length else b""
            try:
                body = json.loads(raw) if raw.strip() else {}
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise InvalidArgument(f"request body is not JSON: {exc}") from exc
            allowed: list[str] = []
            for route, pattern in self._compiled:
                match = pattern.fullmatch(path)
                if not match:
                    continue
                if route.method != method:
                    allowed.append(route.method)
                    continue
                route_out.append(route.template)
                req = ApiRequest(method, path, body, {k.lower(): v for k, v in h.headers.items()})
                self._send_json(h, route.status, route.handler(req, *match.groups()))
                return
            if allowed:
                raise MethodNotAllowed(f"{method} is not allowed on {path}; allowed: {', '.join(sorted(allowed))}")
            raise RouteNotFound(f"no route {method} {path}")
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
        h.tw_status = code  # type: ignore[attr-defined]  # read by _handle for metrics
        h.send_response(code)
        h.send_header("Content-Type", ctype)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)


class _Relayed(TidewaterError):
    """An error answer of the owner, relayed unchanged (status, code, message)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.http_status = status
        self.code = code


def _items(items: list[dict[str, Any]]) -> dict[str, Any]:
    return {"total": len(items), "items": items}


def _object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise InvalidArgument("request body must be a JSON object")
    return body


def _no_unknown(body: dict[str, Any], known: set[str]) -> None:
    unknown = sorted(set(body) - known)
    if unknown:
        raise InvalidArgument(f"unknown field(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
