"""RowChange.row (the mounter's positional fast path) against the dict path: the SQL sink must send the very
same statements and parameters for every column type and dialect, and RowChange must keep behaving like a
plain dataclass whose ``values`` is built from ``row`` on demand."""

from __future__ import annotations

import dataclasses
import pickle
import struct
from typing import Any

import pytest

from cdc.events import UNCHANGED, ColumnSchema, OpType, RowChange, TableName, TableSchema
from processor.mounter import Mounter
from sinks.sql.sink import SQLSink
from tests.sql_sink_fakes import URIS, FakeCursor, assume_tables, fake_connection
from upstream.base import encode_payload
from upstream.postgres.source import PgChangeDecoder

pytestmark = pytest.mark.unit

RELID = 4242

# (name, base type, is_array, text sent by pgoutput) — one column per converter the sink has.
COLUMNS: tuple[tuple[str, str, bool, str | None], ...] = (
    ("id", "int4", False, "7"),
    ("i2", "int2", False, "-3"),
    ("i8", "int8", False, "9223372036854775807"),
    ("x8", "xid8", False, "18446744073709551615"),
    ("n", "numeric", False, "1234.50"),
    ("f4", "float4", False, "1.5"),
    ("f8", "float8", False, "-2.25e-07"),
    ("b", "bool", False, "t"),
    ("t", "text", False, "it's a \"text\" \\ with % and ?"),
    ("vc", "varchar", False, "héllo"),
    ("by", "bytea", False, "\\x00ff10"),
    ("d", "date", False, "2026-11-22"),
    ("tm", "time", False, "01:02:03.5"),
    ("ts", "timestamp", False, "2026-11-22 01:02:03"),
    ("tz", "timestamptz", False, "2026-11-22 01:02:03.123456+00"),
    ("tz2", "timestamptz", False, "2026-11-22 23:30:00+05:30"),
    ("tzinf", "timestamptz", False, "infinity"),
    ("tz3", "timestamptz", False, "2026-11-22 01:02:03+00"),
    ("tz4", "timestamptz", False, "0001-01-01 00:00:00.5+00"),
    ("tzbc", "timestamptz", False, "0044-03-15 01:02:03+00 BC"),
    ("ts2", "timestamp", False, "2026-11-22 01:02:03.12"),
    ("ts3", "timestamp", False, "9999-12-31 23:59:59.999999"),
    ("u", "uuid", False, "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"),
    ("j", "json", False, '{"a": [1, 2]}'),
    ("jb", "jsonb", False, '{"a": 1}'),
    ("iv", "interval", False, "1 day 02:00:00"),
    ("ia", "int4", True, "{1,NULL,3}"),
    ("ta", "text", True, '{"a b",c,NULL}'),
    ("nul", "text", False, None),
)


def schema() -> TableSchema:
    cols = tuple(ColumnSchema(n, 0, base, arr, type_name=base, nullable=n != "id", is_key=n == "id")
                 for n, base, arr, _ in COLUMNS)
    return TableSchema(TableName("public", "t"), cols, ("id",), "d", RELID, version=1)


def tupledata(values: list[str | None]) -> bytes:
    out = [struct.pack(">h", len(values))]
    for v in values:
        if v is None:
            out.append(b"n")
        else:
            data = v.encode()
            out.append(b"t" + struct.pack(">i", len(data)) + data)
    return b"".join(out)


def mounted(s: TableSchema, kind: bytes, key: int) -> RowChange:
    texts = [str(key)] + [t for _, _, _, t in COLUMNS[1:]]
    raw = kind + struct.pack(">I", RELID) + b"N" + tupledata(texts)
    return Mounter(PgChangeDecoder(lambda v: s)).mount(encode_payload(1, raw), 100, 1.5)


def send(dialect: str, s: TableSchema, changes: list[RowChange]) -> list[tuple[str, str, Any]]:
    sink = SQLSink(URIS[dialect])
    try:
        assume_tables(sink, dialect, s, target_name="t")
        cur = FakeCursor()
        conn = fake_connection(cur)
        sink.writer(conn).run(changes)
        return cur.calls
    finally:
        sink.close()


