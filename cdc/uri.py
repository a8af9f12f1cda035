"""Parsing and validation of upstream and sink URIs (no I/O here)."""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, quote, unquote, urlsplit

from cdc.errors import InvalidURI, SecretKeyMissing

SINK_URI_FORMS: dict[str, str] = {
    "mysql": "mysql://user@host:port/db",
    "mariadb": "mariadb://user@host:port/db",
    "postgresql": "postgresql://user@host:port/db",
    "postgres": "postgres://user@host:port/db",
    "sqlite": "sqlite:///path",
    "blackhole": "blackhole://",
    "kafka": "kafka://host:port/topic?protocol=canal-json|debezium|open-protocol",
    "file": "file:///dir?protocol=csv|canal-json|parquet",
}
"""Every sink scheme with the form of its URI (the CLI's help lists them; ``sinks.factory.SINKS`` maps the same
schemes to their classes: tests/unit/sinks/test_sink_factory.py keeps the two equal)."""
SINK_SCHEMES = tuple(SINK_URI_FORMS)
UPSTREAM_SCHEMES = ("postgresql", "postgres", "mysql", "mariadb")


@dataclass(frozen=True)
class ParsedURI:
    raw: str
    scheme: str
    user: str | None
    password: str | None
    host: str | None
    port: int | None
    path: str  # database name for SQL URIs (without leading '/'), file path for sqlite, topic for kafka
    params: dict[str, str] = field(default_factory=dict)
    # every (host, port) of a URI that may name several (kafka://h1:9092,h2:9092/topic); host/port are the first
    hosts: tuple[tuple[str, int | None], ...] = ()

    def redacted(self) -> str:
        """The URI with its password replaced, for logs and API output."""
        return redact(self.raw)


# Query-string / keyword-DSN parameter names whose values are secrets (libpq: password, sslpassword;
# anything spelled like a password, secret or token).
_SECRET_NAME = r"[A-Za-z0-9_.-]*(?:password|passwd|pwd|secret|token)[A-Za-z0-9_.-]*"
_SECRET_PARAM = re.compile(rf"([?&;]{_SECRET_NAME}=)[^&#]*", re.IGNORECASE)
# libpq keyword/value DSN (``host=h user=u password='p w'``): quoted or bare values
_SECRET_KEYWORD = re.compile(rf"(?<![A-Za-z0-9_.?&;-])({_SECRET_NAME}\s*=\s*)('(?:[^'\\]|\\.)*'?|[^\s'&]+)",
                             re.IGNORECASE)
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
_MASK = "***"
_ENCRYPTED_PREFIX = "tidewater-enc:"  # a URI sealed for etcd (cdc.crypto); ciphertext, shown as a marker only
_KNOWN_MAX = 1024
_known: dict[str, None] = {}  # passwords seen by parse_uri, newest last (see scrub)
_known_lock = threading.Lock()


def _mask_params(text: str) -> str:
    return _SECRET_PARAM.sub(lambda m: m.group(1) + _MASK, text)


def redact(raw: str) -> str:
    """``raw`` (one URI or a libpq keyword DSN) with every password hidden: the userinfo password whatever
    characters it holds, and secret parameters (``password=``, ``sslpassword=``...) in the query string or
    as keywords. The password is everything between the first ``:`` after ``scheme://`` and the *last*
    ``@`` (a password may hold ``@``, ``/``, ``?``, ``:`` unencoded): when in doubt more is hidden, never
    less. Never raises; for logs, API answers and error messages."""
    if not raw:
        return raw
    if raw.startswith(_ENCRYPTED_PREFIX):
        return "<encrypted>"
    m = _SCHEME.match(raw)
    if m:
        rest = raw[m.end():]
        at = rest.rfind("@")
        if at >= 0 and ":" in rest[:at]:
            user = rest[:rest.index(":")]
            return f"{raw[:m.end()]}{user}:{_MASK}{_mask_params(rest[at:])}"
        return raw[:m.end()] + _mask_params(rest)
    return _SECRET_KEYWORD.sub(lambda k: k.group(1) + _MASK, raw)


def remember_secret(secret: str | None) -> None:
    """Note a password so that :func:`scrub` hides it wherever it appears (driver messages, tracebacks).
    Passwords of fewer than 4 characters are not noted (they would mask ordinary words)."""
    if not secret or len(secret) < 4:
        return
    with _known_lock:
        _known.pop(secret, None)
        _known[secret] = None
        while len(_known) > _KNOWN_MAX:
            _known.pop(next(iter(_known)))


_URI_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]*")


def scrub(text: str) -> str:
    """Free text (a log line, an error message) with every secret hidden: each URI in it redacted, secret
    keyword parameters masked, and every password noted by :func:`remember_secret` (also percent-encoded)
    replaced. Never raises."""
    if not text:
        return text
    with _known_lock:
        known = sorted(_known, key=len, reverse=True)
    for secret in known:
        if secret in text:
            text = text.replace(secret, _MASK)
        encoded = quote(secret, safe="")
        if encoded != secret and encoded in text:
            text = text.replace(encoded, _MASK)
    text = _URI_IN_TEXT.sub(lambda m: redact(m.group(0)), text)
    return _SECRET_KEYWORD.sub(lambda k: k.group(1) + _MASK, text)


def refuse_sealed(raw: str, what: str) -> None:
    """:class:`SecretKeyMissing` for a URI still sealed (read from etcd without the key that opens it)."""
    if raw.startswith(_ENCRYPTED_PREFIX):
        raise SecretKeyMissing(f"the {what} URI is stored encrypted with a key this capture does not hold: give "
                               "every capture the same --secret-key-file (docs/operations.md, \"Credentials in "
                               "etcd\")")


