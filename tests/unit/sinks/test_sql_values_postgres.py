"""PostgreSQL value converters: what psycopg2 would otherwise send wrongly."""

import math
from decimal import Decimal

import pytest

from cdc.events import ColumnSchema
from sinks.sql.dialect.values import converter

pytestmark = pytest.mark.unit


def conv(base: str):  # type: ignore[no-untyped-def]
    c = converter(ColumnSchema("x", 0, base, False, base), "postgresql", table="t")
    assert c is not None
    return c


def test_float8_negative_zero_keeps_its_sign_as_text() -> None:
    f = conv("float8")
    assert f(-0.0) == "-0"
    for v in (0.0, 1.5, -2.25, math.inf, None, Decimal("1.5")):
        assert f(v) is v  # psycopg2's own adaptation (NaN/Infinity included)
    assert math.isnan(f(math.nan))


def test_float4_is_sent_as_text() -> None:
    f = conv("float4")
    assert (f(-0.0), f(1.5), f(math.nan), f(-math.inf)) == ("-0.0", "1.5", "NaN", "-Infinity")
