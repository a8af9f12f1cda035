"""The SQL sink's per-row text rendering, in two implementations with the same results.

Per row, the sink's statement output renders text that a driver then sends: a PostgreSQL group of rows that came with
their upstream text goes through ``COPY`` as COPY text-format data (:func:`copy_text_py`), and a MySQL/MariaDB group
goes as multi-row INSERT statements of literal rows (:func:`mysql_statements_py`: PyMySQL would escape every value in
Python). A :class:`RowText` names one implementation of both:

- :data:`PYTHON`: the pure-Python functions of this module, the reference;
and turns a generated parameter row function (:func:`sinks.sql.target.binding.row_function`: converters per column,
with their fast and text paths) into one that runs in C (``row_converter``).

- :func:`native`: the same functions in C (``rowtext.c``, a CPython extension module), several times faster per
  row (docs/benchmarks.md, "Issue 22 item 5: the SQL sink's write in C").

The C functions compute exactly what the Python ones return, or call them: C renders only values of exact types it
knows (None, bool, int, str, float, Decimal, naive datetime/date/time) and hands every other value to the
connection's ``literal`` function; any input of a shape it does not expect makes it run the Python reference for the
whole call, which returns the same text or raises the precise error. ``tests/unit/sinks/test_rowtext_equivalence.py``
compares both on generated values of every type, hostile ones included.

Built like :mod:`upstream.postgres.rowcodec` (:mod:`cdc.cbuild`, ``make deps`` or the first use). Without a compiler,
the headers or a writable directory, :func:`native` is None (said once in the log) and :func:`best` is
:data:`PYTHON`: the same text, more CPU. ``TIDEWATER_ROWTEXT=python`` in the environment chooses :data:`PYTHON` too.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from types import ModuleType
from typing import Any

from cdc import cbuild
from sinks.sql.dialect import values


def _copy_value(v: str | None) -> str:
    """One value in COPY's text format: NULL as ``\\N``; backslash, tab, newline and CR escaped."""
    if v is None:
        return "\\N"
    return v.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")


def copy_text_py(texts: Sequence[Sequence[str | None]]) -> str:
    """Rows of upstream text as COPY text-format data (one line per row, tab-separated, NULL as ``\\N``)."""
    lines = []
    append = lines.append
    for t in texts:
        if None not in t:
            line = "\t".join(t)
            # nothing to escape: no backslash, newline, CR, and no tab other than the separators
            if "\\" not in line and "\n" not in line and "\r" not in line and line.count("\t") == len(t) - 1:
                append(line)
                continue
        append("\t".join(map(_copy_value, t)))
    lines.append("")
    return "\n".join(lines)


def copy_bytes_py(texts: Sequence[Sequence[str | None]]) -> bytes:
    """:func:`copy_text_py` encoded in UTF-8: what :attr:`RowText.copy_text` returns (the bytes a UTF-8 connection's
    ``COPY`` reads, and ``LOAD DATA``'s renderer takes, without a round trip through ``str``)."""
    return copy_text_py(texts).encode("utf-8")


def mysql_statements_py(params: Sequence[Sequence[Any]], head: str, tail: str, limit: int,
                        literal: Callable[[Any], str]) -> list[str]:
    """``params`` as statements ``head + "(v,..),(v,..)" + tail`` of at most ``limit`` characters each (a row
    longer than that alone in its statement), values rendered by ``literal`` (a
    :func:`sinks.sql.dialect.values.mysql_literal_function`, whose ``rows`` renders whole rows)."""
    if not params:
        return []
    render = literal.rows(tuple(map(type, params[0])))  # type: ignore[attr-defined]
    out: list[str] = []
    rows: list[str] = []
    size = len(head) + len(tail)
    for r in params:
        text = render(r)
        if rows and size + len(text) > limit:
            out.append(head + ",".join(rows) + tail)
            rows, size = [], len(head) + len(tail)
        rows.append(text)
        size += len(text) + 1
    if rows:
        out.append(head + ",".join(rows) + tail)
    return out


