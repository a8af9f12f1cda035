"""The codec registry, the configuration from URI parameters, and the small helpers of ``sinks.codec.base``."""

from __future__ import annotations

import pytest
from codec_cases import KV

from cdc.errors import InvalidArgument, InvalidConfig
from cdc.events import UNCHANGED, OpType, RowChange
from sinks.codec import (
    PROTOCOLS,
    EncoderConfig,
    Message,
    MessageKind,
    decoder_for,
    encoder_for,
    split_key_change,
)
from sinks.codec.base import MAX_RECORD_OVERHEAD
from sinks.codec.schema_cache import SchemaCache


@pytest.mark.unit
def test_every_protocol_has_an_encoder_and_a_decoder() -> None:
    for name in PROTOCOLS:
        assert encoder_for(name).protocol == name
        assert decoder_for(name).protocol == name


@pytest.mark.unit
def test_unknown_protocol_names_the_supported_ones() -> None:
    with pytest.raises(InvalidArgument, match="avro.*canal-json, csv, debezium, open-protocol"):
        encoder_for("avro")


@pytest.mark.unit
def test_config_from_uri_parameters() -> None:
    cfg = EncoderConfig.from_params({"max-message-bytes": "1024", "enable-tidb-extension": "false",
                                     "csv-binary-encoding-method": "hex", "partition-num": "3",
                                     "decimal-handling-mode": "string", "csv-null": "NULL"})
    assert (cfg.max_message_bytes, cfg.enable_tidb_extension, cfg.csv_binary_encoding, cfg.decimal_handling_mode,
            cfg.csv_null) == (1024, False, "hex", "string", "NULL")
    assert EncoderConfig.from_params({}) == EncoderConfig()
    with pytest.raises(InvalidConfig, match="max-message-bytes"):
        EncoderConfig.from_params({"max-message-bytes": "lots"})
    with pytest.raises(InvalidConfig, match="decimal-handling-mode"):
        EncoderConfig.from_params({"decimal-handling-mode": "approximate"})
    with pytest.raises(InvalidConfig, match="csv-quote"):
        EncoderConfig(csv_quote=",")


@pytest.mark.unit
def test_message_size_is_ticdcs_length() -> None:
    m = Message(b"k" * 10, b"v" * 20, MessageKind.ROW, "x", None, 1)
    assert m.size == 30 + MAX_RECORD_OVERHEAD == 66
    assert Message(None, None, MessageKind.TOMBSTONE, "x", None, 1).size == MAX_RECORD_OVERHEAD


@pytest.mark.unit
def test_split_key_change() -> None:
    upd = RowChange(OpType.UPDATE, KV, 5, 1.0, {"id": 2, "body": "b", "n": 1}, {"id": 1})
    parts = split_key_change(upd)
    assert parts is not None
    delete, insert = parts
    assert (delete.op, delete.old_values, insert.op, insert.values) == (
        OpType.DELETE, {"id": 1}, OpType.INSERT, {"id": 2, "body": "b", "n": 1})
    assert split_key_change(RowChange(OpType.UPDATE, KV, 5, 1.0, {"id": 1, "body": "b", "n": 1}, None)) is None
    partial = RowChange(OpType.UPDATE, KV, 5, 1.0, {"id": 2, "body": UNCHANGED, "n": 1}, {"id": 1})
    assert split_key_change(partial) is None  # an insert cannot be completed


@pytest.mark.unit
def test_schema_cache_reuses_a_version_only_for_the_same_schema() -> None:
    built: list[object] = []
    cache: SchemaCache[int] = SchemaCache(lambda s: built.append(s) or len(built))
    assert cache.get(KV) == cache.get(KV) == 1
    other = type(KV)(KV.name, KV.columns[:2], KV.key, relation_id=KV.relation_id, version=KV.version)
    assert cache.get(other) == 2  # same (table, relation, version), different columns: rebuilt
