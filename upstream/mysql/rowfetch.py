"""Current upstream rows by key (:class:`upstream.base.RowReader`) for a MySQL/MariaDB upstream.

Each value is read with ``SELECT`` (session time zone UTC), rendered to the same text as the stream renders it
(:mod:`upstream.mysql.types`) and parsed with the vocabulary's parsers, so a fetched row equals the row the mounter
makes of the same data. A value the stream would refuse (a zero date) raises ``DecodeError`` here as well.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from cdc.errors import DecodeError
from cdc.events import TableSchema
from cdc.uri import parse_upstream_uri
from upstream.mysql import catalog, conn
from upstream.mysql.conn import describe_uri, mysql_errors
from upstream.postgres import types as text_types


def quoted(ident: str) -> str:
    """``ident`` as a MySQL identifier (backquoted)."""
    return "`" + ident.replace("`", "``") + "`"


def bind_value(v: Any) -> Any:
    """A parsed value (the vocabulary's) as a PyMySQL query parameter (TIMESTAMP values as UTC: the session's zone)."""
    if isinstance(v, datetime) and v.tzinfo is not None:
        return v.astimezone(UTC).replace(tzinfo=None)
    if isinstance(v, bytes | bytearray):
        return bytes(v)
    return v


@dataclass(frozen=True, slots=True)
class ColumnReaders:
    """Per column of a schema, in its order: the renderer of a value as ``SELECT`` returns it to the text the binlog
    stream renders, and the vocabulary's parser of that text (the pair that makes a read row equal a streamed one)."""

    render: tuple[Callable[[Any], str], ...]
    parse: tuple[Callable[[str], Any], ...]


def column_readers(conn: Any, where: str, schema: TableSchema) -> ColumnReaders:
    """:class:`ColumnReaders` of ``schema``'s columns (the renderers from the table's catalog facts now)."""
    facts = catalog.table_facts(conn, where, schema.name)
    renderers = dict(zip((c.name for c in facts.columns), facts.renderers(), strict=True))
    missing = [c.name for c in schema.columns if c.name not in renderers]
    if missing:
        raise DecodeError(f"table {schema.name}: column(s) {', '.join(missing)} no longer exist upstream")
    return ColumnReaders(tuple(renderers[c.name] for c in schema.columns),
                         tuple(text_types.parser_for(c.base_type, c.is_array) for c in schema.columns))


class RowFetcher:
    """``reader(schema, keys)``: per key, the row now (every column by name) or None. One thread at a time."""

    def __init__(self, uri: str, *, label: str = "") -> None:
        self.uri = uri
        self.label = label
        self.where = describe_uri(parse_upstream_uri(uri))
        self._conn: Any = None

    def __call__(self, schema: TableSchema, keys: Sequence[tuple[Any, ...]]) -> list[dict[str, Any] | None]:
        if self._conn is None:
            self._conn = conn.connect(self.uri)
        readers = column_readers(self._conn, self.where, schema)
        names = [c.name for c in schema.columns]
        sql = (f"SELECT {', '.join(quoted(n) for n in names)} FROM {quoted(schema.name.schema)}."
               f"{quoted(schema.name.table)} WHERE " + " AND ".join(f"{quoted(k)} = %s" for k in schema.key))
        out: list[dict[str, Any] | None] = []
        with mysql_errors(self.where, f"reading rows of {schema.name}"), self._conn.cursor() as cur:
            for key in keys:
                cur.execute(sql, [bind_value(v) for v in key])
                row = cur.fetchone()
                if row is None:
                    out.append(None)
                    continue
                vals: dict[str, Any] = {}
                for n, r, p, v in zip(names, readers.render, readers.parse, row, strict=True):
                    try:
                        vals[n] = None if v is None else p(r(v))
                    except (ValueError, ArithmeticError) as exc:
                        raise DecodeError(f"table {schema.name} column {n}: {exc}") from exc
                out.append(vals)
        return out

    def close(self) -> None:
        c, self._conn = self._conn, None
        if c is not None:
            try:
                c.close()
            except Exception:  # noqa: BLE001
                pass