def as_dict(ch: RowChange) -> RowChange:
    assert ch.row is not None
    out = RowChange(ch.op, ch.schema, ch.commit_ts, ch.commit_time,
                    values=dict(zip(ch.schema.column_names, ch.row, strict=True)))
    assert out.row is None
    return out


@pytest.mark.parametrize("dialect", ["sqlite", "mysql", "postgresql"])
def test_positional_and_dict_rows_send_identical_statements(dialect: str) -> None:
    s = schema()
    changes = [mounted(s, b"I", 1), mounted(s, b"I", 2), mounted(s, b"U", 1), mounted(s, b"I", 3),
               mounted(s, b"U", 3)]
    assert all(ch.row is not None for ch in changes)
    delete = RowChange(OpType.DELETE, s, 100, old_values={"id": 2})
    changes = changes[:2] + [delete] + changes[2:]
    positional = send(dialect, s, changes)
    by_name = send(dialect, s, [ch if ch.row is None else as_dict(ch) for ch in changes])
    assert positional == by_name
    assert len(positional) == 1  # the net effect: one upsert of 1 and 3 (2 came and went)
    # every value reached the statement: the text column's value appears in the parameters or the literal
    flat = repr(positional)
    assert "with % and" in flat and "a0eebc99" in flat


@pytest.mark.parametrize("dialect", ["sqlite", "mysql", "postgresql"])
def test_positional_rows_group_with_dict_rows(dialect: str) -> None:
    """A dict row with every column in schema order joins the positional rows' statement, and vice versa."""
    s = schema()
    a, b, c = mounted(s, b"I", 1), mounted(s, b"I", 2), mounted(s, b"I", 3)
    mixed = send(dialect, s, [a, as_dict(b), c])
    assert len(mixed) == 1
    assert mixed == send(dialect, s, [as_dict(a), as_dict(b), as_dict(c)])


def test_mounter_sets_row_only_when_complete() -> None:
    s = schema()
    ins = mounted(s, b"I", 5)
    assert ins.row is not None and len(ins.row) == len(COLUMNS)
    assert ins.values == dict(zip(s.column_names, ins.row, strict=True))
    assert ins.values["id"] == 5 and ins.values["nul"] is None
    # an update with an UNCHANGED column has no positional row
    texts = tupledata(["5"] + [t for _, _, _, t in COLUMNS[1:]])
    raw = b"U" + struct.pack(">I", RELID) + b"N" + texts
    raw_unch = b"U" + struct.pack(">I", RELID) + b"N" + struct.pack(">h", len(COLUMNS)) + b"t\x00\x00\x00\x015" + b"u" * (
        len(COLUMNS) - 1)
    upd = Mounter(PgChangeDecoder(lambda v: s)).mount(encode_payload(1, raw_unch), 100, 1.5)
    assert upd.row is None and upd.values is not None and upd.values["t"] is UNCHANGED
    assert Mounter(PgChangeDecoder(lambda v: s)).mount(encode_payload(1, raw), 100, 1.5).row is not None


def test_row_change_values_is_lazy_and_consistent() -> None:
    s = schema()
    ch = mounted(s, b"I", 9)
    built = ch.values
    assert ch.values is built  # built once
    plain = as_dict(ch)
    assert ch == plain and repr(ch) == repr(plain)
    assert pickle.loads(pickle.dumps(ch)) == plain
    assert dataclasses.replace(ch, commit_ts=1).values == built
    ch.values = {"id": 10}
    assert ch.row is None and ch.values == {"id": 10}  # assigning values drops the positional row
    given = RowChange(OpType.INSERT, s, 1, values={"id": 1})
    assert given.row is None and given.values == {"id": 1}
    empty = RowChange(OpType.DELETE, s, 1, old_values={"id": 1})
    assert empty.values is None and empty.row is None


TEXTS = ["2026-11-22 01:02:03", "2026-11-22 01:02:03.1", "2026-11-22 01:02:03.12", "2026-11-22 01:02:03.123",
         "2026-11-22 01:02:03.1234", "2026-11-22 01:02:03.12345", "2026-11-22 01:02:03.123456",
         "0001-01-01 00:00:00", "9999-12-31 23:59:59.999999", "2000-02-29 12:00:00.000001"]


