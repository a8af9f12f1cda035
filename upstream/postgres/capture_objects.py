"""Tidewater's objects in the upstream database: schema ``tidewater``, its functions and triggers.

They put into the WAL what pgoutput does not carry (DDL: ``sql/10_ddl.sql``; partition repair:
``sql/20_partitions.sql``). One set per database, shared by every changefeed of that database:
``install`` (re)creates every object from the ``sql/*.sql`` files in file-name order (each file is
idempotent); ``uninstall`` drops everything once no Tidewater slot other than the ones being removed is left
in the database. The slots are the registry: no table is created upstream, because a user's ``FOR ALL
TABLES`` publication would publish it and break that publication's subscribers. Both hold a transaction-level advisory lock, so concurrent creates
and removes of changefeeds of one database serialise.

Privileges: event triggers need a superuser. Without one, ``install`` installs nothing and says so
(``InstallResult.reason``): the changefeed then relies on the owner's periodic look for partition changes
(warnings instead of repair) — see docs/limits.md.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from upstream.postgres.conn import pg_errors

log = logging.getLogger(__name__)

SQL_DIR = Path(__file__).with_name("sql")
_LOCK_KEY = 0x7469_6465  # "tide": the advisory lock of install/uninstall


@dataclass(frozen=True, slots=True)
class InstallResult:
    """``installed``: the objects exist and this changefeed is registered. ``reason``: why not (the missing
    privilege and what the changefeed does without them)."""

    installed: bool
    reason: str | None = None


def _files() -> list[Path]:
    return sorted(SQL_DIR.glob("*.sql"))


def install(conn: Any) -> InstallResult:
    """Install (or refresh) the objects. ``conn``: autocommit connection."""
    with pg_errors(conn, "installing Tidewater's upstream objects"), conn.cursor() as cur:
        cur.execute("SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user")
        row = cur.fetchone()
        if not row or not row[0]:
            return InstallResult(False, "the upstream user is not a superuser, which PostgreSQL requires for event "
                                        "triggers: schema changes are seen only as new column lists in the stream "
                                        "(added, dropped and retyped columns are applied; column renames are "
                                        "refused; table renames, CREATE/DROP TABLE, keys, defaults and indexes "
                                        "are not seen), and partition TRUNCATE/DETACH/DROP/ATTACH are not repaired "
                                        "downstream, only reported as warnings by the owner's look (docs/ddl.md)")
        conn.autocommit = False
        try:
            cur.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
            cur.execute("CREATE SCHEMA IF NOT EXISTS tidewater")
            for f in _files():
                cur.execute(f.read_text())
            conn.commit()
        except BaseException:
            conn.rollback()
            raise
        finally:
            conn.autocommit = True
    return InstallResult(True)


def uninstall(conn: Any, *slots: str) -> bool:
    """Drop every object unless a Tidewater slot (``tidewater_slot_*``) other than ``slots`` (those being
    removed) remains in this database. True if dropped."""
    with pg_errors(conn, "removing Tidewater's upstream objects"), conn.cursor() as cur:
        cur.execute("SELECT to_regnamespace('tidewater') IS NOT NULL")
        if not cur.fetchone()[0]:
            return False
        conn.autocommit = False
        try:
            cur.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
            cur.execute("SELECT count(*) FROM pg_catalog.pg_replication_slots WHERE database = current_database() "
                        "AND slot_name LIKE 'tidewater\\_slot\\_%%' AND NOT (slot_name = ANY (%s))", (list(slots),))
            left = cur.fetchone()[0]
            if not left:
                cur.execute("SELECT evtname FROM pg_catalog.pg_event_trigger WHERE evtname LIKE 'tidewater\\_%'")
                for (name,) in cur.fetchall():
                    cur.execute(f'DROP EVENT TRIGGER IF EXISTS "{name}"')
                # only what install made: a PostgreSQL *target* keeps its position table in a schema of the same
                # name, which may be this very database
                cur.execute("SELECT p.oid::regprocedure::text FROM pg_catalog.pg_proc p "
                            "WHERE p.pronamespace = 'tidewater'::regnamespace")
                for (proc,) in cur.fetchall():
                    cur.execute(f"DROP FUNCTION IF EXISTS {proc} CASCADE")  # with them the triggers on tables
                cur.execute("SELECT count(*) FROM pg_catalog.pg_class WHERE relnamespace = 'tidewater'::regnamespace")
                if not cur.fetchone()[0]:
                    cur.execute("DROP SCHEMA tidewater")
            conn.commit()
            return not left
        except BaseException:
            conn.rollback()
            raise
        finally:
            conn.autocommit = True


DDL_TRIGGERS = ("tidewater_ddl_start", "tidewater_ddl_end", "tidewater_ddl_drop")


def captures_ddl(conn: Any) -> bool:
    """Whether the DDL event triggers (sql/10_ddl.sql) are in place and enabled."""
    with pg_errors(conn, "reading Tidewater's upstream objects"), conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_catalog.pg_event_trigger WHERE evtname = ANY(%s) AND evtenabled <> 'D'",
                    (list(DDL_TRIGGERS),))
        return int(cur.fetchone()[0]) == len(DDL_TRIGGERS)


def installed(conn: Any) -> bool:
    """Whether the partition repair objects are in place and enabled: both event triggers, and the TRUNCATE
    trigger on every leaf of every published root (someone may have dropped or disabled one). Only then does
    the owner's look leave partitions alone."""
    with pg_errors(conn, "reading Tidewater's upstream objects"), conn.cursor() as cur:
        cur.execute("SELECT count(*) = 2 FROM pg_catalog.pg_event_trigger "
                    "WHERE evtname IN ('tidewater_partitions_start', 'tidewater_partitions_end') AND evtenabled <> 'D'")
        if not cur.fetchone()[0]:
            return False
        cur.execute("SELECT NOT EXISTS (SELECT 1 FROM tidewater.partitions_members() m WHERE NOT EXISTS ("
                    "SELECT 1 FROM pg_catalog.pg_trigger t WHERE t.tgrelid = m.leaf "
                    "AND t.tgname = 'tidewater_partitions_truncate' AND t.tgenabled <> 'D'))")
        return bool(cur.fetchone()[0])
