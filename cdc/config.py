"""Typed configuration: the changefeed TOML and the server config, validated at load."""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field, fields
from typing import Any

from cdc import serde
from cdc.errors import InvalidConfig


@dataclass(frozen=True)
class FilterConfig:
    rules: tuple[str, ...] = ("*.*",)


DELIVERY_MODES = ("exactly-once", "at-least-once")
_PLAIN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")


PARTITION_DISPATCHERS = ("default", "table", "index-value", "ts", "columns")
# TiCDC's topic expression (pkg/sink/dispatcher/topic): [prefix]{schema}[middle{table}][suffix], or a fixed name
_TOPIC_CHARS = r"[A-Za-z0-9._-]"
_TOPIC_EXPRESSION = re.compile(rf"{_TOPIC_CHARS}*\{{schema\}}({_TOPIC_CHARS}*\{{table\}})?{_TOPIC_CHARS}*"
                               rf"|{_TOPIC_CHARS}{{1,249}}")


@dataclass(frozen=True)
class DispatcherRule:
    """One ``[[sink.dispatchers]]`` rule of a Kafka sink (TiCDC's): the tables ``matcher`` selects (filter rules,
    ``cdc.filter``) go to ``topic`` (an expression with ``{schema}`` and ``{table}``, or a fixed name; empty: the
    sink URI's topic), partitioned by ``partition``: ``default``/``table`` (by table name), ``index-value`` (by
    the row's key), ``ts`` (by commit Ts) or ``columns`` (by the values of ``columns``). The first rule that
    matches a table decides; tables no rule matches go to the URI's topic, by table."""

    matcher: tuple[str, ...] = ()
    topic: str = ""
    partition: str = "default"
    columns: tuple[str, ...] = ()

    def validate(self, where: str) -> None:
        if not self.matcher or any(not isinstance(m, str) or not m.strip() for m in self.matcher):
            raise InvalidConfig(f"{where}: matcher must list table rules, e.g. matcher = ['public.*']")
        if self.partition not in PARTITION_DISPATCHERS:
            raise InvalidConfig(f"{where}: partition {self.partition!r} is not a dispatcher: use one of "
                                f"{', '.join(PARTITION_DISPATCHERS)}")
        if self.partition == "columns" and not self.columns:
            raise InvalidConfig(f"{where}: partition = 'columns' needs the columns to hash, e.g. columns = ['id']")
        if self.columns and self.partition != "columns":
            raise InvalidConfig(f"{where}: columns are only used with partition = 'columns' (partition is "
                                f"{self.partition!r}): remove columns or set partition = 'columns'")
        if self.topic and not _TOPIC_EXPRESSION.fullmatch(self.topic):
            raise InvalidConfig(f"{where}: topic {self.topic!r} is not a topic expression: use a Kafka topic name "
                                "(a-z A-Z 0-9 . _ -, at most 249) or [prefix]{schema}[middle{table}][suffix], e.g. "
                                "topic = 'cdc_{schema}_{table}'")


@dataclass(frozen=True)
class SinkConfig:
    batch_rows: int = 1000  # rows per multi-row statement
    txn_rows: int = 20000  # whole upstream transactions are batched into one downstream txn up to this
    # "exactly-once": SQL sinks store each span's applied position in the target (checkpoint-table) in the
    # same transaction as the rows and skip what is already there on replay; "at-least-once": they don't
    delivery: str = "exactly-once"
    checkpoint_table: str = "tidewater_checkpoint"  # on PostgreSQL in schema "tidewater"
    dispatchers: tuple[DispatcherRule, ...] = ()  # [[sink.dispatchers]]: Kafka topic and partition rules
    # SQL sinks (MySQL/MariaDB, PostgreSQL): downstream connections applying non-conflicting transactions of a write
    # at once (sinks.sql.ops.parallel); 1: one connection, transaction-consistent states downstream. SQLite: always 1
    worker_count: int = 1


@dataclass(frozen=True)
class DdlConfig:
    """``[ddl]``: how schema changes are applied downstream (docs/ddl.md)."""

    replicate_indexes: bool = False  # CREATE/DROP INDEX upstream -> the same secondary index downstream
    mode: str = "apply"  # "apply": schema changes are applied downstream; "ignore": recorded and skipped
    on_error: str = "fail"  # a DDL the sink cannot apply: "fail" the changefeed, or "skip" it (divergence warning)
    skip_ts: tuple[int, ...] = ()  # commit Ts of DDL transactions to skip knowingly (changefeed update --skip-ddl-ts)


