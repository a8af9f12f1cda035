"""Connections to the upstream PostgreSQL, and the one place where psycopg2 errors become ours.

``connect()`` opens either an ordinary autocommit connection (catalog queries, slot and publication
administration) or a ``LogicalReplicationConnection`` (the puller's stream). Every session is pinned
to the output formats the decoder relies on: the walsender renders pgoutput's text-format values with
its own session settings, so ``TimeZone=UTC``, ``DateStyle=ISO``, ``IntervalStyle=postgres``,
``extra_float_digits=3`` and ``bytea_output=hex`` are forced (after any ``options`` from the URI).

Error mapping at connect time (the message always names ``host:port/db``, never the password):

- unreachable host, refused connection, timeout, server starting/shutting down, too many clients
  -> :class:`cdc.errors.UpstreamUnavailable` (retryable);
- authentication failure, unknown role or database, missing pg_hba entry, SSL mismatch
  -> :class:`cdc.errors.InvalidArgument` (the user must fix the URI or the server's access rules);
- no permission to start a walsender -> :class:`cdc.errors.UpstreamNotReady`;
- malformed URI or unknown/invalid connection parameters -> :class:`cdc.errors.InvalidURI`.

:func:`pg_errors` maps errors raised *after* connecting (see its docstring). Connections are not
thread-safe beyond what psycopg2 guarantees: use one connection per thread.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg2
import psycopg2.errors
import psycopg2.extensions
import psycopg2.extras

from cdc.errors import (
    InvalidArgument,
    InvalidURI,
    TidewaterError,
    UpstreamError,
    UpstreamNotReady,
    UpstreamUnavailable,
)
from cdc.uri import ParsedURI, parse_upstream_uri, scrub

log = logging.getLogger(__name__)

DEFAULT_PORT = 5432

# Session settings every upstream connection gets (the text formats the decoder parses).
SESSION_SETTINGS: dict[str, str] = {
    "TimeZone": "UTC",
    "DateStyle": "ISO",
    "IntervalStyle": "postgres",
    "extra_float_digits": "3",
    "bytea_output": "hex",
}

# Defaults for libpq keywords; a parameter of the same name in the URI's query string wins.
_KEEPALIVES = {
    "keepalives": "1",
    "keepalives_idle": "30",
    "keepalives_interval": "10",
    "keepalives_count": "3",
}


# Classification of libpq's connect-time messages (psycopg2 gives no SQLSTATE for those).
_USER_ERRORS = (
    "password authentication failed",
    "authentication failed",
    "no password supplied",
    "no pg_hba.conf entry",
    "does not exist",  # role "x" / database "x" does not exist
    "server does not support ssl",
    "ssl was required",
    "certificate",
    "not permitted to log in",
    "is not permitted to log in",
    "password is expired",
)
_NOT_READY_ERRORS = (
    "permission denied to start wal sender",
    "must be superuser or replication role",
    "must be superuser or have replication",
)
_URI_ERRORS = (
    "invalid connection option",
    "invalid dsn",
    "invalid sslmode",
    "invalid integer value",
    "invalid value for parameter",
    "invalid port number",
    "invalid gssencmode",
    "invalid target_session_attrs",
    "invalid channel_binding",
    "unrecognized configuration parameter",
)

# SQLSTATEs (after connecting) that mean "try again later".
_TRANSIENT_SQLSTATES = {"57P01", "57P02", "57P03", "53300", "57014", "40001", "40P01", "55006"}
# SQLSTATEs that mean "the upstream must be reconfigured": insufficient_privilege,
# object_not_in_prerequisite_state (e.g. wal_level too low), configuration_limit_exceeded (slots used up).
_NOT_READY_SQLSTATES = {"42501", "55000", "53400"}


def redact_uri(raw: str) -> str:
    """``raw`` (a URI or a message holding URIs) with every password hidden (:func:`cdc.uri.scrub`)."""
    return scrub(raw)


def describe_uri(uri: ParsedURI) -> str:
    """``host:port/db`` of a parsed upstream URI, for messages."""
    return f"{uri.host}:{uri.port or DEFAULT_PORT}/{uri.path}"


def describe_conn(conn: Any) -> str:
    """``host:port/db`` of an open psycopg2 connection (best effort, never raises)."""
    try:
        info = conn.info
        return f"{info.host}:{info.port}/{info.dbname}"
    except Exception:  # closed or broken connection
        return "PostgreSQL"


def _options(extra: str | None) -> str:
    forced = " ".join(f"-c {k}={v}" for k, v in SESSION_SETTINGS.items())
    return f"{extra} {forced}" if extra else forced


def connect_kwargs(
    uri: str | ParsedURI, *, timeout: float = 5.0, application_name: str = "tidewater"
) -> dict[str, Any]:
    """The libpq keyword arguments :func:`connect` uses for ``uri`` (exposed for tests and tools)."""
    parsed = _parse(uri)
    kwargs: dict[str, Any] = {
        "host": parsed.host,
        "port": parsed.port or DEFAULT_PORT,
        "dbname": parsed.path,
        "application_name": application_name,
        # libpq takes whole seconds.
        "connect_timeout": str(max(1, math.ceil(timeout))),
        **_KEEPALIVES,
    }
    if parsed.user is not None:
        kwargs["user"] = parsed.user
    if parsed.password is not None:
        kwargs["password"] = parsed.password
    params = dict(parsed.params)
    kwargs["options"] = _options(params.pop("options", None))
    for forbidden in ("replication", "host", "hostaddr", "port", "dbname", "user", "password"):
        if forbidden in params:
            raise InvalidURI(
                f"upstream URI {parsed.redacted()!r}: parameter {forbidden!r} is not allowed in the query "
                "string (put it in the URI itself)"
            )
    kwargs.update(params)
    return kwargs


def _parse(uri: str | ParsedURI) -> ParsedURI:
    if isinstance(uri, ParsedURI):
        return uri
    try:
        parsed = parse_upstream_uri(uri)
    except InvalidURI as exc:
        raise InvalidURI(redact_uri(exc.message)) from None
    if parsed.scheme not in ("postgresql", "postgres"):  # another upstream's URI (mysql://)
        raise InvalidURI(f"not a PostgreSQL URI: {parsed.redacted()!r}: use postgresql://user@host:port/dbname")
    return parsed


def connect(
    uri: str,
    *,
    replication: bool = False,
    timeout: float = 5.0,
    application_name: str = "tidewater",
) -> Any:
    """Open a connection to the upstream PostgreSQL named by ``uri``.

    ``uri`` is ``postgresql://user:pass@host:port/db?param=value...``; query parameters are passed to
    libpq unchanged (``sslmode``, ``sslrootcert``, ``keepalives_idle``...). ``timeout`` bounds the
    connection attempt (rounded up to whole seconds; libpq before 17 treats 1 as 2).

    Returns a psycopg2 connection in autocommit mode, or a
    ``psycopg2.extras.LogicalReplicationConnection`` when ``replication`` is true. Raises only
    :class:`cdc.errors.TidewaterError` subclasses (see the module docstring for the mapping).
    """
    parsed = _parse(uri)
    kwargs = connect_kwargs(parsed, timeout=timeout, application_name=application_name)
    if replication:
        kwargs["connection_factory"] = psycopg2.extras.LogicalReplicationConnection
    try:
        conn = psycopg2.connect(**kwargs)
    except psycopg2.Error as exc:
        raise classify_connect_error(exc, parsed) from None
    try:
        if not replication:
            conn.autocommit = True
    except psycopg2.Error as exc:
        conn.close()
        raise classify_connect_error(exc, parsed) from None
    log.debug("connected to %s (replication=%s)", describe_uri(parsed), replication)
    return conn


def _clean(message: str, password: str | None) -> str:
    text = " ".join(message.split())
    if password and len(password) >= 3:
        text = text.replace(password, "***")
    return redact_uri(text)


def classify_connect_error(exc: BaseException, uri: ParsedURI) -> TidewaterError:
    """Turn a psycopg2 error raised while connecting to ``uri`` into the matching Tidewater error."""
    cause = _clean(str(exc), uri.password)
    lowered = cause.lower()
    who = f" as {uri.user!r}" if uri.user else ""
    where = describe_uri(uri)
    if any(p in lowered for p in _URI_ERRORS):
        return InvalidURI(f"upstream URI {redact_uri(uri.raw)!r} is invalid: {cause}")
    if any(p in lowered for p in _NOT_READY_ERRORS):
        return UpstreamNotReady(
            f"PostgreSQL {where} refused a replication connection{who}: {cause}. "
            f"Fix: ALTER ROLE {uri.user or '<user>'} REPLICATION (and allow replication connections in pg_hba.conf)"
        )
    if any(p in lowered for p in _USER_ERRORS):
        return InvalidArgument(
            f"PostgreSQL {where} rejected the connection{who}: {cause}. Check the user, password, database "
            "name and SSL settings in the upstream URI",
            cause=exc,
        )
    return UpstreamUnavailable(f"cannot connect to PostgreSQL {where}{who}: {cause}", cause=exc)


def classify_error(exc: BaseException, where: str, what: str) -> TidewaterError:
    """Map a psycopg2 error raised while doing ``what`` on an open connection to ``where``.

    Lost connections, shutdowns, cancellations, lock and serialization conflicts, objects in use ->
    :class:`UpstreamUnavailable`; missing privileges, wal_level too low, replication slots used up ->
    :class:`UpstreamNotReady`; anything else -> :class:`UpstreamError`. Tidewater errors pass through
    unchanged.
    """
    if isinstance(exc, TidewaterError):
        return exc
    cause = _clean(str(exc), None) or type(exc).__name__
    pgcode = getattr(exc, "pgcode", None)
    msg = f"PostgreSQL {where}: {what} failed: {cause}"
    if isinstance(exc, psycopg2.InterfaceError | psycopg2.extensions.QueryCanceledError):
        return UpstreamUnavailable(msg, cause=exc)
    if pgcode is None and isinstance(exc, psycopg2.OperationalError):
        return UpstreamUnavailable(msg, cause=exc)
    if pgcode is not None and (pgcode.startswith("08") or pgcode in _TRANSIENT_SQLSTATES):
        return UpstreamUnavailable(msg, cause=exc)
    if pgcode in _NOT_READY_SQLSTATES:
        return UpstreamNotReady(msg, cause=exc)
    return UpstreamError(msg, cause=exc)


@contextmanager
def pg_errors(conn: Any, what: str) -> Iterator[None]:
    """Context manager: re-raise psycopg2 errors from the block via :func:`classify_error`."""
    try:
        yield
    except psycopg2.Error as exc:
        err = classify_error(exc, describe_conn(conn), what)
        if type(err) is UpstreamError and getattr(exc, "pgcode", None) is None and getattr(conn, "closed", 0):
            # no SQLSTATE and the session is gone (a backend terminated mid-COPY gives "error with status
            # PGRES_COPY_OUT and no message from the libpq"): the connection was lost, not the request refused
            err = UpstreamUnavailable(err.message, cause=exc)
        raise err from exc


def probe(uri: str, timeout: float = 2.0) -> None:
    """Cheap reachability check (connect, ``SELECT 1``, close): raises ``UpstreamUnavailable`` (or another
    ``TidewaterError``) while the upstream is away."""
    conn = connect(uri, timeout=timeout, application_name="tidewater-probe")
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT 1")
    except psycopg2.Error as exc:
        raise classify_error(exc, describe_conn(conn), "probe") from exc
    finally:
        conn.close()
