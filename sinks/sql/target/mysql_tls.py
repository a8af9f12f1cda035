"""TLS for MySQL/MariaDB targets from the sink URI, with libpq's ``sslmode`` semantics.

URI parameters (``mysql://app@db2:3306/shop?ssl-mode=verify-full&ssl-ca=/etc/tidewater/db-ca.pem``):

| ``ssl-mode`` | TLS | server certificate |
|---|---|---|
| ``disable`` / ``DISABLED`` | never | - |
| ``prefer`` / ``PREFERRED`` (default) | when the server offers it | not checked |
| ``require`` / ``REQUIRED`` | always (refused without) | not checked; checked against ``ssl-ca`` when one is given (as MySQL's client does) |
| ``verify-ca`` / ``VERIFY_CA`` | always | signed by ``ssl-ca`` (else the system store) |
| ``verify-full`` / ``VERIFY_IDENTITY`` | always | signed, and issued for the URI's host |

``ssl-cert``/``ssl-key`` present a client certificate. Any ``ssl-*`` parameter but ``ssl-mode`` implies at
least ``require``. The context is built here and handed to PyMySQL as ``ssl=``, which makes TLS mandatory
for the connection. Pure: no I/O besides reading the named files.
"""

from __future__ import annotations

import ssl
from typing import Any

from cdc.errors import InvalidURI

PARAMS = ("ssl-mode", "ssl-ca", "ssl-cert", "ssl-key")
_MODES = {"disable": "disable", "disabled": "disable", "prefer": "prefer", "preferred": "prefer",
          "require": "require", "required": "require", "verify-ca": "verify-ca", "verify_ca": "verify-ca",
          "verify-full": "verify-full", "verify_identity": "verify-full", "verify-identity": "verify-full"}


def ssl_mode(params: dict[str, str], shown: str) -> str:
    raw = params.get("ssl-mode")
    if raw is None:
        return "require" if any(params.get(p) for p in PARAMS[1:]) else "prefer"
    mode = _MODES.get(raw.strip().lower())
    if mode is None:
        raise InvalidURI(f"sink URI {shown!r}: ssl-mode {raw!r} is not one of disable, prefer, require, "
                         "verify-ca, verify-full (or DISABLED, PREFERRED, REQUIRED, VERIFY_CA, VERIFY_IDENTITY)")
    if mode in ("disable", "prefer") and any(params.get(p) for p in PARAMS[1:]):
        raise InvalidURI(f"sink URI {shown!r}: ssl-ca/ssl-cert/ssl-key need ssl-mode require, verify-ca or "
                         f"verify-full, not {raw!r}")
    return mode


def tls_connect_args(params: dict[str, str], shown: str) -> dict[str, Any]:
    """PyMySQL connect arguments for the URI's ``ssl-*`` parameters: ``{}`` (prefer: PyMySQL's default),
    ``{"ssl_disabled": True}``, or ``{"ssl": SSLContext}`` (TLS required)."""
    mode = ssl_mode(params, shown)
    if mode == "disable":
        return {"ssl_disabled": True}
    if mode == "prefer":
        return {}
    ca, cert, key = params.get("ssl-ca") or None, params.get("ssl-cert") or None, params.get("ssl-key") or None
    if key and not cert:
        raise InvalidURI(f"sink URI {shown!r}: ssl-key needs ssl-cert")
    try:
        ctx = ssl.create_default_context(cafile=ca)
        if cert:
            ctx.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise InvalidURI(f"sink URI {shown!r}: cannot load the TLS files (ssl-ca {ca or '-'}, ssl-cert "
                         f"{cert or '-'}): {exc}") from exc
    if mode == "require" and not ca:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    elif mode in ("require", "verify-ca"):
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_REQUIRED
    return {"ssl": ctx}
