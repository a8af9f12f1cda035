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
import socket
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from capture.changefeeds import ID_RE, ChangefeedService, CreateRequest, UpdateRequest
from capture.httpguard import ApiLimits, AuthPolicy, Deadlines
from capture.openapi import openapi_document
from cdc.errors import InvalidArgument, NotOwner, TidewaterError
from cdc.stats import RequestStats
from cdc.uri import scrub

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


class Unauthorized(TidewaterError):
    code = "CDC:ErrUnauthorized"
    http_status = 401


class BodyTooLarge(TidewaterError):
    code = "CDC:ErrRequestTooLarge"
    http_status = 413


class RequestTimeout(TidewaterError):
    code = "CDC:ErrRequestTimeout"
    http_status = 408


class LengthRequired(TidewaterError):
    code = "CDC:ErrLengthRequired"
    http_status = 411


# HTTP-level refusals (raised by the standard library's request parsing) in the JSON error shape
_HTTP_CODES = {400: "CDC:ErrInvalidArgument", 408: "CDC:ErrRequestTimeout", 413: "CDC:ErrRequestTooLarge",
               414: "CDC:ErrRequestTooLarge", 431: "CDC:ErrRequestTooLarge", 505: "CDC:ErrInvalidArgument"}
_MAX_LINE = 8192  # request line
# path parameters: what a valid value looks like (anything else is a 400, never a lookup)
_CAPTURE_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
_PARAM_CHECKS: dict[str, tuple[re.Pattern[str], str]] = {
    "changefeed_id": (ID_RE, "letters, digits and single dashes, at most 64 characters"),
    "capture_id": (_CAPTURE_ID_RE, "a capture id as `cdc cli capture list` shows it"),
}


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
                 resign_wait: float = 30.0, *, limits: ApiLimits | None = None, auth: AuthPolicy | None = None,
                 tls: ssl.SSLContext | None = None, forward_tls: ssl.SSLContext | None = None) -> None:
        host, _, port = addr.rpartition(":")
        self.limits = limits or ApiLimits()
        self.auth = auth or AuthPolicy()
        self.tls = tls
        self._forward_tls = forward_tls  # owner forwarding: verify the owner, present our certificate
        self._deadlines = Deadlines()
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
            Route("POST", "/api/v2/changefeeds/{changefeed_id}/snapshot", self._resync, 202),
            Route("POST", "/api/v2/changefeeds/{changefeed_id}/verify", self._verify, 202),
            Route("GET", "/api/v2/changefeeds/{changefeed_id}/verify/{run_id}",
                  lambda r, cf, run: self._verify_runs().get(cf, run)),
            Route("DELETE", "/api/v2/changefeeds/{changefeed_id}/verify/{run_id}",
                  lambda r, cf, run: self._verify_runs().stop(cf, run), 202),
            Route("GET", "/api/v2/captures", lambda r: s.captures()),
            Route("POST", "/api/v2/captures/{capture_id}/drain", lambda r, cid: s.drain_capture(cid), 202),
            Route("GET", "/api/v2/processors", lambda r: _items(s.processors())),
            Route("GET", "/api/v2/processors/{changefeed_id}/{capture_id}",
                  lambda r, cf, cid: s.processor(cf, cid)),
            Route("POST", "/api/v2/owner/resign", self._resign),
        ]
        self._compiled = [(r, r.pattern) for r in self.routes]
        self.stats = RequestStats()
        # plain-text probes outside /api/v2 (Kubernetes, load balancers): path -> handler(h, method); always open
        self._plain: dict[str, Callable[[BaseHTTPRequestHandler, str], None]] = {}
        self.httpd = _HttpServer((host or "127.0.0.1", int(port)), _handler_class(self), self.limits, tls)
        self._thread: threading.Thread | None = None

    @property
    def scheme(self) -> str:
        return "https" if self.tls is not None else "http"

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
        self._deadlines.start()
        # a short poll: stop() waits for serve_forever's next poll (0.5 s by default) on every shutdown
        self._thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), name="http-api",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self._deadlines.stop()

    # ---- handlers --------------------------------------------------------------------------------
    def _health(self, req: ApiRequest) -> dict[str, Any]:
        if not self._healthy():
            raise TidewaterError("capture is not registered in etcd (session lost or not started)")
        return {"status": "ok"}

    def _create(self, req: ApiRequest) -> dict[str, Any]:
        body = _object(req.body)
        _no_unknown(body, {"changefeed_id", "upstream_uri", "sink_uri", "config", "target_ts", "snapshot"})
        for key in ("changefeed_id", "upstream_uri", "sink_uri"):
            if not isinstance(body.get(key, ""), str):
                raise InvalidArgument(f"{key} must be a string")
        if body.get("config") is not None and not isinstance(body["config"], str):
            raise InvalidArgument("config must be a string (the changefeed TOML)")
        if body.get("snapshot") is not None and body["snapshot"] not in ("initial", "none"):
            raise InvalidArgument("snapshot must be \"initial\" or \"none\"")
        target = body.get("target_ts")
        _check_ts("target_ts", target)
        create = CreateRequest(changefeed_id=body.get("changefeed_id", ""), upstream_uri=body.get("upstream_uri", ""),
                               sink_uri=body.get("sink_uri", ""), config=body.get("config") or "",
                               target_ts=target or 0, snapshot=body.get("snapshot"))
        return self.service.create(create)

    def _update(self, req: ApiRequest, cf: str) -> dict[str, Any]:
        body = _object(req.body)
        _no_unknown(body, {"sink_uri", "upstream_uri", "config", "target_ts", "skip_ddl_ts"})
        for key in ("sink_uri", "upstream_uri", "config"):
            if key in body and not isinstance(body[key], str):
                raise InvalidArgument(f"{key} must be a string")
        target = body.get("target_ts")
        _check_ts("target_ts", target)
        skip = body.get("skip_ddl_ts")
        _check_ts("skip_ddl_ts", skip, " (the commit Ts named in the DDL error)")
        return self.service.update(cf, UpdateRequest(sink_uri=body.get("sink_uri"),
                                                     upstream_uri=body.get("upstream_uri"),
                                                     config=body.get("config"), target_ts=target,
                                                     skip_ddl_ts=skip))

    def _resync(self, req: ApiRequest, cf: str) -> dict[str, Any]:
        body = _object(req.body)
        _no_unknown(body, {"tables"})
        tables = body.get("tables")
        if not isinstance(tables, list) or not tables or not all(isinstance(t, str) and t.strip() for t in tables):
            raise InvalidArgument("tables must be a non-empty list of 'schema.name' strings")
        if len(tables) > 1000:
            raise InvalidArgument("at most 1000 tables per request")
        return self.service.resync(cf, tables)

    def _verify_runs(self) -> Any:
        runs = getattr(self.service, "verify_runs", None)
        if runs is None:
            raise NotWired("this capture runs no verify jobs (none is wired in)")
        return runs

    def _verify(self, req: ApiRequest, cf: str) -> dict[str, Any]:
        """Start a ``changefeed verify`` job (docs/verify.md): 202 with its run (poll ``GET .../verify/{id}``)."""
        body = _object(req.body) if req.body is not None else {}
        _no_unknown(body, {"tables", "chunk_rows"})
        tables = body.get("tables")
        if tables is not None and (not isinstance(tables, list) or not tables
                                   or not all(isinstance(t, str) and t.strip() for t in tables)):
            raise InvalidArgument("tables must be a non-empty list of 'schema.name' strings (or absent: every table)")
        if tables is not None and len(tables) > 1000:
            raise InvalidArgument("at most 1000 tables per request")
        chunk_rows = body.get("chunk_rows")
        if chunk_rows is not None and (not isinstance(chunk_rows, int) or isinstance(chunk_rows, bool)
                                       or chunk_rows < 1):
            raise InvalidArgument("chunk_rows must be a positive integer")
        return self._verify_runs().start(cf, tables, chunk_rows)

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

    def _forward(self, addr: str, req: ApiRequest, my_id: str) -> Any:
        """Send ``req`` to the owner at ``addr`` (same scheme as this server; the caller's credentials go
        along, and with TLS this capture's client certificate)."""
        url = f"{self.scheme}://{addr}{req.path}"
        data = json.dumps(req.body).encode()
        headers = {"Content-Type": "application/json", FORWARDED_HEADER: my_id}
        if req.headers.get("authorization"):
            headers["Authorization"] = req.headers["authorization"]
        fwd = urllib.request.Request(url, data=data, method=req.method, headers=headers)
        try:
            with urllib.request.urlopen(fwd, timeout=60, context=self._forward_tls) as resp:
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
    def _handle(self, h: _Handler, method: str) -> None:
        """``_dispatch``, counted in ``stats`` by method, route template and status (metrics)."""
        began = time.monotonic()
        route: list[str] = []
        try:
            self._dispatch(h, method, route)
        finally:
            self.stats.observe(method, route[0] if route else "unmatched", getattr(h, "tw_status", 0),
                               time.monotonic() - began)

    def _dispatch(self, h: _Handler, method: str, route_out: list[str]) -> None:
        path = h.path.split("?", 1)[0].rstrip("/")
        try:
            if path in self._plain:
                route_out.append(path)
                self._plain[path](h, method)
                return
            if self.auth.required(method, path) and not self.auth.allows(h.headers.get("Authorization")):
                h.close_connection = True  # do not read (or wait for) the body of a refused request
                log.warning("http: refused %s %s from %s: %s API token", method, path, h.client_address[0],
                            "wrong" if h.headers.get("Authorization") else "no")
                raise Unauthorized(f"{method} {path} needs an API token: send 'Authorization: Bearer TOKEN' "
                                   "(cdc cli: $TIDEWATER_AUTH_TOKEN or --token-file)")
            body = self._body(h)
            if path == "/metrics" and method == "GET":
                route_out.append("/metrics")
                self._send(h, 200, self._metrics(), "text/plain; version=0.0.4")
                return
            allowed: list[str] = []
            for route, pattern in self._compiled:
                match = pattern.fullmatch(path)
                if not match:
                    continue
                if route.method != method:
                    allowed.append(route.method)
                    continue
                route_out.append(route.template)
                args = [_path_param(name, raw) for name, raw in zip(_PARAM_RE.findall(route.template),
                                                                     match.groups(), strict=True)]
                req = ApiRequest(method, path, body, {k.lower(): v for k, v in h.headers.items()})
                self._send_json(h, route.status, route.handler(req, *args))
                return
            if allowed:
                raise MethodNotAllowed(f"{method} is not allowed on {path}; allowed: {', '.join(sorted(allowed))}")
            raise RouteNotFound(f"no route {method} {path}")
        except TidewaterError as exc:
            if exc.http_status in (401, 408, 411, 413):
                h.close_connection = True
            self._send_json(h, exc.http_status, {"error_code": exc.code, "error_msg": scrub(exc.message)},
                            {"WWW-Authenticate": 'Bearer realm="tidewater"'} if exc.http_status == 401 else None)
        except Exception as exc:  # noqa: BLE001 - report, never kill the server thread silently
            log.exception("http %s %s failed", method, path)
            self._send_json(h, 500, {"error_code": "CDC:ErrInternal",
                                     "error_msg": scrub(f"{type(exc).__name__}: {exc}")})

    def _body(self, h: _Handler) -> Any:
        """The JSON body: at most ``max_body`` bytes (413 before reading more), within the request deadline
        (408), with a valid Content-Length (no chunked bodies: 411)."""
        h.close_connection = True  # until the whole body is read: what is left unread must not become a request
        if h.headers.get("Transfer-Encoding"):
            raise LengthRequired("chunked request bodies are not accepted: send Content-Length")
        raw_length = (h.headers.get("Content-Length") or "0").strip()
        if not raw_length.isdigit() or len(raw_length) > 18:
            raise InvalidArgument(f"invalid Content-Length {raw_length[:40]!r}")
        length = int(raw_length)
        if length > self.limits.max_body:
            raise BodyTooLarge(f"request body of {length} bytes is over the limit of {self.limits.max_body} bytes")
        raw = b""
        if length:
            try:
                raw = h.rfile.read(length)
            except (TimeoutError, OSError) as exc:
                raise RequestTimeout(f"the request body did not arrive within {self.limits.request_timeout:g}s") from exc
            if len(raw) < length:
                if h.expired():
                    raise RequestTimeout(f"the request body did not arrive within {self.limits.request_timeout:g}s")
                raise InvalidArgument(f"request body shorter than its Content-Length ({len(raw)} < {length})")
        h.close_connection = not h.keep_alive
        try:
            return json.loads(raw) if raw.strip() else {}
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            raise InvalidArgument(f"request body is not JSON: {str(exc)[:200]}") from exc

    @staticmethod
    def _send_json(h: BaseHTTPRequestHandler, code: int, obj: Any, headers: dict[str, str] | None = None) -> None:
        ApiServer._send(h, code, json.dumps(obj, indent=2, default=str).encode(), "application/json", headers)

    @staticmethod
    def _send(h: BaseHTTPRequestHandler, code: int, data: bytes, ctype: str,
              headers: dict[str, str] | None = None) -> None:
        h.tw_status = code  # type: ignore[attr-defined]  # read by _handle for metrics
        h.send_response(code)
        h.send_header("Content-Type", ctype)
        h.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            h.send_header(name, value)
        if h.close_connection:
            h.send_header("Connection", "close")
        h.end_headers()
        h.wfile.write(data)


