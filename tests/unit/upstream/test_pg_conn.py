"""upstream.postgres.conn without a PostgreSQL server: URI handling, keyword building, error mapping."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from typing import Any

import psycopg2
import psycopg2.extras
import pytest

from cdc.errors import InvalidArgument, InvalidURI, UpstreamError, UpstreamNotReady, UpstreamUnavailable
from cdc.uri import parse_upstream_uri
from upstream.postgres import conn as pgconn

pytestmark = pytest.mark.unit

SECRET = "s3cr3t-Pw"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that completes the TCP handshake (kernel backlog) but never answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield int(s.getsockname()[1])


def test_closed_port_is_unavailable_and_names_the_endpoint() -> None:
    port = _closed_port()
    with pytest.raises(UpstreamUnavailable) as ei:
        pgconn.connect(f"postgresql://alice:{SECRET}@127.0.0.1:{port}/shop", timeout=2)
    msg = str(ei.value)
    assert f"127.0.0.1:{port}/shop" in msg
    assert "refused" in msg.lower()
    assert SECRET not in msg
    assert ei.value.retryable


def test_silent_server_times_out_as_unavailable(silent_port: int) -> None:
    t0 = time.monotonic()
    with pytest.raises(UpstreamUnavailable) as ei:
        pgconn.connect(f"postgresql://u@127.0.0.1:{silent_port}/db", timeout=1)
    elapsed = time.monotonic() - t0
    assert f"127.0.0.1:{silent_port}/db" in str(ei.value)
    assert "timeout" in str(ei.value).lower()
    assert 0.9 < elapsed < 15  # older libpq versions round 1 s up to 2 s


@pytest.mark.parametrize(
    "uri",
    [
        f"mysql://u:{SECRET}@127.0.0.1:5432/db",
        f"postgresql://u:{SECRET}@127.0.0.1:5432",
        f"postgresql://u:{SECRET}@127.0.0.1:notaport/db",
        "postgresql:/nohost/db",
        "",
    ],
)
def test_malformed_uri_is_invalid_uri_without_password(uri: str) -> None:
    with pytest.raises(InvalidURI) as ei:
        pgconn.connect(uri)
    assert SECRET not in str(ei.value)


def test_unknown_or_invalid_libpq_parameters_are_invalid_uri() -> None:
    port = _closed_port()
    with pytest.raises(InvalidURI) as ei:
        pgconn.connect(f"postgresql://u:{SECRET}@127.0.0.1:{port}/db?sslmode=sometimes")
    assert "sslmode" in str(ei.value) and SECRET not in str(ei.value)
    with pytest.raises(InvalidURI) as ei:
        pgconn.connect(f"postgresql://u@127.0.0.1:{port}/db?frobnicate=1")
    assert "frobnicate" in str(ei.value)
    with pytest.raises(InvalidURI, match="replication"):
        pgconn.connect(f"postgresql://u@127.0.0.1:{port}/db?replication=database")


def test_connect_kwargs_pass_query_parameters_through() -> None:
    kw = pgconn.connect_kwargs(
        "postgresql://al%40ice:p%2Fw%40rd@db.example:6543/my%20db?sslmode=require&application_name=x"
        "&keepalives_idle=7&options=-c%20work_mem%3D8MB",
        timeout=2.2,
    )
    assert kw["host"] == "db.example" and kw["port"] == 6543 and kw["dbname"] == "my db"
    assert kw["user"] == "al@ice" and kw["password"] == "p/w@rd"
    assert kw["sslmode"] == "require"
    assert kw["application_name"] == "x"  # the URI wins over the default
    assert kw["keepalives"] == "1" and kw["keepalives_idle"] == "7"
    assert kw["connect_timeout"] == "3"
    # the user's options come first, the forced session settings last (last -c wins)
    assert kw["options"].startswith("-c work_mem=8MB ")
    assert kw["options"].index("work_mem") < kw["options"].index("TimeZone=UTC")


def test_connect_kwargs_defaults() -> None:
    kw = pgconn.connect_kwargs("postgresql://h/db", application_name="tw-test")
    assert kw["port"] == 5432 and "user" not in kw and "password" not in kw
    assert kw["application_name"] == "tw-test"
    assert kw["connect_timeout"] == "5"
    for k, v in pgconn.SESSION_SETTINGS.items():
        assert f"-c {k}={v}" in kw["options"]


class _FakeConn:
    autocommit = False


def test_replication_uses_logical_replication_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict[str, Any]] = []

    def fake_connect(**kwargs: Any) -> _FakeConn:
        calls.append(kwargs)
        return _FakeConn()

    monkeypatch.setattr(psycopg2, "connect", fake_connect)
    normal = pgconn.connect("postgresql://u@h:1/db")
    repl = pgconn.connect("postgresql://u@h:1/db", replication=True)
    assert "connection_factory" not in calls[0] and normal.autocommit is True
    assert calls[1]["connection_factory"] is psycopg2.extras.LogicalReplicationConnection
    assert repl.autocommit is False  # replication connections are left as psycopg2 makes them


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ('connection to server at "h", port 1 failed: FATAL:  password authentication failed for user "u"', InvalidArgument),
        ('connection to server at "h", port 1 failed: FATAL:  database "nope" does not exist', InvalidArgument),
        ('connection to server at "h", port 1 failed: FATAL:  role "nope" does not exist', InvalidArgument),
        ("FATAL:  no pg_hba.conf entry for host \"1.2.3.4\", user \"u\", database \"d\"", InvalidArgument),
        ("connection to server failed: fe_sendauth: no password supplied", InvalidArgument),
        ("FATAL:  permission denied to start WAL sender\nDETAIL:  Only roles with the REPLICATION attribute", UpstreamNotReady),
        ("FATAL:  sorry, too many clients already", UpstreamUnavailable),
        ("FATAL:  the database system is starting up", UpstreamUnavailable),
        ('could not translate host name "nowhere" to address: Name or service not known', UpstreamUnavailable),
    ],
)  # fmt: skip
def test_connect_error_classification(message: str, expected: type[Exception]) -> None:
    uri = parse_upstream_uri(f"postgresql://u:{SECRET}@h:1/d")
    err = pgconn.classify_connect_error(psycopg2.OperationalError(message + f" {SECRET}"), uri)
    assert type(err) is expected
    assert "h:1/d" in err.message
    assert SECRET not in err.message
    assert "\n" not in err.message


def test_error_classification_after_connect() -> None:
    lost = pgconn.classify_error(
        psycopg2.OperationalError("server closed the connection"), "h:1/d", "reading"
    )
    assert isinstance(lost, UpstreamUnavailable) and "h:1/d" in lost.message and "reading" in lost.message
    assert isinstance(pgconn.classify_error(psycopg2.InterfaceError("closed"), "x", "y"), UpstreamUnavailable)
    assert type(pgconn.classify_error(psycopg2.ProgrammingError("syntax"), "x", "y")) is UpstreamError
    own = InvalidArgument("mine")
    assert pgconn.classify_error(own, "x", "y") is own


def test_pg_errors_context_wraps_psycopg2_errors() -> None:
    class Info:
        host, port, dbname = "hh", 7, "dd"

    class C:
        info = Info()

    with pytest.raises(UpstreamUnavailable, match="hh:7/dd") as ei, pgconn.pg_errors(C(), "testing"):
        raise psycopg2.OperationalError("boom")
    assert isinstance(ei.value.__cause__, psycopg2.OperationalError)
    with pytest.raises(KeyError), pgconn.pg_errors(C(), "testing"):
        raise KeyError("not a database error")


def test_redact_uri() -> None:
    assert pgconn.redact_uri(f"postgresql://u:{SECRET}@h:1/d?x=1") == "postgresql://u:***@h:1/d?x=1"
    assert pgconn.redact_uri("postgresql://u@h:1/d") == "postgresql://u@h:1/d"
    assert pgconn.redact_uri(f"see 'postgresql://:{SECRET}@h/d'") == "see 'postgresql://:***@h/d'"
