"""The MySQL sink's TLS parameters (issue 12, item 7): ``ssl-mode``/``ssl-ca``/``ssl-cert``/``ssl-key`` in
the URI become a PyMySQL TLS context with libpq's sslmode semantics; bad values are refused by name."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from cdc.errors import InvalidURI
from sinks.sql.sink import SQLSink
from sinks.sql.target.mysql_tls import tls_connect_args
from tests.tls_material import TlsMaterial, make_tls_material

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TlsMaterial:
    return make_tls_material(Path(tmp_path_factory.mktemp("tls")))


def test_modes(tls: TlsMaterial) -> None:
    assert tls_connect_args({}, "u") == {}
    assert tls_connect_args({"ssl-mode": "PREFERRED"}, "u") == {}
    assert tls_connect_args({"ssl-mode": "disable"}, "u") == {"ssl_disabled": True}
    ctx = tls_connect_args({"ssl-mode": "REQUIRED"}, "u")["ssl"]
    assert isinstance(ctx, ssl.SSLContext) and ctx.verify_mode == ssl.CERT_NONE and not ctx.check_hostname
    ctx = tls_connect_args({"ssl-mode": "require", "ssl-ca": str(tls.ca_cert)}, "u")["ssl"]
    assert ctx.verify_mode == ssl.CERT_REQUIRED and not ctx.check_hostname  # require + CA = verify-ca
    ctx = tls_connect_args({"ssl-mode": "VERIFY_CA", "ssl-ca": str(tls.ca_cert)}, "u")["ssl"]
    assert ctx.verify_mode == ssl.CERT_REQUIRED and not ctx.check_hostname
    ctx = tls_connect_args({"ssl-mode": "verify-full", "ssl-ca": str(tls.ca_cert),
                            "ssl-cert": str(tls.client_cert), "ssl-key": str(tls.client_key)}, "u")["ssl"]
    assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname
    ctx = tls_connect_args({"ssl-ca": str(tls.ca_cert)}, "u")["ssl"]  # a CA alone implies TLS
    assert ctx.verify_mode == ssl.CERT_REQUIRED


@pytest.mark.parametrize("params,fragment", [
    ({"ssl-mode": "sometimes"}, "not one of"),
    ({"ssl-mode": "disable", "ssl-ca": "/x"}, "need ssl-mode"),
    ({"ssl-mode": "verify-ca", "ssl-ca": "/nonexistent/ca.pem"}, "cannot load"),
    ({"ssl-mode": "require", "ssl-key": "/k.pem"}, "ssl-key needs ssl-cert"),
])
def test_refusals(params: dict[str, str], fragment: str) -> None:
    with pytest.raises(InvalidURI, match=fragment):
        tls_connect_args(params, "mysql://app:***@db/shop")


def test_the_sink_accepts_the_parameters_and_never_echoes_the_password(tls: TlsMaterial) -> None:
    SQLSink(f"mysql://app:Zz-s3cret@127.0.0.1:1/shop?ssl-mode=verify-ca&ssl-ca={tls.ca_cert}").close()
    with pytest.raises(InvalidURI) as exc:
        SQLSink("mysql://app:Zz-s3cret@127.0.0.1:1/shop?ssl-mode=bogus")
    assert "Zz-s3cret" not in str(exc.value) and "ssl-mode" in str(exc.value)
