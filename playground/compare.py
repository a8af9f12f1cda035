"""Row-by-row comparison of upstream PostgreSQL tables with their downstream copies.

Used by the demo and every replication test: both sides are read ordered by key and each value is
normalised to a canonical form (so that e.g. SQLite's 0/1 booleans, MySQL's naive UTC datetimes and
PostgreSQL's aware timestamps compare equal when they denote the same value). Returns the differing
keys, never just a count. A table without a primary key (REPLICA IDENTITY FULL) is compared as a multiset
of rows (a duplicated row downstream is ``extra``); a key held by several target rows is a ``duplicate``.

The comparison is exact where the target can be (docs/type-mapping.md, docs/limits.md): numbers are equal
only when their values are (no float tolerance; ``numeric`` by Decimal value into typed DECIMAL/numeric
columns, by its exact upstream text -- scale and trailing zeros included -- where it is stored as text);
arrays with lower bounds other than 1 keep their bounds in the comparison; the documented differences are
equal: ``-0.0`` and ``0.0`` (MariaDB and SQLite drop the sign), NaN and NaN.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import math
import re
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
    duplicates: list[Any] = field(default_factory=list)  # keys held by more than one target row
    losses: int = 0  # source rows (all of them, not only the first 20) absent downstream
    surplus: int = 0  # target rows (all of them) with no source counterpart: duplicates of a key-less table
    absent: bool = False  # the target has no such table (unequal even when the source table is empty)

    @property
    def equal(self) -> bool:
        return not (self.absent or self.missing or self.extra or self.different or self.duplicates)


def exact_number(v: decimal.Decimal) -> str:
    """The exact value of a finite Decimal as fixed-point text without trailing zeros (``1.50`` -> ``1.5``,
    ``0E-8`` -> ``0``). No rounding: ``Decimal.normalize()`` would round to the context's 28 digits."""
    text = format(v, "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def decimal_text(v: decimal.Decimal) -> str:
    """PostgreSQL's ``numeric_out`` text of a Decimal: fixed point, scale kept (``1.50``, ``0.0000001``)."""
    return format(v, "f") if v.is_finite() else str(v)


def _special_float(v: float) -> Any:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "Infinity" if v > 0 else "-Infinity"
    return 0.0 if v == 0 else v  # -0.0 is 0.0: MariaDB and SQLite drop the sign (docs/type-mapping.md)


def _element(v: Any) -> Any:
    """An array element or JSON value in the form the JSON targets store it (docs/type-mapping.md): decimals
    as their exact text with their scale, NaN/Infinity as strings, timestamps normalised, bytea as ``\\x..``."""
    if v is None or isinstance(v, (bool, int)):
        return v
    if isinstance(v, float):
        return _special_float(v)
    if isinstance(v, decimal.Decimal):
        return decimal_text(v)
    if isinstance(v, (list, tuple)):
        return [_element(x) for x in v]
    if isinstance(v, dict):
        return {k: _element(x) for k, x in v.items()}
    if isinstance(v, (bytes, bytearray, memoryview)):
        return "\\x" + bytes(v).hex()
    if isinstance(v, str):
        return _timestamp_text(v, v)
    return norm(v)


def _timestamp_text(s: str, otherwise: Any) -> Any:
    """``s`` normalised as a timestamp when it is ISO timestamp text, else ``otherwise``."""
    if len(s) >= 19 and s[4:5] == "-" and s[10:11] in ("T", " "):
        try:
            return norm(dt.datetime.fromisoformat(s))
        except ValueError:
            pass
    return otherwise


def norm(v: Any) -> Any:
    """The canonical form of one value, exact: equal forms mean equal values (numbers are compared exactly,
    never within a tolerance). A ``numeric`` column goes through :func:`norm_numeric`, and
    :func:`compare_tables` also requires its text downstream to be exactly the upstream's."""
    if v is None:
        return None
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, (int,)):
        return v
    if isinstance(v, float):
        return _special_float(v)
    if isinstance(v, decimal.Decimal):
        return exact_number(v) if v.is_finite() else str(v)
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
        return json.dumps(_element(list(v)), sort_keys=True)
    if isinstance(v, dict):
        return json.dumps(_element(v), sort_keys=True)
    if isinstance(v, str):
        s = v.strip()
        if s[:1] in "[{" and s[-1:] in "]}":
            try:
                return json.dumps(_element(json.loads(s)), sort_keys=True)
            except ValueError:
                pass
        return _timestamp_text(s, v)
    return str(v)


def norm_numeric(v: Any) -> Any:
    """:func:`norm` for a ``numeric`` column, whose value may be stored as text downstream (SQLite)."""
    if isinstance(v, str):
        try:
            d = decimal.Decimal(v)
        except decimal.InvalidOperation:
            return v
        return exact_number(d) if d.is_finite() else str(d)
    return norm(v)


