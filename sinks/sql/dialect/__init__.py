"""The SQL sink's bottom layer: what each target dialect needs, as pure functions and value objects (no I/O, no
state): type mapping and CREATE TABLE (``typemap``), DDL translation (``ddl``), statement text (``statements``),
value conversion (``values``), driver error classification (``errors``), a window's net effect (``normalize``) and
the apply order of foreign keys (``fkgraph``)."""
