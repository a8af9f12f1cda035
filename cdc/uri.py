"""Parsing and validation of upstream and sink URIs (no I/O here)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, unquote, urlsplit

from cdc.errors import InvalidURI

SINK_SCHEMES = ("mysql", "mariadb", "postgresql", "postgres", "sqlite", "blackhole")
UPSTREAM_SCHEMES = ("postgresql", "postgres")


@dataclass(frozen=True)
class ParsedURI:
    raw: str
    scheme: str
    user: str | None
    password: str | None
    host: str | None
    port: int | None
    path: str  # database name for SQL URIs (without leading '/'), file path for sqlite
    params: dict[str, str] = field(default_factory=dict)

    def redacted(self) -> str:
        """The URI with its password replaced, for logs and API output."""
        return redact(self.raw)


_USERINFO = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*://[^:/@?#]*):[^@/?#]*@")


def redact(raw: str) -> str:
    """Replace the password of ``scheme://user:password@host...`` (as written, percent-encoded or not)."""
    return _USERINFO.sub(r"\1:***@", raw, count=1)


_USERINFO_ANYWHERE = re.compile(r"\b([a-zA-Z][a-zA-Z0-9+.-]*://[^:/@?#\s]*):[^/?#\s]*@")


def redact_text(text: str) -> str:
    """``text`` (a message) with the password of every ``scheme://user:password@`` in it replaced."""
    return _USERINFO_ANYWHERE.sub(r"\1:***@", text)


def parse_uri(raw: str, *, allowed: tuple[str, ...], what: str) -> ParsedURI:
    if not raw or "://" not in raw:
        raise InvalidURI(f"{what} URI {redact(raw or '')!r} is malformed: expected scheme://...")
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
    if not parts.hostname:
        raise InvalidURI(f"{what} URI {redact(raw)!r} has no host")
    path = unquote(parts.path.lstrip("/"))
    return ParsedURI(
        raw=raw,
        scheme=scheme,
        user=unquote(parts.username) if parts.username else None,
        password=unquote(parts.password) if parts.password is not None else None,
        host=parts.hostname,
        port=port,
        path=path,
        params=dict(parse_qsl(parts.query)),
    )


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
