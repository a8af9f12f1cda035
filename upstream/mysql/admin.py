"""Readiness of a MySQL/MariaDB upstream and its binlog positions.

:func:`check_upstream` lists *every* problem with its fix in one :class:`cdc.errors.UpstreamNotReady`: binary
logging off, ``binlog_format`` not ROW, ``binlog_row_image`` not FULL, ``binlog_row_metadata`` not FULL (where the
server has it: MariaDB 10.5+, MySQL 8.0.1+; without it the binlog carries no column names or character sets), and
missing privileges (REPLICATION SLAVE and REPLICATION CLIENT/BINLOG MONITOR on ``*.*``, SELECT on the database).
"""

from __future__ import annotations

import re
from typing import Any

from cdc.errors import UpstreamNotReady
from upstream.mysql.conn import mysql_errors
from upstream.mysql.resume import GtidState, MysqlGtidSet, is_mysql_gtid

_GRANT = re.compile(r"^GRANT (?P<privs>.+?) ON (?P<obj>\S+) TO ", re.IGNORECASE)
_VARIABLES = ("log_bin", "binlog_format", "binlog_row_image", "binlog_row_metadata", "server_id", "version",
              "binlog_transaction_compression", "binlog_row_value_options", "gtid_mode")


def variables(conn: Any, where: str) -> dict[str, str]:
    """The server variables readiness depends on (a missing one is absent from the dict)."""
    with mysql_errors(where, "reading server variables"), conn.cursor() as cur:
        cur.execute("SHOW GLOBAL VARIABLES WHERE Variable_name IN (" + ", ".join(["%s"] * len(_VARIABLES)) + ")",
                    _VARIABLES)
        return {str(k).lower(): str(v) for k, v in cur.fetchall()}


def _unquote(ident: str) -> str:
    return ident[1:-1].replace("``", "`") if ident.startswith("`") and ident.endswith("`") else ident


def privileges(conn: Any, where: str, database: str) -> tuple[set[str], set[str], str]:
    """``(global privileges, privileges on database.*, current user)`` from ``SHOW GRANTS`` (upper case; ``ALL
    PRIVILEGES`` kept as such)."""
    with mysql_errors(where, "reading the user's grants"), conn.cursor() as cur:
        cur.execute("SELECT CURRENT_USER()")
        user = str(cur.fetchone()[0])
        cur.execute("SHOW GRANTS")
        lines = [str(r[0]) for r in cur.fetchall()]
    glob: set[str] = set()
    on_db: set[str] = set()
    for line in lines:
        m = _GRANT.match(line)
        if m is None:
            continue
        obj = m.group("obj")
        privs = {p.strip().upper() for p in re.sub(r"\([^)]*\)", "", m.group("privs")).split(",")}
        schema, _, table = obj.partition(".")
        if obj == "*.*":
            glob |= privs
        elif table == "*" and _unquote(schema) == database:
            on_db |= privs
    return glob, on_db, user


def check_upstream(conn: Any, where: str, database: str) -> dict[str, Any]:
    """Raise ``UpstreamNotReady`` listing every problem with its fix unless the server's binlog can feed a
    changefeed of ``database`` for this user; return the facts checked."""
    v = variables(conn, where)
    glob, on_db, user = privileges(conn, where, database)
    problems: list[str] = []
    if v.get("log_bin", "OFF").upper() not in ("ON", "1"):
        problems.append("binary logging is off: start the server with --log-bin (and --server-id)")
    if v.get("binlog_format", "").upper() != "ROW":
        problems.append(f"binlog_format is {v.get('binlog_format')!r}: SET GLOBAL binlog_format = 'ROW' (and "
                        f"binlog_format = ROW in the server's configuration)")
    if v.get("binlog_row_image", "").upper() != "FULL":
        problems.append(f"binlog_row_image is {v.get('binlog_row_image')!r}: SET GLOBAL binlog_row_image = 'FULL' "
                        f"(and in the server's configuration); a minimal image leaves columns out of the rows")
    if "binlog_row_metadata" in v and v["binlog_row_metadata"].upper() != "FULL":
        problems.append(f"binlog_row_metadata is {v['binlog_row_metadata']!r}: SET GLOBAL binlog_row_metadata = "
                        f"'FULL' (and in the server's configuration); without it the binlog names no columns")
    if v.get("binlog_transaction_compression", "OFF").upper() in ("ON", "1"):
        problems.append("binlog_transaction_compression is ON: SET GLOBAL binlog_transaction_compression = OFF (and "
                        "in the server's configuration); compressed transactions are not replicated yet")
    if "PARTIAL_JSON" in v.get("binlog_row_value_options", "").upper():
        problems.append("binlog_row_value_options is PARTIAL_JSON: SET GLOBAL binlog_row_value_options = '' (and in "
                        "the server's configuration); partial JSON updates carry no whole value")
    all_global = "ALL PRIVILEGES" in glob
    missing: list[str] = []
    if not all_global and "REPLICATION SLAVE" not in glob and "REPLICATION REPLICA" not in glob:
        missing.append("REPLICATION SLAVE")
    if not all_global and not glob & {"REPLICATION CLIENT", "BINLOG MONITOR", "SUPER"}:
        missing.append("REPLICATION CLIENT")
    if missing:
        problems.append(f"user {user} lacks {' and '.join(missing)}: GRANT {', '.join(missing)} ON *.* TO {user}")
    if not (all_global or "SELECT" in glob or on_db & {"SELECT", "ALL PRIVILEGES"}):
        problems.append(f"user {user} cannot read database `{database}`: GRANT SELECT ON `{database}`.* TO {user}")
    if problems:
        raise UpstreamNotReady(f"MySQL {where} is not ready for binlog replication: " + "; ".join(problems))
    return {**v, "user": user, "database": database}


