"""The snapshot job's input: :class:`SnapshotJob`, stored as a JSON file (``--plan FILE``).

The file is written by whoever launches the job (the capture, later; tests and the benchmark now). It holds
the upstream and sink URIs *with* their credentials, so it is created mode 0600 (:func:`write_job`); nothing
the job prints contains a password (``cdc.uri.redact``).

Example::

    {"changefeed": "cf-1", "span": 0, "cluster": "default", "etcd": ["http://127.0.0.1:2379"],
     "upstream": "postgresql://u:p@127.0.0.1:5432/app", "sink": "mysql://root@127.0.0.1:3306/app",
     "tables": ["public.orders", "public.items"], "snapshot": "00000003-00000002-1",
     "commit_ts": 24567840, "chunk_rows": 100000, "spark_master": "local[*]", "spark_conf": {}}
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cdc import serde
from cdc.config import DEFAULT_CHUNK_ROWS, DEFAULT_SPARK_MASTER, SinkConfig
from cdc.errors import InvalidArgument, InvalidConfig
from cdc.events import TableName
from cdc.meta import keys
from cdc.uri import parse_sink_uri

# DEFAULT_CHUNK_ROWS: rows per chunk when the plan does not say; one constant with the changefeed's [snapshot]
# chunk-rows default (cdc.config, where the vocabulary can read it: cdc never imports spark_jobs)

EXECUTOR_TIMEOUT = 120.0
"""Seconds a cluster master may take to register the job's first executor (``SnapshotJob.executor_timeout``): a
standalone worker registers an application's executor within seconds when it has free cores and memory."""


@dataclass(frozen=True)
class SnapshotJob:
    """What to copy, from where, to where, under which snapshot, and where progress goes.

    ``snapshot``: the exported snapshot name of the span's slot (None: every reader takes its own snapshot,
    which is safe for keyed tables only: docs/snapshot.md). ``commit_ts``/``commit_time``: stamped on every
    copied row (the slot's consistent point). ``chunk_rows``: rows per chunk when a table is planned the first
    time (a stored plan is reused as it is). ``spark_conf``: extra Spark settings (``spark.*`` keys).
    """

    changefeed: str
    upstream: str
    sink: str
    tables: tuple[str, ...]
    etcd: tuple[str, ...]
    span: int = 0
    cluster: str = "default"
    snapshot: str | None = None
    commit_ts: int = 0
    commit_time: float = 0.0
    chunk_rows: int = DEFAULT_CHUNK_ROWS
    spark_master: str = DEFAULT_SPARK_MASTER
    spark_conf: dict[str, str] = field(default_factory=dict)
    # copy in this process without starting Spark (a copy too small to be worth a JVM and an executor: the
    # capture decides from the planned rows, [snapshot] spark-min-rows)
    local: bool = False
    # the driver copies chunks itself while the SparkSession starts, and Spark gets the chunks left (False: every
    # chunk goes through Spark, e.g. to test a cluster)
    driver_copies: bool = True
    # the changefeed's [sink] settings (as stored): the copy writes with the same sink configuration as the
    # stream (a Kafka sink's dispatcher rules)
    sink_config: dict[str, Any] = field(default_factory=dict)
    # a keyed table whose target does not exist when it is first planned is created without its primary key, its
    # chunks commit with markers and the key is built after its last chunk (docs/snapshot.md, "The key after the
    # load"); only for the initial copy (never a table copy, a resync or a merge into existing tables)
    defer_keys: bool = False
    # seconds a cluster master (spark://, yarn, k8s://) may take to give the job an executor before it fails with
    # the retryable CDC:ErrSparkNoExecutors (a master without workers would leave the job waiting forever)
    executor_timeout: float = EXECUTOR_TIMEOUT
    # the span's start Ts (its exactly-once origin): the job's sinks record the target tables the copy fills as the
    # changefeed's span's (``sinks.copy_roles.TablesHad.bind_tables_had``), so that one dropped downstream before the
    # stream's first change of it is refused, not created again empty; None: recorded for no changefeed (a tool's copy)
    origin: int | None = None

    def __post_init__(self) -> None:
        try:
            keys.snapshot_prefix(self.cluster, self.changefeed, self.span)
        except ValueError as exc:
            raise InvalidConfig(f"snapshot job: {exc}") from None
        if self.chunk_rows < 1:
            raise InvalidConfig(f"snapshot job: chunk-rows must be at least 1, got {self.chunk_rows}")
        if not self.tables:
            raise InvalidConfig("snapshot job: no tables to copy")
        if not self.etcd:
            raise InvalidConfig("snapshot job: no etcd endpoints for the progress")
        if not self.spark_master:
            raise InvalidConfig("snapshot job: spark-master is empty (default: local[*])")
        if not self.executor_timeout > 0:
            raise InvalidConfig(f"snapshot job: executor-timeout must be > 0 seconds, got {self.executor_timeout}")
        parse_sink_uri(self.sink)  # InvalidURI (redacted) for a malformed sink

    @property
    def sink_settings(self) -> SinkConfig:
        return serde.from_dict(SinkConfig, self.sink_config)

    @property
    def table_names(self) -> list[TableName]:
        return [TableName.parse(t) for t in self.tables]

    @property
    def label(self) -> str:
        return f"changefeed={self.changefeed} span={self.span}"

    def to_json(self) -> bytes:
        return serde.to_json(self)

    @classmethod
    def from_json(cls, raw: bytes | str) -> SnapshotJob:
        try:
            data = json.loads(raw)
        except ValueError as exc:
            raise InvalidConfig(f"snapshot job plan is not JSON: {exc}") from None
        if not isinstance(data, dict):
            raise InvalidConfig("snapshot job plan must be a JSON object")
        missing = [k for k in ("changefeed", "upstream", "sink", "tables", "etcd") if k not in data]
        if missing:
            raise InvalidConfig(f"snapshot job plan lacks {', '.join(missing)}")
        try:
            return serde.from_dict(cls, data)
        except (TypeError, ValueError) as exc:
            if isinstance(exc, InvalidArgument):
                raise
            raise InvalidConfig(f"snapshot job plan is invalid: {exc}") from None


def read_job(path: str | os.PathLike[str]) -> SnapshotJob:
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise InvalidArgument(f"cannot read the snapshot job plan {str(path)!r}: {exc.strerror}") from None
    return SnapshotJob.from_json(raw)


def write_job(job: SnapshotJob, path: str | os.PathLike[str]) -> Path:
    """Write ``job`` to ``path`` readable by its owner only (it holds credentials)."""
    p = Path(path)
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(job.to_json())
    return p
