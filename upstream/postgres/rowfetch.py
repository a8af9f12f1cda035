"""Re-reading current upstream rows by key: the row source a sink uses for a row missing downstream.

When an UPDATE that does not carry every column (PostgreSQL leaves unchanged TOAST values out) finds no
row downstream, the sink must not fill the gaps with NULLs. It asks a :class:`RowFetcher`
(``sinks.base.RowSource``) for the row as the upstream holds it *now*: that row is at least as new as the
change, and every later change of it is still in the stream, so writing it and applying the rest converges
(Debezium's "reselect").

Values are exactly what the mounter would produce for the same row: the rows are read with ``COPY (SELECT
...) TO STDOUT`` in text format, i.e. with the types' output functions under the session settings every
upstream connection gets (``upstream.postgres.conn.SESSION_SETTINGS``, the same the walsender renders
pgoutput values with), and each text is parsed by the column's parser from ``upstream.postgres.types``.
TOASTed values come back in full.

Guarantees:
- ``fetch(schema, keys)`` returns one entry per key, in order: a dict of every column of ``schema`` by name,
  or None when the upstream has no row with that key (deleted since). One query per batch of at most
  ``batch`` keys; keys are matched by ``=`` on the key columns (``IS NOT DISTINCT FROM`` for nullable ones),
  each key value cast to its column's declared type, so a key given as its Python value or as its text
  works alike.
- Errors: :class:`cdc.errors.UpstreamUnavailable` when the upstream cannot be reached (retryable), another
  :class:`cdc.errors.TidewaterError` (``UpstreamError``, ``DecodeError``) when the query or a value fails
  (e.g. a column of ``schema`` no longer exists upstream). After a failure the connection is reopened on the
  next call.
- Threading: one caller thread at a time (the span's sink thread); ``close()`` ends the connection.
- Read-only: the session is ``default_transaction_read_only`` with a ``statement_timeout``; nothing is
  written to the upstream.
"""

from __future__ import annotations

import io
import logging
import re
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from psycopg2 import sql

from cdc.errors import DecodeError, TidewaterError
from cdc.events import ColumnSchema, TableSchema
from upstream.postgres import conn as pg_conn
from upstream.postgres.conn import pg_errors
from upstream.postgres.types import Parser, parser_for

log = logging.getLogger(__name__)

BATCH_KEYS = 500  # keys per query
STATEMENT_TIMEOUT_MS = 30000

_COPY_ESCAPES = {"b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v"}
_COPY_ESCAPE_RE = re.compile(r"\\(.)", re.S)


def copy_unescape(field: str) -> str | None:
    """One field of COPY's text format: ``\\N`` is NULL; backslash escapes are undone (also used by
    :mod:`upstream.postgres.snapshot_read`)."""
    if field == "\\N":
        return None
    if "\\" not in field:
        return field
    return _COPY_ESCAPE_RE.sub(lambda m: _COPY_ESCAPES.get(m.group(1), m.group(1)), field)


def cast_type(col: ColumnSchema) -> sql.Composable:
    """The type a key value is cast to: the column's declared type (``format_type``), else its base type (also
    the cast of chunk bounds in :mod:`upstream.postgres.snapshot_read`)."""
    if col.type_name:
        return sql.SQL(col.type_name)  # format_type() output: already quoted where needed
    return sql.SQL(col.base_type + ("[]" if col.is_array else ""))


def _param(value: Any) -> Any:
    """A key value as a query parameter (psycopg2 adapts the rest; the SQL casts it to the column type)."""
    if isinstance(value, uuid.UUID):
        return str(value)
    return value