@dataclass(frozen=True)
class RowText:
    """One implementation of the text rendering (see the module docstring).

    ``mysql_statements(params, head, tail, limit, literal)``; ``literal`` must carry ``plain_str`` (strings without
    special characters are quoted as they are: backslash escapes on) as :func:`mysql_literal_function` sets it."""

    name: str
    copy_text: Callable[[Sequence[Sequence[str | None]]], bytes]
    """``copy_text(texts)``: :func:`copy_bytes_py` (the rows as COPY text-format data, UTF-8)."""
    mysql_statements: Callable[[Sequence[Sequence[Any]], str, str, int, Callable[[Any], str]], list[str]]
    row_converter: Callable[[int, dict[int, values.Converter], bool, Callable[..., Any]], Callable[..., Any]]


def python_row_converter(n: int, convs: dict[int, values.Converter], with_text: bool,
                         fn: Callable[..., Any]) -> Callable[..., Any]:
    """The generated row function ``fn`` (:func:`sinks.sql.target.binding.row_function`) as it is."""
    return fn


PYTHON = RowText("python", copy_bytes_py, mysql_statements_py, python_row_converter)


def _rowtext(mod: ModuleType) -> RowText:
    mod.configure(copy_text_py, mysql_statements_py, Decimal)
    c_statements = mod.mysql_statements

    def mysql_statements(params: Sequence[Sequence[Any]], head: str, tail: str, limit: int,
                         literal: Callable[[Any], str]) -> list[str]:
        """:func:`mysql_statements_py` in C (see the module doc)."""
        return c_statements(params, head, tail, limit, literal,  # type: ignore[no-any-return]
                            getattr(literal, "plain_str", False))

    # the text paths C runs itself (on an ASCII str; anything else goes to the function)
    gcodes = {values.same_text: 1, values.timestamptz_text: 2, values.timestamp_text: 3,
              values.mysql_timestamptz_text: 4}
    row_converter_cls = mod.RowConverter

    def row_converter(n: int, convs: dict[int, values.Converter], with_text: bool,
                      fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn``, a generated row function of ``convs`` (``binding.row_function``), in C: the same parts in the
        same order (text path, fast path, None, converter), with the converters' ``keeps`` and the text functions
        C knows run in C; every other part calls the Python function."""
        specs = []
        for i in range(n):
            conv = convs.get(i)
            if conv is None:
                specs.append((None,) * 5 + (0, None, None))
                continue
            fast_t, fast_f = values.fast_path(conv) or (None, None)
            text_t, text_g = (values.text_path(conv) if with_text else None) or (None, None)
            keep_t, keep_m = values.keeps(conv) or (None, None)
            specs.append((conv, fast_t, fast_f, text_t, text_g, gcodes.get(text_g, 0), keep_t, keep_m))
        return row_converter_cls(fn, with_text, tuple(specs))  # type: ignore[no-any-return]

    return RowText("c", mod.copy_text, mysql_statements, row_converter)


_EXT = cbuild.Extension(Path(__file__).with_name("rowtext.c"), "sinks.sql.dialect._rowtext", _rowtext,
                        "the SQL sink renders rows in Python (more CPU per row)")


def native() -> RowText | None:
    """The C implementation, compiled and loaded on first call; None when it cannot be built or loaded here (the
    reason is logged once)."""
    return _EXT.get()


def best() -> RowText:
    """:func:`native` when available (and not switched off by ``TIDEWATER_ROWTEXT=python``), else :data:`PYTHON`."""
    if os.environ.get("TIDEWATER_ROWTEXT", "").lower() == "python":
        return PYTHON
    return native() or PYTHON


def main() -> int:
    """``python -m sinks.sql.dialect.rowtext``: build the module now (``make deps``), print where it is."""
    return _EXT.main("C row renderer not built (the SQL sink renders rows in Python)")


if __name__ == "__main__":
    raise SystemExit(main())