def _path_param(name: str, raw: str) -> str:
    """A path segment, percent-decoded and checked (400 for an id that cannot exist, never a 500)."""
    value = urllib.parse.unquote(raw)
    check = _PARAM_CHECKS.get(name)
    if check is not None and not check[0].fullmatch(value):
        raise InvalidArgument(f"invalid {name.replace('_', ' ')} {value[:80]!r}: expected {check[1]}")
    if name == "changefeed_id" and len(value) > 64:
        raise InvalidArgument(f"invalid changefeed id {value[:80]!r}: at most 64 characters")
    return value


class _Handler(BaseHTTPRequestHandler):
    """One connection. Requests are read by our own loop (not the standard library's), so that every
    method reaches the router (405/404 in JSON), every refusal is JSON, and the request deadline holds."""

    protocol_version = "HTTP/1.1"
    # TCP_NODELAY: an answer goes out as two writes (the headers, then the body); with Nagle's algorithm the body
    # waited for the client's delayed ACK of the headers, ~40 ms on every request of a kept-alive connection
    disable_nagle_algorithm = True
    api: ApiServer  # set by _handler_class
    keep_alive = False  # what the request's headers asked for (parse_request's decision)

    def setup(self) -> None:
        self.timeout = self.api.limits.idle_timeout  # per read; StreamRequestHandler applies it
        super().setup()
        self._tls_ok = True
        if isinstance(self.connection, ssl.SSLSocket):
            self.api._deadlines.arm(id(self), self.connection, self.api.limits.request_timeout)
            try:
                self.connection.do_handshake()
            except (OSError, ssl.SSLError) as exc:
                log.debug("http: TLS handshake with %s failed: %s", self.client_address, exc)
                self._tls_ok = False
            finally:
                self.api._deadlines.disarm(id(self))

    def handle(self) -> None:
        if self._tls_ok:
            super().handle()

    def finish(self) -> None:
        self.api._deadlines.forget(id(self))
        try:
            super().finish()
        except OSError:
            pass

    def expired(self) -> bool:
        return self.api._deadlines.expired(id(self))

    def handle_one_request(self) -> None:
        api = self.api
        self.requestline, self.request_version, self.command = "", self.default_request_version, ""
        api._deadlines.arm(id(self), self.connection, api.limits.request_timeout)
        try:
            try:
                line = self.rfile.readline(_MAX_LINE + 1)
                if not line:
                    self.close_connection = True
                    if self.expired():
                        self.send_error(408, "no request within the request timeout")
                    return
                if len(line) > _MAX_LINE:
                    self.send_error(414, f"request line longer than {_MAX_LINE} bytes")
                    return
                self.raw_requestline = line
                if not self.parse_request():  # answers 400/431/505 itself (send_error)
                    return
                if self.expired():
                    self.send_error(408, f"request headers not received within {api.limits.request_timeout:g}s")
                    return
            except (TimeoutError, ConnectionError, ssl.SSLError, OSError):
                self.close_connection = True
                self._try_error(408, f"request not received within {api.limits.idle_timeout:g}s")
                return
            self.close_connection = self.close_connection or self.command not in ("GET", "POST", "PUT", "DELETE")
            self.keep_alive = not self.close_connection
            api._handle(self, self.command)
            self.wfile.flush()
        except (ConnectionError, TimeoutError, ssl.SSLError, OSError):
            self.close_connection = True
        finally:
            api._deadlines.disarm(id(self))

    def handle_expect_100(self) -> bool:
        length = (self.headers.get("Content-Length") or "0").strip()
        if length.isdigit() and int(length) > self.api.limits.max_body:
            self.send_error(413, f"request body of {length} bytes is over the limit of {self.api.limits.max_body} "
                                 "bytes")
            return False
        return super().handle_expect_100()

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """Every refusal of the standard library's parser, in the JSON error shape."""
        self.close_connection = True
        if self.request_version == "HTTP/0.9":  # never served: answer with a status line and headers
            self.request_version = "HTTP/1.1"
        text = message or HTTPStatus(code).phrase
        ApiServer._send_json(self, code, {"error_code": _HTTP_CODES.get(code, "CDC:ErrInvalidArgument"),
                                          "error_msg": text})

    def _try_error(self, code: int, message: str) -> None:
        try:
            self.send_error(code, message)
            self.wfile.flush()
        except OSError:
            pass

    def log_message(self, fmt: str, *args: Any) -> None:
        log.debug("http %s", scrub(fmt % args))


