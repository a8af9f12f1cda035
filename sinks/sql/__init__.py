"""SQL sink (MySQL/MariaDB, PostgreSQL, SQLite): :class:`sinks.sql.sink.SQLSink`.

Layers, top to bottom (each imports only those below it; ``lint-imports`` keeps it so): ``sink`` (the facade),
``ops`` (apply writer, DDL runner, initial-copy loaders), ``target`` (connection, catalog, bindings, exactly-once
position, statement pipeline), ``dialect`` (no I/O, no state: type mapping, DDL translation, statements, values,
errors, normalisation, foreign-key order). The module docstring of :mod:`sinks.sql.sink` says what each holds.
"""
