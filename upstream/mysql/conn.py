"""Connections to an upstream MySQL/MariaDB server, and the one place where PyMySQL errors become ours.

``connect()`` opens an ordinary autocommit connection (catalog queries, readiness checks, positions) pinned to
``time_zone = '+00:00'`` and ``utf8mb4``; the binlog stream (:mod:`upstream.mysql.source`) takes
:func:`stream_settings` for its own connection.

Error mapping (the message names ``host:port/db``, never the password):

- unreachable host, refused connection, timeout, lost connection, server shutting down, too many connections
  -> :class:`cdc.errors.UpstreamUnavailable` (retryable);
- access denied, unknown database -> :class:`cdc.errors.InvalidArgument` (fix the URI or the grants);
- anything else -> :class:`cdc.errors.UpstreamError`.
"""

from __future__ import annotations

import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pymysql
import pymysql.connections

from cdc.errors import InvalidArgument, TidewaterError, UpstreamError, UpstreamUnavailable
from cdc.uri import ParsedURI, parse_upstream_uri

DEFAULT_PORT = 3306

# client error codes (CR_*) and server error codes (ER_*) that mean "try again later"
_UNAVAILABLE = frozenset({
    2002, 2003, 2005, 2006, 2013, 2055,  # can't connect, unknown host, gone away, lost connection
    1040, 1053, 1077, 1152, 1158, 1159, 1160, 1161, 1205, 1213,  # too many conns, shutdown, net errors, lock waits
})
_ACCESS = frozenset({1044, 1045, 1049, 1698})  # access denied (db, user), unknown database


_preferred_lock = threading.Lock()
_preferred: list[ssl.SSLContext] = []  # the one PREFERRED-mode context, made by the first connection


class Connection(pymysql.connections.Connection):  # type: ignore[misc]
    """PyMySQL's connection, with the TLS context of its default PREFERRED mode (no ``ssl`` argument: try TLS, check
    no certificate) made once per process instead of once per connection. PyMySQL builds that context with
    ``ssl.create_default_context()``, which loads the system's CA certificates: ~0.1 s of CPU per connection, three
    per span start (the span's connection and the binlog stream's two). The context is PyMySQL's own, made by PyMySQL
    with the same argument; it is only reused (PyMySQL never changes a context after making it, and an
    ``SSLContext`` may wrap sockets of several threads). Any other ``ssl`` argument is PyMySQL's as before."""

    def _create_ssl_ctx(self, sslp: Any) -> ssl.SSLContext:
        if type(sslp) is not dict or sslp:
            return super()._create_ssl_ctx(sslp)  # type: ignore[no-any-return]
        with _preferred_lock:
            if not _preferred:
                _preferred.append(super()._create_ssl_ctx({}))
            return _preferred[0]


def describe_uri(uri: ParsedURI) -> str:
    """``host:port/db`` of a parsed upstream URI, for messages."""
    return f"{uri.host or '127.0.0.1'}:{uri.port or DEFAULT_PORT}/{uri.path}"


def connect_kwargs(uri: ParsedURI, timeout: float) -> dict[str, Any]:
    """PyMySQL's keyword arguments for ``uri`` (no database selected: every query names its schema)."""
    return {
        "host": uri.host or "127.0.0.1", "port": uri.port or DEFAULT_PORT, "user": uri.user or "root",
        "password": uri.password or "", "connect_timeout": timeout, "charset": "utf8mb4", "autocommit": True,
    }


def stream_settings(uri_text: str, timeout: float = 5.0) -> dict[str, Any]:
    """The connection settings of a binlog stream (``pymysqlreplication``'s ``connection_settings``)."""
    kw = connect_kwargs(parse_upstream_uri(uri_text), timeout)
    return {"host": kw["host"], "port": kw["port"], "user": kw["user"], "password": kw["password"],
            "connect_timeout": timeout, "charset": "utf8mb4"}


def classify_error(exc: BaseException, where: str, doing: str) -> TidewaterError:
    """Our error for a PyMySQL (or socket) error raised while ``doing`` against ``where``."""
    code = exc.args[0] if isinstance(exc, pymysql.MySQLError) and exc.args and isinstance(exc.args[0], int) else 0
    text = f"MySQL {where}: {doing}: {exc}"
    if isinstance(exc, OSError | EOFError) or code in _UNAVAILABLE or isinstance(exc, pymysql.err.InterfaceError):
        return UpstreamUnavailable(text)
    if code in _ACCESS:
        return InvalidArgument(text)
    return UpstreamError(text)


@contextmanager
def mysql_errors(where: str, doing: str) -> Iterator[None]:
    """Re-raise PyMySQL and socket errors inside the block as :class:`cdc.errors.TidewaterError`."""
    try:
        yield
    except TidewaterError:
        raise
    except (pymysql.MySQLError, OSError, EOFError) as exc:
        raise classify_error(exc, where, doing) from exc


def connect(uri_text: str, *, timeout: float = 5.0) -> Any:
    """An autocommit PyMySQL connection to the URI's server, session time zone UTC (TIMESTAMP values as UTC)."""
    uri = parse_upstream_uri(uri_text)
    where = describe_uri(uri)
    with mysql_errors(where, "connecting"):
        conn = Connection(**connect_kwargs(uri, timeout))
    try:
        with mysql_errors(where, "setting the session"), conn.cursor() as cur:
            cur.execute("SET time_zone = '+00:00'")
    except BaseException:
        conn.close()
        raise
    return conn


def probe(uri_text: str, timeout: float = 2.0) -> None:
    """Connect, ``SELECT 1``, close: ``UpstreamUnavailable`` (or another TidewaterError) while it is away."""
    conn = connect(uri_text, timeout=timeout)
    try:
        with mysql_errors(describe_uri(parse_upstream_uri(uri_text)), "probe"), conn.cursor() as cur:
            cur.execute("SELECT 1")
    finally:
        conn.close()
