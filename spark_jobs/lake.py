"""Spark reads the lake: a Structured Streaming job that keeps a Parquet table equal to an upstream table, from the
storage sink's files (``python -m spark_jobs.lake --sink URI --table s.t --output DIR --checkpoint DIR``).

Source: the Python streaming data source ``format("tidewater_lake")`` (options ``uri``: the storage sink URI,
``table``: ``schema.table``; optional ``until``: a commit Ts the stream never goes past, for a table state at exactly
that point, ``changefeed verify``'s). Its offsets are :class:`sinks.storage.reader.LakeOffset`\\ s: each micro-batch covers the
changes between the previous published ``metadata`` checkpoint and the current one, and nothing above it (only whole
transactions that every span has published). One Spark partition per file slice (:meth:`StorageReader.plan`), read in
the executors; each row is a change: ``_op`` (``I`` insert, ``U`` update, ``D`` delete, ``T`` truncate / drop table),
``_commit_ts``, the order columns ``_version``, ``_date``, ``_file``, ``_line``, the table's columns typed
(:func:`spark_type`) and ``_unavailable`` (columns the upstream did not send). An update that changes the key comes as a
``D`` of the old key and an ``I`` of the new row; an update of a key-less table as a ``D`` of its whole old image and an
``I`` of the new row.

Sink (``foreachBatch``, :func:`merge_batch`): the output directory holds one Parquet directory per applied batch,
``v{batch id}``, and ``_current`` naming the latest. A batch reads the current version, folds its changes in commit
order into the rows they touch (:class:`sinks.storage.reader.TableState`: upsert and delete by key, unsent values kept,
key changes moved; run on the driver for the touched rows only), writes ``current minus touched rows plus their new
images`` as ``v{batch id}`` and then replaces ``_current`` atomically. Idempotent by batch id: a batch at or below
``_current`` (Spark re-running the last batch after a crash, with the same offsets) changes nothing; a half-written
``v{id}`` is overwritten. The two previous versions are kept for readers in flight; older ones are removed.

A key-less table (``REPLICA IDENTITY FULL`` upstream) is a multiset: an insert adds a row, a delete removes one row
equal to its old image (null equal to null), an update does both; the rows a batch touches are those equal to an old
image, with their duplicates (:func:`_touched`). A delete of a row the table does not hold fails the batch (the lake
would differ from the upstream), naming the row.

Read the table with :func:`read_table` (Spark) or :func:`current_path` (any Parquet reader). Limits: the stream's
column set is the table's
at start (a later DDL that adds columns stops the query with a message: restart it, it continues from its
checkpoint); ``time`` columns are strings (Spark has no time type), unbounded ``numeric`` strings with the exact
text, ``uuid`` strings.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import operator
import os
import pickle
import shutil
import sys
import uuid
from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from cdc import serde
from cdc.errors import InvalidArgument, TidewaterError
from cdc.events import UNCHANGED, ColumnSchema, OpType, TableName, TableSchema
from sinks.codec import types as T
from sinks.codec.text import decimal_text
from sinks.storage.reader import LakeChange, LakeOffset, Slice, StorageReader, TableState

log = logging.getLogger(__name__)

FORMAT = "tidewater_lake"
ORDER = ("_commit_ts", "_version", "_date", "_file", "_line")
META = (StructField("_op", StringType(), False), StructField("_commit_ts", LongType(), False),
        StructField("_version", LongType(), False), StructField("_date", StringType(), False),
        StructField("_file", LongType(), False), StructField("_line", LongType(), False))
UNAVAILABLE = StructField("_unavailable", ArrayType(StringType()), True)
CURRENT = "_current"

_SCALARS: dict[str, Callable[[], DataType]] = {
    "int2": ShortType, "int4": IntegerType, "int8": LongType, "oid": LongType, "xid": LongType, "cid": LongType,
    "xid8": lambda: DecimalType(20, 0), "float4": FloatType, "float8": DoubleType, "bool": BooleanType,
    "bytea": BinaryType, "date": DateType, "timestamp": TimestampNTZType, "timestamptz": TimestampType,
}


def _decimal(col: ColumnSchema) -> DecimalType | None:
    ps = T.numeric_precision_scale(col)
    return DecimalType(*ps) if ps is not None and 1 <= ps[0] <= 38 and 0 <= ps[1] <= ps[0] else None


def spark_type(col: ColumnSchema) -> DataType:
    """PostgreSQL column -> Spark type (like the storage sink's Parquet mapping; ``time`` and ``uuid`` as strings)."""
    if col.is_array:
        make = _SCALARS.get(col.base_type)
        return ArrayType(make() if make is not None and col.base_type != "xid8" else StringType())
    if col.base_type == "numeric":
        return _decimal(col) or StringType()
    make = _SCALARS.get(col.base_type)
    return make() if make is not None else StringType()


def table_struct(schema: TableSchema) -> StructType:
    """The output table's Spark schema: the upstream columns, typed."""
    return StructType([StructField(c.name, spark_type(c), True) for c in schema.columns])


def _to_spark(table: TableName, col: ColumnSchema) -> Callable[[Any], Any]:
    """Reader value -> the Python value Spark takes for :func:`spark_type` (InvalidArgument for what it cannot
    hold: PostgreSQL's ``infinity`` and BC dates, ``24:00:00``, NaN in a decimal)."""
    st = spark_type(col)

    def refuse(v: Any) -> InvalidArgument:
        return InvalidArgument(f"table {table}: column {col.name!r}: the value {str(v)[:60]!r} has no Spark "
                               f"{st.simpleString()} form")

    if isinstance(st, StringType):
        def text(v: Any) -> Any:
            if isinstance(v, Decimal):
                return decimal_text(v)
            if isinstance(v, list):
                return json.dumps(v, default=str)
            return v if isinstance(v, str) else v.isoformat() if hasattr(v, "isoformat") else str(v)
        return text
    if isinstance(st, ArrayType):
        elem = st.elementType

        def array(v: Any) -> Any:
            if not isinstance(v, list) or any(isinstance(x, list) for x in v):
                raise refuse(v)
            if isinstance(elem, StringType):
                return [None if x is None else decimal_text(x) if isinstance(x, Decimal) else str(x) for x in v]
            return v
        return array
    if isinstance(st, DecimalType):
        def dec(v: Any) -> Any:
            if not isinstance(v, (Decimal, int)) or (isinstance(v, Decimal) and not v.is_finite()):
                raise refuse(v)
            return Decimal(v)
        return dec
    if isinstance(st, (DateType, TimestampType, TimestampNTZType)):
        def temporal(v: Any) -> Any:
            if isinstance(v, str):
                raise refuse(v)
            return v
        return temporal
    return lambda v: v


class SlicePartition(InputPartition):
    """One :class:`sinks.storage.reader.Slice`, pickled."""

    def __init__(self, index: int, data: bytes) -> None:
        super().__init__(index)
        self.data = data


def _options(options: dict[str, str]) -> tuple[str, TableName]:
    uri, table = options.get("uri"), options.get("table")
    if not uri or not table:
        raise InvalidArgument(f"{FORMAT}: the options 'uri' (the storage sink URI) and 'table' are required")
    return uri, TableName.parse(table)


def _until(options: dict[str, str]) -> int | None:
    raw = options.get("until")
    return int(raw) if raw else None


class LakeDataSource(DataSource):
    """``format("tidewater_lake")``: see the module docstring."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def _table_schema(self) -> TableSchema:
        cached = getattr(self, "_cached", None)
        if cached is None:
            uri, table = _options(self.options)
            cached = StorageReader(uri).latest_schema(table)
            if cached is None:
                raise InvalidArgument(f"{FORMAT}: table {table} has no schema file under the sink's directory yet "
                                      f"(start the job once the changefeed has written it)")
            self._cached = cached
        return cached

    def schema(self) -> StructType:
        return StructType([*META, *table_struct(self._table_schema()).fields, UNAVAILABLE])

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:  # noqa: N802 - Spark's name
        return LakeStreamReader(dict(self.options), self._table_schema())


class LakeStreamReader(DataSourceStreamReader):
    """Offsets on the driver (:meth:`latestOffset`, :meth:`partitions`), slices read in the executors."""

    def __init__(self, options: dict[str, str], schema: TableSchema) -> None:
        self.uri, self.table = _options(options)
        self.until = _until(options)
        self.schema_json = serde.to_json(schema)
        self._reader: StorageReader | None = None

    @property
    def reader(self) -> StorageReader:
        if self._reader is None:
            self._reader = StorageReader(self.uri)
        return self._reader

    def initialOffset(self) -> dict:  # noqa: N802 - Spark's name
        return LakeOffset().to_dict()

    def latestOffset(self, start: dict, limit: Any) -> dict:  # noqa: N802 - Spark's name
        return self.reader.latest_offset(LakeOffset.from_dict(start), [self.table], self.until).to_dict()

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        slices = self.reader.plan(LakeOffset.from_dict(start), LakeOffset.from_dict(end), [self.table])
        return [SlicePartition(i, pickle.dumps(s)) for i, s in enumerate(slices)]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, SlicePartition)
        s: Slice = pickle.loads(partition.data)
        schema = serde.from_json(TableSchema, self.schema_json)
        yield from slice_rows(StorageReader(self.uri), s, schema)

    def commit(self, end: dict) -> None:
        pass


def slice_rows(reader: StorageReader, s: Slice, schema: TableSchema) -> Iterator[tuple[Any, ...]]:
    """The source rows of one slice (module docstring)."""
    names = schema.column_names
    convs = [_to_spark(schema.name, c) for c in schema.columns]
    nulls = (None,) * len(names)
    if s.file is not None:
        file_schema = reader.schema_files(s.table)[s.file.version].schema
        new = set(file_schema.column_names) - set(names)
        if new:
            raise InvalidArgument(f"{FORMAT}: table {s.table} has columns {sorted(new)} that the running query does "
                                  f"not know (a DDL at table version {s.file.version}): restart the query; it "
                                  f"continues from its checkpoint with the new columns")
    for c in reader.read_slice(s):
        ts, version, date, index, line = c.order
        if c.fill:  # not applied here yet (docs/limits.md): stop rather than keep NULL where the source has values
            given = sorted(k for k, v in (c.values or {}).items() if v is not None)
            if given:
                raise InvalidArgument(
                    f"{FORMAT}: table {s.table}: column(s) {given} were added at table version {version} with values "
                    "for the rows that existed before (ADD COLUMN ... DEFAULT), which the lake job cannot apply yet: "
                    "its rows of the table would keep NULL there. Read this table with the storage reader "
                    "(sinks.storage.reader, `rebuild`), which applies them")
            continue
        if c.op is OpType.TRUNCATE:
            yield ("T", ts, version, date, index, line, *nulls, None)
            continue
        if c.op is OpType.DELETE:
            yield ("D", ts, version, date, index, 2 * line, *_values(c.old or {}, names, convs))
            continue
        values = c.values or {}
        old = c.old
        if c.op is OpType.UPDATE and old and not schema.has_key:  # a multiset: remove the old image, add the new
            yield ("D", ts, version, date, index, 2 * line, *_values(old, names, convs))
            yield ("I", ts, version, date, index, 2 * line + 1, *_values(values, names, convs))
            continue
        if c.op is OpType.UPDATE and old and schema.has_key and all(k in old for k in schema.key) and \
                any(old[k] != values.get(k) for k in schema.key):
            yield ("D", ts, version, date, index, 2 * line, *_values({k: old[k] for k in schema.key}, names, convs))
            yield ("I", ts, version, date, index, 2 * line + 1, *_values(values, names, convs))
            continue
        yield ("I" if c.op is OpType.INSERT else "U", ts, version, date, index, 2 * line, *_values(values, names, convs))


def _values(values: dict[str, Any], names: tuple[str, ...], convs: list[Callable[[Any], Any]]) -> list[Any]:
    out: list[Any] = []
    missing: list[str] = []
    for n, conv in zip(names, convs, strict=True):
        v = values.get(n, UNCHANGED)
        if v is UNCHANGED:
            missing.append(n)
            out.append(None)
        else:
            out.append(None if v is None else conv(v))
    out.append(missing or None)
    return out


# ---- the sink side ---------------------------------------------------------------------------------------------
def current_path(output: str) -> str | None:
    """The Parquet directory of the table's current version, None before the first batch."""
    try:
        with open(os.path.join(output, CURRENT)) as f:
            return os.path.join(output, json.load(f)["path"])
    except FileNotFoundError:
        return None


def _current_batch(output: str) -> int | None:
    try:
        with open(os.path.join(output, CURRENT)) as f:
            return int(json.load(f)["batch"])
    except FileNotFoundError:
        return None


def _set_current(output: str, batch_id: int, path: str) -> None:
    tmp = os.path.join(output, f".{CURRENT}.{uuid.uuid4().hex}")
    with open(tmp, "w") as f:
        json.dump({"batch": batch_id, "path": path}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(output, CURRENT))
    fd = os.open(output, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def lake_change(row: Any, names: tuple[str, ...]) -> LakeChange:
    """A source row (collected) -> the reader's change (unsent values UNCHANGED)."""
    op = row["_op"]
    order = tuple(row[c] for c in ORDER)
    if op == "T":
        return LakeChange(OpType.TRUNCATE, row["_commit_ts"], order)  # type: ignore[arg-type]
    missing = set(row["_unavailable"] or ())
    values = {n: (UNCHANGED if n in missing else row[n]) for n in names}
    if op == "D":
        return LakeChange(OpType.DELETE, row["_commit_ts"], order, None,  # type: ignore[arg-type]
                          {n: v for n, v in values.items() if v is not UNCHANGED})
    return LakeChange(OpType.INSERT if op == "I" else OpType.UPDATE, row["_commit_ts"], order,  # type: ignore[arg-type]
                      values)


def _touched(changes: list[LakeChange], schema: TableSchema) -> tuple[set[tuple[Any, ...]], tuple[str, ...]]:
    """The rows of the current version a batch can change, as values of the columns that find them: the keys of
    every image (keyed table), or the whole old images of deletes and updates (key-less table: a multiset, where an
    insert only adds a row and a delete or update removes one row equal to its old image, null equal to null)."""
    if schema.has_key:
        key = schema.key
        return {tuple(image[k] for k in key) for c in changes for image in (c.values, c.old) if image is not None}, key
    names = schema.column_names
    return {tuple(c.old.get(n) for n in names) for c in changes if c.old}, names


def merge_batch(spark: Any, output: str, schema: TableSchema, batch: Any, batch_id: int) -> None:
    """Apply one micro-batch to the output table (module docstring)."""
    current = _current_batch(output)
    if current is not None and current >= batch_id:
        log.info("lake %s: batch %d is applied already (current %d)", schema.name, batch_id, current)
        return
    rows = batch.orderBy(*ORDER).collect()
    if not rows:
        return
    names = schema.column_names
    struct = table_struct(schema)
    changes = [lake_change(r, names) for r in rows]
    last_truncate = max((i for i, c in enumerate(changes) if c.op is OpType.TRUNCATE), default=-1)
    base_path = current_path(output)
    state = TableState(schema)
    if last_truncate >= 0 or base_path is None:
        changes = changes[last_truncate + 1:]
        untouched = spark.createDataFrame([], struct)
    else:
        base = spark.read.parquet(base_path)
        touched, cols = _touched(changes, schema)
        keys = spark.createDataFrame(sorted(touched, key=repr), StructType([struct[k] for k in cols]))
        match = functools.reduce(operator.and_, [base[c].eqNullSafe(keys[c]) for c in cols])
        state.seed(r.asDict() for r in base.join(keys, match, "left_semi").collect())
        untouched = base.join(keys, match, "left_anti")
    state.apply(changes)
    if state.problems:
        raise TidewaterError(f"lake {schema.name}: batch {batch_id} cannot be applied exactly: "
                             f"{'; '.join(state.problems[:3])}")
    new_rows = spark.createDataFrame([tuple(r[n] for n in names) for r in state.rows()], struct)
    path = f"v{batch_id:020d}"
    untouched.select(*names).unionByName(new_rows).write.mode("overwrite").parquet(os.path.join(output, path))
    _set_current(output, batch_id, path)
    keep = {path, *[n for n in sorted(os.listdir(output)) if n.startswith("v")][-3:]}
    for name in os.listdir(output):
        if name.startswith("v") and name not in keep:
            shutil.rmtree(os.path.join(output, name), ignore_errors=True)
    log.info("lake %s: batch %d applied (%d changes) -> %s", schema.name, batch_id, len(changes), path)


def start(spark: Any, sink_uri: str, table: str, output: str, checkpoint: str, *, trigger_seconds: float = 5.0,
          until: int | None = None) -> Any:
    """Start the streaming query (returns the ``StreamingQuery``); ``until``: apply nothing past this commit Ts."""
    spark.dataSource.register(LakeDataSource)
    spark.conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
    schema = StorageReader(sink_uri).latest_schema(TableName.parse(table))
    reader = spark.readStream.format(FORMAT).option("uri", sink_uri).option("table", table)
    source = (reader.option("until", str(until)) if until is not None else reader).load()
    if schema is None:
        raise InvalidArgument(f"{FORMAT}: table {table} has no schema file yet")
    os.makedirs(output, exist_ok=True)
    return (source.writeStream
            .foreachBatch(lambda df, batch_id: merge_batch(spark, output, schema, df, batch_id))
            .option("checkpointLocation", checkpoint)
            .trigger(processingTime=f"{trigger_seconds} seconds")
            .queryName(f"tidewater-lake-{table}")
            .start())


def run_available(spark: Any, sink_uri: str, table: str, output: str, checkpoint: str, *,
                  until: int | None = None) -> None:
    """Apply everything published so far (``until``: up to that commit Ts, no further), then stop (tests,
    cron-style runs, ``changefeed verify``)."""
    query = start(spark, sink_uri, table, output, checkpoint, trigger_seconds=0.5, until=until)
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    if query.exception() is not None:
        raise TidewaterError(f"lake {table}: the streaming query failed: {query.exception()}")


def read_table(spark: Any, output: str) -> Any:
    """The output table now (a DataFrame), None before the first batch."""
    path = current_path(output)
    return spark.read.parquet(path) if path is not None else None


def main(argv: list[str] | None = None) -> int:
    from spark_jobs.session import spark_session

    p = argparse.ArgumentParser(prog="python -m spark_jobs.lake", description=__doc__.split("\n\n")[0])
    p.add_argument("--sink", required=True, help="the storage sink URI (file:///dir?protocol=...)")
    p.add_argument("--table", required=True, help="schema.table")
    p.add_argument("--output", required=True, help="directory of the Parquet table")
    p.add_argument("--checkpoint", required=True, help="Structured Streaming checkpoint directory")
    p.add_argument("--master", default="local[*]")
    p.add_argument("--trigger", type=float, default=5.0, help="seconds between micro-batches")
    p.add_argument("--once", action="store_true", help="apply what is published, then stop")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s [%(name)s] %(message)s")
    try:
        spark = spark_session(args.master, app_name="tidewater-lake")
        if args.once:
            run_available(spark, args.sink, args.table, args.output, args.checkpoint)
        else:
            start(spark, args.sink, args.table, args.output, args.checkpoint,
                  trigger_seconds=args.trigger).awaitTermination()
    except TidewaterError as exc:
        print(f"lake job failed: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
