"""Mounter: stored raw upstream changes -> typed :class:`cdc.events.RowChange`.

The span's source (``upstream.base.SpanSource``) stores each row change in the sorter as
``encode_payload(schema_version, raw)``, where ``raw`` is the upstream's own encoding of one change (a
pgoutput Insert/Update/Delete/Truncate message in non-streamed form for PostgreSQL) and
``schema_version`` names the :class:`TableSchema` the tuple was encoded with. The mounter parses it and
converts every text value with the column's parser, both through the source's
:class:`upstream.base.ChangeDecoder`, using that schema version — never the current one.

Mapping (TiCDC's RowChangedEvent, with PostgreSQL's replica identity made explicit):

- INSERT: ``values`` = the full new row; also given positionally as ``row`` (schema column order; the
  dict is built only when ``values`` is read), with the text pgoutput sent as ``row_text``. An insert whose
  image lacks columns (a MySQL partial row image: ``UNCHANGED`` values) has ``values`` only, never ``row``.
- UPDATE: ``values`` = the new row. A column the upstream did not send (unchanged TOAST value) is
  ``UNCHANGED`` — except when the old row was sent in full (REPLICA IDENTITY FULL, tuple kind 'O'):
  then it takes the old row's value, which is the same datum. A key column that is ``UNCHANGED`` in
  the new row takes its value from the old key tuple ('K') when one was sent. ``old_values`` = the
  old key columns (``TableSchema.key``) for a 'K' tuple (sent when the key changed), the full old
  row for 'O', else None. An UPDATE without an old tuple and without ``UNCHANGED`` columns also carries
  ``row``.
- DELETE: ``old_values`` = the key columns from a 'K' tuple, or the full old row from an 'O' tuple.
- TRUNCATE: no values; ``extra["truncate_options"]`` holds pgoutput's option bits
  (1 = CASCADE, 2 = RESTART IDENTITY). The source stores one truncate payload per relation.

``UNCHANGED`` is never turned into NULL (``None``): a sink must leave such a column as it is.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from cdc.errors import DecodeError
from cdc.events import UNCHANGED, OpType, RowChange, TableSchema
from upstream.base import ChangeDecoder, Mount, Parser, PlainPlan

__all__ = ["Mounter"]

_STR_OR_NULL = frozenset((str, type(None)))  # text values and NULLs only: no UNCHANGED, no binary value
_unpack_version = struct.Struct(">I").unpack_from  # the schema version prefix of upstream.base.encode_payload
_PLAIN_OPS = {"I": OpType.INSERT, "U": OpType.UPDATE}  # ChangeDecoder.plain_row's kinds


@dataclass(frozen=True, slots=True)
class _Plan:
    """Everything mount() needs for one schema version, computed once."""

    schema: TableSchema
    names: tuple[str, ...]
    parsers: tuple[Parser, ...]
    parse_row: Callable[[Sequence[Any]], tuple[Any, ...]]  # decoder.row_parser(parsers): str/None values only
    key: tuple[tuple[int, str, Parser], ...]  # (column index, name, parser) of each key column
    ncols: int


class _RowChangeBuilder:
    """Same slot layout as :class:`RowChange`; building this and switching the class skips the dataclass
    __init__ (a default factory and the ``values`` property) on the per-row path."""

    __slots__ = ("op", "schema", "commit_ts", "commit_time", "values", "old_values", "extra", "row", "row_text")


if tuple(RowChange.__slots__) != _RowChangeBuilder.__slots__:  # keep the twin in step with the dataclass
    raise RuntimeError("_RowChangeBuilder slots differ from RowChange")


def _positional(op: OpType, schema: TableSchema, commit_ts: int, commit_time: float, row: tuple[Any, ...],
                texts: Sequence[Any]) -> RowChange:
    """A RowChange with ``row`` (and its upstream text ``row_text``) set and ``values`` built lazily."""
    o: Any = _RowChangeBuilder()
    o.op = op
    o.schema = schema
    o.commit_ts = commit_ts
    o.commit_time = commit_time
    o.values = None
    o.old_values = None
    o.extra = {}
    o.row = row
    o.row_text = texts
    o.__class__ = RowChange
    return o


def _not_text(value: Any) -> Any:
    if value is None or value is UNCHANGED:
        return value
    raise ValueError("binary-format value (Tidewater never requests binary = true)")


class Mounter:
    """Turns stored payloads into :class:`RowChange` objects.

    ``decoder`` (the span source's :class:`upstream.base.ChangeDecoder`) resolves schema versions — asked once
    per version (the per-version column parsers are cached — schema versions are immutable) — and parses
    changes and values; its per-row functions are bound once here.

    Guarantees: :meth:`mount` is a pure function of the payload, the Ts/time and the schema (no I/O,
    no logging, nothing kept between calls but the cache). The class is thread-compatible: one
    Mounter per table pipeline, or share it — concurrent calls only race to fill the cache with equal
    entries. Every malformed payload, a tuple whose column count differs from the schema, a value
    that does not parse, or a binary-format value raises :class:`cdc.errors.DecodeError` naming the
    table (and the column, when one is at fault).
    """

    mount: Mount
    """``mount(payload, commit_ts, commit_time) -> RowChange``: mount one stored payload of a transaction committed at
    ``commit_ts``/``commit_time``. Pure apart from the per-version cache; raises :class:`DecodeError` (see the class
    doc). The decoder's :meth:`~upstream.base.ChangeDecoder.plain_mounter` over this class's own function (which
    mounts every payload, plain rows included): the same RowChange either way, plain rows without a Python call
    where the decoder has compiled code. With ``defer`` (the sink writes rows by their text,
    ``sinks.base.TextRows``) an insert's ``row`` may be a deferred row, parsed from ``row_text`` on first use
    (``cdc.events.RowChange.row``): the decoder defers only rows whose every value parses later exactly as now, so
    the values, and what is refused, are the same."""

    def __init__(self, decoder: ChangeDecoder, defer: bool = False) -> None:
        self._decoder = decoder
        self._parse_change = decoder.parse_change
        self._plain_row = decoder.plain_row
        self._plans: dict[int, _Plan] = {}
        self._plain_plans: dict[int, PlainPlan] = {}  # what decoder.plain_mounter needs of each planned version
        if defer:
            self.mount = decoder.plain_mounter(self._plain_plans, self._mount, True)
        else:
            self.mount = decoder.plain_mounter(self._plain_plans, self._mount)

    # ---- planning -----------------------------------------------------------------------------
    def _plan(self, version: int) -> _Plan:
        plan = self._plans.get(version)
        if plan is not None:
            return plan
        decoder = self._decoder
        schema = decoder.schema(version)
        names = tuple(c.name for c in schema.columns)
        parsers = tuple(decoder.parser(c) for c in schema.columns)
        index = {n: i for i, n in enumerate(names)}
        missing = [k for k in schema.key if k not in index]
        if missing:
            raise DecodeError(
                f"{schema.name} (schema version {version}): key columns {missing} not in the schema"
            )
        key = tuple((index[k], k, parsers[index[k]]) for k in schema.key)
        plan = _Plan(schema, names, parsers, decoder.row_parser(parsers), key, len(names))
        self._plans[version] = plan
        self._plain_plans[version] = (schema, schema.relation_id, plan.parse_row, plan.ncols)
        return plan

    # ---- row building ----------------------------------------------------------------------------
    def _row(self, plan: _Plan, tup: Sequence[Any], version: int, what: str) -> dict[str, Any]:
        return dict(zip(plan.names, self._values(plan, tup, version, what), strict=True))

    def _values(self, plan: _Plan, tup: Sequence[Any], version: int, what: str) -> tuple[Any, ...]:
        """The typed values of a tuple, in schema column order."""
        if len(tup) != plan.ncols:
            raise DecodeError(
                f"{plan.schema.name} (schema version {version}): {what} tuple has {len(tup)} columns, "
                f"the schema has {plan.ncols}"
            )
        try:
            if _STR_OR_NULL.issuperset(map(type, tup)):  # no UNCHANGED or binary value
                return plan.parse_row(tup)
            return tuple([(p(v) if type(v) is str else _not_text(v)) for p, v in zip(plan.parsers, tup, strict=False)])
        except Exception as e:  # locate the column for the message; the slow path is the error path
            for n, p, v in zip(plan.names, plan.parsers, tup, strict=True):
                try:
                    p(v) if type(v) is str else _not_text(v)
                except Exception as col_err:
                    raise self._value_error(plan, version, n, v, col_err) from col_err
            raise DecodeError(f"{plan.schema.name}: cannot mount {what} tuple: {e}", cause=e) from e

    def _key(self, plan: _Plan, tup: Sequence[Any], version: int) -> dict[str, Any]:
        if len(tup) != plan.ncols:
            raise DecodeError(
                f"{plan.schema.name} (schema version {version}): old key tuple has {len(tup)} columns, "
                f"the schema has {plan.ncols}"
            )
        out: dict[str, Any] = {}
        for i, n, p in plan.key:
            v = tup[i]
            if type(v) is not str:
                if v is None:
                    raise DecodeError(
                        f"{plan.schema.name} (schema version {version}): key column {n!r} is NULL in the "
                        "old key tuple; the table's key must be its replica identity"
                    )
                if v is not UNCHANGED:
                    raise self._value_error(plan, version, n, v, ValueError("binary-format value"))
                out[n] = v
                continue
            try:
                out[n] = p(v)
            except Exception as e:
                raise self._value_error(plan, version, n, v, e) from e
        return out

    @staticmethod
    def _value_error(plan: _Plan, version: int, column: str, value: Any, err: Exception) -> DecodeError:
        shown = value[:60] if isinstance(value, str | bytes) else value
        col = plan.schema.column(column)
        kind = f"{col.base_type}[]" if col.is_array else col.base_type
        return DecodeError(
            f"{plan.schema.name} (schema version {version}): column {column!r} ({kind}): "
            f"cannot parse {shown!r}: {err}",
            cause=err,
        )

    # ---- public -------------------------------------------------------------------------------
    def _mount(self, payload: bytes, commit_ts: int, commit_time: float) -> RowChange:
        """:attr:`mount` in Python, for every payload."""
        if len(payload) < 5:
            raise DecodeError(f"sorter payload too short ({len(payload)} bytes)")
        version = _unpack_version(payload)[0]
        plan = self._plans.get(version) or self._plan(version)
        # the common case, fused (one call of the decoder): an insert, or an update of nothing but its new row, all
        # text values that parse; anything else (and every error) takes the general path below
        plain = self._plain_row(payload, 4, plan.parse_row, plan.ncols)
        if plain is not None:
            schema = plan.schema
            if plain[1] == schema.relation_id or not schema.relation_id:
                return _positional(_PLAIN_OPS[plain[0]], schema, commit_ts, commit_time, plain[2], plain[3])
        pc = self._parse_change(payload[4:])
        schema = plan.schema
        if schema.relation_id and pc.relid != schema.relation_id:
            raise DecodeError(
                f"{schema.name} (schema version {version}): change is for relation {pc.relid}, "
                f"the schema is for relation {schema.relation_id}"
            )
        kind = pc.kind
        if kind == "I":
            assert pc.new is not None
            new = pc.new
            if UNCHANGED in new:  # (a MySQL partial row image) not a whole row: no ``row``
                return RowChange(OpType.INSERT, schema, commit_ts, commit_time, self._row(plan, new, version, "new"))
            return _positional(OpType.INSERT, schema, commit_ts, commit_time, self._values(plan, new, version, "new"), new)
        if kind == "U":
            assert pc.new is not None
            old = pc.old
            if old is None and UNCHANGED not in pc.new:
                return _positional(
                    OpType.UPDATE, schema, commit_ts, commit_time, self._values(plan, pc.new, version, "new"), pc.new
                )
            values = self._row(plan, pc.new, version, "new")
            if old is None:
                return RowChange(OpType.UPDATE, schema, commit_ts, commit_time, values)
            if pc.old_kind == "O":
                old_values = self._row(plan, old, version, "old")
                for v in pc.new:
                    if v is UNCHANGED:
                        # REPLICA IDENTITY FULL: the old row holds the unchanged datum.
                        for n, nv in values.items():
                            if nv is UNCHANGED:
                                values[n] = old_values[n]
                        break
            else:
                old_values = self._key(plan, old, version)
                for n, ov in old_values.items():
                    if values[n] is UNCHANGED:  # unchanged key datum: same value as the old key
                        values[n] = ov
            return RowChange(OpType.UPDATE, schema, commit_ts, commit_time, values, old_values)
        if kind == "D":
            assert pc.old is not None
            if pc.old_kind == "O":
                old_values = self._row(plan, pc.old, version, "old")
            else:
                old_values = self._key(plan, pc.old, version)
            return RowChange(OpType.DELETE, schema, commit_ts, commit_time, None, old_values)
        if kind == "T":
            return RowChange(
                OpType.TRUNCATE,
                schema,
                commit_ts,
                commit_time,
                extra={"truncate_options": pc.truncate_options},
            )
        raise DecodeError(f"{schema.name} (schema version {version}): unexpected change kind {kind!r}")
