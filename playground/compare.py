"""Row-by-row comparison of upstream PostgreSQL tables with their downstream copies.

Used by the demo and every replication test: both sides are read ordered by key and each value is
normalised to a canonical form (so that e.g. SQLite's 0/1 booleans, MySQL's naive UTC datetimes and
PostgreSQL's aware timestamps compare equal when they denote the same value). Returns the differing
keys, never just a count.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import uuid
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from cdc.uri import parse_sink_uri


@dataclass
class TableDiff:
    table: str
    source_rows: int
    target_rows: int
    missing: list[Any] = field(default_factory=list)  # keys upstream only
    extra: list[Any] = field(default_factory=list)  # keys downstream only
    different: list[Any] = field(default_factory=list)  # keys with different values
    sample: list[tuple[Any, Any]] = field(default_factory=list)  # (source row, target row) of the first differences
    # tables without a key (compared as multisets of full rows; missing/extra then hold row images):
    duplicates: int = 0  # target rows beyond the source's count of the same full row
    losses: int = 0  # source rows beyond the target's count of the same full row

    @property
    def equal(self) -> bool:
        return not (self.missing or self.extra or self.different)


def norm(v: Any) -> Any:
    if v is None:
        return None
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, (int,)):
        return v
    if isinstance(v, float):
        return v
    if isinstance(v, decimal.Decimal):
        if v.is_nan():
            return "NaN"
        return format(v.normalize(), "f")
    if isinstance(v, dt.datetime):
        if v.tzinfo is not None:
            v = v.astimezone(dt.UTC).replace(tzinfo=None)
        return v.isoformat(sep=" ")
    if isinstance(v, (dt.date, dt.time)):
        return v.isoformat()
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v).hex()
    if isinstance(v, uuid.UUID):
        return str(v)
    if isinstance(v, (list, tuple)):
        return json.dumps([norm(x) for x in v])
    if isinstance(v, dict):
        return json.dumps(v, sort_keys=True)
    if isinstance(v, str):
        s = v.strip()
        if s[:1] in "[{" and s[-1:] in "]}":
            try:
                return json.dumps(json.loads(s), sort_keys=True)
            except ValueError:
                pass
        try:  # numbers stored as text (SQLite NUMERIC affinity, MySQL DECIMAL read back as str)
            d = decimal.Decimal(s)
            if s and (s[0].isdigit() or s[0] in "-+.") and "e" not in s.lower():
                return format(d.normalize(), "f")
        except decimal.InvalidOperation:
            pass
        if len(s) >= 19 and s[4] == "-" and s[10] in "T ":
            try:
                return norm(dt.datetime.fromisoformat(s))
            except ValueError:
                pass
        return v
    return str(v)


def _same(a: Any, b: Any) -> bool:
    """Normalised values are equal, or both are numbers within float precision (a float8 read back
    from MySQL as DECIMAL(.., 10), a real widened to double)."""
    if a == b:
        return True
    if isinstance(a, float) or isinstance(b, float):
        try:
            fa, fb = float(a), float(b)
        except (TypeError, ValueError):
            return False
        return abs(fa - fb) <= 1e-6 * max(1.0, abs(fa), abs(fb))
    return False


def rows_equal(a: tuple, b: tuple) -> bool:
    return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))


def _source_rows(pg_conn: Any, schema: str, table: str, key: list[str]) -> tuple[list[str], dict[Any, tuple]]:
    import psycopg2.extras
    from psycopg2 import sql

    with pg_conn.cursor() as cur:
        # JSON as text on this cursor only (the caller's connection keeps its own typecasters)
        psycopg2.extras.register_default_json(cur, loads=lambda x: x)
        psycopg2.extras.register_default_jsonb(cur, loads=lambda x: x)
        cur.execute(sql.SQL("SELECT * FROM {}.{} ORDER BY {}").format(
            sql.Identifier(schema), sql.Identifier(table), sql.SQL(", ").join(map(sql.Identifier, key))))
        cols = [d.name for d in cur.description]
        idx = [cols.index(k) for k in key]
        rows = {}
        for r in cur:
            nr = tuple(norm(x) for x in r)
            rows[tuple(nr[i] for i in idx)] = nr
    return cols, rows


def _pg_key(pg_conn: Any, schema: str, table: str) -> list[str]:
    with pg_conn.cursor() as cur:
        cur.execute(
            """SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid
               AND a.attnum = ANY(i.indkey) WHERE i.indrelid = (quote_ident(%s) || '.' || quote_ident(%s))::regclass
               AND i.indisprimary ORDER BY array_position(i.indkey, a.attnum)""", (schema, table))
        return [r[0] for r in cur.fetchall()]


def sqlalchemy_url(sink_uri: str) -> str:
    u = parse_sink_uri(sink_uri)
    if u.scheme in ("mysql", "mariadb"):
        return "mysql+pymysql://" + sink_uri.split("://", 1)[1]
    if u.scheme in ("postgresql", "postgres"):
        return "postgresql+psycopg2://" + sink_uri.split("://", 1)[1]
    return sink_uri


def compare_tables(pg_conn: Any, tables: list[str], sink_uri: str) -> list[TableDiff]:
    """Compare ``schema.table`` upstream tables with where the sink put them (see docs/type-mapping.md)."""
    u = parse_sink_uri(sink_uri)
    engine = sa.create_engine(sqlalchemy_url(sink_uri))
    out = []
    try:
        with engine.connect() as tconn:
            for qualified in tables:
                schema, _, table = qualified.partition(".")
                key = _pg_key(pg_conn, schema, table)
                target_schema = schema if u.scheme in ("postgresql", "postgres") else None
                if not key:  # no primary key (REPLICA IDENTITY FULL): compare multisets of full rows
                    out.append(_compare_multiset(pg_conn, tconn, qualified, schema, table, target_schema))
                    continue
                cols, src = _source_rows(pg_conn, schema, table, key)
                meta = sa.MetaData()
                try:
                    t = sa.Table(table, meta, autoload_with=tconn, schema=target_schema)
                except sa.exc.NoSuchTableError:
                    out.append(TableDiff(qualified, len(src), 0, missing=sorted(src)[:20]))
                    continue
                res = tconn.execute(sa.select(*[t.c[c] for c in cols]))
                idx = [cols.index(k) for k in key]
                dst = {}
                for r in res:
                    nr = tuple(norm(x) for x in r)
                    dst[tuple(nr[i] for i in idx)] = nr
                diff = TableDiff(qualified, len(src), len(dst))
                diff.missing = sorted(k for k in src if k not in dst)[:20]
                diff.extra = sorted(k for k in dst if k not in src)[:20]
                diff.different = sorted(k for k in src if k in dst and not rows_equal(src[k], dst[k]))[:20]
                diff.sample = [(src[k], dst[k]) for k in diff.different[:3]]
                out.append(diff)
    finally:
        engine.dispose()
    return out


def _compare_multiset(pg_conn: Any, tconn: Any, qualified: str, schema: str, table: str,
                      target_schema: str | None) -> TableDiff:
    """A table without a key: count each full-row image on both sides. Every surplus copy downstream is a
    duplicate (a transaction applied twice), every missing copy a loss; ``missing``/``extra`` list up to 20
    such row images."""
    import collections

    import psycopg2.extras
    from psycopg2 import sql

    with pg_conn.cursor() as cur:
        psycopg2.extras.register_default_json(cur, loads=lambda x: x)
        psycopg2.extras.register_default_jsonb(cur, loads=lambda x: x)
        cur.execute(sql.SQL("SELECT * FROM {}.{}").format(sql.Identifier(schema), sql.Identifier(table)))
        cols = [d.name for d in cur.description]
        src = collections.Counter(tuple(norm(x) for x in r) for r in cur)
    try:
        t = sa.Table(table, sa.MetaData(), autoload_with=tconn, schema=target_schema)
    except sa.exc.NoSuchTableError:
        n = sum(src.values())
        return TableDiff(qualified, n, 0, missing=sorted(src, key=repr)[:20], losses=n)
    dst = collections.Counter(tuple(norm(x) for x in r) for r in tconn.execute(sa.select(*[t.c[c] for c in cols])))
    diff = TableDiff(qualified, sum(src.values()), sum(dst.values()))
    lost, dup = src - dst, dst - src
    diff.losses, diff.duplicates = sum(lost.values()), sum(dup.values())
    diff.missing = sorted(lost, key=repr)[:20]
    diff.extra = sorted(dup, key=repr)[:20]
    return diff
