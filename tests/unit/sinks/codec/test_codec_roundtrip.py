"""Round trips: every scenario of ``codec_cases`` encoded and decoded again equals what the protocol promises to
keep (``codec_expect``), for every protocol and its main option variants; plus DDL, watermarks and the decoders'
behaviour without a known schema."""

from __future__ import annotations

from dataclasses import replace

import pytest
from codec_cases import ALL, KV, ROW1, cases
from codec_expect import check, round_trip

from cdc.events import OpType, RowChange
from sinks.codec import EncoderConfig, MessageKind, decoder_for, encoder_for

BASE = EncoderConfig(debezium_database="appdb", max_batch_size=3)
VARIANTS = [
    ("canal-json", BASE),
    ("canal-json", replace(BASE, enable_tidb_extension=False)),
    ("open-protocol", BASE),
    ("open-protocol", replace(BASE, max_batch_size=1, max_message_bytes=200)),
    ("debezium", BASE),
    ("debezium", replace(BASE, schemas_enable=False, decimal_handling_mode="string", interval_handling_mode="string",
                         binary_handling_mode="base64-url-safe", tombstones_on_delete=False)),
    ("debezium", replace(BASE, binary_handling_mode="hex")),
    ("csv", BASE),
    ("csv", replace(BASE, csv_output_old_value=True, csv_quote="", csv_delimiter="|", csv_include_commit_ts=False)),
    ("csv", replace(BASE, csv_quote="'", csv_null="NULL", csv_terminator="\n", csv_binary_encoding="hex")),
]


@pytest.mark.unit
@pytest.mark.parametrize(("protocol", "cfg"), VARIANTS, ids=lambda v: v if isinstance(v, str) else "")
def test_every_case_round_trips(protocol: str, cfg: EncoderConfig) -> None:
    for case in cases():
        if case.changes and protocol in case.protocols:
            check(protocol, cfg, case.changes)


@pytest.mark.unit
@pytest.mark.parametrize("protocol", ["canal-json", "open-protocol", "debezium"])
def test_ddl_and_watermark_round_trip(protocol: str) -> None:
    enc = encoder_for(protocol, BASE)
    dec = decoder_for(protocol, BASE)
    for case in cases():
        if case.ddl is not None:
            m = enc.encode_ddl(case.ddl)
            assert m is not None and m.kind is MessageKind.DDL
            (ev,) = dec.decode(m.key, m.value)
            assert (ev.kind, ev.table, ev.commit_ts, ev.query) == (MessageKind.DDL, case.ddl.table,
                                                                    case.ddl.commit_ts, case.ddl.query)
        if case.watermark is not None:
            m = enc.encode_watermark(case.watermark)
            assert m is not None and m.kind is MessageKind.WATERMARK
            (ev,) = dec.decode(m.key, m.value)
            assert (ev.kind, ev.commit_ts) == (MessageKind.WATERMARK, case.watermark.ts)


@pytest.mark.unit
def test_csv_has_no_in_band_ddl_watermark_or_truncate() -> None:
    from sinks.codec import EncodeError

    enc = encoder_for("csv", BASE)
    for case in cases():
        if case.ddl is not None:
            assert enc.encode_ddl(case.ddl) is None
        if case.watermark is not None:
            assert enc.encode_watermark(case.watermark) is None
    with pytest.raises(EncodeError, match="TRUNCATE"):
        enc.append_row(RowChange(OpType.TRUNCATE, KV, 5, 0.0))


@pytest.mark.unit
@pytest.mark.parametrize("protocol", ["canal-json", "open-protocol", "debezium", "csv"])
def test_decoding_without_a_schema_keeps_what_the_message_says(protocol: str) -> None:
    change = RowChange(OpType.INSERT, ALL, 9, 1.0, dict(ROW1))
    (ev,) = round_trip(protocol, BASE, [change], with_schemas=False)
    assert ev.op is OpType.INSERT and ev.values is not None
    if protocol == "csv":  # positional: without the schema the values are the file's strings, by position
        assert ev.values["0"] == "1" and ev.values["9"] == ROW1["c_text"]
        return
    assert ev.values["id"] == 1 and ev.values["c_text"] == ROW1["c_text"]
    assert ev.values["c_bytea"] == ROW1["c_bytea"]
    assert ev.values["c_num"] == ROW1["c_num"]


@pytest.mark.unit
def test_open_protocol_batches_respect_count_and_size() -> None:
    rows = [RowChange(OpType.INSERT, KV, 100 + i, 1.0, {"id": i, "body": "x" * (i * 40), "n": i}) for i in range(12)]
    for cfg in (replace(BASE, max_batch_size=4), replace(BASE, max_batch_size=16, max_message_bytes=600)):
        enc = encoder_for("open-protocol", cfg)
        enc.append_rows(rows)
        msgs = enc.build()
        assert sum(m.rows for m in msgs) == len(rows)
        for m in msgs:
            assert m.rows <= cfg.max_batch_size
            assert m.rows == 1 or m.size <= cfg.max_message_bytes
        got = [e.values["id"] for m in msgs for e in decoder_for("open-protocol", cfg).decode(m.key, m.value)]
        assert got == list(range(12))


