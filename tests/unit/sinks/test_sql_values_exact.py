"""Values exactly as upstream (issue 8 item 7), at the converter and type-mapping level: numeric text without
exponent notation or lost zeros, arrays with lower bounds kept or refused per target, enums and domains on
PostgreSQL targets, and the row-by-row compare's exactness. Real servers: tests/integration/test_values_exact.py."""

from __future__ import annotations

import datetime as dt
import math
from decimal import Decimal
from typing import Any

import pytest

from cdc.errors import SinkError
from cdc.events import ColumnSchema, TableName, TableSchema
from playground.compare import exact_number, norm, norm_numeric, rows_equal, text_exact, with_bounds
from sinks.sql.dialect.typemap import plan_table
from sinks.sql.dialect.values import checks_every_value, converter, decimal_text, fast_path, text_path
from upstream.postgres.types import parser_for

pytestmark = pytest.mark.unit

# numeric_out texts (what pgoutput sends) whose Decimal str() differs or is easy to get wrong
NUMERIC_TEXTS = ["0", "0.0000001", "0.00000000", "-0.0000001234", "1.50", "100", "1200", "0.000001",
                 "123456789012345678901234567890.123456789012345678901234567890", "-1", "NaN", "Infinity",
                 "-Infinity", "0." + "0" * 40 + "1", "9" * 60]


def col(name: str, base: str, *, array: bool = False, type_name: str = "", typmod: int = -1) -> ColumnSchema:
    return ColumnSchema(name, 0, base, array, type_name, typmod)


def conv(c: ColumnSchema, dialect: str, scale: int | None = None) -> Any:
    f = converter(c, dialect, table="public.t", scale=scale)
    assert f is not None
    return f


@pytest.mark.parametrize("text", NUMERIC_TEXTS)
def test_sqlite_numeric_is_the_upstream_text_on_every_path(text: str) -> None:
    value = parser_for("numeric", False)(text)
    f = conv(col("n", "numeric"), "sqlite")
    assert f(value) == text
    assert decimal_text(value) == text
    typ, fast = fast_path(f) or (None, None)
    assert typ is Decimal and fast is not None and fast(value) == text
    typ, from_text = text_path(f) or (None, None)
    assert typ is Decimal and from_text is not None and from_text(text) == text


def test_str_of_a_small_decimal_is_exponent_notation_which_the_sinks_never_send() -> None:
    assert str(Decimal("0.0000001")) == "1E-7"  # the trap
    assert conv(col("n", "numeric"), "sqlite")(Decimal("0.0000001")) == "0.0000001"
    assert conv(col("a", "numeric", array=True), "sqlite")([Decimal("0.0000001"), Decimal("1.50")]) == \
        '["0.0000001", "1.50"]'
    assert conv(col("a", "numeric", array=True), "postgresql")([Decimal("0.0000001")]) == '{"0.0000001"}'


def test_sqlite_and_postgres_declare_numeric_exactly() -> None:
    s = TableSchema(TableName("public", "t"), (
        ColumnSchema("id", 23, "int4", is_key=True, nullable=False),
        col("small", "numeric", type_name="numeric(10,2)", typmod=(10 << 16 | 2) + 4),
        col("free", "numeric", type_name="numeric"),
        col("neg", "numeric", type_name="numeric(3,-2)", typmod=(3 << 16 | (-2 & 0x7FF)) + 4),
    ), ("id",))
    lite = plan_table(s, "sqlite", target_schema=None, target_name="t")
    assert [c.ddl_type for c in lite.columns] == ["INTEGER", "TEXT", "TEXT", "TEXT"]  # never NUMERIC affinity
    pg = plan_table(s, "postgresql", target_schema="public", target_name="t")
    assert [(c.ddl_type, c.scale) for c in pg.columns] == [
        ("int4", None), ("numeric(10,2)", 2), ("numeric", None), ("numeric(3,-2)", None)]


def test_postgres_refuses_what_a_narrower_existing_numeric_column_would_round() -> None:
    f = conv(col("n", "numeric", type_name="numeric(12,4)", typmod=(12 << 16 | 4) + 4), "postgresql", scale=2)
    assert f(Decimal("1.20")) == Decimal("1.20")
    assert f(Decimal("1.2000")) == Decimal("1.2000")  # zeros beyond the scale lose nothing
    assert f(Decimal("Infinity")) == "Infinity"
    with pytest.raises(SinkError, match=r"public\.t.*'n'.*1\.2345.*numeric\(\.\., 2\)"):
        f(Decimal("1.2345"))
    with pytest.raises(SinkError, match=r"0\.0000001"):
        f(Decimal("0.0000001"))
    assert checks_every_value(f)  # so the upstream text must not bypass it (COPY)
    assert not checks_every_value(conv(col("n", "numeric"), "postgresql"))
    assert not checks_every_value(None)