def _normalizers(n: int, numeric: list[int]) -> list[Any]:
    return [norm_numeric if i in numeric else norm for i in range(n)]


def _same(a: Any, b: Any) -> bool:
    """Normalised values are equal (exactly: no tolerance for numbers)."""
    return a == b


def rows_equal(a: tuple, b: tuple) -> bool:
    return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))


def with_bounds(value: Any, dims: str | None) -> Any:
    """An array whose lower bounds are not all 1 (``array_dims`` ``[0:2]``) keeps them in its canonical
    form, so that a target that dropped them differs."""
    if value is None or dims is None or all(b.split(":")[0] == "1" for b in dims.strip("[]").split("][")):
        return value
    return f"{dims}={value}"


def text_exact(src: tuple, dst_raw: tuple, numeric: list[int]) -> bool:
    """numeric columns stored as text downstream hold exactly the upstream's text (scale and trailing
    zeros included, never exponent notation): ``1.50`` is not ``1.5``."""
    for i in numeric:
        d = dst_raw[i]
        if isinstance(d, str) and isinstance(src[i], decimal.Decimal) and d != decimal_text(src[i]):
            return False
    return True


_BOUNDS_PREFIX = r"^(\[-?[0-9]+:-?[0-9]+\])+="


def _rebased(column: Any, typ: str) -> Any:
    """``column``'s array with its bounds decoration removed (lower bounds 1), as type ``typ``."""
    from psycopg2 import sql

    return sql.SQL("(regexp_replace({}::text, {}, '')::{})").format(column, sql.Literal(_BOUNDS_PREFIX), sql.SQL(typ))


def _row_key(row: list[Any], idx: list[int], seen: dict[tuple, int]) -> tuple:
    """The key of a normalised row: its key columns; for a table without a key (REPLICA IDENTITY FULL)
    ``(row, n)`` for the row's n-th occurrence, so that rows compare as a multiset and a duplicate shows."""
    if idx:
        return tuple(row[i] for i in idx)
    whole = tuple(row)
    n = seen[whole] = seen.get(whole, 0) + 1
    return (whole, n)


def _sorted(keys: Any) -> list[Any]:
    """Keys in a stable order, also when they mix None, numbers and text (rows of key-less tables)."""
    keys = list(keys)
    try:
        return sorted(keys)
    except TypeError:
        return sorted(keys, key=repr)


def _source_rows(pg_conn: Any, schema: str, table: str, key: list[str]
                 ) -> tuple[list[str], dict[Any, tuple], dict[Any, tuple], list[int]]:
    """Column names, canonical rows by canonical key, raw rows by canonical key, numeric column indexes."""
    import psycopg2.extras
    from psycopg2 import sql

    with pg_conn.cursor() as cur:
        cur.execute(
            """SELECT a.attname, t.typcategory = 'A',
                      CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE t.oid END = 'numeric'::regtype,
                      CASE WHEN e.typtype = 'd' THEN pg_catalog.format_type(e.typbasetype, e.typtypmod) || '[]'
                           WHEN e.typtype = 'e' OR e.typnamespace <> 'pg_catalog'::regnamespace THEN 'text[]'
                           ELSE pg_catalog.format_type(a.atttypid, a.atttypmod) END
               FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
               LEFT JOIN pg_type e ON e.oid = t.typelem AND t.typcategory = 'A'
               WHERE a.attrelid = (quote_ident(%s) || '.' || quote_ident(%s))::regclass
                 AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum""", (schema, table))
        kinds = cur.fetchall()
    arrays = [n for n, is_array, _, _ in kinds if is_array]
    with pg_conn.cursor() as cur:
        # JSON as text on this cursor only (the caller's connection keeps its own typecasters)
        psycopg2.extras.register_default_json(cur, loads=lambda x: x)
        psycopg2.extras.register_default_jsonb(cur, loads=lambda x: x)
        # psycopg2 cannot read an array with bounds: read it rebased to 1, and its bounds beside it;
        # arrays of domains as arrays of the base type, of enums and other user types as text[] (psycopg2
        # would return their text)
        select = sql.SQL(", ").join(
            sql.SQL("{} AS {}").format(_rebased(sql.Identifier(n), typ) if is_array else sql.Identifier(n),
                                        sql.Identifier(n))
            for n, is_array, _, typ in kinds)
        dims = sql.SQL("").join(sql.SQL(", array_dims({})").format(sql.Identifier(a)) for a in arrays)
        order = sql.SQL(" ORDER BY {}").format(sql.SQL(", ").join(map(sql.Identifier, key))) if key else sql.SQL("")
        cur.execute(sql.SQL("SELECT {}{} FROM {}.{}{}").format(
            select, dims, sql.Identifier(schema), sql.Identifier(table), order))
        ncols = len(cur.description) - len(arrays)
        cols = [d.name for d in cur.description[:ncols]]
        idx = [cols.index(k) for k in key]
        arr_idx = [cols.index(a) for a in arrays]
        numeric = [cols.index(n) for n, _, is_num, _ in kinds if is_num and n in cols]
        fns = _normalizers(ncols, numeric)
        rows, raw = {}, {}
        seen: dict[tuple, int] = {}
        for r in cur:
            nr = [f(x) for f, x in zip(fns, r[:ncols], strict=True)]
            for j, i in enumerate(arr_idx):
                nr[i] = with_bounds(nr[i], r[ncols + j])
            k = _row_key(nr, idx, seen)
            rows[k] = tuple(nr)
            raw[k] = tuple(r[:ncols])
    return cols, rows, raw, numeric


