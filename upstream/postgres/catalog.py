"""Catalog introspection of the upstream PostgreSQL: which tables exist and what they look like.

All functions take an open, ordinary (non-replication) autocommit psycopg2 connection, run read-only
catalog queries and are safe to call concurrently on *different* connections. Identifiers are
compared exactly (case- and space-sensitive), as they are stored in ``pg_class``.

Choices documented here, relied on by the puller and the sinks:

- :func:`list_tables` returns ordinary (``r``) and partitioned (``p``) tables outside ``pg_catalog``,
  ``information_schema``, ``tidewater`` (Tidewater's own upstream objects, ``capture_objects``) and the
  ``pg_toast*``/``pg_temp*`` schemas. Partitions (children of a
  partitioned table) are *not* listed: their parent is, and publications are created with
  ``publish_via_partition_root`` so their changes arrive under the parent's name. Temporary and
  unlogged tables are not listed either: PostgreSQL cannot publish them.
- :func:`table_schema` lists columns in ``attnum`` order, skipping dropped and *virtual* generated
  columns (pgoutput never sends those). *Stored* generated columns are listed like plain columns, as
  the Relation message lists them: Tidewater creates its publications with
  ``publish_generated_columns = stored`` (PostgreSQL 18+; measured: without it pgoutput leaves them
  out of the Relation message and the tuples; with it they arrive as plain columns with their computed
  values). :func:`generated_columns` tells which columns are generated.
- ``ColumnSchema.base_type`` is the ``pg_type.typname`` of the column's type after resolving domains
  (recursively) and, for arrays, of the element type (``is_array`` is then true). Enums and every other
  user-defined non-domain type (composite, range over a user type, extension types such as ``citext``
  or ``hstore``) report ``base_type = 'text'``: their values are exchanged in text form.
  ``type_oid`` is the declared type (``atttypid``, as in pgoutput's Relation message); ``type_name``
  is ``format_type(atttypid, atttypmod)``, except for domains (and arrays of domains): there it is
  ``format_type()`` of the base type with the domain's modifier (``numeric(10,2)``, ``integer[]``), so
  that a target creates the base type; ``type_modifier`` is ``atttypmod``, or the modifier of the
  first domain that has one.
- Key: with ``REPLICA IDENTITY INDEX`` the identity index's columns (that is what pgoutput sends as
  the old key, even when a primary key exists); with ``DEFAULT`` the primary key (index column order)
  if it is *not* DEFERRABLE (PostgreSQL cannot use a deferrable key as replica identity: such a table
  has no identity, ``key = ()``; measured on 18.6: its UPDATE/DELETE fail once it is published); with
  ``FULL`` the primary key even when deferrable (old images are full rows, and the key is unique at
  every commit, which is what the sink applies); for
  ``REPLICA IDENTITY FULL`` without a primary key all columns with ``has_key = False``; with no
  usable identity ``key = ()`` and ``has_key = False``. ``ColumnSchema.is_key`` is true exactly for
  the columns in ``key``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from psycopg2 import sql

from cdc.errors import InvalidArgument
from cdc.events import ColumnSchema, TableName, TableSchema
from upstream.base import PartitionLeaf
from upstream.postgres.conn import pg_errors

PG_CATALOG_NAMESPACE = 11  # oid of pg_catalog

_LIST_TABLES = """
SELECT n.nspname, c.relname
FROM pg_catalog.pg_class c
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind IN ('r', 'p')
  AND NOT c.relispartition
  AND c.relpersistence = 'p'
  AND n.nspname NOT IN ('pg_catalog', 'information_schema', 'tidewater')
  AND n.nspname !~ '^pg_(toast|temp_)'
ORDER BY n.nspname, c.relname
"""

_REL_BY_NAME = """
SELECT c.oid, n.nspname, c.relname, c.relkind, c.relreplident, c.relpersistence, c.relispartition
FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %s AND c.relname = %s
"""

_REL_BY_OID = """
SELECT c.oid, n.nspname, c.relname, c.relkind, c.relreplident, c.relpersistence, c.relispartition
FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE c.oid = %s
"""

_COLUMNS = """
SELECT a.attname, a.atttypid, a.atttypmod, a.attnotnull,
       pg_catalog.format_type(a.atttypid, a.atttypmod)