@pytest.mark.unit
@pytest.mark.parametrize(("protocol", "cfg"), VARIANTS, ids=lambda v: v if isinstance(v, str) else "")
def test_unsent_values_of_every_placeholder_shape_round_trip(protocol: str, cfg: EncoderConfig) -> None:
    """Unchanged TOAST values in each shape the protocols use for them (Debezium: string, bytes, text/int/uuid/bytes
    arrays) come back as UNCHANGED, also without the message's schema part."""
    from codec_cases import col
    from codec_expect import check

    from cdc.events import UNCHANGED, TableName, TableSchema

    schema = TableSchema(TableName("s", "toast"), (
        col("id", 20, "int8", key=True), col("t", 25, "text"), col("b", 17, "bytea"), col("j", 3802, "jsonb"),
        col("ta", 1009, "text", array=True), col("ia", 1016, "int8", array=True),
        col("ua", 2951, "uuid", array=True), col("ba", 1001, "bytea", array=True)), ("id",))
    new = {"id": 1, **{c.name: UNCHANGED for c in schema.columns[1:]}}
    check(protocol, cfg, [RowChange(OpType.UPDATE, schema, 7, 1.0, new, None)])


@pytest.mark.unit
@pytest.mark.parametrize(("protocol", "cfg"), VARIANTS, ids=lambda v: v if isinstance(v, str) else "")
def test_table_without_a_key_round_trips(protocol: str, cfg: EncoderConfig) -> None:
    """REPLICA IDENTITY FULL without a key: no key anywhere (canal pkNames null, Debezium key null, no handle-key
    flag), full old rows."""
    from codec_cases import col
    from codec_expect import check

    from cdc.events import TableName, TableSchema

    schema = TableSchema(TableName("s", "log"), (col("at", 1184, "timestamptz"), col("msg", 25, "text")),
                         ("at", "msg"), replica_identity="f", has_key=False)
    a = {"at": None, "msg": "x"}
    b = {"at": None, "msg": "y"}
    check(protocol, cfg, [RowChange(OpType.INSERT, schema, 1, 1.0, dict(a)),
                          RowChange(OpType.UPDATE, schema, 2, 1.0, dict(b), dict(a)),
                          RowChange(OpType.DELETE, schema, 3, 1.0, None, dict(b))])


@pytest.mark.unit
@pytest.mark.parametrize("protocol", ["canal-json", "open-protocol"])
def test_key_only_messages_for_large_rows(protocol: str) -> None:
    """TiCDC's handle-key-only and claim-check forms: the key columns only, marked, decodable."""
    big = RowChange(OpType.UPDATE, KV, 42, 1.0, {"id": 2, "body": "x" * 10_000, "n": 1}, {"id": 1})
    enc, dec = encoder_for(protocol, BASE), decoder_for(protocol, BASE)
    full = enc.encode_key_only(big)
    assert full.size < 400 and full.row_key == (1,)
    (ev,) = dec.decode(full.key, full.value)
    assert (ev.op, ev.values, ev.old, ev.extra) == (OpType.UPDATE, {"id": 2}, {"id": 1}, {"onlyHandleKey": True})
    cc = enc.encode_key_only(big, "s3://bucket/cc/0001.json")
    (ev,) = dec.decode(cc.key, cc.value)
    assert ev.extra == {"claimCheckLocation": "s3://bucket/cc/0001.json"} and ev.values == {"id": 2}


@pytest.mark.unit
def test_protocols_without_a_key_only_form_refuse_it() -> None:
    from sinks.codec import EncodeError

    change = RowChange(OpType.INSERT, KV, 42, 1.0, {"id": 2, "body": "x", "n": 1})
    for protocol in ("debezium", "csv"):
        with pytest.raises(EncodeError, match="key-only"):
            encoder_for(protocol, BASE).encode_key_only(change)
    with pytest.raises(EncodeError, match="enable-tidb-extension"):
        encoder_for("canal-json", replace(BASE, enable_tidb_extension=False)).encode_key_only(change)


@pytest.mark.unit
def test_key_only_bytes_are_ticdcs() -> None:
    gone = RowChange(OpType.DELETE, KV, 42, 1.0, None, {"id": 1})
    canal = encoder_for("canal-json", BASE, clock=lambda: 2.0)
    assert canal.encode_key_only(gone).value == (
        b'{"id":0,"database":"app","table":"kv","pkNames":["id"],"isDdl":false,"type":"DELETE","es":1000,"ts":2000,'
        b'"sql":"","sqlType":{"id":-5},"mysqlType":{"id":"bigint"},"old":null,"data":[{"id":"1"}],'
        b'"_tidb":{"commitTs":42,"onlyHandleKey":true}}')
    open_ = encoder_for("open-protocol", BASE)
    m = open_.encode_key_only(gone, "loc")
    assert m.key == b"\0" * 7 + b"\1" + b"\0" * 7 + b'2{"ts":42,"scm":"app","tbl":"kv","t":1,"ccl":"loc"}'
    assert m.value == b"\0" * 7 + b'*{"d":{"id":{"t":8,"h":true,"f":11,"v":1}}}'