MAX_SINK_WORKERS = 8  # [sink] worker-count (each is a downstream connection; the engine pool holds 5 + 10)

SNAPSHOT_MODES = ("initial", "none")
EXISTING_ROWS = ("refuse", "truncate", "merge")

DEFAULT_CHUNK_ROWS = 100_000
"""``[snapshot] chunk-rows`` when a changefeed (or a snapshot job's plan, ``spark_jobs.plan``) does not say: the one
default of the copy. docs/benchmarks.md: the chunk-size sweep ("Snapshot copy") found no size from 10k to 200k rows
faster than another beyond the host's noise once chunks were grouped per task, and every measurement of the copy as
built ("Initial snapshot": COPY passthrough, key after the load) ran with 100k-row chunks; a chunk's fixed costs
(its query, a commit, a fence read, an etcd record, a marker row) are half those of 50k-row chunks per row, and a
re-copied chunk stays small (reading streams, so memory does not depend on the size)."""

DEFAULT_SPARK_MASTER = "local[*]"
SPARK_MASTER_URL = re.compile(r"^(local(\[(\*|[1-9][0-9]*)(,[1-9][0-9]*)?\])?|yarn|(spark|k8s)://\S+)$")
"""The master URLs Spark 4 accepts (``mesos://`` was removed in Spark 4.0: the installed pyspark has no Mesos
scheduler)."""
SPARK_MASTER_FORMS = "local[*], local[N], spark://host:port (a standalone master), yarn or k8s://https://host:port"


@dataclass(frozen=True)
class SnapshotConfig:
    """``[snapshot]``: the copy of the rows that exist when the changefeed is created (docs/snapshot.md)."""

    mode: str = "initial"  # "initial": copy the existing rows first, then stream; "none": stream changes only
    # a target table that already holds rows: "refuse" (create fails naming it), "truncate" it first, or "merge"
    # (upsert by key over what is there; refused for tables without a key, whose rows would be duplicated)
    on_existing_rows: str = "refuse"
    chunk_rows: int = DEFAULT_CHUNK_ROWS  # rows per chunk (one downstream transaction, one etcd record)
    spark_master: str = DEFAULT_SPARK_MASTER  # any Spark master URL (SPARK_MASTER_URL)
    # fewer rows than this left to copy in a span: the job copies them in its own process without starting Spark
    # (a JVM and its executors cost seconds; measured in docs/benchmarks.md, "Snapshot copy"); 0: always Spark
    spark_min_rows: int = 20_000


CONSISTENCY_MODES = ("default", "snapshot")


@dataclass(frozen=True)
class ConsistencyConfig:
    """``[consistency]``: what a reader of the target may see (docs/consistency.md).

    ``default``: each key's changes in upstream order, transaction-consistent with one span and one apply worker
    (nothing extra is written). ``snapshot``: the target moves only from one upstream-consistent state to the next:
    spans stage their changes in the target, and every ``interval`` seconds one coordinator makes everything up to a
    global barrier visible in one downstream transaction, with a row in ``tidewater_syncpoint`` (``syncpoint``
    must then be true: the barrier record is what makes a half-applied barrier recoverable)."""

    mode: str = "default"
    interval: float = 1.0  # seconds between barriers (snapshot mode)
    syncpoint: bool = False  # write tidewater_syncpoint rows (implied by snapshot mode; default mode: not yet)

    @property
    def snapshot(self) -> bool:
        return self.mode == "snapshot"

    def validate(self, sink: SinkConfig) -> None:
        if self.mode not in CONSISTENCY_MODES:
            raise InvalidConfig(f"consistency.mode must be \"default\" or \"snapshot\", got {self.mode!r}")
        if isinstance(self.interval, bool) or not isinstance(self.interval, int | float) \
                or not 0.05 <= self.interval <= 3600:
            raise InvalidConfig(f"consistency.interval must be between 0.05 and 3600 seconds, got {self.interval!r}")
        if not isinstance(self.syncpoint, bool):
            raise InvalidConfig(f"consistency.syncpoint must be true or false, got {self.syncpoint!r}")
        if not self.snapshot:
            if self.syncpoint:
                raise InvalidConfig("consistency.syncpoint = true needs consistency.mode = \"snapshot\": a SQL "
                                    "target has no read as of a past time, so a default-mode syncpoint row could "
                                    "not be read back as a state (docs/consistency.md); set mode = \"snapshot\" "
                                    "(every barrier recorded, readers see whole barriers) or leave syncpoint out")
            return
        if sink.delivery != "exactly-once":
            raise InvalidConfig("consistency.mode = \"snapshot\" needs sink.delivery = \"exactly-once\" (the staged "
                                "changes are written exactly once, with the span's position)")