FROM pg_catalog.pg_attribute a
WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated IN ('', 's')
ORDER BY a.attnum
"""

_GENERATED = """
SELECT a.attname, a.attgenerated
FROM pg_catalog.pg_attribute a
WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated <> ''
ORDER BY a.attnum
"""

# Columns of the primary key (indisprimary) or of the replica identity index (indisreplident),
# in index column order.
_INDEX_COLUMNS = """
SELECT a.attname
FROM pg_catalog.pg_index i
CROSS JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, pos)
JOIN pg_catalog.pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
WHERE i.indrelid = %s AND {flag}
ORDER BY k.pos
"""

_TYPES = """
SELECT oid, typname, typtype, typcategory, typelem, typbasetype, typtypmod, typnamespace
FROM pg_catalog.pg_type WHERE oid = ANY(%s)
"""


@dataclass(frozen=True, slots=True)
class RelationInfo:
    """The ``pg_class`` facts about one relation that eligibility checks need."""

    oid: int
    name: TableName
    relkind: str  # r ordinary, p partitioned, v view, m matview, f foreign...
    replica_identity: str  # d default, f full, i index, n nothing
    persistence: str  # p permanent, u unlogged, t temporary
    is_partition: bool


@dataclass(frozen=True, slots=True)
class _Type:
    oid: int
    name: str
    typtype: str
    category: str
    elem: int
    basetype: int
    typmod: int
    namespace: int


def list_tables(conn: Any) -> list[TableName]:
    """Every replicable table of the connected database, sorted like ``TableName`` (code points)."""
    with pg_errors(conn, "listing tables"), conn.cursor() as cur:
        cur.execute(_LIST_TABLES)
        return sorted(TableName(s, t) for s, t in cur.fetchall())


def relation_info(conn: Any, table: TableName | int) -> RelationInfo | None:
    """The relation named ``table`` (or with that oid), of any kind, or None if there is none."""
    with pg_errors(conn, f"looking up {table}"), conn.cursor() as cur:
        if isinstance(table, TableName):
            cur.execute(_REL_BY_NAME, (table.schema, table.table))
        else:
            cur.execute(_REL_BY_OID, (int(table),))
        row = cur.fetchone()
    if row is None:
        return None
    oid, schema, name, relkind, replident, persistence, is_partition = row
    return RelationInfo(
        int(oid), TableName(schema, name), relkind, replident, persistence, bool(is_partition)
    )


def table_oid(conn: Any, table: TableName) -> int | None:
    """The relation oid of ``table``, or None if no relation has that name."""
    info = relation_info(conn, table)
    return info.oid if info is not None else None


def _load_types(cur: Any, oids: set[int], cache: dict[int, _Type]) -> None:
    missing = {o for o in oids if o and o not in cache}
    while missing:
        cur.execute(_TYPES, (sorted(missing),))
        found = set()
        for oid, name, typtype, category, elem, basetype, typmod, nsp in cur.fetchall():
            t = _Type(int(oid), name, typtype, category, int(elem), int(basetype), int(typmod), int(nsp))
            cache[t.oid] = t
            found.add(t.oid)
        # follow domains' base types and arrays' element types
        nxt = set()
        for o in found:
            t = cache[o]
            nxt.update(x for x in (t.elem, t.basetype) if x and x not in cache)
        missing = nxt


def _resolve_domain(oid: int, types: dict[int, _Type], typmod: int) -> tuple[_Type, int]:
    t = types[oid]
    seen = 0
    while t.typtype == "d":
        if typmod == -1:
            typmod = t.typmod
        t = types[t.basetype]
        seen += 1
        if seen > 100:  # pragma: no cover - catalog corruption
            raise InvalidArgument(f"domain chain of type {oid} does not end")
    return t, typmod


def _base_name(t: _Type) -> str:
    if t.typtype == "e" or t.namespace != PG_CATALOG_NAMESPACE:
        return "text"
    return t.name


def _domain_type_names(cur: Any, rows: list[tuple[Any, ...]], types: dict[int, _Type]) -> dict[str, str]:
    """Column name -> ``format_type()`` of its base type, for columns declared with a domain (or an array
    of one); one query, and none for tables without domains."""
    wanted: dict[str, tuple[int, int, str]] = {}
    for name, typid, typmod, *_ in rows:
        declared = types[int(typid)]
        elem = types.get(declared.elem) if declared.category == "A" else None
        if declared.typtype != "d" and (elem is None or elem.typtype != "d"):
            continue
        t, mod = _resolve_domain(int(typid), types, int(typmod))
        suffix = ""
        if t.category == "A" and t.elem != 0:
            (t, mod), suffix = _resolve_domain(t.elem, types, mod), "[]"
        wanted[name] = (t.oid, mod, suffix)
    if not wanted:
        return {}
    cur.execute("SELECT pg_catalog.format_type(b, m) FROM unnest(%s::oid[], %s::int4[]) WITH ORDINALITY x(b, m, i) "
                "ORDER BY i", ([w[0] for w in wanted.values()], [w[1] for w in wanted.values()]))
    return {n: r[0] + w[2] for (n, w), r in zip(wanted.items(), cur.fetchall(), strict=True)}


def _column(row: tuple[Any, ...], types: dict[int, _Type], key: set[str], domains: dict[str, str]) -> ColumnSchema:
    name, typid, typmod, notnull, type_name = row
    t, typmod = _resolve_domain(int(typid), types, int(typmod))
    is_array = t.category == "A" and t.elem != 0
    if is_array:
        t, typmod = _resolve_domain(t.elem, types, typmod)
    type_name = domains.get(name, type_name)
    return ColumnSchema(
        name=name,
        type_oid=int(typid),
        base_type=_base_name(t),
        is_array=is_array,
        type_name=type_name,
        type_modifier=typmod,
        nullable=not notnull,
        is_key=name in key,
    )


def _index_columns(cur: Any, oid: int, flag: str) -> tuple[str, ...]:
    cur.execute(_INDEX_COLUMNS.format(flag=flag), (oid,))
    return tuple(r[0] for r in cur.fetchall())


def table_schema(conn: Any, table: TableName | int, *, version: int = 0) -> TableSchema:
    """The current schema of ``table`` (by name or relation oid). See the module doc for the rules.

    Raises :class:`cdc.errors.InvalidArgument` when there is no such table (or it is not a table).
    The result reflects the catalog at the time of the call; it is not locked against later DDL.
    """
    info = relation_info(conn, table)
    if info is None:
        raise InvalidArgument(f"table {table} does not exist in the upstream database")
    if info.relkind not in ("r", "p"):
        raise InvalidArgument(f"{info.name} is not a table (relkind {info.relkind!r})")
    with pg_errors(conn, f"reading the schema of {info.name}"), conn.cursor() as cur:
        cur.execute(_COLUMNS, (info.oid,))
        rows = cur.fetchall()
        types: dict[int, _Type] = {}
        _load_types(cur, {int(r[1]) for r in rows}, types)
        domains = _domain_type_names(cur, rows, types)
        pk = _index_columns(cur, info.oid, "i.indisprimary")
        pk_immediate = bool(pk) and bool(_index_columns(cur, info.oid, "i.indisprimary AND i.indimmediate"))
        ident = _index_columns(cur, info.oid, "i.indisreplident") if info.replica_identity == "i" else ()
    return build_schema(info.name, info.oid, info.replica_identity, rows, types, domains, pk, pk_immediate, ident,
                        version=version)


def build_schema(name: TableName, oid: int, replica_identity: str, rows: Sequence[Sequence[Any]],
                 types: dict[int, _Type], domains: dict[str, str], pk: tuple[str, ...], pk_immediate: bool,
                 ident: tuple[str, ...], *, version: int = 0, defaults: dict[str, str] | None = None) -> TableSchema:
    """The :class:`TableSchema` of catalog facts (the rules of the module doc): ``rows`` as :data:`_COLUMNS`
    returns them, ``types`` the closure of their types (:func:`type_row`), ``domains`` the display type of
    domain columns. Shared by :func:`table_schema` and the DDL trigger's messages (``ddl_decode``), so a table
    described by either is the same schema."""
    names = tuple(r[0] for r in rows)
    has_key = True
    if replica_identity == "i" and ident:
        key = ident
    elif (replica_identity == "d" and pk_immediate) or (replica_identity == "f" and pk):
        key = pk
    elif replica_identity == "f":
        key, has_key = names, False
    else:  # DEFAULT without a (non-deferrable) primary key, NOTHING, or INDEX whose index was dropped
        key, has_key = (), False
    keyset = set(key)
    cols = tuple(_column(tuple(r), types, keyset, domains) for r in rows)
    if defaults:
        cols = tuple(replace(c, default=defaults.get(c.name)) for c in cols)
    return TableSchema(name=name, columns=cols, key=key, replica_identity=replica_identity, relation_id=oid,
                       version=version, has_key=has_key)


def type_row(row: Sequence[Any]) -> _Type:
    """A type of :func:`build_schema`'s closure from ``(oid, typname, typtype, typcategory, typelem,
    typbasetype, typtypmod, typnamespace)``."""
    oid, name, typtype, category, elem, basetype, typmod, nsp = row[:8]
    return _Type(int(oid), name, typtype, category, int(elem), int(basetype), int(typmod), int(nsp))


def generated_columns(conn: Any, oid: int) -> dict[str, str]:
    """The generated columns of relation ``oid``: name -> ``'s'`` (stored) or ``'v'`` (virtual), attnum order."""
    with pg_errors(conn, f"reading the generated columns of relation {oid}"), conn.cursor() as cur:
        cur.execute(_GENERATED, (oid,))
        return {name: kind for name, kind in cur.fetchall()}


def partitions(conn: Any, table: TableName | int) -> list[RelationInfo]:
    """The leaf partitions of a partitioned table (empty for a plain table), sorted by name."""
    info = relation_info(conn, table)
    if info is None or info.relkind != "p":
        return []
    with pg_errors(conn, f"listing partitions of {info.name}"), conn.cursor() as cur:
        cur.execute(
            "SELECT relid::oid FROM pg_catalog.pg_partition_tree(%s) WHERE isleaf ORDER BY relid::regclass::text",
            (info.oid,),
        )
        oids = [int(r[0]) for r in cur.fetchall()]
    out = [relation_info(conn, o) for o in oids]
    return [p for p in out if p is not None]


_PUBLISHED_LEAVES = """
SELECT rn.nspname, root.relname, l.oid, ln.nspname, l.relname, l.relfilenode,
       coalesce(pg_catalog.pg_get_expr(l.relpartbound, l.oid), '')
