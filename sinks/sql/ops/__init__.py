"""The SQL sink's operations, built from the target objects: applying one write (``writer`` with ``output``),
applying a schema change once (``ddl_run``), and the initial copy's loaders (``bulk``: COPY passthrough,
``deferred_key``: the key built after the load, ``copy_targets``: preparing the target tables)."""