@pytest.mark.parametrize("text", TEXTS)
def test_timestamp_text_paths_equal_formatting_the_parsed_value(text: str) -> None:
    from sinks.sql.dialect.values import temporal_text, timestamp_text, timestamptz_text
    from upstream.postgres.types import parser_for

    for base, t, g in (("timestamp", text, timestamp_text), ("timestamptz", text + "+00", timestamptz_text)):
        value = parser_for(base, False)(t)
        assert g(t) == temporal_text(value), (base, t)


@pytest.mark.parametrize("text", ["infinity", "-infinity", "2026-11-22 01:02:03+05:30", "2026-11-22 01:02:03+00 BC",
                                  "2026-11-22T01:02:03+00", "2026-11-22 01:02:03,5+00", "2026-W47-7 01:02:03+00",
                                  "2026-11-22 01:02+00", "2026-11-22 01:02:03.+00", "2026-11-22 01:02:03.1234567+00",
                                  "12026-11-22 01:02:03+00", "2026-11-22 01:02:03"])
def test_timestamptz_text_path_declines_other_shapes(text: str) -> None:
    from sinks.sql.dialect.values import timestamptz_text

    assert timestamptz_text(text) is None


def test_text_path_used_only_when_every_row_has_text() -> None:
    """A dict row joining a group of positional rows switches the group to formatting values: same result."""
    s = schema()
    a, b = mounted(s, b"I", 1), mounted(s, b"I", 2)
    assert a.row_text is not None
    assert send("sqlite", s, [a, as_dict(b)]) == send("sqlite", s, [as_dict(a), b]) == send("sqlite", s, [a, b])


def whole_update(s: TableSchema, key: int, old_key: int) -> RowChange:
    """An UPDATE as the MySQL mounter builds one from whole images: the new row positional with its upstream text,
    the whole old row by name (here the old row of key ``old_key``)."""
    new = mounted(s, b"I", key)
    old = mounted(s, b"I", old_key).values
    ch = RowChange(OpType.UPDATE, s, 100, 1.5, old_values=dict(old or {}))
    ch.row, ch.row_text = new.row, new.row_text
    return ch


class _CountedValues(RowChange):
    """A RowChange that counts the reads of ``values`` (the dict a positional row builds on first access)."""

    __slots__ = ()
    reads: list[int] = []

    @property  # type: ignore[override]
    def values(self) -> dict[str, Any] | None:
        _CountedValues.reads.append(1)
        return RowChange.values.fget(self)  # type: ignore[attr-defined]

    @values.setter
    def values(self, v: dict[str, Any] | None) -> None:
        RowChange.values.fset(self, v)  # type: ignore[attr-defined]


@pytest.mark.parametrize("dialect", ["sqlite", "mysql", "postgresql"])
def test_whole_updates_with_a_positional_row_send_what_their_dict_form_sends(dialect: str) -> None:
    """A MySQL update (positional new row and whole old row): in place when its key is unchanged, a key change
    otherwise; the same statements as the dict form either way."""
    s = schema()
    changes = [mounted(s, b"I", 1), whole_update(s, 1, 1), whole_update(s, 2, 2), whole_update(s, 4, 3)]
    assert all(ch.row is not None for ch in changes)
    by_name = [ch if ch.row is None else dataclasses.replace(as_dict(ch), old_values=ch.old_values) for ch in changes]
    assert send(dialect, s, changes) == send(dialect, s, by_name)


def test_a_whole_update_with_a_positional_row_is_written_without_its_dict() -> None:
    """The in-place UPDATE of a MySQL full row image reaches the statement from ``row`` (and its upstream text), as an
    insert does: ``values`` is never built."""
    s = schema()
    ch = whole_update(s, 1, 1)
    counted = _CountedValues(OpType.UPDATE, s, 100, 1.5, old_values=ch.old_values)
    counted.row, counted.row_text = ch.row, ch.row_text
    _CountedValues.reads.clear()
    calls = send("mysql", s, [counted])
    assert _CountedValues.reads == [] and len(calls) == 1 and "ON DUPLICATE KEY UPDATE" in calls[0][1]