@dataclass(frozen=True)
class ChangefeedConfig:
    """The changefeed TOML. Keys use dashes in TOML (``span-count``) and underscores here."""

    span_count: int = 1
    memory_quota: int = 256 * 1024 * 1024  # bytes of change data in sorter memory, split over the spans
    filter: FilterConfig = field(default_factory=FilterConfig)
    sink: SinkConfig = field(default_factory=SinkConfig)
    ddl: DdlConfig = field(default_factory=DdlConfig)
    snapshot: SnapshotConfig = field(default_factory=SnapshotConfig)
    consistency: ConsistencyConfig = field(default_factory=ConsistencyConfig)

    def validate(self) -> ChangefeedConfig:
        if not 1 <= self.span_count <= 64:
            raise InvalidConfig(f"span-count must be between 1 and 64, got {self.span_count}")
        if self.memory_quota < (1 << 20):
            raise InvalidConfig(f"memory-quota must be at least 1 MiB (1048576 bytes), got {self.memory_quota}")
        if self.ddl.mode not in ("apply", "ignore"):
            raise InvalidConfig(f"ddl.mode must be \"apply\" or \"ignore\", got {self.ddl.mode!r}")
        if self.ddl.on_error not in ("fail", "skip"):
            raise InvalidConfig(f"ddl.on-error must be \"fail\" or \"skip\", got {self.ddl.on_error!r}")
        if any(not isinstance(t, int) or t <= 0 for t in self.ddl.skip_ts):
            raise InvalidConfig(f"ddl.skip-ts must list positive commit Ts, got {list(self.ddl.skip_ts)!r}")
        if self.sink.batch_rows < 1 or self.sink.txn_rows < 1:
            raise InvalidConfig("sink.batch-rows and sink.txn-rows must be positive")
        if not isinstance(self.sink.worker_count, int) or not 1 <= self.sink.worker_count <= MAX_SINK_WORKERS:
            raise InvalidConfig(f"sink.worker-count must be between 1 and {MAX_SINK_WORKERS}, got "
                                f"{self.sink.worker_count!r}")
        if self.sink.delivery not in DELIVERY_MODES:
            raise InvalidConfig(f"sink.delivery must be one of {', '.join(DELIVERY_MODES)}, got {self.sink.delivery!r}")
        if not _PLAIN_NAME.fullmatch(self.sink.checkpoint_table):
            raise InvalidConfig("sink.checkpoint-table must be a plain table name (letters, digits, _; at most 63), "
                                f"got {self.sink.checkpoint_table!r}")
        for i, rule in enumerate(self.sink.dispatchers):
            if not isinstance(rule, DispatcherRule):
                raise InvalidConfig(f"sink.dispatchers[{i}] must be a table ([[sink.dispatchers]] with matcher, "
                                    "topic, partition)")
            rule.validate(f"sink.dispatchers[{i}]")
        if not self.filter.rules:
            raise InvalidConfig("filter.rules must not be empty")
        if self.snapshot.mode not in SNAPSHOT_MODES:
            raise InvalidConfig(f"snapshot.mode must be \"initial\" or \"none\", got {self.snapshot.mode!r}")
        if self.snapshot.on_existing_rows not in EXISTING_ROWS:
            raise InvalidConfig(f"snapshot.on-existing-rows must be one of {', '.join(EXISTING_ROWS)}, got "
                                f"{self.snapshot.on_existing_rows!r}")
        if self.snapshot.spark_min_rows < 0:
            raise InvalidConfig(f"snapshot.spark-min-rows must be >= 0, got {self.snapshot.spark_min_rows}")
        if self.snapshot.chunk_rows < 1:
            raise InvalidConfig(f"snapshot.chunk-rows must be positive, got {self.snapshot.chunk_rows}")
        if not isinstance(self.snapshot.spark_master, str) or not SPARK_MASTER_URL.match(self.snapshot.spark_master):
            raise InvalidConfig(f"snapshot.spark-master {self.snapshot.spark_master!r} is not a Spark master URL: use "
                                f"{SPARK_MASTER_FORMS}")
        self.consistency.validate(self.sink)
        return self

    def to_dict(self) -> dict[str, Any]:
        return serde.to_dict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ChangefeedConfig:
        return serde.from_dict(cls, data).validate()

    @classmethod
    def from_toml(cls, text: str) -> ChangefeedConfig:
        try:
            raw = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise InvalidConfig(f"changefeed config is not valid TOML: {exc}") from exc
        return cls.from_dict(_check_keys(cls, _undash(raw), "changefeed config"))


