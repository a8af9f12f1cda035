"""The bytes of one staged upstream transaction (``[consistency] mode = "snapshot"``, docs/consistency.md): its mounted
row changes, as the span's sink stages them and the barrier's coordinator reads them back.

Guarantees:
- :func:`decode` of :func:`encode` gives changes equal to the input (``RowChange`` equality: op, schema, commit Ts and
  time, values, old values, extra), with the same ``row``/``row_text`` where they were set, so the coordinator's
  writer takes the same paths as a direct apply would.
- :func:`decode` rebuilds only the classes of :data:`ALLOWED` (the change vocabulary of ``cdc.events`` and the value
  types the mounters produce): a staged value naming anything else (a row of the staging table written by something
  other than Tidewater) raises :class:`SinkError` naming it; nothing else is ever imported or called. Changes carry
  plain values only (``cdc.events``: None, bool, int, float, str, bytes, Decimal, date/time/datetime, UUID, lists);
  :func:`encode` refuses anything the decoder would refuse, before the staging transaction commits.
- The schema objects of one transaction are stored once however many of its changes share them.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Sequence
from typing import Any

from cdc.errors import SinkError
from cdc.events import RowChange

ALLOWED: frozenset[tuple[str, str]] = frozenset({
    ("cdc.events", "RowChange"), ("cdc.events", "TableSchema"), ("cdc.events", "ColumnSchema"),
    ("cdc.events", "TableName"), ("cdc.events", "OpType"), ("cdc.events", "UNCHANGED"),
    ("decimal", "Decimal"), ("datetime", "date"), ("datetime", "time"), ("datetime", "datetime"),
    ("datetime", "timedelta"), ("datetime", "timezone"), ("uuid", "UUID"), ("uuid", "SafeUUID"),
    ("builtins", "set"), ("builtins", "frozenset"), ("builtins", "bytearray"),
})
"""The globals a staged transaction may name: (module, name)."""

_PROTOCOL = 5


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in ALLOWED:
            raise SinkError(f"a staged transaction names {module}.{name}, which is not a row change value: the "
                            "staging table holds a row Tidewater did not write")
        return super().find_class(module, name)


class _Pickler(pickle.Pickler):
    def reducer_override(self, obj: Any) -> Any:  # noqa: ANN401 - pickle's hook
        cls = type(obj)
        if cls.__module__ not in ("builtins", "cdc.events", "decimal", "datetime", "uuid", "enum") \
                and (cls.__module__, cls.__qualname__) not in ALLOWED:
            raise SinkError(f"a change value of type {cls.__module__}.{cls.__qualname__} cannot be staged "
                            "([consistency] mode = \"snapshot\"): only plain values are")
        return NotImplemented


def encode(changes: Sequence[RowChange]) -> bytes:
    """One transaction's changes as bytes (module docstring)."""
    out = io.BytesIO()
    _Pickler(out, protocol=_PROTOCOL).dump(list(changes))
    return out.getvalue()


def decode(data: bytes) -> list[RowChange]:
    """The changes :func:`encode` stored in ``data``; :class:`SinkError` for anything else."""
    try:
        changes = _Unpickler(io.BytesIO(data)).load()
    except SinkError:
        raise
    except Exception as exc:
        raise SinkError(f"a staged transaction cannot be read back ({type(exc).__name__}: {exc})") from exc
    if not isinstance(changes, list) or not all(isinstance(c, RowChange) for c in changes):
        raise SinkError("a staged transaction does not hold row changes: the staging table holds a row Tidewater "
                        "did not write")
    return changes
