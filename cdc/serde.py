"""JSON <-> typed dataclass conversion for everything stored in etcd or sent over the API.

Field names are the dataclass field names (snake_case). Unknown fields are ignored on load (forward
compatibility across versions); missing fields take their defaults. Fields a dataclass derives itself
(``field(init=False)``, such as ``TableSchema.column_names``) are neither written nor read.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import json
import types
import typing
from typing import Any, TypeVar

T = TypeVar("T")


def to_dict(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.init}
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, dict):
        return {str(k): to_dict(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    return obj


def to_json(obj: Any) -> bytes:
    return json.dumps(to_dict(obj), sort_keys=True, separators=(",", ":")).encode()


def _convert(tp: Any, value: Any) -> Any:
    if value is None:
        return None
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return _convert(args[0], value) if len(args) == 1 else value
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return tp(value)
    if origin in (list, tuple):
        args = typing.get_args(tp)
        inner = args[0] if args else Any
        items = [_convert(inner, v) for v in value]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        _, vt = typing.get_args(tp) or (Any, Any)
        return {k: _convert(vt, v) for k, v in value.items()}
    if tp is float and isinstance(value, int):
        return float(value)
    return value


@functools.cache
def _fields(cls: type) -> tuple[tuple[str, Any], ...]:
    """``(name, resolved type)`` of each field of dataclass ``cls``: resolving the annotations (strings, under
    ``from __future__ import annotations``) costs tens of microseconds, and every etcd read decodes records."""
    hints = typing.get_type_hints(cls)
    return tuple((f.name, hints[f.name]) for f in dataclasses.fields(cls) if f.init)


def from_dict(cls: type[T], data: dict[str, Any]) -> T:
    kwargs = {name: _convert(tp, data[name]) for name, tp in _fields(cls) if name in data}
    return cls(**kwargs)


def from_json(cls: type[T], raw: bytes | str) -> T:
    return from_dict(cls, json.loads(raw))