@pytest.mark.parametrize("dialect", ["mysql", "sqlite"])
@pytest.mark.parametrize("text", ["[0:2]={1,2,3}", "[0:1][2:3]={{1,2},{3,4}}", "[-5:-4]={NULL,7}"])
def test_json_targets_refuse_arrays_with_other_lower_bounds(dialect: str, text: str) -> None:
    value = parser_for("int4", True)(text)
    assert value == text  # kept as sent by the upstream parser
    f = conv(col("arr", "int4", array=True), dialect)
    with pytest.raises(SinkError, match=r"table public\.t: column 'arr' has the array .*lower bound is not 1"):
        f(value)
    assert f(parser_for("int4", True)("{{1,2},{3,4}}")) == "[[1, 2], [3, 4]]"  # default bounds: JSON


@pytest.mark.parametrize("text", ["[0:2]={1,2,3}", "[0:1][2:3]={{1,2},{3,4}}", '[0:1]={"a b",NULL}'])
def test_postgres_targets_get_the_array_text_with_its_bounds(text: str) -> None:
    value = parser_for("text", True)(text)
    assert conv(col("arr", "text", array=True), "postgresql")(value) == text


def test_enums_and_user_types_are_text_on_postgres_and_domains_their_base_type() -> None:
    s = TableSchema(TableName("public", "t"), (
        ColumnSchema("id", 23, "int4", is_key=True, nullable=False),
        ColumnSchema("mood", 16390, "text", False, "mood"),  # an enum, as the catalog reports it
        ColumnSchema("moods", 16389, "text", True, "mood[]"),
        ColumnSchema("ci", 16400, "text", False, "citext"),
        ColumnSchema("amount", 16410, "numeric", False, "numeric(10,2)", (10 << 16 | 2) + 4),  # a domain
        ColumnSchema("ids", 16420, "int4", True, "integer[]"),  # a domain over integer[]
    ), ("id",))
    pg = plan_table(s, "postgresql", target_schema="public", target_name="t")
    assert [c.ddl_type for c in pg.columns] == ["int4", "text", "text[]", "text", "numeric(10,2)", "integer[]"]
    my = plan_table(s, "mysql", target_schema=None, target_name="t")
    assert [c.ddl_type for c in my.columns][1:5] == ["LONGTEXT", "JSON", "LONGTEXT", "DECIMAL(10,2)"]


# ---- the row-by-row compare is exact ---------------------------------------------------------------
def test_compare_numbers_exactly() -> None:
    assert exact_number(Decimal("1.50")) == "1.5" and exact_number(Decimal("0E-8")) == "0"
    big = "12345678901234567890.1234567890123"  # 33 digits: normalize() would round it to 28
    assert exact_number(Decimal(big)) == big != exact_number(Decimal(big[:-1] + "4"))
    assert norm_numeric("0.0000001") == norm(Decimal("0.0000001")) == "0.0000001"
    assert norm_numeric(1e-07) != norm(Decimal("0.0000001"))  # a REAL is not the decimal
    assert not rows_equal((0.1,), (0.1000001,))  # no float tolerance
    assert rows_equal((-0.0,), (0.0,))  # MariaDB and SQLite drop the sign of zero (documented)
    assert rows_equal((norm(math.nan),), (norm("NaN"),)) and norm(Decimal("NaN")) == "NaN"
    assert norm(math.inf) == norm_numeric("Infinity") == norm(Decimal("Infinity"))


def test_compare_numeric_text_exactly() -> None:
    src = (Decimal("1.50"), Decimal("0.0000001"))
    assert text_exact(src, ("1.50", "0.0000001"), [0, 1])
    assert not text_exact(src, ("1.5", "0.0000001"), [0, 1])  # trailing zero lost
    assert not text_exact(src, ("1.50", "1E-7"), [0, 1])  # exponent notation
    assert text_exact(src, (Decimal("1.500"), Decimal("1E-7")), [0, 1])  # typed DECIMAL: by value


def test_compare_arrays_with_bounds_and_json_elements() -> None:
    assert with_bounds(norm([1, 2, 3]), "[1:3]") == norm([1, 2, 3])
    assert with_bounds(norm([1, 2, 3]), "[0:2]") != norm([1, 2, 3])
    assert with_bounds(norm([[1], [2]]), "[1:2][0:0]") != norm([[1], [2]])
    assert with_bounds(None, "[0:2]") is None
    ts = dt.datetime(2024, 2, 29, 10, 0, 0, 5, tzinfo=dt.UTC)
    assert norm([Decimal("1.50"), ts, b"\x01", -0.0, math.nan]) == \
        norm('["1.50", "2024-02-29 10:00:00.000005+00:00", "\\\\x01", 0.0, "NaN"]')
    assert norm([Decimal("1.50")]) != norm('["1.5"]')  # array elements keep their scale
