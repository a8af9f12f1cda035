"""What makes the HTTP API safe to expose: request limits, authentication and TLS (docs/api.md, "Security").

* :class:`ApiLimits`: the largest body (413 beyond it, never read), the time a client has to send a whole
  request (headers and body; 408 after it), the per-read idle timeout and the number of connections served
  at once (more are closed at once). :class:`Deadlines` enforces the request deadline with one reaper thread:
  it shuts the read side of a late connection down, so the thread blocked reading it wakes up and answers 408.
  So no client can pin a thread, and no request holds more than ``max_body`` bytes of memory.
* :class:`AuthPolicy`: bearer tokens (or HTTP basic auth with any user name and a token as the password),
  read from a file or the environment, never from the command line (``ps`` shows it). Every mutating route
  (any method but GET) needs one; GET routes need one when ``protect_reads``; ``open_paths`` (health probes)
  never do.
* :func:`server_tls_context` / :func:`client_tls_context`: TLS for the server, the CLI and owner forwarding;
  mutual TLS when the server requires client certificates signed by its CA.

Thread-safety: :class:`Deadlines` is thread-safe; the others are immutable.
"""

from __future__ import annotations

import base64
import hmac
import ipaddress
import logging
import os
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from cdc.config import ServerConfig
from cdc.errors import InvalidConfig

log = logging.getLogger(__name__)

TOKEN_ENV = "TIDEWATER_AUTH_TOKEN"  # one token (or several, comma-separated)
TOKEN_FILE_ENV = "TIDEWATER_AUTH_TOKEN_FILE"


@dataclass(frozen=True)
class ApiLimits:
    max_body: int = 1 << 20  # bytes; a create/update body is a few KB
    request_timeout: float = 10.0  # seconds to send the request line, headers and body
    idle_timeout: float = 10.0  # seconds one read may wait (also: an idle keep-alive connection is closed)
    max_connections: int = 64  # served at once; more are closed unanswered


# Health probes (Kubernetes, systemd, load balancers) never need a token. The probe routes a capture may
# serve; a probe path added to the API must be listed here.
PROBE_PATHS = frozenset({"/api/v2/health", "/api/v2/health/live", "/api/v2/health/ready", "/livez", "/readyz",
                         "/healthz", "/liveness", "/readiness"})


@dataclass(frozen=True)
class AuthPolicy:
    tokens: tuple[str, ...] = ()
    protect_reads: bool = False
    open_paths: frozenset[str] = PROBE_PATHS

    @property
    def enabled(self) -> bool:
        return bool(self.tokens)

    def required(self, method: str, path: str) -> bool:
        if not self.tokens or path in self.open_paths:
            return False
        return method != "GET" or self.protect_reads

    def allows(self, authorization: str | None) -> bool:
        """Whether the ``Authorization`` header carries one of the tokens (compared in constant time)."""
        if not authorization:
            return False
        scheme, _, value = authorization.strip().partition(" ")
        value = value.strip()
        if scheme.lower() == "basic":
            try:
                value = base64.b64decode(value, validate=True).decode().partition(":")[2]
            except (ValueError, UnicodeDecodeError):
                return False
        elif scheme.lower() != "bearer":
            return False
        given = value.encode()
        return any(hmac.compare_digest(given, t.encode()) for t in self.tokens)


def load_tokens(token_file: str = "", environ: dict[str, str] | None = None) -> tuple[str, ...]:
    """Tokens from ``token_file`` (one per line; ``#`` comments; several lines = rotation: every listed
    token is accepted), else from ``$TIDEWATER_AUTH_TOKEN_FILE``, else ``$TIDEWATER_AUTH_TOKEN``
    (comma-separated). Tokens shorter than 16 characters are refused."""
    env = os.environ if environ is None else environ
    path = token_file or env.get(TOKEN_FILE_ENV, "")
    if path:
        try:
            lines = Path(path).read_text().splitlines()
        except OSError as exc:
            raise InvalidConfig(f"cannot read the auth token file {path}: {exc.strerror or exc}") from exc
        tokens = tuple(t.strip() for t in lines if t.strip() and not t.strip().startswith("#"))
        if not tokens:
            raise InvalidConfig(f"the auth token file {path} holds no token")
    else:
        tokens = tuple(t.strip() for t in env.get(TOKEN_ENV, "").split(",") if t.strip())
    short = [t for t in tokens if len(t) < 16]
    if short:
        raise InvalidConfig("auth tokens must be at least 16 characters (e.g. `openssl rand -hex 32`)")
    return tokens


