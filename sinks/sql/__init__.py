"""SQL sink (MySQL/MariaDB, PostgreSQL, SQLite); see :mod:`sinks.sql.sink`."""

from sinks.sql.sink import SQLSink

__all__ = ["SQLSink"]