def master_position(conn: Any, where: str) -> tuple[str, int]:
    """``(file, position)`` of the server's binlog end now (``SHOW MASTER STATUS``)."""
    row = binlog_status(conn, where)
    if row is None:
        raise UpstreamNotReady(f"MySQL {where}: SHOW MASTER STATUS shows no binlog (binary logging is off)")
    return str(row[0]), int(row[1])


_PARSE_ERROR = 1064


def _show(conn: Any, where: str, doing: str, statements: tuple[str, ...], *, many: bool) -> Any:
    """The first of ``statements`` the server understands (MySQL 8.4 removed ``SHOW MASTER STATUS`` and ``SHOW
    SLAVE HOSTS`` for ``SHOW BINARY LOG STATUS`` and ``SHOW REPLICAS``, which MariaDB does not have): its row, or rows
    with ``many``."""
    import pymysql

    for i, sql in enumerate(statements):
        try:
            with mysql_errors(where, doing), conn.cursor() as cur:
                cur.execute(sql)
                return cur.fetchall() if many else cur.fetchone()
        except Exception as exc:  # noqa: BLE001 - a syntax error: the next spelling
            cause = exc.__cause__
            if (i + 1 == len(statements) or not isinstance(cause, pymysql.MySQLError)
                    or not cause.args or cause.args[0] != _PARSE_ERROR):
                raise
    raise AssertionError("unreachable")


def binlog_status(conn: Any, where: str) -> tuple[Any, ...] | None:
    """The server's binlog status row (file, position, ..., and on MySQL its ``Executed_Gtid_Set`` last), or None when
    binary logging is off."""
    row = _show(conn, where, "reading the binlog position", ("SHOW MASTER STATUS", "SHOW BINARY LOG STATUS"),
                many=False)
    return None if row is None else tuple(row)


def binary_logs(conn: Any, where: str) -> list[tuple[str, int]]:
    """``SHOW BINARY LOGS``: every binlog file the server still has, with its size."""
    with mysql_errors(where, "listing the binlog files"), conn.cursor() as cur:
        cur.execute("SHOW BINARY LOGS")
        return [(str(r[0]), int(r[1])) for r in cur.fetchall()]


def gtid_at(conn: Any, where: str, log_file: str, pos: int) -> str | None:
    """MariaDB's GTID position at ``(log_file, pos)`` (``BINLOG_GTID_POS``; None where the server has none)."""
    try:
        with mysql_errors(where, "reading the GTID position"), conn.cursor() as cur:
            cur.execute("SELECT BINLOG_GTID_POS(%s, %s)", (log_file, pos))
            row = cur.fetchone()
    except Exception:  # noqa: BLE001 - MySQL has no BINLOG_GTID_POS: the GTID is informative only
        return None
    return None if row is None or row[0] is None else str(row[0])


def replica_server_ids(conn: Any, where: str) -> set[int] | None:
    """The ``server_id`` of every replica registered with the server now (``SHOW SLAVE HOSTS``; None when this user
    may not list them)."""
    try:
        rows = _show(conn, where, "listing the replicas", ("SHOW SLAVE HOSTS", "SHOW REPLICAS"), many=True)
        return {int(r[0]) for r in rows}
    except Exception:  # noqa: BLE001 - REPLICATION MASTER ADMIN missing: the clash shows when the span starts
        return None


def server_id(conn: Any, where: str) -> int:
    """The server's ``@@server_id`` (a replica's differs from its primary's: it tells the servers apart)."""
    with mysql_errors(where, "reading the server_id"), conn.cursor() as cur:
        cur.execute("SELECT @@server_id")
        return int(cur.fetchone()[0])


def gtid_binlog_pos(conn: Any, where: str) -> str | None:
    """MariaDB's ``@@gtid_binlog_pos``: the GTID of the last transaction of each domain in the server's binlog (None:
    the server has no such variable, e.g. MySQL)."""
    try:
        with mysql_errors(where, "reading the GTID position"), conn.cursor() as cur:
            cur.execute("SELECT @@gtid_binlog_pos")
            row = cur.fetchone()
    except Exception:  # noqa: BLE001 - MySQL: no MariaDB GTID
        return None
    return None if row is None or row[0] is None else str(row[0])


