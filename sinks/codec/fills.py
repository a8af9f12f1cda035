"""An added column's fill (:class:`cdc.events.ColumnFill`: what the rows that existed before an ADD COLUMN hold
upstream in it) as JSON and back, for what carries DDL to consumers: the Kafka sink's ``tidewater-ddl`` header and
the storage sink's schema files.

Form: ``{"value": text}`` (``null`` for NULL), the value in the text form of the text protocols (the form canal-json
and CSV write the column's values in, :func:`sinks.codec.canal_json.canal_text_converter`, read back by
:mod:`sinks.codec.text`'s parsers, so a consumer gets the same Python value as for the column's row values), or
``{"per_row": true}`` (each row its own value: a consumer reads them back from the upstream by key).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from cdc.events import ColumnFill, ColumnSchema
from sinks.codec import text as X
from sinks.codec import types as T
from sinks.codec.canal_json import canal_text_converter


def fill_doc(col: ColumnSchema, fill: ColumnFill) -> dict[str, Any]:
    """``fill`` of column ``col`` as JSON (module docstring)."""
    if fill.per_row:
        return {"per_row": True}
    return {"value": None if fill.value is None else canal_text_converter(col)(fill.value)}


def _parser(col: ColumnSchema) -> Callable[[str], Any]:
    kind = T.value_kind(col)
    return X.array_parser(T.element_kind(col)) if kind == T.K_ARRAY else X.text_parser(kind)


def fill_of(col: ColumnSchema, doc: Mapping[str, Any]) -> ColumnFill:
    """The fill :func:`fill_doc` wrote for ``col``; ``ValueError`` (or ``ArithmeticError``) when it is malformed."""
    if doc.get("per_row"):
        return ColumnFill(col.name, per_row=True)
    if "value" not in doc:
        raise ValueError(f"a fill of column {col.name} without its value: {doc!r}")
    text = doc["value"]
    return ColumnFill(col.name, None if text is None else _parser(col)(str(text)))
