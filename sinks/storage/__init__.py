"""The storage sink (``file:///dir?protocol=csv|canal-json|parquet``): TiCDC's storage-sink layout on a local
directory, and a reader of it.

- :mod:`sinks.storage.config`: the URI and its options;
- :mod:`sinks.storage.layout`: paths, schema files (TiCDC's ``TableDefinition``), ``metadata``;
- :mod:`sinks.storage.fs`: atomic publication on the local file system, errors naming the path;
- :mod:`sinks.storage.parquet`: Parquet files with typed columns (pyarrow);
- :mod:`sinks.storage.sink`: the sink and its guarantees;
- :mod:`sinks.storage.reader`: rebuilding tables from the files up to the published checkpoint (tests, the Spark
  lake job, any consumer).

The transport is separate from the codecs (``sinks.codec``): CSV and canal-json bytes come from their encoders.
"""
