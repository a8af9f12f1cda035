"""Sink factory: a lazy registry from URI scheme to sink class (faust-style).

Each scheme maps to a ``"module:Class"`` string that is imported only when a sink of that scheme is
opened, so that e.g. a blackhole changefeed never imports SQLAlchemy. A new sink is one line in
:data:`SINKS` (plus its scheme and URI form in ``cdc.uri.SINK_URI_FORMS``, which the CLI's help lists) or a
:func:`register_sink` call.

Every sink class is constructed as ``cls(uri, config)``; construction does no I/O (call ``check()`` to
connect). What a scheme supports is the roles its class implements (``sinks.base``, ``sinks.copy_roles``):
:func:`supports` asks without opening a sink. :class:`SinkFactory` bundles :func:`open_sink` and :func:`supports`
for the capture to hand to the owner and the processor (``sinks.base.SinkOpener``), which never import this module.
Thread-safety: the registry is read-only after import; ``register_sink`` is for start-up code.
"""

from __future__ import annotations

import importlib

from cdc.config import DdlConfig, SinkConfig
from cdc.errors import InvalidConfig, InvalidURI
from cdc.uri import parse_sink_uri
from sinks.base import DdlSettings, TxnSink

SINKS: dict[str, str] = {
    "mysql": "sinks.sql.sink:SQLSink",
    "mariadb": "sinks.sql.sink:SQLSink",
    "postgresql": "sinks.sql.sink:SQLSink",
    "postgres": "sinks.sql.sink:SQLSink",
    "sqlite": "sinks.sql.sink:SQLSink",
    "blackhole": "sinks.blackhole:BlackholeSink",
    "kafka": "sinks.kafka.sink:KafkaSink",
    "file": "sinks.storage.sink:StorageSink",
}


def register_sink(scheme: str, target: str) -> None:
    """Map ``scheme`` to ``"package.module:Class"`` (replacing an earlier mapping)."""
    if ":" not in target:
        raise ValueError(f"sink target {target!r} must be 'module:Class'")
    SINKS[scheme.lower()] = target


def sink_class(scheme: str) -> type[TxnSink]:
    """Import and return the class registered for ``scheme``; InvalidURI if none is."""
    target = SINKS.get(scheme.lower())
    if target is None:
        raise InvalidURI(f"sink URI scheme {scheme!r} is not supported (use one of: {', '.join(sorted(SINKS))})")
    module_name, _, attr = target.partition(":")
    cls = getattr(importlib.import_module(module_name), attr)
    if not (isinstance(cls, type) and issubclass(cls, TxnSink)):
        raise TypeError(f"{target} is not a sink class (sinks.base.TxnSink)")
    return cls


def open_sink(uri: str, config: SinkConfig | None = None, ddl: DdlConfig | None = None) -> TxnSink:
    """A new, unconnected sink for ``uri``; raises InvalidURI for a malformed or unsupported URI. ``ddl``:
    the changefeed's ``[ddl]`` settings (given to a ``DdlSettings`` sink)."""
    parsed = parse_sink_uri(uri)
    if config is not None and config.dispatchers and parsed.scheme != "kafka":
        raise InvalidConfig(f"[[sink.dispatchers]] route rows to Kafka topics and partitions; the sink "
                            f"{parsed.redacted()} is not a Kafka sink: remove the dispatchers")
    sink = sink_class(parsed.scheme)(uri, config or SinkConfig())
    if ddl is not None and isinstance(sink, DdlSettings):
        sink.set_ddl_config(ddl)
    return sink


def supports(uri: str, role: type) -> bool:
    """The sink class of ``uri``'s scheme implements ``role`` (a class of ``sinks.base`` or ``sinks.copy_roles``);
    no sink is opened. Raises InvalidURI for a malformed or unsupported URI."""
    return issubclass(sink_class(parse_sink_uri(uri).scheme), role)


class SinkFactory:
    """:func:`open_sink` and :func:`supports` as one object (``sinks.base.SinkOpener``): what the capture hands to
    the owner and the processor. Stateless; thread-safe."""

    def open(self, uri: str, config: SinkConfig | None = None, ddl: DdlConfig | None = None) -> TxnSink:
        return open_sink(uri, config, ddl)

    def supports(self, uri: str, role: type) -> bool:
        return supports(uri, role)