def _raw(column: Any) -> Any:
    """The column as its driver returns it: SQLAlchemy's MySQL DOUBLE is ``asdecimal`` and would turn a
    float into a Decimal rounded to 10 fractional digits (5e-324 -> 0). Arrays (PostgreSQL) rebased to 1,
    which psycopg2 can read (their bounds are read beside them)."""
    if isinstance(column.type, sa.Float):
        return sa.type_coerce(column, sa.Float(asdecimal=False))
    if isinstance(column.type, sa.ARRAY):
        return sa.cast(sa.func.regexp_replace(sa.cast(column, sa.Text), _BOUNDS_PREFIX, ""), column.type)
    return column


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


def _diff(qualified: str, cols: list[str], key: list[str], src: dict[Any, tuple], src_raw: dict[Any, tuple],
          numeric: list[int], target: Any, arr_idx: list[int]) -> TableDiff:
    """Compare the source's canonical rows with ``target`` rows (values in ``cols`` order, then the
    ``array_dims`` of the array columns ``arr_idx`` when there are any)."""
    idx = [cols.index(k) for k in key]
    n = len(cols)
    fns = _normalizers(n, numeric)
    dst, dst_raw = {}, {}
    duplicates = []
    dst_seen: dict[tuple, int] = {}
    read = 0
    for r in target:
        read += 1
        nr = [f(x) for f, x in zip(fns, r[:n], strict=True)]
        for j, i in enumerate(arr_idx):
            nr[i] = with_bounds(nr[i], r[n + j])
        k = _row_key(nr, idx, dst_seen)
        if idx and k in dst:
            duplicates.append(k)
        dst[k] = tuple(nr)
        dst_raw[k] = tuple(r[:n])
    diff = TableDiff(qualified, len(src), read, duplicates=_sorted(set(duplicates))[:20])
    missing = [k for k in src if k not in dst]
    extra = [k for k in dst if k not in src]
    diff.losses, diff.surplus = len(missing), len(extra) + len(duplicates)
    diff.missing = _sorted(missing)[:20]
    diff.extra = _sorted(extra)[:20]
    diff.different = _sorted(
        k for k in src if k in dst and not (
            rows_equal(src[k], dst[k]) and text_exact(src_raw[k], dst_raw[k], numeric)))[:20]
    diff.sample = [(src[k], dst[k]) for k in diff.different[:3]]
    return diff


def compare_rows(pg_conn: Any, qualified: str, rows: Any) -> TableDiff:
    """Compare the upstream table ``schema.table`` with ``rows`` (dicts by column name, e.g. a table rebuilt from
    the storage sink's files by ``sinks.storage.reader``), with the same canonical forms as
    :func:`compare_tables`. Arrays carry no bounds there: one with lower bounds other than 1 differs."""
    schema, _, table = qualified.partition(".")
    key = _pg_key(pg_conn, schema, table)
    cols, src, src_raw, numeric = _source_rows(pg_conn, schema, table, key)
    return _diff(qualified, cols, key, src, src_raw, numeric, (tuple(r.get(c) for c in cols) for r in rows), [])


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
                cols, src, src_raw, numeric = _source_rows(pg_conn, schema, table, key)
                meta = sa.MetaData()
                try:
                    t = sa.Table(table, meta, autoload_with=tconn, schema=target_schema)
                except sa.exc.NoSuchTableError:
                    out.append(TableDiff(qualified, len(src), 0, missing=_sorted(src)[:20], losses=len(src), absent=True))
                    continue
                arrays = [c for c in cols if isinstance(t.c[c].type, sa.ARRAY)]
                res = tconn.execute(sa.select(*[_raw(t.c[c]) for c in cols],
                                              *[sa.func.array_dims(t.c[c]) for c in arrays]))
                diff = _diff(qualified, cols, key, src, src_raw, numeric, res, [cols.index(a) for a in arrays])
                out.append(diff)
    finally:
        engine.dispose()
    return out