_USERINFO_ANYWHERE = re.compile(r"\b([a-zA-Z][a-zA-Z0-9+.-]*://[^:/@?#\s]*):[^/?#\s]*@")


def redact_text(text: str) -> str:
    """``text`` (a message) with the password of every ``scheme://user:password@`` in it replaced."""
    return _USERINFO_ANYWHERE.sub(r"\1:***@", text)


def parse_uri(raw: str, *, allowed: tuple[str, ...], what: str) -> ParsedURI:
    refuse_sealed(raw, what)
    if not raw or "://" not in raw:
        raise InvalidURI(f"{what} URI {redact(raw or '')!r} is malformed: expected scheme://...")
    if raw.split("://", 1)[0].lower() == "kafka" and "kafka" in allowed:
        return _parse_multi_host(raw, "kafka", what)
    try:
        parts = urlsplit(raw)
        port = parts.port
    except ValueError as exc:
        raise InvalidURI(f"{what} URI {redact(raw)!r} is malformed: {exc}") from exc
    scheme = parts.scheme.lower()
    if scheme not in allowed:
        raise InvalidURI(f"{what} URI scheme {scheme!r} is not supported (use one of: {', '.join(allowed)})")
    if scheme == "sqlite":
        # sqlite:///relative/path or sqlite:////absolute/path, like SQLAlchemy
        path = raw.split("://", 1)[1]
        if not path.startswith("/") or len(path) < 2:
            raise InvalidURI(f"{what} URI {redact(raw)!r}: use sqlite:///path/to/file.db")
        path = path[1:].split("?", 1)[0]
        return ParsedURI(raw, scheme, None, None, None, None, path, dict(parse_qsl(parts.query)))
    if scheme == "blackhole":
        return ParsedURI(raw, scheme, None, None, None, None, "", dict(parse_qsl(parts.query)))
    if scheme == "file":
        # file:///absolute/dir (the storage sink; a host is not supported, local files only)
        path = unquote(parts.path)
        if parts.netloc not in ("", "localhost") or not path.startswith("/") or path == "/":
            raise InvalidURI(f"{what} URI {redact(raw)!r}: use file:///absolute/path/to/dir (a local directory)")
        return ParsedURI(raw, scheme, None, None, None, None, path.rstrip("/") or "/", dict(parse_qsl(parts.query)))
    if not parts.hostname:
        raise InvalidURI(f"{what} URI {redact(raw)!r} has no host")
    path = unquote(parts.path.lstrip("/"))
    password = unquote(parts.password) if parts.password is not None else None
    params = dict(parse_qsl(parts.query))
    remember_secret(password)
    for name, value in params.items():
        if _SECRET_PARAM.match(f"?{name}="):
            remember_secret(value)
    return ParsedURI(
        raw=raw,
        scheme=scheme,
        user=unquote(parts.username) if parts.username else None,
        password=password,
        host=parts.hostname,
        port=port,
        path=path,
        params=params,
    )


_HOST_PORT = re.compile(r"(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[^:\[\]]+))(?::(?P<port>[0-9]*))?")


def _parse_multi_host(raw: str, scheme: str, what: str) -> ParsedURI:
    """``scheme://host[:port][,host[:port]...][/path][?query]``: urlsplit reads one host only (its port would be
    ``9092,h2:9092``). No user information: credentials go in query parameters (``sasl-password``, masked)."""
    rest = raw.split("://", 1)[1]
    if "@" in rest.split("?", 1)[0]:
        raise InvalidURI(f"{what} URI {redact(raw)!r}: a {scheme} URI takes no user or password before the host; "
                         "use the sasl-user, sasl-password and sasl-mechanism parameters")
    cut = min((i for i in (rest.find("/"), rest.find("?"), rest.find("#")) if i >= 0), default=len(rest))
    hosts: list[tuple[str, int | None]] = []
    for item in rest[:cut].split(","):
        m = _HOST_PORT.fullmatch(item.strip())
        if m is None:
            raise InvalidURI(f"{what} URI {redact(raw)!r} is malformed: {item.strip()!r} is not host[:port] "
                             f"(several brokers: {scheme}://h1:9092,h2:9092/topic)")
        port_text = m.group("port")
        port = int(port_text) if port_text else None
        if port_text == "" or (port is not None and not 0 < port < 65536):
            raise InvalidURI(f"{what} URI {redact(raw)!r} is malformed: the port of {item.strip()!r} must be 1-65535")
        hosts.append(((m.group("v6") or m.group("host")).lower(), port))
    parts = urlsplit(f"{scheme}://x{rest[cut:]}")
    params = dict(parse_qsl(parts.query))
    for name, value in params.items():
        if _SECRET_PARAM.match(f"?{name}="):
            remember_secret(value)
    return ParsedURI(raw=raw, scheme=scheme, user=None, password=None, host=hosts[0][0], port=hosts[0][1],
                     path=unquote(parts.path.lstrip("/")), params=params, hosts=tuple(hosts))


def parse_sink_uri(raw: str) -> ParsedURI:
    uri = parse_uri(raw, allowed=SINK_SCHEMES, what="sink")
    if uri.scheme in ("mysql", "mariadb") and not uri.path:
        raise InvalidURI(f"sink URI {uri.redacted()!r} names no database: use mysql://user@host:port/dbname")
    return uri


def parse_upstream_uri(raw: str) -> ParsedURI:
    uri = parse_uri(raw, allowed=UPSTREAM_SCHEMES, what="upstream")
    if not uri.path:
        raise InvalidURI(f"upstream URI {uri.redacted()!r} names no database: postgresql://user@host:port/dbname")
    return uri
