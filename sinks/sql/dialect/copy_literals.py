"""The initial copy's rows into MySQL/MariaDB without a Python object per row: PostgreSQL COPY text straight to the
literal rows of a multi-row ``INSERT`` (:class:`LiteralRows`), or to the same values as ``LOAD DATA`` input
(:class:`LoadRows`), in C (``copy_literals.c``, a CPython extension module).

The sink's parsed path (``SnapshotReader.read_chunk`` -> ``RowChange`` -> converters -> ``mysql_literal_function``)
spends a few microseconds of Python per row; the C function makes the same literal text from the COPY text directly.
It is the parsed path's exact stand-in, never a second opinion:

- Only columns whose upstream base type is in :data:`KINDS` (not arrays) are rendered; a table with any other column
  is not (:func:`column_kinds` is None) and its chunks take the parsed path.
- A value is rendered only in the forms PostgreSQL's output function writes for its type (with the reader session's
  settings: ISO dates, UTC, ``extra_float_digits = 3``), producing exactly the literal the parsed path makes of it;
  anything else in a chunk (NaN, infinities, a numeric with non-zero digits beyond the target's scale, BC or 5-digit
  years, an offset other than ``+00``, a backslash in a non-text value, a wrong column count) makes
  :meth:`LiteralRows.feed` return None, and the caller writes the chunk through the parsed path, which stores it or
  raises the precise error (``DataRejected`` for a narrower scale, never a rounded value).
- ``tests/unit/sinks/test_copy_literals_equivalence.py`` compares it with the parsed path's functions on generated
  values of every kind and on odd forms: the same bytes, or C declines.

The C file is compiled with the system's compiler on first use (``make deps`` builds it ahead: ``python -m
sinks.sql.dialect.copy_literals``; :mod:`cdc.cbuild`). Where it cannot be built, :func:`native` is None (said once in
the log) and every chunk takes the parsed path: the same rows, more CPU. ``TIDEWATER_COPY_LITERALS=python`` chooses
the parsed path too.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from cdc import cbuild
from cdc.events import TableSchema

KINDS = {
    "int2": "INT", "int4": "INT", "int8": "INT", "bool": "BOOL", "text": "TEXT", "varchar": "TEXT", "bpchar": "TEXT",
    "name": "TEXT", "numeric": "NUMERIC", "float4": "FLOAT", "float8": "FLOAT", "date": "DATE", "time": "TIME",
    "timestamp": "TIMESTAMP", "timestamptz": "TIMESTAMPTZ", "uuid": "UUID",
}
"""Upstream base types the C renderer knows, by its kind names (the others: the parsed path)."""


_EXT = cbuild.Extension(Path(__file__).with_name("copy_literals.c"), "sinks.sql.dialect._copy_literals",
                        lambda mod: mod, "the initial copy into MySQL/MariaDB parses its rows in Python (more CPU per row)")


def native() -> ModuleType | None:
    """The C module, compiled and loaded on first call; None when it cannot be built or loaded here, or
    ``TIDEWATER_COPY_LITERALS=python`` (the reason is logged once)."""
    if os.environ.get("TIDEWATER_COPY_LITERALS", "").lower() == "python":
        return None
    return _EXT.get()


def column_kinds(schema: TableSchema) -> bytes | None:
    """The C kinds of ``schema``'s columns, or None when a column is not rendered in C (or C is not available)."""
    mod = native()
    if mod is None or not schema.columns:
        return None
    out = []
    for c in schema.columns:
        name = None if c.is_array else KINDS.get(c.base_type)
        if name is None:
            return None
        out.append(getattr(mod, name))
    return bytes(out)


class _Lines:
    """A chunk's COPY text fed in blocks cut anywhere, handed to a C render function in whole lines."""

    def __init__(self, render: Any, kinds: bytes, scales: Sequence[int | None], max_bytes: int,
                 max_rows: int) -> None:
        self._render = render
        self._kinds = kinds
        self._scales = tuple(-1 if s is None else int(s) for s in scales)
        self._max_bytes = max_bytes
        self._max_rows = max_rows
        self._carry = b""
        self.rows = 0

    def _feed(self, block: bytes) -> list[Any] | None:
        cut = block.rfind(b"\n")
        if cut < 0:
            self._carry += block
            return []
        data = self._carry + block[:cut + 1] if self._carry else block[:cut + 1]
        self._carry = block[cut + 1:]
        bodies, n = self._render(data, self._kinds, self._scales, self._max_bytes, self._max_rows)
        if bodies is None:
            return None
        self.rows += n
        return bodies  # type: ignore[no-any-return]

    def finish(self) -> bool:
        """True when the text ended with a whole line (COPY's always does); False: a partial last line was left."""
        return not self._carry


def _module() -> Any:
    mod = native()
    if mod is None:
        raise RuntimeError("the C literal renderer is not available")
    return mod


class LiteralRows(_Lines):
    """Turns a chunk's COPY text, fed in blocks cut anywhere, into bodies of literal rows ``(..),(..)`` for ``INSERT
    .. VALUES <body> ..``, each of at most ``max_rows`` rows and ``max_bytes`` bytes. ``rows``: lines rendered so far.
    Not thread-safe (one chunk, one thread)."""

    def __init__(self, kinds: bytes, scales: Sequence[int | None], max_bytes: int, max_rows: int) -> None:
        super().__init__(_module().render, kinds, scales, max_bytes, max_rows)

    def feed(self, block: bytes) -> list[bytes] | None:
        """The bodies of the whole lines completed by ``block``; None: a line holds a value C does not render
        exactly as the parsed path (the chunk must be written through that path)."""
        return self._feed(block)


class LoadRows(_Lines):
    """:class:`LiteralRows` as the input of MySQL's ``LOAD DATA`` in its default format (tab-separated fields,
    ``\\N`` for NULL, backslash escapes, one row per line): each value is its literal's text without the quotes,
    which the server converts to the column's type as it converts the literal (for the target column types
    ``sinks.sql.ops.load_copy`` allows). It accepts exactly the lines :class:`LiteralRows` accepts: a chunk it
    declines is one the literal path declines too. Not thread-safe (one chunk, one thread)."""

    def __init__(self, kinds: bytes, scales: Sequence[int | None], max_bytes: int, max_rows: int) -> None:
        super().__init__(_module().render_load, kinds, scales, max_bytes, max_rows)

    def feed(self, block: bytes) -> list[tuple[bytes, int]] | None:
        """The bodies (text, rows in it) of the whole lines completed by ``block``, each of at most ``max_rows``
        rows and ``max_bytes`` bytes (a single larger row is a body of its own); None: a line holds a value C does
        not render exactly (the chunk must be written through the parsed path)."""
        return self._feed(block)


def main() -> int:
    """``python -m sinks.sql.dialect.copy_literals``: build the module now (``make deps``), print where it is."""
    return _EXT.main("C literal renderer not built (the initial copy into MySQL parses rows in Python)")


if __name__ == "__main__":
    raise SystemExit(main())
