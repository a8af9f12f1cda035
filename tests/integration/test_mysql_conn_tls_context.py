"""The upstream's PyMySQL connections share one PREFERRED-mode TLS context (upstream.mysql.conn.Connection) instead
of loading the system's CA certificates per connection, and still connect, encrypted where the server offers TLS and
in plain text where it does not (the real MariaDB of the fixtures)."""

from __future__ import annotations

import pytest

from cdc.uri import parse_upstream_uri
from playground.servers import MariaDBServer
from upstream.mysql import conn

pytestmark = pytest.mark.integration


def _cipher(c: conn.Connection) -> str:
    with c.cursor() as cur:
        cur.execute("SHOW SESSION STATUS LIKE 'Ssl_cipher'")
        row = cur.fetchone()
    return row[1] if row else ""


def test_connections_share_the_preferred_context(mariadb_server: MariaDBServer, mariadb_database: str) -> None:
    uri = mariadb_server.uri(mariadb_database)
    first, second = conn.connect(uri), conn.connect(uri)
    stream = conn.Connection(**conn.stream_settings(uri))  # as BinLogStreamReader opens its own (pymysql_wrapper)
    try:
        assert first.ctx is second.ctx is stream.ctx
        assert first.ssl and not first._ssl_required  # PyMySQL's PREFERRED mode, as without the shared context
        ciphers = {_cipher(c) for c in (first, second, stream)}
        assert len(ciphers) == 1  # the same outcome for each: all encrypted, or all plain where the server has no TLS
        with first.cursor() as cur:
            cur.execute("SELECT @@time_zone")
            assert cur.fetchone() == ("+00:00",)
    finally:
        for c in (first, second, stream):
            c.close()


def test_an_explicit_ssl_argument_is_pymysqls_own(mariadb_server: MariaDBServer, mariadb_database: str) -> None:
    """Only the argument-less PREFERRED context is shared: ``ssl={'verify_mode': False, ...}`` makes its own."""
    kw = conn.connect_kwargs(parse_upstream_uri(mariadb_server.uri(mariadb_database)), 5.0)
    shared = conn.connect(mariadb_server.uri(mariadb_database))
    try:
        ctx = conn.Connection(**kw, ssl={"verify_mode": False}, defer_connect=True).ctx
        assert ctx is not shared.ctx
    finally:
        shared.close()
