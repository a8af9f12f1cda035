"""The rows-event decoding of the MySQL/MariaDB span source in C, with :mod:`upstream.mysql.rowdecode` as the
reference and fallback.

``rowcodec.c`` (a CPython extension module) turns a rows event's full images straight into the stored payloads
(:mod:`upstream.mysql.payload`): integers, YEAR, UTF-8 text, binary strings, DATE, DATETIME, TIMESTAMP and TIME
rendered in C, every other column by calling its Python reader (:class:`upstream.mysql.rowdecode.RowDecoder` builds
the plan). C renders only values it recognises exactly; for anything else (an invalid or zero date, a TIME outside a
day, invalid UTF-8, a truncated event, a Python reader's error) it returns None and the Python decoder decodes the
event again, which decides or raises the precise error. ``tests/unit/upstream/test_mysql_rowcodec.py`` compares both
on generated rows of every type, and ``tests/integration/test_mysql_own_decoder.py`` on a real binlog.

Built on first use with the system's C compiler and this interpreter's headers (:mod:`cdc.cbuild`; ``make deps``
builds it ahead). Without them :func:`native` is None (said once in the log) and the span decodes in Python: the same
payloads, more CPU. ``TIDEWATER_ROWCODEC=python`` in the environment chooses Python too.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from cdc import cbuild
from upstream.mysql import binlog

DecodeRows = Callable[..., "list[bytes] | None"]
"""``decode_rows(data, off, end, kind, head, codes, p1, p2, calls)`` (see ``rowcodec.c``)."""

CALL, INT, UINT, YEAR, TEXT, BYTEA, BINARY, DATE, DATETIME2, TIMESTAMP2, TIME2 = range(11)
"""The column codes of ``rowcodec.c`` (checked against the built module when it loads)."""


def _adapt(mod: ModuleType) -> ModuleType:
    names = ("CALL", "INT", "UINT", "YEAR", "TEXT", "BYTEA", "BINARY", "DATE", "DATETIME2", "TIMESTAMP2", "TIME2")
    if [getattr(mod, n) for n in names] != list(range(11)):
        raise ImportError("rowcodec.c's column codes differ from rowcodec.py's")
    return mod


_EXT = cbuild.Extension(Path(__file__).with_name("rowcodec.c"), "upstream.mysql._rowcodec", _adapt,
                        "MySQL rows are decoded in Python (more CPU per row)")


def native() -> DecodeRows | None:
    """The C ``decode_rows``, compiled and loaded on first call; None when it cannot be built or loaded here."""
    mod = _EXT.get()
    return None if mod is None else mod.decode_rows  # type: ignore[no-any-return]


def best() -> DecodeRows | None:
    """:func:`native` unless ``TIDEWATER_ROWCODEC=python`` is set (then None: decode in Python)."""
    if os.environ.get("TIDEWATER_ROWCODEC", "").lower() == "python":
        return None
    return native()


def best_crc_ok() -> Callable[[bytes, int], bool]:
    """``crc_ok(data, end)``: whether the 4 bytes at ``end`` are the CRC32 of ``data[1:end]`` (an event's checksum,
    :func:`upstream.mysql.binlog.crc_ok`): in C where built (a table-driven CRC32, several times faster than
    ``zlib.crc32`` on the small events of single-row transactions here), else the Python one."""
    mod = None if os.environ.get("TIDEWATER_ROWCODEC", "").lower() == "python" else _EXT.get()
    return binlog.crc_ok if mod is None else mod.crc_ok  # type: ignore[no-any-return]


def main() -> int:
    """``python -m upstream.mysql.rowcodec``: build the module now (``make deps``), print where it is."""
    return _EXT.main("MySQL C row codec not built (rows are decoded in Python)")


if __name__ == "__main__":
    raise SystemExit(main())
