"""The SQL sink's middle layer: the objects of one target, with state and public methods: the connection
(``connection.Target``: URI, engine, statement pipeline, error mapping), the catalog of its tables with their
bindings and foreign keys (``catalog``, ``binding``), the exactly-once position (``position``) and the statement
worker (``pipeline``)."""