FROM pg_catalog.pg_publication p
JOIN pg_catalog.pg_publication_rel pr ON pr.prpubid = p.oid
JOIN pg_catalog.pg_class root ON root.oid = pr.prrelid AND root.relkind = 'p'
JOIN pg_catalog.pg_namespace rn ON rn.oid = root.relnamespace
CROSS JOIN LATERAL pg_catalog.pg_partition_tree(root.oid) t
JOIN pg_catalog.pg_class l ON l.oid = t.relid AND t.isleaf
JOIN pg_catalog.pg_namespace ln ON ln.oid = l.relnamespace
WHERE p.pubname = ANY(%s)
ORDER BY 1, 2, 4, 5
"""


def published_partition_leaves(conn: Any, publications: list[str]) -> list[PartitionLeaf]:
    """The leaf partitions of every partitioned table listed in ``publications`` (one query)."""
    with pg_errors(conn, "listing the partitions of published tables"), conn.cursor() as cur:
        cur.execute(_PUBLISHED_LEAVES, (list(publications),))
        return [PartitionLeaf(TableName(rs, rt), int(oid), TableName(ls, lt), int(node), bound)
                for rs, rt, oid, ls, lt, node, bound in cur.fetchall()]


def has_rows(conn: Any, oid: int) -> bool:
    """True when relation ``oid`` holds at least one row (False when it no longer exists)."""
    info = relation_info(conn, oid)
    if info is None:
        return False
    ident = sql.Identifier(info.name.schema, info.name.table)
    with pg_errors(conn, f"reading {info.name}"), conn.cursor() as cur:
        cur.execute(sql.SQL("SELECT EXISTS (SELECT 1 FROM {})").format(ident))
        return bool(cur.fetchone()[0])
