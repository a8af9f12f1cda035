"""The per-row functions of the PostgreSQL change path, in two implementations with the same results.

Per stored row the span runs a handful of functions: the puller reads each Insert/Update/Delete's relation id
(:func:`pgoutput.plain_change_relid`), and the mounter parses the row's tuple (:func:`pgoutput.plain_row`,
:func:`pgoutput.insert_values`, :func:`pgoutput.parse_change`) and its text values (:func:`types.row_parser`).
A :class:`RowCodec` names one implementation of all five:

- :data:`PYTHON`: the pure-Python functions of :mod:`upstream.postgres.pgoutput` and :mod:`upstream.postgres.types`,
  the reference;
- :func:`native`: the same functions in C (``rowcodec.c``, a CPython extension module), several times faster per
  row (docs/benchmarks.md, "Issue 22 item 5").

The C functions compute exactly what the Python ones return, or call them: C handles only well-formed messages
given as ``bytes`` and text values in PostgreSQL's canonical output forms (integers, floats, booleans, dates, times,
timestamps, timestamps with the ``+00`` offset of the UTC sessions Tidewater opens); anything else (a malformed
message, an odd value, a parser it does not know) goes to the Python function it stands in for, which decides or
raises the precise error. ``tests/unit/upstream/test_rowcodec_equivalence.py`` compares both on generated rows of
every column type, and the decoder and mounter tests run over both.

Deferred rows (``plain_mounter(plans, general, defer=True)``, for a sink that writes rows by their text,
``sinks.base.TextRows``): the C mounter stores an insert's ``row`` as a ``DeferredRow`` (parsed from ``row_text`` when
first called, the tuple kept; a sequence of the same values too) where every value of the row is one C parses later
exactly as now and cannot refuse: NULL, a text column's value, or the canonical text of an integer (at most 18
digits), numeric (digits with an optional sign and fraction), float (the same with an optional exponent, ``NaN``,
``Infinity``, ``-Infinity``), boolean, date, time or timestamp (with ``+00``) with every field in the range Python's
constructors accept.
Any other row is parsed at once, as without ``defer``; the Python codec never defers (:func:`never_defer`).
``defer_row`` lets the MySQL upstream's C mounter defer its inserts by the same rule.

The C file is compiled with the system's C compiler and this interpreter's headers on first use (``make deps``
builds it ahead; :mod:`cdc.cbuild`). Without a compiler, the headers or a writable directory,
:func:`native` is None (said once in the log) and :func:`best` is :data:`PYTHON`: the same values, more CPU.
``TIDEWATER_ROWCODEC=python`` in the environment chooses :data:`PYTHON` too.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from cdc import cbuild
from cdc.events import UNCHANGED, OpType, RowChange
from upstream.base import Mount, ParsedChange, PlainPlan
from upstream.postgres import pgoutput, types

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RowCodec:
    """One implementation of the per-row functions (see the module docstring); every member is a plain function,
    meant to be bound to a local once."""

    name: str
    plain_change_relid: Callable[[bytes], int]
    insert_values: Callable[[bytes, int], tuple[int, list[Any]] | None]
    parse_change: Callable[[bytes], ParsedChange]
    plain_row: Callable[[bytes, int, Callable[[Sequence[Any]], tuple[Any, ...]], int],
                        tuple[str, int, tuple[Any, ...], list[Any]] | None]
    row_parser: Callable[[Sequence[types.Parser]], Callable[[Sequence[Any]], tuple[Any, ...]]]
    plain_mounter: Callable[[dict[int, PlainPlan], Mount, bool], Mount]
    defer_row: Callable[[Callable[[Sequence[Any]], tuple[Any, ...]], list[Any]], Any]
    """``defer_row(row_parser, texts)``: ``texts`` (a list of str/None) as a deferred row (``cdc.events.RowChange.row``)
    when parsing them later with ``row_parser`` (one of :attr:`row_parser`'s) gives exactly what parsing them now
    gives and cannot fail, else None (parse now)."""


def general_mounter(plans: dict[int, PlainPlan], general: Mount, defer: bool = False) -> Mount:
    """The pure-Python :meth:`ChangeDecoder.plain_mounter <upstream.base.ChangeDecoder.plain_mounter>`: the
    mounter's own function, unchanged (it never defers a row: the reference parses every value at once)."""
    return general


def never_defer(row_parser: Callable[[Sequence[Any]], tuple[Any, ...]], texts: list[Any]) -> None:
    """The pure-Python :attr:`RowCodec.defer_row`: the reference parses every row at once."""
    return None


PYTHON = RowCodec("python", pgoutput.plain_change_relid, pgoutput.insert_values, pgoutput.parse_change,
                  pgoutput.plain_row, types.row_parser, general_mounter, never_defer)


def _codec(mod: ModuleType) -> RowCodec:
    mod.configure(UNCHANGED, pgoutput.plain_change_relid, pgoutput.insert_values, pgoutput.parse_change,
                  pgoutput.plain_row, pgoutput.parsed_change)
    codes = {types.parser_for("text", False): mod.TEXT, int: mod.INT, float: mod.FLOAT,
             types.parser_for("bool", False): mod.BOOL, types.parser_for("date", False): mod.DATE,
             types.parser_for("time", False): mod.TIME, types.parser_for("timestamp", False): mod.TIMESTAMP,
             types.parser_for("timestamptz", False): mod.TIMESTAMPTZ, types.parser_for("numeric", False): mod.NUMERIC}
    call = mod.CALL
    row_parser_cls = mod.RowParser
    py_row_parser = types.row_parser

    def row_parser(parsers: Sequence[types.Parser]) -> Callable[[Sequence[Any]], tuple[Any, ...]]:
        """:func:`types.row_parser` in C: known parsers run in C, the others are called (see the module doc)."""
        ps = tuple(parsers)
        return row_parser_cls(bytes(codes.get(p, call) for p in ps), ps, py_row_parser(ps))  # type: ignore[no-any-return]

    plain_mounter = mod.PlainMounter
    if not mod.configure_rows(RowChange, OpType.INSERT, OpType.UPDATE):  # pragma: no cover - RowChange changed
        log.warning("the C row codec does not know RowChange's slots: rows are mounted in Python")
        plain_mounter = general_mounter
    return RowCodec("c", mod.plain_change_relid, mod.insert_values, mod.parse_change, mod.plain_row, row_parser,
                    plain_mounter, mod.defer_row)


_EXT = cbuild.Extension(Path(__file__).with_name("rowcodec.c"), "upstream.postgres._rowcodec", _codec,
                        "row decoding runs in Python (more CPU per row)")


def native() -> RowCodec | None:
    """The C implementation, compiled and loaded on first call; None when it cannot be built or loaded here (the
    reason is logged once)."""
    return _EXT.get()


def best() -> RowCodec:
    """:func:`native` when available (and not switched off by ``TIDEWATER_ROWCODEC=python``), else :data:`PYTHON`."""
    if os.environ.get("TIDEWATER_ROWCODEC", "").lower() == "python":
        return PYTHON
    return native() or PYTHON


def main() -> int:
    """``python -m upstream.postgres.rowcodec``: build the module now (``make deps``), print where it is."""
    return _EXT.main("C row codec not built (rows are decoded in Python)")


if __name__ == "__main__":
    raise SystemExit(main())