def mysql_gtid_at(conn: Any, where: str, log_file: str, pos: int) -> str | None:
    """MySQL's executed GTID set at ``(log_file, pos)`` (a transaction boundary): the file's ``Previous_gtids`` and
    every GTID of the file before ``pos`` (``SHOW BINLOG EVENTS``, read in pages up to ``pos``). None when the file has
    no ``Previous_gtids`` event (MariaDB) or the server has no GTIDs (gtid_mode OFF: an empty set)."""
    found: MysqlGtidSet | None = None
    offset, page = 0, 2000
    with mysql_errors(where, "reading the binlog's GTIDs"), conn.cursor() as cur:
        while True:
            cur.execute(f"SHOW BINLOG EVENTS IN %s FROM 4 LIMIT {offset}, {page}", (log_file,))
            rows = cur.fetchall()
            for _name, epos, etype, _sid, _end, info in rows:
                if int(epos) >= pos:
                    return None if found is None or not str(found) else str(found)
                if etype == "Previous_gtids":
                    found = MysqlGtidSet.parse(str(info or ""))
                elif etype == "Gtid" and found is not None:
                    text = str(info).split("'")[1] if "'" in str(info) else ""
                    uuid, _, gno = text.rpartition(":")
                    if uuid and gno.isdigit():
                        found.add(uuid.lower(), int(gno))
            if len(rows) < page:
                return None if found is None or not str(found) else str(found)
            offset += page


def mysql_takeover_problems(conn: Any, where: str, wanted: str) -> list[str]:
    """Why this MySQL server cannot continue a stream after executed GTID set ``wanted`` (empty: it can): the GTIDs of
    ``wanted`` it has not executed (a replica must have applied them all: ``@@gtid_executed`` contains ``wanted``),
    and the GTIDs after ``wanted`` its binlog no longer holds (``@@gtid_purged`` not inside ``wanted``)."""
    with mysql_errors(where, "comparing GTID sets"), conn.cursor() as cur:
        cur.execute("SELECT @@GLOBAL.gtid_mode, GTID_SUBTRACT(%s, @@GLOBAL.gtid_executed), "
                    "GTID_SUBTRACT(@@GLOBAL.gtid_purged, %s)", (wanted, wanted))
        mode, lacking, purged = cur.fetchone()
    problems = []
    if str(mode).upper() != "ON":
        problems.append(f"its gtid_mode is {mode}: failover by GTID needs gtid_mode = ON")
    if lacking:
        problems.append(f"its binlog lacks {str(lacking).replace(chr(10), '')}")
    if purged:
        problems.append(f"its binlog no longer holds what follows: purged {str(purged).replace(chr(10), '')}")
    return problems


def takeover_problems(conn: Any, where: str, wanted: str) -> list[str]:
    """Why this server cannot continue a stream after GTID state ``wanted`` (empty: it can): the GTIDs it
    lacks (its binlog position must contain ``wanted``: ``log_slave_updates`` on a replica), and the domains whose
    transactions right after ``wanted`` its binlog no longer holds (purged). A MySQL GTID set is compared by the
    server itself (:func:`mysql_takeover_problems`)."""
    if is_mysql_gtid(wanted):
        return mysql_takeover_problems(conn, where, wanted)
    state = GtidState.parse(wanted)
    if not state.domains:
        return ["the checkpoint names no GTID (the changefeed was read from a server without MariaDB GTIDs)"]
    have = gtid_binlog_pos(conn, where)
    if have is None:
        return ["the server has no MariaDB GTID position (@@gtid_binlog_pos): failover by GTID needs MariaDB"]
    problems = [f"its binlog lacks {m}" for m in state.missing_in(GtidState.parse(have))]
    files = binary_logs(conn, where)
    if files:
        oldest = gtid_at(conn, where, files[0][0], 4)
        if oldest is not None:
            problems += [f"its binlog no longer holds what follows: {m}" for m in state.after(GtidState.parse(oldest))]
    return problems


def binlog_retention_seconds(conn: Any, where: str) -> float | None:
    """How long the server keeps binlog files (``binlog_expire_logs_seconds``, else ``expire_logs_days``); None:
    forever (0 or unset)."""
    with mysql_errors(where, "reading the binlog retention"), conn.cursor() as cur:
        cur.execute("SHOW GLOBAL VARIABLES WHERE Variable_name IN ('binlog_expire_logs_seconds', 'expire_logs_days')")
        v = {str(k).lower(): str(val) for k, val in cur.fetchall()}
    seconds = float(v.get("binlog_expire_logs_seconds") or 0)
    if seconds <= 0:
        seconds = float(v.get("expire_logs_days") or 0) * 86400
    return seconds if seconds > 0 else None
