"""Administration of the upstream PostgreSQL: readiness checks, publications and logical slots.

All functions take an ordinary (non-replication) psycopg2 connection in autocommit mode, as returned
by :func:`upstream.postgres.conn.connect`, and raise only :class:`cdc.errors.TidewaterError`
subclasses. Every identifier reaches SQL through ``psycopg2.sql.Identifier``; names in hints are
quoted the same way, so they can be pasted into psql. Functions hold no state of their own: they are
safe to call from several threads on *different* connections.

Idempotency: :func:`create_publication` (same tables), :func:`add_tables_to_publication`,
:func:`remove_tables_from_publication`, :func:`drop_publication`, :func:`drop_slot` and
``create_slot(..., if_not_exists=True)`` can be repeated after a crash at any point and converge to the
same state. They are not atomic with each other: a crash between creating a slot and a publication
leaves the slot, which the caller must either reuse or drop (a forgotten slot retains WAL forever).

Publications are created ``WITH (publish_via_partition_root = true)`` so that changes to partitions
arrive under the partitioned table's name and schema, and on PostgreSQL 18+ also with
``publish_generated_columns = stored`` so that stored generated columns arrive as plain columns with
their computed values (see :func:`publishes_generated`).

Which tables may be published at all is :mod:`upstream.postgres.eligibility`
(:func:`~upstream.postgres.eligibility.check_tables`): run it before any publication is touched.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg2
import psycopg2.errors
from psycopg2 import sql

from cdc.errors import InvalidArgument, UpstreamError, UpstreamNotReady, UpstreamUnavailable
from cdc.events import TableName
from cdc.ts import str_to_lsn
from upstream.base import JoinRule
from upstream.postgres.conn import describe_conn, pg_errors
from upstream.postgres.eligibility import publishes_generated

MIN_SERVER_VERSION = 140000
PLUGIN = "pgoutput"
SLOT_NAME_RE = re.compile(r"[a-z0-9_]{1,63}")
_MAX_IDENTIFIER_BYTES = 63

_CURRENT_LSN = "CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_lsn() END"

_READINESS = """
SELECT current_setting('server_version_num')::int,
       current_setting('server_version'),
       current_setting('wal_level'),
       current_setting('max_replication_slots')::int,
       (SELECT count(*) FROM pg_catalog.pg_replication_slots),
       current_setting('max_wal_senders')::int,
       (SELECT count(*) FROM pg_catalog.pg_stat_activity WHERE backend_type = 'walsender'),
       current_user,
       current_database(),
       r.rolsuper,
       r.rolreplication,
       has_database_privilege(current_database(), 'CREATE'),
       pg_is_in_recovery()
