"""The SQL sink's middle layer: the objects of one target, with state and public methods: the connection
(``connection.Target``: URI, engine, statement pipeline, error mapping, the transaction frame every write shares),
the catalog of its tables with their bindings and foreign keys (``catalog``, ``binding``), the exactly-once position
(``position``), the tables of Tidewater's own in the target (``own_table``) and the statement worker
(``pipeline``)."""
