"""The MySQL sink verifies the server's certificate when asked (issue 12, item 7), against a real MariaDB
started with ``--ssl-cert/--ssl-key`` and a CA made in the test: TLS is really negotiated, a server whose
certificate another CA signed is refused under verify-ca/verify-full, and ``disable`` connects in clear."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pymysql
import pytest

from cdc.errors import TidewaterError
from playground.servers import MariaDBServer
from sinks.sql.sink import SQLSink
from sinks.sql.target.mysql_tls import tls_connect_args
from tests.tls_material import TlsMaterial, make_tls_material

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TlsMaterial:
    return make_tls_material(Path(tmp_path_factory.mktemp("tls")))


@pytest.fixture(scope="module")
def tls_mariadb(tmp_path_factory: pytest.TempPathFactory, tls: TlsMaterial) -> Iterator[MariaDBServer]:
    server = MariaDBServer(tmp_path_factory.mktemp("mariadb-tls"), settings={
        "ssl-cert": str(tls.server_cert), "ssl-key": str(tls.server_key), "ssl-ca": str(tls.ca_cert)}).start()
    server.create_database("shop")
    yield server
    server.stop()


def cipher(server: MariaDBServer, params: dict[str, str]) -> str:
    conn = pymysql.connect(host="127.0.0.1", port=server.port, user="root", connect_timeout=5,
                           **tls_connect_args(params, "test"))
    try:
        with conn.cursor() as cur:
            cur.execute("SHOW SESSION STATUS LIKE 'Ssl_cipher'")
            return str(cur.fetchone()[1])
    finally:
        conn.close()


def test_tls_verified_and_refused(tls_mariadb: MariaDBServer, tls: TlsMaterial) -> None:
    base = f"mysql://root@127.0.0.1:{tls_mariadb.port}/shop"
    good = {"ssl-mode": "verify-full", "ssl-ca": str(tls.ca_cert)}
    assert cipher(tls_mariadb, good)  # negotiated
    assert cipher(tls_mariadb, {"ssl-mode": "disable"}) == ""
    for mode in ("verify-ca", "verify-full"):
        sink = SQLSink(f"{base}?ssl-mode={mode}&ssl-ca={tls.ca_cert}")
        try:
            sink.check()
        finally:
            sink.close()
    # the wrong CA: refused, with the reason
    for mode in ("verify-ca", "VERIFY_IDENTITY"):
        sink = SQLSink(f"{base}?ssl-mode={mode}&ssl-ca={tls.other_ca_cert}&connect-timeout=5")
        try:
            with pytest.raises(TidewaterError, match="(?i)certificate verify failed"):
                sink.check()
        finally:
            sink.close()
    # require without a CA encrypts without checking (libpq's sslmode=require)
    assert cipher(tls_mariadb, {"ssl-mode": "require"})
