"""A PySpark Python Data Source whose partitions are snapshot chunks: ``format("tidewater_snapshot")``.

    spark.dataSource.register(SnapshotDataSource)
    df = (spark.read.format("tidewater_snapshot")
          .option("upstream", "postgresql://...").option("table", "public.orders")
          .option("snapshot", "00000003-00000002-1")      # optional: else each chunk at its own snapshot
          .option("chunk_rows", "50000")                   # optional
          .load())

One row per upstream row, one ``string`` column per upstream column with the upstream's *text* of the value
(the same text pgoutput sends; NULL is null), one Spark partition per chunk of
:meth:`upstream.base.SnapshotReader.plan`, read by :meth:`~upstream.base.SnapshotReader.read_chunk` in the
executor: the reading path of the snapshot copy, made available to DataFrame jobs (``cdc verify`` will checksum
chunks with it). The plan and the table schema are taken once when the DataFrame is planned, under the
snapshot, and travel to the executors inside the partitions. Options ``plan`` (a ``cdc.snapshot.TablePlan``
as JSON) reads exactly the chunks of a stored plan instead.

The copy job itself does not go through this source: there each task writes the rows it reads straight into
the sink in the same Python worker, which spares every row a trip through the JVM (docs/snapshot.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StringType, StructField, StructType

from cdc import serde
from cdc.config import DEFAULT_CHUNK_ROWS
from cdc.errors import InvalidArgument
from cdc.events import TableName, TableSchema
from cdc.snapshot import SnapshotChunk, TablePlan
from upstream import open_upstream

FORMAT = "tidewater_snapshot"


class ChunkPartition(InputPartition):
    """One chunk (as ``cdc.snapshot.SnapshotChunk`` JSON, picklable)."""

    def __init__(self, index: int, chunk_json: bytes) -> None:
        super().__init__(index)
        self.chunk_json = chunk_json


def _options(options: dict[str, str]) -> tuple[str, TableName, str | None]:
    upstream, table = options.get("upstream"), options.get("table")
    if not upstream or not table:
        raise InvalidArgument(f"{FORMAT}: the options 'upstream' and 'table' are required")
    return upstream, TableName.parse(table), options.get("snapshot") or None


class SnapshotDataSource(DataSource):
    """See the module docstring."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def _table_schema(self) -> TableSchema:
        cached = getattr(self, "_cached_schema", None)
        if cached is None:
            upstream, table, snapshot = _options(self.options)
            up = open_upstream(upstream)
            try:
                with up.snapshot_reader(snapshot, label=FORMAT) as reader:
                    cached = reader.table_schema(table)
            finally:
                up.close()
            self._cached_schema = cached
        return cached

    def schema(self) -> StructType:
        return StructType([StructField(c.name, StringType(), True) for c in self._table_schema().columns])

    def reader(self, schema: StructType) -> DataSourceReader:
        return SnapshotChunkReader(dict(self.options), self._table_schema())


class SnapshotChunkReader(DataSourceReader):
    """Plans on the driver (:meth:`partitions`), reads one chunk per task (:meth:`read`)."""

    def __init__(self, options: dict[str, str], table_schema: TableSchema) -> None:
        self.upstream, self.table, self.snapshot = _options(options)
        self.schema_json = serde.to_json(table_schema)
        self.chunk_rows = int(options.get("chunk_rows") or DEFAULT_CHUNK_ROWS)
        self.plan_json = options.get("plan")

    def partitions(self) -> list[InputPartition]:
        if self.plan_json:
            plan = serde.from_json(TablePlan, self.plan_json)
        else:
            schema = serde.from_json(TableSchema, self.schema_json)
            up = open_upstream(self.upstream)
            try:
                with up.snapshot_reader(self.snapshot, label=FORMAT) as reader:
                    plan = reader.plan(schema, self.chunk_rows)
            finally:
                up.close()
        return [ChunkPartition(c.index, serde.to_json(c)) for c in plan.chunks]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, ChunkPartition)
        schema = serde.from_json(TableSchema, self.schema_json)
        chunk = serde.from_json(SnapshotChunk, partition.chunk_json)
        up = open_upstream(self.upstream)
        try:
            with up.snapshot_reader(self.snapshot, label=FORMAT) as reader:
                for change in reader.read_chunk(schema, chunk):
                    yield tuple(change.row_text or ())
        finally:
            up.close()
