"""MySQL's binary JSON (upstream.mysql.json_binary) from hand-built values, and MySQL GTID sets (upstream.mysql.resume):
the small and large container formats, inlined and offset values, escapes, doubles as my_gcvt prints them,
malformed values refused; GTID sets parse, merge and print as MySQL does, and tokens carry them. The real server's
text is the reference in tests/integration/test_mysql8_json.py."""

from __future__ import annotations

import struct

import pytest

from cdc.errors import DecodeError
from upstream.mysql.json_binary import JsonBinaryError, mysql_double, to_text
from upstream.mysql.resume import MysqlGtidSet, ResumePoint, is_mysql_gtid, uuid_text

pytestmark = pytest.mark.unit


def _small_object(pairs: list[tuple[bytes, int, bytes]]) -> bytes:
    """A small object of (key, value type, inlined 2-byte value or an offset value's bytes)."""
    n = len(pairs)
    header = 4 + n * 4 + n * 3
    keys = b"".join(k for k, _, _ in pairs)
    body = bytearray()
    key_entries, value_entries = bytearray(), bytearray()
    koff = header
    voff = header + len(keys)
    for k, t, v in pairs:
        key_entries += struct.pack("<HH", koff, len(k))
        koff += len(k)
        if t in (0x04, 0x05, 0x06):
            value_entries += bytes([t]) + v
        else:
            value_entries += bytes([t]) + struct.pack("<H", voff + len(body))
            body += v
    size = header + len(keys) + len(body)
    return bytes([0x00]) + struct.pack("<HH", n, size) + key_entries + value_entries + keys + body


def test_objects_arrays_and_scalars_print_as_mysql_prints_them() -> None:
    doc = _small_object([(b"a", 0x05, struct.pack("<h", -7)), (b"bb", 0x04, b"\x01\x00"),
                         (b"ccc", 0x0C, bytes([4]) + b'q"\n\x01'), (b"dddd", 0x0B, struct.pack("<d", 3.0))])
    assert to_text(doc) == '{"a": -7, "bb": true, "ccc": "q\\"\\n\\u0001", "dddd": 3.0}'
    # a large array (4-byte offsets): an inlined int32 and a uint64 at an offset
    arr = bytes([0x03]) + struct.pack("<II", 2, 8 + 10 + 8) + bytes([0x07]) + struct.pack("<i", -2**31) \
        + bytes([0x0A]) + struct.pack("<I", 18) + struct.pack("<Q", 2**64 - 1)
    assert to_text(arr) == "[-2147483648, 18446744073709551615]"
    assert to_text(b"") == "null" and to_text(b"\x04\x02") == "false"
    assert to_text(b"\x0c\x03\xc3\xa9x") == '"éx"'


def test_opaque_decimals_and_temporal_values() -> None:
    dec = bytes([0x0F, 246, 4, 4, 2, 0x81, 0x32])  # DECIMAL(4,2) 1.50: length 4, precision, scale, binary
    assert to_text(dec) == "1.50"
    ymd = ((2024 * 13 + 2) << 5) | 29
    hms = (23 << 12) | (59 << 6) | 58
    packed = (((ymd << 17) | hms) << 24) + 123456
    assert to_text(bytes([0x0F, 12, 8]) + struct.pack("<q", packed)) == '"2024-02-29 23:59:58.123456"'
    assert to_text(bytes([0x0F, 10, 8]) + struct.pack("<q", (ymd << 17) << 24)) == '"2024-02-29"'
    assert to_text(bytes([0x0F, 15, 2]) + b"\x00\xff").startswith('"base64:type15:AP8=')


@pytest.mark.parametrize(("value", "text"), [
    (0.0, "0.0"), (3.0, "3.0"), (-1.5, "-1.5"), (0.1, "0.1"), (1e300, "1e300"), (1e15, "1e15"),
    (123456789012345.0, "123456789012345.0"), (2.5e-5, "0.000025"), (1.5e-14, "0.000000000000015"),
    (1e-15, "0.000000000000001"), (1e-16, "1e-16"), (5e-324, "5e-324"), (0.30000000000000004, "0.30000000000000004"), (1e21, "1e21"),
])
def test_doubles_follow_my_gcvt(value: float, text: str) -> None:
    assert mysql_double(value) == text


def test_malformed_values_are_refused() -> None:
    with pytest.raises(JsonBinaryError):
        to_text(b"\x0c\x05ab")  # a string longer than its value
    with pytest.raises(JsonBinaryError):
        to_text(b"\x7f")
    with pytest.raises(JsonBinaryError):
        to_text(bytes([0x02]) + struct.pack("<HH", 1, 200))  # an array larger than its value


def test_mysql_gtid_sets_parse_merge_and_print_as_mysql_does() -> None:
    u1, u2 = "3E11FA47-71CA-11E1-9E33-C80AA9429562", "0ab5f9c4-71ca-11e1-9e33-c80aa9429562"
    s = MysqlGtidSet.parse(f"{u1}:1-5:7,\n{u2}:3")
    assert str(s) == f"{u2}:3,{u1.lower()}:1-5:7"
    s.add(u1.lower(), 6)
    s.add(u2, 4)
    s.add(u2, 4)
    assert str(s) == f"{u2}:3-4,{u1.lower()}:1-7"
    assert str(MysqlGtidSet.parse("")) == "" and is_mysql_gtid(str(s)) and not is_mysql_gtid("0-1-5")
    assert uuid_text(bytes.fromhex(u1.replace("-", ""))) == u1.lower()
    for bad in ("nouuid:1", f"{u1}:x-3", f"{u1}"):
        with pytest.raises(DecodeError):
            MysqlGtidSet.parse(bad)
    token = ResumePoint(0, 1, "mysql-bin.000002", 155, str(s)).encode()
    assert ResumePoint.decode(token).gtid == str(s)
