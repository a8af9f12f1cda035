"""The rows-event decoding of the MySQL/MariaDB span source in C, with :mod:`upstream.mysql.rowdecode` as the
reference and fallback.

``rowcodec.c`` (a CPython extension module) turns a rows event's full images straight into the stored payloads
(:mod:`upstream.mysql.payload`): integers, YEAR, UTF-8 text, binary strings, DATE, DATETIME, TIMESTAMP and TIME
rendered in C, every other column by calling its Python reader (:class:`upstream.mysql.rowdecode.RowDecoder` builds
the plan). C renders only values it recognises exactly; for anything else (an invalid or zero date, a TIME outside a
day, invalid UTF-8, a truncated event, a Python reader's error) it returns None and the Python decoder decodes the
event again, which decides or raises the precise error. ``tests/unit/upstream/test_mysql_rowcodec.py`` compares both
on generated rows of every type, and ``tests/integration/test_mysql_own_decoder.py`` on a real binlog.

The same module holds the decoder side (:class:`Decoding`, the per-row members of
:class:`upstream.mysql.source.MySqlChangeDecoder`): :mod:`upstream.mysql.payload`'s ``parse``, ``insert_values`` and
``plain_row`` in C, and ``MySqlMounter``, which builds the :class:`cdc.events.RowChange` of a stored change whose
images are whole and whose values all parse (the new row of an insert or update positionally, as the PostgreSQL path
does for its inserts, with the stored text as ``row_text``; the old row of an update or delete by name, as
:class:`processor.mounter.Mounter` builds it) without calling Python per row; :func:`whole_mounter` is its reference. C handles
only what it recognises exactly and hands everything else to the Python function it stands in for (a malformed
payload, an absent value, a value that does not parse: the Python mounter raises the precise error).
``tests/unit/upstream/test_mysql_mount_codec.py`` compares both.

Built on first use with the system's C compiler and this interpreter's headers (:mod:`cdc.cbuild`; ``make deps``
builds it ahead). Without them :func:`native` is None (said once in the log) and the span decodes in Python: the same
payloads, more CPU. ``TIDEWATER_ROWCODEC=python`` in the environment chooses Python too.
"""

from __future__ import annotations

import logging
import os
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from cdc import cbuild
from cdc.errors import DecodeError
from cdc.events import UNCHANGED, OpType, RowChange
from upstream.base import Mount, ParsedChange, PlainPlan
from upstream.mysql import payload, wire
from upstream.postgres import rowcodec as text_codec
from upstream.postgres import types as text_types

log = logging.getLogger(__name__)

DecodeRows = Callable[..., "list[bytes] | None"]
"""``decode_rows(data, off, end, kind, head, codes, p1, p2, calls)`` (see ``rowcodec.c``)."""
DecodeEvent = Callable[..., "list[bytes] | None"]
"""``decode_event(heads, full, padded, codes, p1, p2, calls, data, end, etype)`` (see ``rowcodec.c``)."""

CALL, INT, UINT, YEAR, TEXT, BYTEA, BINARY, DATE, DATETIME2, TIMESTAMP2, TIME2 = range(11)
"""The column codes of ``rowcodec.c`` (checked against the built module when it loads)."""


@dataclass(frozen=True)
class Decoding:
    """One implementation of the decoder side's per-row functions (see the module docstring); every member is a plain
    function, meant to be bound once: :meth:`upstream.base.ChangeDecoder.insert_values`, ``parse_change``,
    ``plain_row``, ``row_parser`` and ``plain_mounter`` of stored MySQL changes."""

    name: str
    insert_values: Callable[[bytes, int], tuple[int, list[Any]] | None]
    parse_change: Callable[[bytes], ParsedChange]
    plain_row: Callable[[bytes, int, Callable[[Sequence[Any]], tuple[Any, ...]], int],
                        tuple[str, int, tuple[Any, ...], list[Any]] | None]
    row_parser: Callable[[Sequence[text_types.Parser]], Callable[[Sequence[Any]], tuple[Any, ...]]]
    plain_mounter: Callable[[dict[int, PlainPlan], Mount, bool], Mount]


_version = struct.Struct(">I").unpack_from  # upstream.base.encode_payload's schema version
_TEXT = frozenset((str, type(None)))