def server_tls_context(cert: str, key: str, ca: str = "", require_client_cert: bool = False) -> ssl.SSLContext:
    """TLS for the API server: ``cert``/``key`` (PEM); with ``require_client_cert`` only clients with a
    certificate signed by ``ca`` are served (mutual TLS)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(cert, key)
        if ca:
            ctx.load_verify_locations(ca)
    except (OSError, ssl.SSLError) as exc:
        raise InvalidConfig(f"cannot load the TLS certificate/key/CA ({cert}, {key}, {ca or '-'}): {exc}") from exc
    if require_client_cert:
        if not ca:
            raise InvalidConfig("mutual TLS (tls-client-auth) needs a CA (--ca) to check client certificates")
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def client_tls_context(ca: str = "", cert: str = "", key: str = "") -> ssl.SSLContext:
    """TLS for clients of the API (the CLI, owner forwarding): the server is verified against ``ca`` (else
    the system store); ``cert``/``key`` are presented for mutual TLS."""
    ctx = ssl.create_default_context(cafile=ca or None)
    try:
        if cert:
            ctx.load_cert_chain(cert, key or None)
    except (OSError, ssl.SSLError) as exc:
        raise InvalidConfig(f"cannot load the client certificate {cert}: {exc}") from exc
    return ctx


def is_loopback(host: str) -> bool:
    """Whether ``host`` (of ``--addr``) reaches this machine only; empty means 127.0.0.1 to the API server."""
    if host in ("localhost", ""):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class Deadlines:
    """Request deadlines of open connections, enforced by one daemon thread. ``arm(key, sock, seconds)``
    before reading a request, ``disarm(key)`` once it is read; a connection still armed at its deadline has
    its read side shut down (its reader gets EOF) and ``expired(key)`` becomes true."""

    def __init__(self, tick: float = 0.25) -> None:
        self._tick = tick
        self._lock = threading.Condition()
        self._armed: dict[int, tuple[float, socket.socket]] = {}
        self._expired: set[int] = set()
        self._stopped = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="http-deadlines", daemon=True)
                self._thread.start()

    def arm(self, key: int, sock: socket.socket, seconds: float) -> None:
        self.start()
        with self._lock:
            self._expired.discard(key)
            self._armed[key] = (time.monotonic() + seconds, sock)

    def disarm(self, key: int) -> None:
        with self._lock:
            self._armed.pop(key, None)

    def expired(self, key: int) -> bool:
        with self._lock:
            return key in self._expired

    def forget(self, key: int) -> None:
        with self._lock:
            self._armed.pop(key, None)
            self._expired.discard(key)

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            self._lock.notify_all()

    def _run(self) -> None:
        while True:
            with self._lock:
                if self._stopped:
                    return
                self._lock.wait(self._tick)
                now = time.monotonic()
                late = [(k, s) for k, (due, s) in self._armed.items() if due <= now]
                for k, _ in late:
                    del self._armed[k]
                    self._expired.add(k)
            for _, sock in late:
                try:
                    # the plain socket's shutdown, also for a TLS socket (whose own shutdown would unwrap it)
                    socket.socket.shutdown(sock, socket.SHUT_RD)
                except OSError:
                    pass


@dataclass(frozen=True)
class ApiSecurity:
    """Everything :class:`capture.api.ApiServer` needs to be safe, built from the server config."""

    limits: ApiLimits
    auth: AuthPolicy
    tls: ssl.SSLContext | None
    forward_tls: ssl.SSLContext | None  # owner forwarding to another capture

    @classmethod
    def from_config(cls, config: ServerConfig, environ: dict[str, str] | None = None) -> ApiSecurity:
        limits = ApiLimits(max_body=config.max_body_bytes, request_timeout=config.request_timeout,
                           idle_timeout=config.request_timeout, max_connections=config.max_connections)
        auth = AuthPolicy(tokens=load_tokens(config.auth_token_file, environ),
                          protect_reads=config.auth_read == "protected")
        tls = forward = None
        if config.tls_cert:
            tls = server_tls_context(config.tls_cert, config.tls_key, config.tls_ca, config.tls_client_auth)
            forward = client_tls_context(config.tls_ca, config.tls_cert, config.tls_key)
        return cls(limits, auth, tls, forward)

    @staticmethod
    def loose_files(config: ServerConfig) -> list[str]:
        """Secret files of ``config`` that other users of the machine can read (they should be 0600)."""
        out = []
        for what, path in (("auth token file", config.auth_token_file), ("secret key file", config.secret_key_file),
                           ("TLS key", config.tls_key)):
            try:
                if path and os.stat(path).st_mode & 0o077:
                    out.append(f"the {what} {path} is readable by other users: chmod 600 it")
            except OSError:
                pass  # a missing file is reported where it is read
        return out

    def exposure_warning(self, addr: str) -> str | None:
        """A warning when the API listens beyond loopback without TLS or without authentication."""
        host = addr.rpartition(":")[0]
        if is_loopback(host):
            return None
        missing = [what for what, ok in (("TLS", self.tls is not None), ("authentication", self.auth.enabled))
                   if not ok]
        if not missing:
            return None
        return (f"the HTTP API listens on {addr}, reachable from other hosts, without {' and '.join(missing)}: "
                "anyone who can reach it can pause, change or remove changefeeds (and read tokens on the wire). Give "
                "--tls-cert/--tls-key and an auth token file, or bind 127.0.0.1 (docs/api.md, \"Security\")")
