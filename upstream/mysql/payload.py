"""The stored form of one MySQL row change (``raw`` after the schema version, :func:`upstream.base.encode_payload`).

``kind`` (1 byte: ``I``, ``U``, ``D``), the relation id (4 bytes, big-endian), then the new row (``I``, ``U``) and
the old row (``U``, ``D``), each as a 2-byte column count followed by, per column, a 4-byte signed length (-1:
NULL; -2: a value the row event did not carry, ``cdc.events.UNCHANGED``) and that many bytes of UTF-8 text (the
value's text form, :mod:`upstream.mysql.types`). Old rows are whole under ``binlog_row_image = FULL`` (a parsed
change's ``old_kind`` is ``'O'``); an old row with an absent value (a partial image, :mod:`upstream.mysql.row_image`)
holds its key columns only (``old_kind`` ``'K'``).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import Any

from cdc.errors import DecodeError
from cdc.events import UNCHANGED
from upstream.base import ParsedChange, plain_insert

_HEAD = struct.Struct(">cI")
_COUNT = struct.Struct(">H")
_LEN = struct.Struct(">i")
_NULL = _LEN.pack(-1)
_ABSENT = _LEN.pack(-2)


def _tuple(values: Sequence[str | None]) -> bytes:
    parts = [_COUNT.pack(len(values))]
    for v in values:
        if v is None:
            parts.append(_NULL)
        else:
            b = v.encode()
            parts.append(_LEN.pack(len(b)))
            parts.append(b)
    return b"".join(parts)


def encode(kind: bytes, relid: int, new: Sequence[str | None] | None, old: Sequence[str | None] | None) -> bytes:
    """One change: ``kind`` ``b'I'`` (``new``), ``b'U'`` (``new`` and ``old``) or ``b'D'`` (``old``)."""
    out = _HEAD.pack(kind, relid)
    if new is not None:
        out += _tuple(new)
    if old is not None:
        out += _tuple(old)
    return out


def _partial_tuple(values: Sequence[Any]) -> bytes:
    return b"".join(_ABSENT if v is UNCHANGED else _tuple([v])[_COUNT.size:] for v in values)


def encode_partial(kind: bytes, relid: int, new: Sequence[Any] | None, old: Sequence[Any] | None) -> bytes:
    """:func:`encode` of a change whose rows may hold ``UNCHANGED`` (values a partial row image did not carry)."""
    out = _HEAD.pack(kind, relid)
    for row in (new, old):
        if row is not None:
            out += _COUNT.pack(len(row)) + _partial_tuple(row)
    return out


def _read_tuple(raw: bytes, off: int) -> tuple[list[Any], int, bool]:
    """(values, offset after them, whether a value is absent)."""
    (n,) = _COUNT.unpack_from(raw, off)
    off += 2
    vals: list[Any] = []
    absent = False
    for _ in range(n):
        (ln,) = _LEN.unpack_from(raw, off)
        off += 4
        if ln < 0:
            if ln == -1:
                vals.append(None)
            elif ln == -2:
                vals.append(UNCHANGED)
                absent = True
            else:
                raise ValueError(f"value length {ln}")
        else:
            vals.append(raw[off:off + ln].decode())
            off += ln
    return vals, off, absent


def parse(raw: bytes) -> ParsedChange:
    """The change :func:`encode` stored (DecodeError when malformed)."""
    try:
        kind_b, relid = _HEAD.unpack_from(raw, 0)
        kind = kind_b.decode()
        off = _HEAD.size
        new = old = None
        old_kind = None
        if kind in ("I", "U"):
            new, off, _ = _read_tuple(raw, off)
        if kind in ("U", "D"):
            old, off, partial = _read_tuple(raw, off)
            old_kind = "K" if partial else "O"
        if kind not in ("I", "U", "D") or off != len(raw):
            raise ValueError(f"kind {kind!r}, {len(raw) - off} trailing bytes")
    except (struct.error, UnicodeDecodeError, ValueError) as exc:
        raise DecodeError(f"malformed MySQL change payload ({len(raw)} bytes): {exc}") from exc
    return ParsedChange(kind, relid, new, old, old_kind, 0)


def insert_values(payload: bytes, offset: int) -> tuple[int, list[Any]] | None:
    """``(relid, new values)`` when ``payload[offset:]`` is a well-formed insert, else None."""
    if payload[offset:offset + 1] != b"I":
        return None
    try:
        pc = parse(payload[offset:])
    except DecodeError:
        return None
    assert pc.new is not None
    return pc.relid, pc.new


def plain_row(payload: bytes, offset: int, parse_row: Callable[[Sequence[Any]], tuple[Any, ...]],
              ncols: int) -> tuple[str, int, tuple[Any, ...], list[Any]] | None:
    """:meth:`upstream.base.ChangeDecoder.plain_row` of a stored MySQL change: ``("I", relid, parse_row(values),
    values)`` when ``payload[offset:]`` is a well-formed insert of ``ncols`` values, each text or NULL (none absent),
    that ``parse_row`` parses; else None. (A stored update always carries its old row, so it is never plain.)"""
    return plain_insert(insert_values, payload, offset, parse_row, ncols)
