"""The codec layer shared by the Kafka and storage sinks: one encoder and one decoder per protocol.

A lazy registry (faust-style, like ``sinks.factory``): a protocol name maps to ``"module:Class"`` strings, imported
when first used. ``encoder_for("canal-json", config)`` / ``decoder_for(...)`` build one; ``PROTOCOLS`` lists the
names a sink URI may use. The contract is ``sinks.codec.base`` (docs/sinks.md, "Formats").

How a sink uses an encoder (one encoder per destination, e.g. Kafka topic+partition or storage file):

    enc = encoder_for(protocol, EncoderConfig.from_params(uri_query))
    for change in transaction_changes:          # whole transactions, commit order
        enc.append_row(change)
    for msg in enc.build():                     # in order; msg.kind, msg.size, msg.table, msg.commit_ts, msg.rows
        send(msg.key, msg.value, msg.headers)
    big = enc.encode_key_only(change, location) # a row over max-message-bytes: TiCDC's key-only / claim-check form
    send(enc.encode_ddl(ddl_event))             # at the barrier; None when the protocol has no in-band DDL
    send(enc.encode_watermark(watermark))       # to every partition; None when the protocol has none
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from cdc.errors import InvalidArgument
from sinks.codec.base import (
    DecodedEvent,
    Decoder,
    EncodeError,
    EncoderConfig,
    Message,
    MessageDecodeError,
    MessageKind,
    MessageTooLarge,
    RowEventEncoder,
    split_key_change,
)

__all__ = [
    "PROTOCOLS", "DecodedEvent", "Decoder", "EncodeError", "EncoderConfig", "Message", "MessageDecodeError",
    "MessageKind", "MessageTooLarge", "RowEventEncoder", "decoder_for", "encoder_class", "encoder_for",
    "split_key_change",
]

PROTOCOLS: dict[str, tuple[str, str]] = {
    "canal-json": ("sinks.codec.canal_json:CanalJsonEncoder", "sinks.codec.canal_json:CanalJsonDecoder"),
    "debezium": ("sinks.codec.debezium:DebeziumEncoder", "sinks.codec.debezium:DebeziumDecoder"),
    "open-protocol": ("sinks.codec.open_protocol:OpenProtocolEncoder",
                      "sinks.codec.open_protocol:OpenProtocolDecoder"),
    "csv": ("sinks.codec.csv:CsvEncoder", "sinks.codec.csv:CsvDecoder"),
}
"""Protocol name -> (encoder class, decoder class). Which sink offers which protocol is the sink's business
(Kafka: canal-json, debezium, open-protocol; storage: csv, canal-json)."""


def _load(target: str) -> Any:
    module_name, _, attr = target.partition(":")
    return getattr(importlib.import_module(module_name), attr)


def _entry(protocol: str) -> tuple[str, str]:
    entry = PROTOCOLS.get(protocol.lower())
    if entry is None:
        raise InvalidArgument(f"protocol {protocol!r} is not supported (use one of: {', '.join(sorted(PROTOCOLS))})")
    return entry


def encoder_class(protocol: str) -> type[RowEventEncoder]:
    """The encoder class of ``protocol``; InvalidArgument naming the supported ones if there is none."""
    cls = _load(_entry(protocol)[0])
    if not (isinstance(cls, type) and issubclass(cls, RowEventEncoder)):
        raise TypeError(f"{_entry(protocol)[0]} is not a RowEventEncoder")
    return cls


def encoder_for(protocol: str, config: EncoderConfig | None = None, *,
                clock: Callable[[], float] | None = None) -> RowEventEncoder:
    """A new encoder of ``protocol`` (``clock``: the time source of "time of encoding" fields)."""
    cls = encoder_class(protocol)
    return cls(config) if clock is None else cls(config, clock=clock)


def decoder_for(protocol: str, config: EncoderConfig | None = None, **kwargs: Any) -> Decoder:
    """A new decoder of ``protocol`` (``schemas=``: a lookup of table schemas for exact value types)."""
    cls = _load(_entry(protocol)[1])
    if not (isinstance(cls, type) and issubclass(cls, Decoder)):
        raise TypeError(f"{_entry(protocol)[1]} is not a Decoder")
    return cls(config, **kwargs)