FROM pg_catalog.pg_roles r WHERE r.rolname = current_user
"""


def _ident(conn: Any, *parts: str) -> str:
    return sql.Identifier(*parts).as_string(conn)


def _table_ident(conn: Any, table: TableName) -> str:
    return _ident(conn, table.schema, table.table)


# ---- readiness ---------------------------------------------------------------------------------------
def check_upstream(conn: Any, *, slots_needed: int = 1) -> dict[str, Any]:
    """Check that the upstream can serve logical replication to this user; return its facts.

    Raises :class:`cdc.errors.UpstreamNotReady` listing *every* problem with its fix: server older
    than PostgreSQL 14, ``wal_level`` not ``logical``, a standby, fewer than ``slots_needed`` free
    replication slots or WAL senders, a user without REPLICATION (and not superuser), no CREATE
    privilege on the database (needed for publications). Pass ``slots_needed=0`` when the slots already
    exist (a restart). Returns a dict with ``server_version_num``, ``server_version``, ``wal_level``,
    ``max_replication_slots``, ``replication_slots_used``, ``max_wal_senders``, ``wal_senders_used``,
    ``user``, ``database``, ``is_superuser``, ``has_replication``, ``can_create``, ``in_recovery``.
    """
    with pg_errors(conn, "checking the upstream configuration"), conn.cursor() as cur:
        cur.execute(_READINESS)
        row = cur.fetchone()
    if row is None:  # pragma: no cover - current_user always has a pg_roles row
        raise UpstreamError(f"PostgreSQL {describe_conn(conn)}: current user not found in pg_roles")
    keys = (
        "server_version_num", "server_version", "wal_level", "max_replication_slots",
        "replication_slots_used", "max_wal_senders", "wal_senders_used", "user", "database",
        "is_superuser", "has_replication", "can_create", "in_recovery",
    )  # fmt: skip
    facts = dict(zip(keys, row, strict=True))
    user = _ident(conn, facts["user"])
    problems: list[str] = []
    if facts["server_version_num"] < MIN_SERVER_VERSION:
        problems.append(
            f"server version {facts['server_version']} is too old: PostgreSQL 14 or newer is required"
        )
    if facts["wal_level"] != "logical":
        problems.append(
            f"wal_level is {facts['wal_level']!r}: set wal_level = logical in postgresql.conf and restart "
            "PostgreSQL (or ALTER SYSTEM SET wal_level = logical; then restart)"
        )
    if facts["in_recovery"]:
        problems.append("the server is a standby (in recovery): point the upstream URI at the primary")
    free_slots = facts["max_replication_slots"] - facts["replication_slots_used"]
    if free_slots < slots_needed:
        problems.append(
            f"max_replication_slots = {facts['max_replication_slots']} and {facts['replication_slots_used']} "
            f"are in use, {slots_needed} more needed: raise max_replication_slots in postgresql.conf and "
            "restart, or drop unused slots with SELECT pg_drop_replication_slot('<name>')"
        )
    free_senders = facts["max_wal_senders"] - facts["wal_senders_used"]
    if free_senders < slots_needed:
        problems.append(
            f"max_wal_senders = {facts['max_wal_senders']} and {facts['wal_senders_used']} are in use, "
            f"{slots_needed} more needed: raise max_wal_senders in postgresql.conf and restart"
        )
    if not (facts["is_superuser"] or facts["has_replication"]):
        problems.append(
            f"user {user} lacks the REPLICATION attribute: ALTER ROLE {user} REPLICATION "
            "(and allow it in pg_hba.conf)"
        )
    if not (facts["is_superuser"] or facts["can_create"]):
        problems.append(
            f"user {user} cannot create publications in database {_ident(conn, facts['database'])}: "
            f"GRANT CREATE ON DATABASE {_ident(conn, facts['database'])} TO {user}"
        )
    if problems:
        raise UpstreamNotReady(
            f"PostgreSQL {describe_conn(conn)} is not ready for logical replication: " + "; ".join(problems)
        )
    return facts


# ---- publications ------------------------------------------------------------------------------------


def publication_publishes_generated(conn: Any, name: str) -> bool | None:
    """Whether publication ``name`` publishes stored generated columns (``pubgencols = 's'``); None if
    the publication does not exist. Always False before PostgreSQL 18."""
    _check_publication_name(name)
    with pg_errors(conn, f"reading publication {name!r}"), conn.cursor() as cur:
        if not publishes_generated(conn):
            cur.execute("SELECT false FROM pg_catalog.pg_publication WHERE pubname = %s", (name,))
        else:
            cur.execute("SELECT pubgencols = 's' FROM pg_catalog.pg_publication WHERE pubname = %s", (name,))
        row = cur.fetchone()
    return None if row is None else bool(row[0])


def _check_publication_name(name: str) -> None:
    if not name or "\x00" in name or len(name.encode()) > _MAX_IDENTIFIER_BYTES:
        raise InvalidArgument(f"invalid publication name {name!r}: 1 to 63 bytes, no NUL")


def _publication(cur: Any, name: str) -> tuple[int, bool, bool, bool] | None:
    cur.execute(
        "SELECT p.oid, p.puballtables, p.pubviaroot, "
        "       to_regclass('pg_catalog.pg_publication_namespace') IS NOT NULL "
        "FROM pg_catalog.pg_publication p WHERE p.pubname = %s",
        (name,),
    )
    row = cur.fetchone()
    if row is None:
        return None
    oid, alltables, viaroot, has_nsp_catalog = row
    has_schemas = False
    if has_nsp_catalog:
        cur.execute("SELECT count(*) > 0 FROM pg_catalog.pg_publication_namespace WHERE pnpubid = %s", (oid,))
        has_schemas = bool(cur.fetchone()[0])
    return int(oid), bool(alltables), bool(viaroot), has_schemas


def _publication_rel_tables(cur: Any, pub_oid: int) -> list[TableName]:
    cur.execute(
        "SELECT n.nspname, c.relname FROM pg_catalog.pg_publication_rel pr "
        "JOIN pg_catalog.pg_class c ON c.oid = pr.prrelid "
        "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE pr.prpubid = %s",
        (pub_oid,),
    )
    return sorted(TableName(s, t) for s, t in cur.fetchall())


def publication_tables(conn: Any, name: str) -> list[TableName] | None:
    """The tables listed explicitly in publication ``name`` (sorted), or None if it does not exist."""
    _check_publication_name(name)
    with pg_errors(conn, f"reading publication {name!r}"), conn.cursor() as cur:
        pub = _publication(cur, name)
        return None if pub is None else _publication_rel_tables(cur, pub[0])


def _table_list(tables: list[TableName]) -> sql.Composable:
    return sql.SQL(", ").join(sql.Identifier(t.schema, t.table) for t in tables)


def create_publication(conn: Any, name: str, tables: list[TableName]) -> bool:
    """Create publication ``name`` FOR TABLE ``tables``; return True if created, False if it existed.

    Idempotent: an existing publication with exactly these tables is accepted (and switched to
    ``publish_via_partition_root``, and on PostgreSQL 18+ ``publish_generated_columns = stored``, if
    needed). One that differs (other tables, FOR ALL TABLES, FOR
    TABLES IN SCHEMA) raises :class:`cdc.errors.InvalidArgument`. Run ``eligibility.check_tables`` first.
    """
    _check_publication_name(name)
    wanted = sorted(set(tables))
    ident = sql.Identifier(name)
    with pg_errors(conn, f"creating publication {name!r}"), conn.cursor() as cur:
        for _attempt in range(2):
            pub = _publication(cur, name)
            if pub is not None:
                break
            stmt = sql.SQL("CREATE PUBLICATION {}").format(ident)
            if wanted:
                stmt += sql.SQL(" FOR TABLE ") + _table_list(wanted)
            stmt += sql.SQL(" WITH (publish_via_partition_root = true")
            stmt += sql.SQL(", publish_generated_columns = stored)" if publishes_generated(conn) else ")")
            try:
                cur.execute(stmt)
                return True
            except psycopg2.errors.DuplicateObject:
                continue  # created concurrently: compare below
        assert pub is not None
        oid, alltables, viaroot, has_schemas = pub
        have = _publication_rel_tables(cur, oid)
        if alltables or has_schemas or have != wanted:
            shown = (
                "ALL TABLES" if alltables else ", ".join(_table_ident(conn, t) for t in have) or "no tables"
            )
            if has_schemas:
                shown += " and whole schemas"
            raise InvalidArgument(
                f"publication {_ident(conn, name)} already exists in {describe_conn(conn)} with different "
                f"tables ({shown}); expected: {', '.join(_table_ident(conn, t) for t in wanted) or 'none'}"
            )
        if not viaroot:
            cur.execute(sql.SQL("ALTER PUBLICATION {} SET (publish_via_partition_root = true)").format(ident))
        if publishes_generated(conn):
            cur.execute("SELECT pubgencols FROM pg_catalog.pg_publication WHERE oid = %s", (oid,))
            if cur.fetchone()[0] != "s":
                cur.execute(sql.SQL("ALTER PUBLICATION {} SET (publish_generated_columns = stored)").format(ident))
    return False


JOIN_COMMENT = "tidewater:"  # prefix of a span publication's comment holding its join rule (sql/10_ddl.sql)


def join_rule_doc(rule: JoinRule, span: int, publications: Sequence[str]) -> dict[str, Any]:
    """What the DDL trigger reads of a join rule (``tidewater.ddl_join`` in ``sql/10_ddl.sql``)."""
    return {"v": 1, "span": span, "spans": rule.span_count, "rules": rule.filter.anchored_regexes(),
            "names": rule.target_names, "fold": rule.fold_case, "keyless": rule.keyless,
            "pubs": list(publications)}


def set_join_rule(conn: Any, publication: str, doc: dict[str, Any] | None) -> None:
    """Store (``doc``) or clear (None) the join rule of a span's publication, as its comment: it lives and
    dies with the publication, and a ``FOR ALL TABLES`` publication of the user never sees it (no table)."""
    _check_publication_name(publication)
    text = None if doc is None else JOIN_COMMENT + json.dumps(doc, separators=(",", ":"))
    with pg_errors(conn, f"setting the join rule of publication {publication!r}"), conn.cursor() as cur:
        cur.execute(sql.SQL("COMMENT ON PUBLICATION {} IS %s").format(sql.Identifier(publication)), (text,))


def _existing_publication_tables(cur: Any, conn: Any, name: str) -> list[TableName]:
    pub = _publication(cur, name)
    if pub is None:
        raise InvalidArgument(f"publication {_ident(conn, name)} does not exist in {describe_conn(conn)}")
    return _publication_rel_tables(cur, pub[0])


def add_tables_to_publication(conn: Any, name: str, tables: list[TableName]) -> list[TableName]:
    """Add the ``tables`` that are not yet in publication ``name``; return those added (sorted).

    Idempotent. Raises :class:`cdc.errors.InvalidArgument` if the publication does not exist.
    """
    _check_publication_name(name)
    with pg_errors(conn, f"adding tables to publication {name!r}"), conn.cursor() as cur:
        have = set(_existing_publication_tables(cur, conn, name))
        new = sorted(set(tables) - have)
        if new:
            cur.execute(
                sql.SQL("ALTER PUBLICATION {} ADD TABLE ").format(sql.Identifier(name)) + _table_list(new)
            )
    return new


def remove_tables_from_publication(conn: Any, name: str, tables: list[TableName]) -> list[TableName]:
    """Remove those of ``tables`` that are in publication ``name``; return those removed (sorted)."""
    _check_publication_name(name)
    with pg_errors(conn, f"removing tables from publication {name!r}"), conn.cursor() as cur:
        have = set(_existing_publication_tables(cur, conn, name))
        gone = sorted(set(tables) & have)
        if gone:
            cur.execute(
                sql.SQL("ALTER PUBLICATION {} DROP TABLE ").format(sql.Identifier(name)) + _table_list(gone)
            )
    return gone


def drop_publication(conn: Any, name: str) -> None:
    """Drop publication ``name`` if it exists (idempotent)."""
    _check_publication_name(name)
    with pg_errors(conn, f"dropping publication {name!r}"), conn.cursor() as cur:
        cur.execute(sql.SQL("DROP PUBLICATION IF EXISTS {}").format(sql.Identifier(name)))


# ---- slots -------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class SlotInfo:
    """One row of ``pg_replication_slots``, LSNs as ints.

    ``restart_lsn``/``confirmed_flush_lsn`` are None for an invalidated slot; ``retained_bytes`` is
    the WAL the slot keeps (current WAL position minus ``restart_lsn``); ``wal_status`` is
    ``reserved``/``extended``/``unreserved``/``lost``; ``invalidation_reason`` is set (PostgreSQL 17+)
    when the slot can no longer be used.
    """

    name: str
    plugin: str | None
    slot_type: str
    database: str | None
    temporary: bool
    active: bool
    active_pid: int | None
    restart_lsn: int | None
    confirmed_flush_lsn: int | None
    wal_status: str | None
    retained_bytes: int | None
    safe_wal_size: int | None
    invalidation_reason: str | None

    @property
    def lost(self) -> bool:
        """True when the slot is unusable (its WAL was removed or it was invalidated)."""
        return self.wal_status == "lost" or self.invalidation_reason is not None


def validate_slot_name(name: str) -> None:
    """Raise :class:`cdc.errors.InvalidArgument` unless ``name`` matches ``[a-z0-9_]{1,63}``."""
    if not isinstance(name, str) or not SLOT_NAME_RE.fullmatch(name):
        raise InvalidArgument(
            f"invalid replication slot name {name!r}: use 1 to 63 lower-case letters, digits and underscores"
        )


def _lsn(text: str | None) -> int | None:
    return None if text is None else str_to_lsn(text)


_SLOTS = f"""
SELECT to_jsonb(s), pg_wal_lsn_diff({_CURRENT_LSN}, s.restart_lsn)::bigint
FROM pg_catalog.pg_replication_slots s
"""


def _slot_from_row(row: tuple[Any, ...]) -> SlotInfo:
    d, retained = row
    return SlotInfo(
        name=d["slot_name"],
        plugin=d.get("plugin"),
        slot_type=d.get("slot_type", ""),
        database=d.get("database"),
        temporary=bool(d.get("temporary")),
        active=bool(d.get("active")),
        active_pid=d.get("active_pid"),
        restart_lsn=_lsn(d.get("restart_lsn")),
        confirmed_flush_lsn=_lsn(d.get("confirmed_flush_lsn")),
        wal_status=d.get("wal_status"),
        retained_bytes=None if retained is None else int(retained),
        safe_wal_size=d.get("safe_wal_size"),
        invalidation_reason=d.get("invalidation_reason"),
    )


def slot_info(conn: Any, name: str) -> SlotInfo | None:
    """The replication slot ``name``, or None if there is none."""
    validate_slot_name(name)
    with pg_errors(conn, f"reading replication slot {name!r}"), conn.cursor() as cur:
        cur.execute(_SLOTS + " WHERE s.slot_name = %s", (name,))
        row = cur.fetchone()
    return None if row is None else _slot_from_row(row)


def list_slots(conn: Any, prefix: str = "") -> list[SlotInfo]:
    """All replication slots whose name starts with ``prefix`` (every database), sorted by name."""
    with pg_errors(conn, "listing replication slots"), conn.cursor() as cur:
        cur.execute(_SLOTS + " WHERE starts_with(s.slot_name::text, %s) ORDER BY s.slot_name", (prefix,))
        return [_slot_from_row(r) for r in cur.fetchall()]


def create_slot(conn: Any, name: str, *, if_not_exists: bool = False) -> int:
    """Create logical slot ``name`` with plugin pgoutput; return its consistent point (an LSN int).

    Changes committed after the returned LSN will be streamed from the slot. Creating a slot waits for
    transactions running at that moment to finish. An existing slot raises
    :class:`cdc.errors.InvalidArgument`, unless ``if_not_exists`` is true: then, if it is a pgoutput
    slot of this database that is not lost, its ``confirmed_flush_lsn`` is returned.
    """
    validate_slot_name(name)
    with pg_errors(conn, f"creating replication slot {name!r}"), conn.cursor() as cur:
        try:
            cur.execute("SELECT lsn::text FROM pg_create_logical_replication_slot(%s, %s)", (name, PLUGIN))
            return str_to_lsn(cur.fetchone()[0])
        except psycopg2.errors.DuplicateObject as exc:
            if not if_not_exists:
                raise InvalidArgument(
                    f"replication slot {name!r} already exists in {describe_conn(conn)}", cause=exc
                ) from exc
        cur.execute("SELECT current_database()")
        database = cur.fetchone()[0]
    info = slot_info(conn, name)
    if info is None:
        raise UpstreamUnavailable(f"replication slot {name!r} vanished while it was being reused; retry")
    if info.slot_type != "logical" or info.plugin != PLUGIN or info.database != database:
        raise InvalidArgument(
            f"replication slot {name!r} exists but is a {info.slot_type} slot with plugin {info.plugin!r} in "
            f"database {info.database!r}, not a {PLUGIN} slot of {database!r}: drop it or choose another name"
        )
    if info.lost or info.confirmed_flush_lsn is None:
        raise InvalidArgument(
            f"replication slot {name!r} exists but is invalidated ({info.invalidation_reason or info.wal_status}):"
            " drop it and start again"
        )
    return info.confirmed_flush_lsn


def create_slot_exported(repl_conn: Any, name: str, *, temporary: bool = False) -> tuple[int, str]:
    """Create pgoutput slot ``name`` on a *replication* connection, exporting its snapshot (``temporary``: the
    slot is dropped when that session ends, however it ends).

    Returns ``(consistent_point_lsn, snapshot_name)``. Readers that run
    ``BEGIN ISOLATION LEVEL REPEATABLE READ; SET TRANSACTION SNAPSHOT '<snapshot_name>'`` see the
    database exactly as of the consistent point: every commit up to it and none after, which the slot
    then streams. The snapshot stays importable only while ``repl_conn`` stays open and runs no other
    command, so import it everywhere first, then stream or close. An existing slot raises
    :class:`cdc.errors.InvalidArgument`.
    """
    validate_slot_name(name)
    temp = " TEMPORARY" if temporary else ""
    if repl_conn.server_version >= 150000:
        cmd = f"CREATE_REPLICATION_SLOT {name}{temp} LOGICAL {PLUGIN} (SNAPSHOT 'export')"
    else:
        cmd = f"CREATE_REPLICATION_SLOT {name}{temp} LOGICAL {PLUGIN} EXPORT_SNAPSHOT"
    with pg_errors(repl_conn, f"creating replication slot {name!r}"):
        cur = repl_conn.cursor()
        try:
            cur.execute(cmd)
        except psycopg2.errors.DuplicateObject as exc:
            raise InvalidArgument(
                f"replication slot {name!r} already exists in {describe_conn(repl_conn)}", cause=exc
            ) from exc
        _slot, point, snapshot, _plugin = cur.fetchone()
    return str_to_lsn(point), snapshot


def drop_slot(conn: Any, name: str, *, timeout: float = 30.0) -> bool:
    """Drop slot ``name``; return True if this call dropped it, False if it did not exist.

    If a walsender is streaming from the slot, that backend is terminated and the drop retried until
    it succeeds or ``timeout`` seconds pass (then :class:`cdc.errors.UpstreamUnavailable`). A client
    that keeps reconnecting can win the race for a while; the loop keeps terminating it.
    """
    validate_slot_name(name)
    deadline = time.monotonic() + timeout
    with pg_errors(conn, f"dropping replication slot {name!r}"), conn.cursor() as cur:
        while True:
            try:
                cur.execute("SELECT pg_drop_replication_slot(%s)", (name,))
                return True
            except psycopg2.errors.UndefinedObject:
                return False
            except psycopg2.errors.ObjectInUse as exc:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise UpstreamUnavailable(
                        f"replication slot {name!r} in {describe_conn(conn)} is still in use after "
                        f"{timeout:g} s: {exc.pgerror or exc}".strip(),
                        cause=exc,
                    ) from exc
            cur.execute(
                "SELECT active_pid FROM pg_catalog.pg_replication_slots WHERE slot_name = %s", (name,)
            )
            row = cur.fetchone()
            if row is None:
                return False
            if row[0] is not None:
                wait_ms = int(max(1, min(remaining, 5.0)) * 1000)
                cur.execute("SELECT pg_terminate_backend(%s, %s)", (row[0], wait_ms))
            else:
                time.sleep(0.05)


def current_wal_lsn(conn: Any) -> int:
    """The server's current WAL write position (replay position on a standby), as an int."""
    with pg_errors(conn, "reading the current WAL position"), conn.cursor() as cur:
        cur.execute(f"SELECT ({_CURRENT_LSN})::text")
        return str_to_lsn(cur.fetchone()[0])


