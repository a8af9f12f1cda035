"""A table of Tidewater's own in an SQL target (the exactly-once position of :mod:`sinks.sql.target.position`, the
record of applied DDL of :mod:`sinks.sql.ops.ddl_run`): where it lives (schema ``tidewater`` on PostgreSQL, the
sink URI's database on MySQL/MariaDB and SQLite), its name as statements spell it, the driver's parameter marker,
the target's clock, and its creation when missing.

Guarantees: :meth:`OwnTable.create` only ever runs ``CREATE .. IF NOT EXISTS`` (a concurrent creation by another
session counts as success, :meth:`sinks.sql.target.connection.Target.run_ddl`), on MySQL and PostgreSQL on an
autocommit connection, so never inside a data transaction (MySQL DDL would commit it). On SQLite it does nothing:
the caller runs ``create_table`` inside its own transaction (one writer per file).
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from sinks.sql.target.connection import Target

PG_SCHEMA = "tidewater"
NOW = {"postgresql": "now()", "mysql": "UTC_TIMESTAMP(6)", "sqlite": "strftime('%Y-%m-%d %H:%M:%f', 'now')"}
"""The target's clock (UTC where the column type has no zone) per dialect, as an SQL expression."""


class OwnTable:
    """Table ``table`` of Tidewater's own on ``dialect`` (module docstring), whose column definitions are ``columns``
    (the body of its ``CREATE TABLE``). ``schema`` (None but on PostgreSQL), ``label`` (for messages), ``name``
    (quoted), ``p`` (the parameter marker), ``now`` (:data:`NOW`), ``create_schema`` (None but on PostgreSQL) and
    ``create_table`` (utf8mb4 with a binary collation on MySQL/MariaDB) are plain strings."""

    def __init__(self, dialect: str, preparer: Any, table: str, columns: str) -> None:
        q = preparer.quote
        self.dialect = dialect
        self.table = table
        self.schema = PG_SCHEMA if dialect == "postgresql" else None
        self.label = f"{self.schema}.{table}" if self.schema else table
        self.name = f"{q(self.schema)}.{q(table)}" if self.schema else q(table)
        self.p = "?" if dialect == "sqlite" else "%s"
        self.now = NOW[dialect]
        self.create_schema = f"CREATE SCHEMA IF NOT EXISTS {q(PG_SCHEMA)}" if self.schema else None
        self.create_table = f"CREATE TABLE IF NOT EXISTS {self.name} ({columns})"
        if dialect == "mysql":
            self.create_table += " DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin"

    def create(self, target: Target) -> None:
        """Create the schema and the table if missing, on an autocommit connection (MySQL, PostgreSQL); nothing on
        SQLite (see the module docstring). Driver errors are raised as they are."""
        if self.dialect == "sqlite":
            return
        with target.engine.connect() as ddl:
            ddl.execution_options(isolation_level="AUTOCOMMIT")
            if self.create_schema:
                target.run_ddl(ddl, self.create_schema)
            target.run_ddl(ddl, self.create_table)

    def exists(self, conn: Connection) -> bool:
        """Whether the table exists, as ``conn`` sees it (e.g. before deleting a removed changefeed's rows)."""
        return bool(sa.inspect(conn).has_table(self.table, schema=self.schema))
