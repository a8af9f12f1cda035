"""What a decoder must give back for a row change, per protocol: the round-trip oracle of the codec tests.

It states each protocol's documented losses (docs/sinks.md, "Formats") and nothing more: a key-only old image
without REPLICA IDENTITY FULL, Debezium's UTC-normalised timetz and approximate interval, CSV's placeholders for
unsent columns.
"""

from __future__ import annotations

import math
from decimal import Decimal
from typing import Any

from cdc.events import UNCHANGED, OpType, RowChange, TableSchema, is_snapshot
from sinks.codec import DecodedEvent, EncoderConfig, MessageKind, decoder_for, encoder_for
from sinks.codec import debezium_values as D


def same(a: Any, b: Any) -> bool:
    """Equality with NaN equal to NaN (floats and Decimals) and exact types for numbers."""
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    if isinstance(a, Decimal) and isinstance(b, Decimal):
        return (a.is_nan() and b.is_nan()) or (a == b and a.as_tuple().exponent == b.as_tuple().exponent)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if type(a) is not type(b) and not (a is None or b is None):
        return False
    return a == b


def _full(schema: TableSchema, d: dict[str, Any] | None) -> bool:
    return d is not None and len(d) >= len(schema.columns)


def _debezium_value(schema: TableSchema, name: str, v: Any, cfg: EncoderConfig) -> Any:
    if v is None or v is UNCHANGED:
        return v
    base = schema.column(name).base_type
    if base == "timetz":
        return D.zoned_time(v)
    if base == "interval":
        return D.iso_interval(v) if cfg.interval_handling_mode == "string" else D.micro_duration(v)
    return v


def _row(schema: TableSchema, d: dict[str, Any] | None, protocol: str, cfg: EncoderConfig,
         fill: Any = None) -> dict[str, Any] | None:
    """``d`` as the decoder returns a complete row (missing columns: ``fill``)."""
    if d is None:
        return None
    out = {c.name: d.get(c.name, fill) for c in schema.columns}
    if protocol == "debezium":
        out = {k: _debezium_value(schema, k, v, cfg) for k, v in out.items()}
    return out


def _key_only(schema: TableSchema, known: dict[str, Any]) -> dict[str, Any]:
    return {k: known[k] for k in schema.key}


def expected(change: RowChange, protocol: str, cfg: EncoderConfig) -> list[dict[str, Any]]:
    """The decoded events (as dicts of DecodedEvent fields) that ``change`` must come back as."""
    s, op = change.schema, change.op
    ts = change.commit_ts
    if protocol == "canal-json" and not cfg.enable_tidb_extension:
        ts = None
    if protocol == "csv" and not cfg.csv_include_commit_ts:
        ts = None
    ev: dict[str, Any] = {"kind": MessageKind.ROW, "table": s.name, "op": op, "commit_ts": ts}
    new, prev = (change.values if op in (OpType.INSERT, OpType.UPDATE) else None), change.old_values
    if op is OpType.TRUNCATE:
        if protocol == "debezium":
            return [{**ev, "key": None, "values": None, "old": None}]
        return [{**ev, "kind": MessageKind.DDL, "key": None, "values": None, "old": None}]
    if op is OpType.INSERT:
        key = _key_only(s, new) if s.has_key else None
        return [{**ev, "key": key, "values": _row(s, new, protocol, cfg), "old": None,
                 "snapshot": protocol == "debezium" and is_snapshot(change)}]
    assert s.has_key or _full(s, prev)
    old_key = _key_only(s, {**(new or {}), **(prev or {})}) if s.has_key else None
    if protocol == "debezium":
        if op is OpType.UPDATE and prev is not None and s.has_key and old_key != _key_only(s, new):
            return [{**ev, "op": OpType.DELETE, "key": old_key, "values": None, "old": _row(s, prev, protocol, cfg)},
                    {**ev, "op": OpType.INSERT, "key": _key_only(s, new), "values": _row(s, new, protocol, cfg),
                     "old": None}]
        if op is OpType.DELETE:
            return [{**ev, "key": old_key, "values": None, "old": _row(s, prev, protocol, cfg)}]
        old = _row(s, prev, protocol, cfg) if _full(s, prev) else None
        return [{**ev, "key": _key_only(s, new) if s.has_key else None, "values": _row(s, new, protocol, cfg),
                 "old": old}]
    if protocol == "csv":
        if op is OpType.DELETE:
            return [{**ev, "key": old_key, "values": None, "old": _row(s, prev, protocol, cfg, UNCHANGED)}]
        if not cfg.csv_output_old_value:
            return [{**ev, "key": _key_only(s, new) if s.has_key else None, "values": _row(s, new, protocol, cfg),
                     "old": None}]
        old = _row(s, prev, protocol, cfg) if _full(s, prev) else {**_row(s, {}, protocol, cfg, UNCHANGED),
                                                                     **(old_key or {})}
        return [{**ev, "key": old_key, "values": _row(s, new, protocol, cfg), "old": old}]
    # canal-json, open-protocol: the old image is complete or the key columns
    old = _row(s, prev, protocol, cfg) if _full(s, prev) else old_key
    if op is OpType.DELETE:
        return [{**ev, "key": old_key, "values": None, "old": old}]
    return [{**ev, "key": old_key, "values": _row(s, new, protocol, cfg), "old": old}]


def as_dict(e: DecodedEvent) -> dict[str, Any]:
    return {"kind": e.kind, "table": e.table, "op": e.op, "commit_ts": e.commit_ts, "key": e.key,
            "values": e.values, "old": e.old, "snapshot": e.snapshot}


def round_trip(protocol: str, cfg: EncoderConfig, changes: list[RowChange], *,
               with_schemas: bool = True) -> list[DecodedEvent]:
    """Encode ``changes`` (one build) and decode every message; tombstones are dropped."""
    enc = encoder_for(protocol, cfg)
    enc.append_rows(changes)
    schemas = {c.schema.name: c.schema for c in changes}
    dec = decoder_for(protocol, cfg, schemas=schemas.get if with_schemas else None)
    out: list[DecodedEvent] = []
    for m in enc.build():
        out += [e for e in dec.decode(m.key, m.value) if e.kind is not MessageKind.TOMBSTONE]
    return out


def check(protocol: str, cfg: EncoderConfig, changes: list[RowChange]) -> None:
    got = [as_dict(e) for e in round_trip(protocol, cfg, changes)]
    want = [w for c in changes for w in expected(c, protocol, cfg)]
    assert len(got) == len(want), (got, want)
    for g, w in zip(got, want, strict=True):
        w = {"snapshot": False, **w}
        for k, v in w.items():
            assert same(g[k], v), f"{protocol}: {k}: got {g[k]!r}, want {v!r}"
