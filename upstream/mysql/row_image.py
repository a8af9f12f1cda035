"""Partial row images: a binlog row event whose columns-present bitmap does not cover every column of its table.

``binlog_row_image`` is checked to be ``FULL`` globally when a changefeed is created, but any session may
``SET SESSION binlog_row_image = MINIMAL`` (or ``NOBLOB``) and then write row events that carry only some columns:
MINIMAL logs the key in the before image and only the columns the statement wrote in the after image (an INSERT
listing some columns logs only those); NOBLOB leaves out BLOB/TEXT columns the statement did not write.

:func:`partial_image` is the one check, made once per row event (not per row) from the event's own bitmaps, so it does
not depend on how the event's rows are decoded. What the span does with a partial image (:mod:`upstream.mysql.source`)
is never to take it as full: an absent after-image column the before image carries keeps that value (the statement did
not write it); any other absent column is ``cdc.events.UNCHANGED`` (a SQL target leaves the column as it is, a row
missing downstream is re-read from the upstream by key, Kafka and storage write the unavailable-value placeholder);
a before image without every key column cannot name its row and fails the span (:func:`missing_key`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from cdc.events import UNCHANGED

WARN_PARTIAL_ROW_IMAGE = "CDC:WarnPartialRowImage"
"""The data warning (severity notice) of a table that had row events with a partial image."""


@dataclass(frozen=True, slots=True)
class PartialImage:
    """The column indexes (in table order) absent from a row event's before and after images; ``()`` for an image
    that is complete or that the event does not have (an INSERT has no before image, a DELETE no after image)."""

    before: tuple[int, ...]
    after: tuple[int, ...]


@lru_cache(maxsize=256)
def _mask(column_count: int) -> int:
    return (1 << column_count) - 1


def _absent(column_count: int, bitmap: bytes | None) -> tuple[int, ...]:
    if bitmap is None:
        return ()
    mask = _mask(column_count)
    bits = int.from_bytes(bitmap, "little") & mask
    if bits == mask:
        return ()
    return tuple(i for i in range(column_count) if not bits >> i & 1)


def partial_image(column_count: int, present: bytes | None, present_after: bytes | None = None, *,
                  has_before: bool) -> PartialImage | None:
    """None when the row event's images hold every one of the table's ``column_count`` columns (a FULL image), else
    which columns each image lacks. ``present`` is the event's (first) columns-present bitmap: the before image's for
    an UPDATE or DELETE (``has_before``), the after image's for an INSERT; ``present_after`` an UPDATE's second bitmap
    (its after image). Bit ``i`` (little-endian, byte ``i // 8``) stands for column ``i``."""
    first = _absent(column_count, present)
    second = _absent(column_count, present_after)
    if not first and not second:
        return None
    return PartialImage(first, second) if has_before else PartialImage((), first)


def complete_after(before: Sequence[Any] | None, after: list[Any]) -> list[Any]:
    """``after`` (an UPDATE's after image, ``UNCHANGED`` where absent) with each absent value the before image holds
    put in: a column the statement did not write kept its value. Changes ``after`` in place and returns it."""
    if before is not None:
        for i, v in enumerate(after):
            if v is UNCHANGED and before[i] is not UNCHANGED:
                after[i] = before[i]
    return after


def missing_key(image: Sequence[Any], key_idx: Sequence[int]) -> list[int]:
    """The positions of ``key_idx`` whose value ``image`` lacks (``UNCHANGED``)."""
    return [i for i in key_idx if image[i] is UNCHANGED]
