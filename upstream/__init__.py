"""Upstreams (source databases) behind one interface: :mod:`upstream.base`.

:func:`open_upstream` picks the implementation by the URI's scheme through a lazy registry (module path as
a string, imported on first use), so that callers depend on :mod:`upstream.base` only and an upstream's
driver is imported only when a URI of its kind is used.
"""

from __future__ import annotations

import importlib
from typing import Any

from cdc.errors import InvalidURI
from cdc.uri import refuse_sealed
from upstream.base import Upstream

# scheme -> "module:class" implementing upstream.base.Upstream
_REGISTRY: dict[str, str] = {
    "postgres": "upstream.postgres.upstream:PostgresUpstream",
    "postgresql": "upstream.postgres.upstream:PostgresUpstream",
    "mysql": "upstream.mysql.upstream:MySqlUpstream",
    "mariadb": "upstream.mysql.upstream:MySqlUpstream",
}


def open_upstream(uri: str, **options: Any) -> Upstream:
    """The :class:`upstream.base.Upstream` for ``uri`` (no I/O yet: sessions open on first use).

    ``options`` go to the implementation (PostgreSQL: ``timeout`` for connecting, ``statement_timeout`` in
    seconds for every query of the session). Raises :class:`cdc.errors.InvalidURI` for an unknown scheme.
    """
    refuse_sealed(uri, "upstream")
    scheme = uri.split(":", 1)[0].lower() if ":" in uri else ""
    target = _REGISTRY.get(scheme)
    if target is None:
        raise InvalidURI(f"unsupported upstream URI scheme {scheme!r}: use one of {sorted(_REGISTRY)}")
    module, _, name = target.partition(":")
    cls = getattr(importlib.import_module(module), name)
    return cls(uri, **options)