class RowFetcher:
    """A ``sinks.base.RowSource`` reading the current rows of one upstream (see the module docstring).

    ``connect(uri)`` opens an autocommit connection (default :func:`upstream.postgres.conn.connect`); it is
    opened on the first call and kept until :meth:`close` or a failure.
    """

    def __init__(self, upstream_uri: str, *, label: str = "", batch: int = BATCH_KEYS,
                 connect: Callable[[str], Any] = pg_conn.connect) -> None:
        self._uri = upstream_uri
        self._label = label
        self._batch = max(1, batch)
        self._connect = connect
        self._conn: Any = None
        self.queries = 0  # queries run (for tests and metrics)

    def __call__(self, schema: TableSchema, keys: Sequence[tuple[Any, ...]]) -> list[dict[str, Any] | None]:
        out: list[dict[str, Any] | None] = []
        for start in range(0, len(keys), self._batch):
            out.extend(self._fetch(schema, keys[start:start + self._batch]))
        return out

    def __enter__(self) -> RowFetcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # noqa: BLE001 - closing a broken connection
                pass

    # ---- internals -------------------------------------------------------------------------------
    def _connection(self) -> Any:
        if self._conn is None:
            conn = self._connect(self._uri)
            try:
                with pg_errors(conn, "preparing the row-fetch session"), conn.cursor() as cur:
                    cur.execute(f"SET statement_timeout = {STATEMENT_TIMEOUT_MS}")
                    cur.execute("SET default_transaction_read_only = on")
            except BaseException:
                conn.close()
                raise
            self._conn = conn
        return self._conn

    def _fetch(self, schema: TableSchema, keys: Sequence[tuple[Any, ...]]) -> list[dict[str, Any] | None]:
        if not keys:
            return []
        key_cols = [schema.column(k) for k in schema.key]
        for k in keys:
            if len(k) != len(key_cols):
                raise TidewaterError(f"{schema.name}: a key of {len(k)} value(s) for a key of {len(key_cols)} "
                                     f"column(s) {list(schema.key)}")
        query = self._query(schema, key_cols, len(keys))
        params = [p for i, k in enumerate(keys) for p in (i, *map(_param, k))]
        conn = self._connection()
        buf = io.StringIO()
        try:
            with pg_errors(conn, f"re-reading {len(keys)} row(s) of {schema.name}"), conn.cursor() as cur:
                cur.copy_expert(cur.mogrify(query, params), buf)
        except BaseException:
            self.close()  # reopened on the next call
            raise
        self.queries += 1
        return self._rows(schema, buf.getvalue(), len(keys))

    @staticmethod
    def _query(schema: TableSchema, key_cols: list[ColumnSchema], n: int) -> sql.Composed:
        """``COPY (SELECT k.i, t.<columns> FROM (VALUES (%s, %s::type, ...), ...) k(i, ...) JOIN t ON ...)``."""
        knames = [sql.Identifier(f"k{j}") for j in range(len(key_cols))]
        row = sql.SQL("({})").format(sql.SQL(", ").join(
            [sql.SQL("%s::int4")] + [sql.SQL("%s::{}").format(cast_type(c)) for c in key_cols]))
        values = sql.SQL(", ").join([row] * n)
        on = sql.SQL(" AND ").join(
            sql.SQL("t.{} {} k.{}").format(sql.Identifier(c.name),
                                           sql.SQL("IS NOT DISTINCT FROM" if c.nullable and not c.is_key else "="),
                                           kn)
            for c, kn in zip(key_cols, knames, strict=True))
        cols = sql.SQL(", ").join(sql.SQL("t.{}").format(sql.Identifier(c.name)) for c in schema.columns)
        return sql.SQL("COPY (SELECT k.i, {cols} FROM (VALUES {values}) AS k(i, {knames}) "
                       "JOIN {table} AS t ON {on}) TO STDOUT").format(
            cols=cols, values=values, knames=sql.SQL(", ").join(knames),
            table=sql.Identifier(schema.name.schema, schema.name.table), on=on)

    @staticmethod
    def _rows(schema: TableSchema, text: str, n: int) -> list[dict[str, Any] | None]:
        names = schema.column_names
        parsers: list[Parser] = [parser_for(c.base_type, c.is_array) for c in schema.columns]
        out: list[dict[str, Any] | None] = [None] * n
        for line in text.split("\n"):
            if not line:
                continue
            fields = line.split("\t")
            if len(fields) != len(names) + 1:
                raise DecodeError(f"{schema.name}: re-read row has {len(fields) - 1} columns, the schema "
                                  f"{len(names)}")
            i = int(fields[0])
            if out[i] is not None:
                continue  # several rows match (a table without a unique key): the first one
            row: dict[str, Any] = {}
            for name, parse, field in zip(names, parsers, fields[1:], strict=True):
                value = copy_unescape(field)
                try:
                    row[name] = None if value is None else parse(value)
                except (ValueError, ArithmeticError) as exc:
                    raise DecodeError(f"{schema.name}: column {name!r}: cannot parse re-read value "
                                      f"{value[:60]!r}: {exc}", cause=exc) from exc
            out[i] = row
        return out