def whole_mounter(plans: dict[int, PlainPlan], general: Mount, defer: bool = False) -> Mount:
    """The pure-Python :meth:`~upstream.base.ChangeDecoder.plain_mounter` of stored MySQL changes, the reference of
    ``rowcodec.c``'s ``MySqlMounter``: an update whose images are whole and whose values all parse keeps its new row
    positional, as an insert does (``row``, with the stored text as ``row_text``; ``values`` built on first access),
    and its whole old row by name (``old_values``), so that a sink can take it as a whole row without a dict and use
    the upstream's text; everything else (inserts and deletes included) is ``general``'s (the mounter's own
    function), which also raises every error."""

    def mount(raw: bytes, commit_ts: int, commit_time: float) -> RowChange:
        if raw[4:5] == b"U" and len(raw) >= 5:
            plan = plans.get(_version(raw)[0])
            if plan is not None:
                schema, relid, parse_row, ncols = plan
                try:
                    pc = payload.parse(raw[4:])
                except DecodeError:
                    return general(raw, commit_ts, commit_time)
                new, old = pc.new, pc.old
                if ((not relid or pc.relid == relid) and pc.old_kind == "O" and new is not None and old is not None
                        and len(new) == ncols == len(old) and _TEXT.issuperset(map(type, new))
                        and _TEXT.issuperset(map(type, old))):
                    try:
                        row, orow = parse_row(new), parse_row(old)
                    except Exception:  # noqa: BLE001 - the general path raises the precise error
                        return general(raw, commit_ts, commit_time)
                    names = schema.column_names
                    ch = RowChange(OpType.UPDATE, schema, commit_ts, commit_time, None,
                                   dict(zip(names, orow, strict=True)))
                    ch.row, ch.row_text = row, new
                    return ch
        return general(raw, commit_ts, commit_time)

    return mount


PYTHON = Decoding("python", payload.insert_values, payload.parse, payload.plain_row, text_types.row_parser,
                  whole_mounter)
"""The pure-Python reference: :mod:`upstream.mysql.payload` and :mod:`upstream.postgres.types`."""


def _adapt(mod: ModuleType) -> ModuleType:
    names = ("CALL", "INT", "UINT", "YEAR", "TEXT", "BYTEA", "BINARY", "DATE", "DATETIME2", "TIMESTAMP2", "TIME2")
    if [getattr(mod, n) for n in names] != list(range(11)):
        raise ImportError("rowcodec.c's column codes differ from rowcodec.py's")
    mod.configure(UNCHANGED, payload.insert_values, payload.parse, payload.plain_row, ParsedChange)
    text = text_codec.native() or text_codec.PYTHON
    c_mounter = mod.MySqlMounter

    def mounter(plans: dict[int, PlainPlan], general: Mount, defer: bool = False) -> Mount:
        """``MySqlMounter``; with ``defer``, an insert's row deferred where the text codec's ``defer_row`` gives one
        (upstream.base.ChangeDecoder.plain_mounter)."""
        return c_mounter(plans, general, text.defer_row if defer else None)  # type: ignore[no-any-return]

    if not mod.configure_rows(RowChange, OpType.INSERT, OpType.UPDATE, OpType.DELETE):  # pragma: no cover
        log.warning("the MySQL C row codec does not know RowChange's slots: rows are mounted in Python")
        mounter = whole_mounter
    mod.decoding = Decoding("c", mod.insert_values, mod.parse_change, mod.plain_row, text.row_parser, mounter)
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


def best_event() -> DecodeEvent | None:
    """The C ``decode_event`` (a whole rows event, header included: ``RowDecoder.event_decoder``) unless
    ``TIDEWATER_ROWCODEC=python`` is set or it is not built here (then None)."""
    if os.environ.get("TIDEWATER_ROWCODEC", "").lower() == "python":
        return None
    mod = _EXT.get()
    return None if mod is None else mod.decode_event  # type: ignore[no-any-return]


def native_decoding() -> Decoding | None:
    """The decoder side in C (the row parser of :func:`upstream.postgres.rowcodec.native` where that is built); None
    when this module cannot be built or loaded here."""
    mod = _EXT.get()
    return None if mod is None else mod.decoding  # type: ignore[no-any-return]


def best_decoding() -> Decoding:
    """:func:`native_decoding` unless ``TIDEWATER_ROWCODEC=python`` is set or it is not available: then
    :data:`PYTHON`."""
    if os.environ.get("TIDEWATER_ROWCODEC", "").lower() == "python":
        return PYTHON
    return native_decoding() or PYTHON


def best_frame() -> wire.Frame:
    """:func:`upstream.mysql.wire.frame` (the dump's packets framed into events, CRC32 verified) in C where built (a
    table-driven CRC32, several times faster than ``zlib.crc32`` on the small events of single-row transactions, and
    no Python call per event), else the Python one."""
    mod = None if os.environ.get("TIDEWATER_ROWCODEC", "").lower() == "python" else _EXT.get()
    return wire.frame if mod is None else mod.frame_events  # type: ignore[no-any-return]


def main() -> int:
    """``python -m upstream.mysql.rowcodec``: build the module now (``make deps``), print where it is."""
    return _EXT.main("MySQL C row codec not built (rows are decoded in Python)")


if __name__ == "__main__":
    raise SystemExit(main())
