"""spark_jobs.verify_values: the canonical forms of the verifier are exact (a value equals its stored form on each
target and nothing else) and the chunk checksum is an order-independent multiset sum."""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal
from typing import Any

import pytest

from cdc.events import ColumnSchema, TableName, TableSchema
from spark_jobs.verify_values import INEXACT, RowForms, add_hash, column_forms, key_text, row_hash


def col(base: str, is_array: bool = False) -> ColumnSchema:
    return ColumnSchema("c", 0, base, is_array)


def same(base: str, dialect: str, upstream: Any, stored: Any, *, is_array: bool = False) -> bool:
    up, down = column_forms(col(base, is_array), dialect)
    return bool(up(upstream) == down(stored))


UTC = dt.UTC


@pytest.mark.parametrize(("base", "dialect", "upstream", "stored"), [
    ("numeric", "mysql", Decimal("1.50"), Decimal("1.500000")),  # DECIMAL(p,s) pads the scale: same value
    ("numeric", "sqlite", Decimal("1.50"), "1.50"),
    ("numeric", "sqlite", Decimal("1E-7"), "0.0000001"),
    ("float8", "mysql", -0.0, 0.0),  # documented: MariaDB drops the sign
    ("float8", "sqlite", float("nan"), "NaN"),
    ("float4", "mysql", 0.1, 0.1),
    ("bool", "mysql", True, 1),
    ("bool", "sqlite", False, 0),
    ("timestamptz", "mysql", dt.datetime(2024, 1, 1, 10, 0, 0, 500000, tzinfo=UTC), dt.datetime(2024, 1, 1, 10, 0, 0, 500000)),
    ("timestamptz", "sqlite", dt.datetime(2024, 1, 1, 10, tzinfo=UTC), "2024-01-01 10:00:00.000000+00:00"),
    ("timestamp", "sqlite", dt.datetime(2024, 1, 1, 10, 0, 0, 250000), "2024-01-01 10:00:00.250000"),
    ("time", "mysql", dt.time(10, 0, 1, 125000), dt.timedelta(hours=10, seconds=1, microseconds=125000)),
    ("date", "sqlite", dt.date(2020, 2, 29), "2020-02-29"),
    ("bytea", "mysql", b"\x00\xff", b"\x00\xff"),
    ("uuid", "mysql", __import__("uuid").UUID(int=5), "00000000-0000-0000-0000-000000000005"),
    ("jsonb", "mysql", '{"b": 1, "a": 1.50}', '{"a": 1.5, "b": 1}'),  # a JSON number by value
    ("text", "mysql", "x ", "x "),
])
def test_a_value_equals_its_stored_form(base: str, dialect: str, upstream: Any, stored: Any) -> None:
    assert same(base, dialect, upstream, stored)


@pytest.mark.parametrize(("base", "dialect", "upstream", "stored"), [
    ("numeric", "sqlite", Decimal("1.50"), "1.5"),  # the text keeps the scale on SQLite
    ("numeric", "mysql", Decimal("12345678901234567890.1234567890123"), Decimal("12345678901234567890.1234567890124")),
    ("float8", "mysql", 0.1, 0.1000000000000001),  # no tolerance
    ("timestamptz", "mysql", dt.datetime(2024, 1, 1, 10, tzinfo=UTC), dt.datetime(2024, 1, 1, 10, 0, 0, 1)),
    ("timestamptz", "mysql", dt.datetime(2024, 1, 1, 10, tzinfo=dt.timezone(dt.timedelta(hours=2))),
     dt.datetime(2024, 1, 1, 10)),  # 10:00+02 is 08:00 UTC
    ("text", "mysql", "", None),  # empty is not NULL
    ("text", "mysql", "x ", "x"),  # padding counts
    ("jsonb", "mysql", '{"a": 1}', '{"a": "1"}'),
    ("bool", "mysql", True, 0),
])
def test_a_different_value_differs(base: str, dialect: str, upstream: Any, stored: Any) -> None:
    assert not same(base, dialect, upstream, stored)


def test_arrays_as_json_and_arrays_with_bounds_are_inexact() -> None:
    assert same("numeric", "mysql", [Decimal("1.50"), None], json.dumps(["1.50", None]), is_array=True)
    assert not same("int4", "sqlite", [1, 2], "[1, 3]", is_array=True)
    up, down = column_forms(col("int4", True), "sqlite")
    assert up("[0:1]={1,2}") == INEXACT and down("[1, 2]") != INEXACT
    up, _ = column_forms(col("timestamp"), "mysql")
    assert up("infinity") == INEXACT  # the parser's text for a value no DATETIME holds


def test_postgresql_targets_compare_the_upstream_text() -> None:
    schema = TableSchema(TableName("public", "t"), (ColumnSchema("id", 23, "int4", is_key=True),
                                                     ColumnSchema("n", 1700, "numeric")), key=("id",))
    forms = RowForms(schema, "postgresql")
    assert forms.upstream((1, Decimal("1.50")), ("1", "1.50")) == ("1", "1.50")
    assert forms.target(("1", "1.5")) != forms.upstream((1, Decimal("1.50")), ("1", "1.50"))
    assert forms.key(("1", "1.50")) == ("1",)
    mysql = RowForms(schema, "mysql")
    assert mysql.key(mysql.upstream((7, Decimal("2")), ("7", "2"))) == (7,) and key_text((7,)) == ("7",)


def test_the_chunk_checksum_is_an_order_free_multiset_sum() -> None:
    rows = [("1", "a"), ("2", None), ("3", "")]
    hashes = [row_hash(r) for r in rows]
    total = 0
    for h in hashes:
        total = add_hash(total, h)
    again = 0
    for h in reversed(hashes):
        again = add_hash(again, h)
    assert total == again
    assert row_hash(("2", None)) != row_hash(("2", "")) != row_hash(("2", "None"))
    assert add_hash(total, hashes[0]) != total  # a duplicated row changes the sum (key-less tables)
    assert 0 <= add_hash((1 << 64) - 1, 5) < (1 << 64)


def test_copy_text_lines_hash_the_same_whatever_the_pieces() -> None:
    from spark_jobs.verify_chunk import LineSums

    text = b"1\ta\t\\N\n2\t\xc3\xa9\t1.50\n3\t\\\\N\t\n"
    whole = LineSums()
    whole.write(text)
    whole.close()
    for cut in range(1, len(text)):
        parts = LineSums()
        parts.write(text[:cut])
        parts.write(text[cut:].decode("utf-8", "surrogateescape").encode("utf-8", "surrogateescape"))
        parts.close()
        assert (parts.rows, parts.sum) == (whole.rows, whole.sum) == (3, whole.sum)
    other = LineSums()
    other.write(text.replace(b"1.50", b"1.5"))
    assert other.sum != whole.sum  # the text with its scale
    cut = LineSums()
    cut.write(b"1\ta\n2\tb")
    with pytest.raises(ValueError):
        cut.close()