def publications_listing(conn: Any, oid: int, names: Sequence[str]) -> list[str]:
    """Those of publications ``names`` that list relation ``oid`` explicitly (sorted). By relation, not by name:
    a rename of the table does not change the answer."""
    with pg_errors(conn, f"reading the publications of relation {oid}"), conn.cursor() as cur:
        return _publications_listing(cur, oid, names)


def _publications_listing(cur: Any, oid: int, names: Sequence[str]) -> list[str]:
    cur.execute("SELECT p.pubname FROM pg_catalog.pg_publication_rel pr "
                "JOIN pg_catalog.pg_publication p ON p.oid = pr.prpubid "
                "WHERE pr.prrelid = %s AND p.pubname = ANY(%s) ORDER BY 1", (int(oid), list(names)))
    return [r[0] for r in cur.fetchall()]


def add_table_locked(conn: Any, publication: str, table: TableName, *, lock_timeout_ms: int,
                     count_cap: int, others: Sequence[str] = ()) -> int | None:
    """Add ``table`` to ``publication`` in one transaction holding ``SHARE`` lock on the table.

    The lock waits for the table's in-flight writers and holds back new ones until the commit, so the
    rows seen here are exactly those committed before the table joined the publication; every later
    change is streamed. Returns how many rows the table already held (they will not be streamed; counted
    up to ``count_cap``, so the writers wait for at most that scan), 0 if it was empty, None if nothing was
    done (the lock was not granted within ``lock_timeout_ms``, or the table is already in the publication or in
    one of the publications ``others``). That check is made under the lock, on the relation the name then
    denotes: a rename or drop needs a stronger lock, so the name cannot move to another relation before the
    commit (a table renamed onto ``table`` since the caller listed the publications is found in its own).
    ``conn`` must be in autocommit mode.
    """
    ident = sql.Identifier(table.schema, table.table)
    with pg_errors(conn, f"adding {table} to publication {publication!r}"), conn.cursor() as cur:
        cur.execute("BEGIN")
        try:
            cur.execute(f"SET LOCAL lock_timeout = {int(lock_timeout_ms)}")
            cur.execute(sql.SQL("LOCK TABLE {} IN SHARE MODE").format(ident))
            cur.execute("SELECT %s::regclass::oid", (ident.as_string(conn),))
            if _publications_listing(cur, cur.fetchone()[0], [publication, *others]):
                cur.execute("ROLLBACK")
                return None
            cur.execute(sql.SQL("SELECT count(*) FROM (SELECT 1 FROM {} LIMIT %s) AS r").format(ident),
                        (int(count_cap),))
            had_rows = int(cur.fetchone()[0])
            cur.execute(sql.SQL("ALTER PUBLICATION {} ADD TABLE {}").format(sql.Identifier(publication), ident))
            cur.execute("COMMIT")
            return had_rows
        except psycopg2.errors.LockNotAvailable:
            cur.execute("ROLLBACK")
            return None
        except BaseException:
            try:
                cur.execute("ROLLBACK")
            except Exception:  # noqa: BLE001 - the connection may be broken; the original error matters
                pass
            raise
