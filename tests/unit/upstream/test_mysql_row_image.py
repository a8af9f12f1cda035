"""upstream.mysql.row_image: which columns a row event's bitmaps leave out, and how a partial image is stored
(upstream.mysql.payload) and mounted (never as a whole row)."""

from __future__ import annotations

from cdc.events import UNCHANGED, ColumnSchema, OpType, TableName, TableSchema
from processor.mounter import Mounter
from upstream.base import encode_payload
from upstream.mysql import payload
from upstream.mysql.row_image import PartialImage, complete_after, missing_key, partial_image
from upstream.mysql.source import MySqlChangeDecoder


def test_a_full_bitmap_is_no_partial_image_whatever_its_padding_bits() -> None:
    assert partial_image(4, b"\x0f", has_before=False) is None
    assert partial_image(4, b"\xff", b"\xff", has_before=True) is None  # unused bits set
    assert partial_image(9, b"\xff\x01", b"\xff\x01", has_before=True) is None


def test_absent_columns_are_named_per_image() -> None:
    assert partial_image(4, b"\x03", has_before=False) == PartialImage((), (2, 3))  # an INSERT: its after image
    assert partial_image(4, b"\x01", has_before=True) == PartialImage((1, 2, 3), ())  # a DELETE
    assert partial_image(4, b"\x01", b"\x02", has_before=True) == PartialImage((1, 2, 3), (0, 2, 3))  # MINIMAL UPDATE
    assert partial_image(4, b"\x0b", b"\x0f", has_before=True) == PartialImage((2,), ())  # NOBLOB UPDATE writing b
    assert partial_image(10, b"\xff\x01", has_before=False) == PartialImage((), (9,))


def test_an_unwritten_after_value_comes_from_the_before_image_and_a_missing_key_is_found() -> None:
    U = UNCHANGED
    assert complete_after(["1", "5", U, "1"], [U, "6", U, U]) == ["1", "6", U, "1"]
    assert complete_after(None, [U, "6"]) == [U, "6"]
    assert missing_key(["1", U, U], [0]) == [] and missing_key([U, "x", U], [0, 2]) == [0, 2]


SCHEMA = TableSchema(TableName("d", "t"), (ColumnSchema("id", 23, "int4", nullable=False, is_key=True),
                                           ColumnSchema("a", 23, "int4"), ColumnSchema("b", 25, "text")),
                     ("id",), "d", 7, 1)


def test_a_partial_insert_mounts_without_a_whole_row_and_a_partial_old_row_as_its_key() -> None:
    U = UNCHANGED
    mount = Mounter(MySqlChangeDecoder(lambda v: SCHEMA)).mount
    ins = mount(encode_payload(1, payload.encode_partial(b"I", 7, ["1", "2", U], None)), 10, 1.0)
    assert ins.op is OpType.INSERT and ins.row is None and ins.values == {"id": 1, "a": 2, "b": U}
    upd = mount(encode_payload(1, payload.encode_partial(b"U", 7, [U, "3", U], ["1", U, U])), 11, 1.0)
    assert upd.op is OpType.UPDATE and upd.values == {"id": 1, "a": 3, "b": U} and upd.old_values == {"id": 1}
    dele = mount(encode_payload(1, payload.encode_partial(b"D", 7, None, ["1", U, U])), 12, 1.0)
    assert dele.op is OpType.DELETE and dele.old_values == {"id": 1}
    # a whole row stays what it was: positional, old row 'O'
    full = mount(encode_payload(1, payload.encode(b"U", 7, ["1", "3", None], ["1", "2", "x"])), 13, 1.0)
    assert full.old_values == {"id": 1, "a": 2, "b": "x"}
    assert payload.parse(payload.encode_partial(b"D", 7, None, ["1", None, U])).old_kind == "K"
    assert payload.parse(payload.encode(b"D", 7, None, ["1", None, "x"])).old_kind == "O"
