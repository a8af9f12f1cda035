"""Property-style round trips: random tables (a random subset of the types), random rows (NULLs, special values,
unchanged TOAST values) and random insert/update/delete sequences under REPLICA IDENTITY FULL and DEFAULT, through
every protocol: what the decoder returns equals what the protocol promises to keep (``codec_expect``).
Deterministic (``derandomize``) so that a failure reproduces; hypothesis prints the falsifying example."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

import pytest
from codec_cases import col, numeric_typmod
from codec_expect import check
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdc.events import UNCHANGED, OpType, RowChange, TableName, TableSchema
from sinks.codec import EncoderConfig

_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=20)


def _decimal(places: int | None, allow_special: bool) -> st.SearchStrategy[Decimal]:
    if places is None:
        base = st.decimals(allow_nan=False, allow_infinity=False, min_value=Decimal("-1e30"),
                           max_value=Decimal("1e30"))
        base = base.map(lambda d: Decimal(format(d, "f")))  # PostgreSQL's text has no exponent
        if allow_special:
            base = base | st.sampled_from([Decimal("NaN"), Decimal("Infinity"), Decimal("-Infinity")])
        return base
    return st.decimals(min_value=-10**6, max_value=10**6, places=places, allow_nan=False, allow_infinity=False)


# (column, value strategy, may be UNCHANGED)
def _types(allow_special_numeric: bool) -> list[tuple[Any, st.SearchStrategy[Any], bool]]:
    return [
        (col("c_int2", 21, "int2"), st.integers(-(2**15), 2**15 - 1), False),
        (col("c_int4", 23, "int4"), st.integers(-(2**31), 2**31 - 1), False),
        (col("c_int8", 20, "int8"), st.integers(-(2**63), 2**63 - 1), False),
        (col("c_num", 1700, "numeric", typmod=numeric_typmod(12, 4)), _decimal(4, False), False),
        (col("c_numf", 1700, "numeric"), _decimal(None, allow_special_numeric), False),
        (col("c_f8", 701, "float8"), st.floats(), False),
        (col("c_f4", 700, "float4"), st.floats(width=32), False),
        (col("c_bool", 16, "bool"), st.booleans(), False),
        (col("c_text", 25, "text"), _text, True),
        (col("c_vc", 1043, "varchar", typmod=54), _text, False),
        (col("c_bytea", 17, "bytea"), st.binary(max_size=16), True),
        (col("c_date", 1082, "date"), st.dates() | st.sampled_from(["infinity", "-infinity", "0044-03-15 BC"]), False),
        (col("c_time", 1083, "time"), st.times() | st.just("24:00:00"), False),
        (col("c_ts", 1114, "timestamp"), st.datetimes() | st.sampled_from(["infinity", "-infinity"]), False),
        (col("c_tstz", 1184, "timestamptz"), st.datetimes(timezones=st.just(dt.UTC)) | st.just("infinity"), False),
        (col("c_uuid", 2950, "uuid"), st.uuids(), False),
        (col("c_jsonb", 3802, "jsonb"), st.sampled_from(['{}', '{"a": 1}', '[1, "x<y&z"]', "null"]), True),
        (col("c_interval", 1186, "interval"), st.sampled_from(
            ["00:00:00", "1 day", "-2 years -3 mons", "3 days 04:05:06.5", "-1 days +23:59:59.999999"]), False),
        (col("c_timetz", 1266, "timetz"), st.sampled_from(["00:00:00+00", "23:59:59.5-07", "12:00:00+05:30"]), False),
        (col("c_ints", 1007, "int4", array=True), st.lists(st.none() | st.integers(-(2**31), 2**31 - 1), max_size=4),
         True),
        (col("c_texts", 1009, "text", array=True), st.lists(st.none() | _text, max_size=4), True),
        (col("c_enum", 16500, "mood"), st.sampled_from(["ok", "sad"]), False),
    ]


@st.composite
def scenarios(draw: st.DrawFn, allow_special_numeric: bool) -> list[RowChange]:
    types = _types(allow_special_numeric)
    picked = draw(st.lists(st.sampled_from(range(len(types))), min_size=1, max_size=8, unique=True))
    cols = [types[i] for i in sorted(picked)]
    full = draw(st.booleans())
    schema = TableSchema(TableName("s", "t"), (col("id", 20, "int8", key=True), *(c for c, _, _ in cols)), ("id",),
                         replica_identity="f" if full else "d", relation_id=1, version=draw(st.integers(0, 3)))

    def row(key: int, allow_unchanged: bool) -> dict[str, Any]:
        out: dict[str, Any] = {"id": key}
        for c, strategy, toastable in cols:
            if allow_unchanged and toastable and draw(st.integers(0, 2)) == 0:
                out[c.name] = UNCHANGED
            else:
                out[c.name] = draw(st.none() | strategy)
        return out

    changes: list[RowChange] = []
    live: dict[int, dict[str, Any]] = {}
    ts = 100
    for _ in range(draw(st.integers(1, 6))):
        ts += draw(st.integers(1, 3))
        op = draw(st.sampled_from(["insert", "update", "delete"])) if live else "insert"
        if op == "insert":
            key = draw(st.integers(0, 2**40).filter(lambda k: k not in live))
            values = row(key, False)
            changes.append(RowChange(OpType.INSERT, schema, ts, ts / 10, values))
            live[key] = values
            continue
        key = draw(st.sampled_from(sorted(live)))
        old = live.pop(key)
        if op == "delete":
            changes.append(RowChange(OpType.DELETE, schema, ts, ts / 10, None, dict(old) if full else {"id": key}))
            continue
        new_key = key if draw(st.booleans()) else draw(st.integers(0, 2**40).filter(lambda k: k not in live))
        new = row(new_key, not full)
        if full:
            new = {k: old[k] if v is UNCHANGED else v for k, v in new.items()}
            prev: dict[str, Any] | None = dict(old)
        else:
            prev = {"id": key} if new_key != key else None
        changes.append(RowChange(OpType.UPDATE, schema, ts, ts / 10, new, prev))
        live[new_key] = {k: old[k] if v is UNCHANGED else v for k, v in new.items()}
    return changes


PROTOCOL_CONFIGS = [
    ("canal-json", EncoderConfig()),
    ("open-protocol", EncoderConfig(max_batch_size=3)),
    ("debezium", EncoderConfig()),
    ("debezium", EncoderConfig(schemas_enable=False, decimal_handling_mode="string", interval_handling_mode="string")),
    ("csv", EncoderConfig()),
    ("csv", EncoderConfig(csv_output_old_value=True, csv_quote="")),
]


@pytest.mark.unit
@pytest.mark.parametrize(("protocol", "cfg"), PROTOCOL_CONFIGS, ids=lambda v: v if isinstance(v, str) else "")
def test_random_rows_round_trip(protocol: str, cfg: EncoderConfig) -> None:
    special = protocol != "debezium" or cfg.decimal_handling_mode == "string"

    @settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
    @given(scenarios(special))
    def run(changes: list[RowChange]) -> None:
        check(protocol, cfg, changes)

    run()