# ---- a MySQL/MariaDB upstream ------------------------------------------------------------------------------
def _bit_width(column_type: str) -> int:
    m = re.match(r"bit\((\d+)\)", column_type.strip().lower())
    return int(m.group(1)) if m else 1


def _mysql_source_rows(my_conn: Any, schema: str, table: str
                       ) -> tuple[list[str], list[str], dict[Any, tuple], dict[Any, tuple], list[int]]:
    """Like :func:`_source_rows` for a MySQL/MariaDB table (session time zone UTC): columns, key, canonical rows,
    raw rows, numeric column indexes (DECIMAL and BIGINT UNSIGNED, which Tidewater carries as numeric). TIME values
    (``timedelta``) are compared as times of day, the only ones the upstream replicates."""
    with my_conn.cursor() as cur:
        cur.execute("SET time_zone = '+00:00'")
        cur.execute("SELECT COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, COLUMN_KEY FROM information_schema.COLUMNS "
                    "WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s ORDER BY ORDINAL_POSITION", (schema, table))
        kinds = cur.fetchall()
        cur.execute("SELECT COLUMN_NAME FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = %s AND "
                    "TABLE_NAME = %s AND INDEX_NAME = 'PRIMARY' ORDER BY SEQ_IN_INDEX", (schema, table))
        key = [r[0] for r in cur.fetchall()]
    cols = [k[0] for k in kinds]
    numeric = [i for i, k in enumerate(kinds)
               if k[1] == "decimal" or (k[1] == "bigint" and "unsigned" in str(k[2]).lower())]
    times = [i for i, k in enumerate(kinds) if k[1] == "time"]
    bits = {i: _bit_width(str(k[2])) for i, k in enumerate(kinds) if k[1] == "bit"}
    fns = _normalizers(len(cols), numeric)
    idx = [cols.index(k) for k in key]
    q = lambda n: "`" + n.replace("`", "``") + "`"  # noqa: E731
    rows, raw = {}, {}
    seen: dict[tuple, int] = {}
    with my_conn.cursor() as cur:
        cur.execute(f"SELECT {', '.join(map(q, cols))} FROM {q(schema)}.{q(table)}")
        for r in cur.fetchall():
            r = list(r)
            for i in numeric:
                if isinstance(r[i], int):
                    r[i] = decimal.Decimal(r[i])
            for i in times:
                if isinstance(r[i], dt.timedelta):
                    r[i] = (dt.datetime.min + r[i]).time()
            for i, width in bits.items():
                if isinstance(r[i], bytes):  # BIT(n) is carried as bit(n): compared as its n-character text
                    r[i] = format(int.from_bytes(r[i], "big"), f"0{width}b")
            nr = [f(x) for f, x in zip(fns, r, strict=True)]
            k = _row_key(nr, idx, seen)
            rows[k] = tuple(nr)
            raw[k] = tuple(r)
    return cols, key, rows, raw, numeric


def compare_mysql_rows(my_conn: Any, qualified: str, rows: Any) -> TableDiff:
    """:func:`compare_rows` for a MySQL/MariaDB upstream table ``db.table`` (``rows``: dicts by column name, e.g. a
    table rebuilt from the storage sink's files)."""
    schema, _, table = qualified.partition(".")
    cols, key, src, src_raw, numeric = _mysql_source_rows(my_conn, schema, table)
    return _diff(qualified, cols, key, src, src_raw, numeric, (tuple(r.get(c) for c in cols) for r in rows), [])


def compare_mysql_tables(my_conn: Any, tables: list[str], sink_uri: str) -> list[TableDiff]:
    """:func:`compare_tables` for a MySQL/MariaDB upstream (``my_conn``: a PyMySQL connection): ``db.table`` names,
    whose target tables are named ``table`` in MySQL/SQLite targets and ``db.table`` in PostgreSQL ones."""
    u = parse_sink_uri(sink_uri)
    engine = sa.create_engine(sqlalchemy_url(sink_uri))
    out = []
    try:
        with engine.connect() as tconn:
            for qualified in tables:
                schema, _, table = qualified.partition(".")
                cols, key, src, src_raw, numeric = _mysql_source_rows(my_conn, schema, table)
                target_schema = schema if u.scheme in ("postgresql", "postgres") else None
                try:
                    t = sa.Table(table, sa.MetaData(), autoload_with=tconn, schema=target_schema)
                except sa.exc.NoSuchTableError:
                    out.append(TableDiff(qualified, len(src), 0, missing=_sorted(src)[:20], losses=len(src), absent=True))
                    continue
                res = tconn.execute(sa.select(*[_raw(t.c[c]) for c in cols]))
                out.append(_diff(qualified, cols, key, src, src_raw, numeric, res, []))
    finally:
        engine.dispose()
    return out