def _handler_class(api: ApiServer) -> type[_Handler]:
    return type("Handler", (_Handler,), {"api": api})


class _HttpServer(ThreadingHTTPServer):
    """Threads per connection, at most ``max_connections`` at once (more are closed unanswered); TLS
    sockets are wrapped without a handshake here: the handshake runs in the connection's own thread,
    under its deadline, so a client that never finishes it cannot block ``accept``."""

    daemon_threads = True
    block_on_close = False

    def __init__(self, address: tuple[str, int], handler: type[_Handler], limits: ApiLimits,
                 tls: ssl.SSLContext | None) -> None:
        self._slots = threading.BoundedSemaphore(limits.max_connections)
        self._max_connections = limits.max_connections
        self._tls = tls
        self._refused_logged = 0.0
        super().__init__(address, handler)

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, addr = super().get_request()
        if self._tls is not None:
            sock = self._tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        return sock, addr

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            now = time.monotonic()
            if now - self._refused_logged > 10:
                self._refused_logged = now
                log.warning("http: more than %d connections at once; closing new ones", self._max_connections)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except Exception:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


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


def _check_ts(name: str, value: Any, hint: str = "") -> None:
    """A Ts in a body: absent/null, or an integer in 0 .. 2**64-1 (a float, a string or a bool is refused)."""
    if value is None:
        return
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 1 << 64:
        raise InvalidArgument(f"{name} must be an integer between 0 and 2^64-1{hint}")


def _no_unknown(body: dict[str, Any], known: set[str]) -> None:
    unknown = sorted(set(body) - known)
    if unknown:
        raise InvalidArgument(f"unknown field(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