def _undash(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k.replace("-", "_"): _undash(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_undash(v) for v in obj]
    return obj


def _check_keys(cls: type, data: dict[str, Any], where: str) -> dict[str, Any]:
    """Unknown keys are an error (a typo must not silently fall back to a default)."""
    names = {f.name: f for f in fields(cls)}
    for key, value in data.items():
        if key not in names:
            raise InvalidConfig(f"unknown key {key.replace('_', '-')!r} in {where}")
        sub = names[key].default_factory if names[key].default_factory is not None else None  # type: ignore[misc]
        if isinstance(value, dict) and sub is not None:
            _check_keys(type(sub()), value, f"{where} [{key}]")
        item = TABLE_ARRAYS.get((cls, key))
        if item is not None:
            if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
                raise InvalidConfig(f"{where}: {key.replace('_', '-')} must be an array of tables "
                                    f"([[...{key.replace('_', '-')}]])")
            for i, v in enumerate(value):
                _check_keys(item, v, f"{where} [[{key.replace('_', '-')}]] #{i + 1}")
    return data


TABLE_ARRAYS: dict[tuple[type, str], type] = {(SinkConfig, "dispatchers"): DispatcherRule}
"""Fields holding arrays of tables (``[[sink.dispatchers]]``): the dataclass of each item, for key checks."""


@dataclass(frozen=True)
class ServerConfig:
    """`cdc server` settings (flags override the --config TOML).

    Timing invariant (Patroni-style, checked at load): ``owner_tick + 2 * etcd_timeout < session_ttl``
    so that a healthy capture always renews its lease before it expires.

    Checkpoint cadence (docs/architecture.md, "Checkpoint cadence"): a span whose checkpoint Ts moves is
    reported at most every ``checkpoint_min_interval``; one whose checkpoint Ts does not move (only its
    time or resolved Ts) every ``checkpoint_interval``; all due spans of a capture share one etcd
    transaction. The owner aggregates the changefeed checkpoint when span statuses change, at most every
    ``owner_flush_interval``, besides its full ``owner_tick`` cycle.
    """

    etcd: tuple[str, ...] = ("http://127.0.0.1:2379",)
    addr: str = "127.0.0.1:8300"
    data_dir: str = "/tmp/tidewater"
    cluster_id: str = "default"
    log_file: str = ""
    log_level: str = "info"
    session_ttl: int = 10
    owner_tick: float = 0.5
    etcd_timeout: float = 3.0
    checkpoint_interval: float = 1.0  # span status writes while its checkpoint Ts stands still (idle)
    checkpoint_min_interval: float = 0.2  # span status writes while its checkpoint Ts moves (busy)
    owner_flush_interval: float = 0.1  # owner: changefeed checkpoint aggregation after span status changes
    sorter_disk_quota: int = 0  # bytes; 0 = unlimited
    gc_ttl: float = 86400.0  # a changefeed stopped/failed longer than this releases its slots
    error_backoff_min: float = 10.0  # retry of a failed span: exponential from this ...
    error_backoff_max: float = 600.0  # ... up to this
    error_stuck_duration: float = 1800.0  # warning for longer than this -> failed
    upstream_check_interval: float = 10.0  # owner's look at slots, retained WAL and new tables
    drain_timeout: float = 60.0  # SIGTERM waits this long for the owner to move the spans away
    # the owner's writes downstream (a sink's published checkpoint, a snapshot-mode changefeed's barrier) failing this
    # long: the changefeed's warning (CDC:WarnCheckpointNotPublished, CDC:WarnBarrierNotApplied); read as a term starts
    downstream_warn_after: float = 30.0
    # API security (docs/api.md, "Security"); secrets come from files or the environment, never flags' values
    auth_token_file: str = ""  # bearer tokens, one per line (else $TIDEWATER_AUTH_TOKEN[_FILE])
    auth_read: str = "open"  # "open": GET routes need no token; "protected": they do (health stays open)
    tls_cert: str = ""  # PEM certificate and key: the API speaks HTTPS
    tls_key: str = ""
    tls_ca: str = ""  # CA for client certificates (mutual TLS) and for verifying other captures
    tls_client_auth: bool = False  # require client certificates signed by tls-ca
    max_body_bytes: int = 1 << 20  # larger request bodies are refused (413)
    request_timeout: float = 10.0  # a request (line, headers, body) must arrive within this (408)
    max_connections: int = 64  # API connections served at once
    secret_key_file: str = ""  # Fernet keys sealing changefeed credentials in etcd (else $TIDEWATER_SECRET_KEY_FILE)
    # logs (docs/operations.md, "Logs")
    log_format: str = "text"  # "text" or "json" (one object per line, stable field names)
    log_max_bytes: int = 0  # rotate --log-file beyond this size (0: never; e.g. logrotate or journald does it)
    log_backups: int = 5  # rotated files kept
    log_warn_interval: float = 60.0  # the same warning at most once per this many seconds (then a count)
    # a span's source (reading and decoding the upstream's stream) in a process of its own, so that one busy span uses
    # two cores (processor/source_process.py; docs/operations.md, "Server settings"); applies to spans started after
    puller_process: bool = False

    def validate(self) -> ServerConfig:
        if self.session_ttl < 3:
            raise InvalidConfig("session-ttl must be at least 3 seconds")
        if self.owner_tick + 2 * self.etcd_timeout >= self.session_ttl:
            raise InvalidConfig(
                f"owner-tick ({self.owner_tick}s) + 2 * etcd-timeout ({self.etcd_timeout}s) must be less than "
                f"session-ttl ({self.session_ttl}s)")
        if not 0 < self.checkpoint_min_interval <= self.checkpoint_interval:
            raise InvalidConfig(
                f"checkpoint-min-interval ({self.checkpoint_min_interval}s) must be > 0 and <= checkpoint-interval "
                f"({self.checkpoint_interval}s)")
        if self.owner_flush_interval <= 0 or self.owner_tick <= 0:
            raise InvalidConfig("owner-tick and owner-flush-interval must be > 0")
        if self.downstream_warn_after <= 0:
            raise InvalidConfig(f"downstream-warn-after must be > 0, got {self.downstream_warn_after}")
        if self.error_backoff_min <= 0 or self.error_backoff_max < self.error_backoff_min:
            raise InvalidConfig("error-backoff-min must be > 0 and <= error-backoff-max")
        if ":" not in self.addr:
            raise InvalidConfig(f"--addr {self.addr!r} must be HOST:PORT")
        if self.auth_read not in ("open", "protected"):
            raise InvalidConfig(f"auth-read must be \"open\" or \"protected\", got {self.auth_read!r}")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise InvalidConfig("TLS needs both a certificate and its key (--tls-cert and --tls-key)")
        if self.tls_client_auth and not (self.tls_cert and self.tls_ca):
            raise InvalidConfig("mutual TLS (tls-client-auth) needs --tls-cert, --tls-key and --tls-ca")
        if self.max_body_bytes < 1024 or self.request_timeout <= 0 or self.max_connections < 1:
            raise InvalidConfig("max-body-bytes must be >= 1024, request-timeout > 0 and max-connections >= 1")
        if self.log_format not in ("text", "json"):
            raise InvalidConfig(f"log-format must be \"text\" or \"json\", got {self.log_format!r}")
        if not isinstance(self.puller_process, bool):
            raise InvalidConfig(f"puller-process must be true or false, got {self.puller_process!r}")
        if self.log_max_bytes < 0 or self.log_backups < 0 or self.log_warn_interval < 0:
            raise InvalidConfig("log-max-bytes, log-backups and log-warn-interval must not be negative")
        return self

    @classmethod
    def from_toml(cls, text: str, **overrides: Any) -> ServerConfig:
        try:
            raw = _undash(tomllib.loads(text)) if text else {}
        except tomllib.TOMLDecodeError as exc:
            raise InvalidConfig(f"server config is not valid TOML: {exc}") from exc
        _check_keys(cls, raw, "server config")
        raw.update({k: v for k, v in overrides.items() if v is not None})
        if isinstance(raw.get("etcd"), str):
            raw["etcd"] = tuple(u.strip() for u in raw["etcd"].split(",") if u.strip())
        return serde.from_dict(cls, raw).validate()
