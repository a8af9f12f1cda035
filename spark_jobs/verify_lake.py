"""``changefeed verify`` on a storage sink: the lake (:mod:`spark_jobs.lake`) is the target side (docs/verify.md,
"A storage sink: the lake").

The verifier keeps its own lake of the changefeed's tables under the sink's directory (:func:`lake_root`:
``<sink root>/.tidewater-verify/<changefeed>/``, a name the storage reader skips), one Parquet table and one
Structured Streaming checkpoint per upstream table; each verification continues it from that checkpoint.
:func:`build_lake` runs the lake job (Spark) up to exactly the verification point ``Y`` (``until``: whole
transactions up to ``Y``, nothing after it) once the sink's ``metadata`` checkpoint has reached ``Y``
(:func:`wait_published`), and returns each table's Parquet version at ``Y``, which never changes afterwards (a new
batch writes a new version). The chunk tasks then read those versions with pyarrow (:func:`lake_rows`, a key range
pushed down as a filter) and compare them with the upstream under the snapshot at ``Y``, in the canonical forms of
the ``lake`` dialect (:mod:`spark_jobs.verify_values`). No module here imports Spark: :func:`build_lake` is handed
the session.
"""

from __future__ import annotations

import functools
import logging
import operator
import os
import time
from collections.abc import Iterator, Sequence
from typing import Any

from cdc.errors import TidewaterError
from cdc.events import TableName, TableSchema
from sinks.storage.config import StorageConfig
from sinks.storage.reader import StorageReader

log = logging.getLogger(__name__)

LAKE_DIR = ".tidewater-verify"
"""The verifier's lakes, under the sink's root (a dot name: the storage reader lists no table there)."""

LAKE_SCHEMES = frozenset({"file"})
"""Sink schemes whose files the verifier reads as a lake (the storage sink on a local or mounted file system)."""

PUBLISH_POLL = 0.2
"""Seconds between two reads of the sink's ``metadata`` while waiting for the point."""


def lake_root(sink_uri: str, changefeed: str) -> str:
    """Where the verifier keeps ``changefeed``'s lake: ``<sink root>/.tidewater-verify/<changefeed>``."""
    return os.path.join(StorageConfig.from_uri(sink_uri).root, LAKE_DIR, changefeed or "-")


def _dir_name(table: str) -> str:
    return table.replace("/", "%2F")


def published(sink_uri: str) -> int:
    """The sink's published changefeed checkpoint (``metadata``), 0 before the first."""
    return StorageReader(sink_uri).checkpoint() or 0


def wait_published(sink_uri: str, ts: int, timeout: float) -> int:
    """Wait until the sink's ``metadata`` checkpoint is at or past ``ts`` (the changefeed held at ``ts`` publishes
    exactly ``ts``); returns it. TidewaterError after ``timeout`` seconds, naming where it stands."""
    deadline = time.monotonic() + timeout
    while True:
        ckpt = published(sink_uri)
        if ckpt >= ts:
            return ckpt
        if time.monotonic() >= deadline:
            raise TidewaterError(f"the storage sink's metadata checkpoint stayed at {ckpt}, below the verification "
                                 f"point {ts}, for {timeout:.0f}s: its files cannot be cut at the point")
        time.sleep(PUBLISH_POLL)


def build_lake(spark: Any, sink_uri: str, changefeed: str, tables: Sequence[str], until: int | None) -> dict[str, str]:
    """Run the lake job for each table up to ``until`` (None: the published checkpoint) and return each table's
    Parquet version now ("" when the table has no version yet: no change published, an empty table)."""
    from spark_jobs import lake

    root = lake_root(sink_uri, changefeed)
    reader = StorageReader(sink_uri)
    out: dict[str, str] = {}
    for table in tables:
        name = _dir_name(table)
        output = os.path.join(root, "tables", name)
        if reader.latest_schema(TableName.parse(table)) is None:
            out[table] = ""  # no schema file: the sink has written nothing of it (a table without rows)
            continue
        lake.run_available(spark, sink_uri, table, output, os.path.join(root, "checkpoints", name), until=until)
        out[table] = lake.current_path(output) or ""
        log.info("verify changefeed=%s: lake %s at %s -> %s", changefeed or "-", table, until, out[table] or "empty")
    return out


def _compare(cols: list[Any], values: list[Any], op: str) -> Any:
    """``(cols) op (values)`` in lexicographic order as a pyarrow expression (``op``: ``>=`` or ``<``)."""
    strict = operator.gt if op == ">=" else operator.lt
    terms = []
    for i, (c, v) in enumerate(zip(cols, values, strict=True)):
        prefix = [cols[j] == values[j] for j in range(i)]
        terms.append(functools.reduce(operator.and_, [*prefix, strict(c, v)]))
    if op == ">=":
        terms.append(functools.reduce(operator.and_, [c == v for c, v in zip(cols, values, strict=True)]))
    return functools.reduce(operator.or_, terms)


def range_filter(key: Sequence[str], lower: Sequence[Any] | None, upper: Sequence[Any] | None) -> Any:
    """``lower <= (key) < upper`` as a pyarrow dataset filter, bounds as Parquet values (None: unbounded; both
    None: no filter)."""
    import pyarrow.dataset as ds

    cols = [ds.field(k) for k in key]
    conds = [_compare(cols, list(bound), op) for bound, op in ((lower, ">="), (upper, "<")) if bound is not None]
    return functools.reduce(operator.and_, conds) if conds else None


def lake_rows(path: str, schema: TableSchema, key: Sequence[str] = (), lower: Sequence[Any] | None = None,
              upper: Sequence[Any] | None = None) -> Iterator[tuple[Any, ...]]:
    """The rows of the lake's Parquet version ``path`` with ``lower <= key < upper`` (:func:`range_filter`),
    columns in the upstream schema's order, in no order; none for ``path`` "" (no version yet)."""
    if not path:
        return
    import pyarrow.dataset as ds

    names = list(schema.column_names)
    dataset = ds.dataset(path, format="parquet")
    missing = [n for n in names if n not in dataset.schema.names]
    if missing:
        raise TidewaterError(f"the lake of {schema.name} at {path} has no column(s) {missing}: it was built before a "
                             "DDL; remove the verifier's lake directory to rebuild it")
    flt = range_filter(key, lower, upper) if key else None
    for batch in dataset.to_batches(columns=names, filter=flt):
        columns = [batch.column(i).to_pylist() for i in range(len(names))]
        yield from zip(*columns, strict=True)


def lake_count(path: str) -> int:
    """The rows of the lake's Parquet version ``path`` (0 for "")."""
    if not path:
        return 0
    import pyarrow.dataset as ds

    return int(ds.dataset(path, format="parquet").count_rows())

