"""The codec contract: row changes, DDL and watermarks -> messages (key, value, metadata), and back.

A codec turns Tidewater's vocabulary (:class:`cdc.events.RowChange`, :class:`cdc.events.DdlEvent`,
:class:`cdc.ts.Watermark`) into the bytes of one wire protocol (canal-json, Debezium JSON, TiCDC open-protocol,
TiCDC storage CSV) and back. It is transport-free: the Kafka sink and the storage sink (``file://``) use the same
encoders; neither the encoders nor the decoders do I/O or logging (docs/sinks.md, "Formats").

Guarantees of every :class:`RowEventEncoder` (TiCDC's RowEventEncoder/TxnEventEncoder):

- **Order.** ``build()`` returns the messages of everything appended since the previous ``build()``, in append
  order; a message never holds rows of two destinations because the caller keeps one encoder per destination
  (Kafka topic and partition, storage file). Protocols that batch (open-protocol: several events per message; CSV:
  every row appended goes into one message) put consecutive events together and never reorder them.
- **Completeness.** Every appended row change is in exactly one message of the next ``build()`` (a Debezium
  delete may add a tombstone message; a key-changing update is a delete, a tombstone and a create, as Debezium's
  PostgreSQL connector writes it). Nothing is dropped: a value the protocol cannot carry exactly raises
  :class:`EncodeError` naming the table and column, and a value the upstream did not send (an unchanged TOAST
  value, ``cdc.events.UNCHANGED``; a non-key column of a delete without the full old row) is written as
  ``EncoderConfig.unavailable_value_placeholder`` where the protocol has no way to leave it out (docs/sinks.md).
- **Size.** Encoders never split a row; an open-protocol batch never exceeds ``max_batch_size`` events and never
  grows past ``max_message_bytes`` (a single oversized event is a message of its own). Whether an oversized
  message may be sent is the transport's decision: ``Message.size`` is TiCDC's ``Length()`` (key + value + the
  Kafka record overhead) and ``Message.row_key`` names the row (``MessageTooLarge``).
- **Determinism.** The bytes depend only on the input and the configuration, except the fields a protocol defines
  as "time of encoding" (canal-json ``ts``, Debezium ``payload.ts_ms``), which come from the injectable ``clock``.
- **Errors and state.** After an exception the encoder's buffered messages are unspecified: discard the encoder
  (the sink retries the whole write from its checkpoint). Encoders are not thread-safe; ``build()``,
  ``encode_ddl()`` and ``encode_watermark()`` may be called in any order from the one thread that owns it.

Decoders (:class:`Decoder`) parse one Kafka record / one storage file back into :class:`DecodedEvent`\\ s, a
protocol-neutral form used by the consumer library and by the round-trip tests. Given the table's
:class:`cdc.events.TableSchema` (``schemas``), values come back as the mounter's Python values; without it, as
the protocol itself types them (docs/sinks.md lists what is lossy).
"""

from __future__ import annotations

import enum
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any, ClassVar

from cdc.errors import InvalidConfig, SinkError, TidewaterError
from cdc.events import UNCHANGED, DdlEvent, OpType, RowChange, TableName, TableSchema
from cdc.ts import Watermark

MAX_RECORD_OVERHEAD = 5 * 5 + 10 + 1
"""Bytes a Kafka record adds to its key and value at most (5 varint32 + 1 varint64 + 1): TiCDC's
``MaxRecordOverhead``, part of ``Message.size``."""

DEBEZIUM_PLACEHOLDER = "__debezium_unavailable_value"


class EncodeError(SinkError):
    """A value or event the protocol cannot carry exactly (names the table, the column and the fix). Not retryable:
    the changefeed fails with it (configure the protocol differently, exclude the column or the table)."""

    code = "CDC:ErrCodecEncode"


class MessageTooLarge(SinkError):
    """A message longer than ``max-message-bytes`` that the transport may not send (names the table and the key)."""

    code = "CDC:ErrMessageTooLarge"


class MessageDecodeError(TidewaterError):
    """Bytes that are not a message of the protocol (a consumer reading the wrong topic, a truncated file)."""

    code = "CDC:ErrCodecDecode"


class MessageKind(enum.Enum):
    ROW = "row"
    """Row changes (one or, for batching protocols, several)."""
    TOMBSTONE = "tombstone"
    """Debezium: the null-value record after a delete, for Kafka log compaction (key only)."""
    DDL = "ddl"
    """A schema change (or a TRUNCATE in protocols that have no row-level truncate): sent after every row before it
    and before every row after it; TiCDC sends it to partition 0 (canal-json) or to every partition."""
    WATERMARK = "watermark"
    """Every change with ``commit_ts <= ts`` was sent before it, on this partition (send to every partition)."""


@dataclass(slots=True)
class Message:
    """One record of the protocol: what a transport sends (Kafka) or writes (one line group of a storage file).

    ``table`` is None for watermarks; ``commit_ts`` is the commit Ts of the (last) event in it, the watermark's Ts
    for a watermark; ``rows`` counts the row changes it carries (0 for DDL, watermark and tombstone);
    ``row_key`` is the key of the (last) row in it, as ``RowChange.key_values()`` gives it (for error messages and
    key-based dispatch). ``headers`` are Kafka record headers (Debezium's ``__debezium.newkey`` / ``oldkey``).
    """

    key: bytes | None
    value: bytes | None
    kind: MessageKind
    protocol: str
    table: TableName | None
    commit_ts: int
    rows: int = 0
    headers: tuple[tuple[str, bytes], ...] = ()
    row_key: tuple[Any, ...] | None = None

    @property
    def size(self) -> int:
        """Approximate bytes on the wire (TiCDC's ``Message.Length()``): key + value + the record overhead."""
        return (len(self.key) if self.key else 0) + (len(self.value) if self.value else 0) + MAX_RECORD_OVERHEAD


_BOOL_TEXT = {"true": True, "false": False, "1": True, "0": False, "on": True, "off": False}
DECIMAL_MODES = ("precise", "string", "double")
BINARY_MODES = ("bytes", "base64", "base64-url-safe", "hex")
INTERVAL_MODES = ("numeric", "string")
CSV_BINARY_ENCODINGS = ("base64", "hex")
SKIPPABLE = ("c", "u", "d", "t")  # Debezium's skipped.operations codes


@dataclass(frozen=True)
class EncoderConfig:
    """Protocol options (sink URI query parameters and ``[sink]`` settings, kebab-case names in brackets).

    Defaults follow TiCDC (canal-json, open-protocol, CSV) and Debezium's PostgreSQL connector except where
    docs/sinks.md says otherwise: ``enable_tidb_extension`` is on (TiCDC: off) so that canal-json carries commit Ts
    and watermarks; CSV includes the commit Ts (TiCDC: off) so that the lake job can order and cut by it.
    """

    max_message_bytes: int = 10 * 1024 * 1024  # [max-message-bytes] TiCDC's default
    max_batch_size: int = 16  # [max-batch-size] events per open-protocol message
    enable_tidb_extension: bool = True  # [enable-tidb-extension] canal-json _tidb.commitTs and TIDB_WATERMARK
    unavailable_value_placeholder: str = DEBEZIUM_PLACEHOLDER  # [unavailable-value-placeholder]
    # Debezium
    tombstones_on_delete: bool = True  # [tombstones-on-delete] a null-value record after each delete
    debezium_server_name: str = "tidewater"  # [debezium-server-name] Debezium's topic.prefix (source.name)
    debezium_database: str = ""  # [debezium-database] source.db: the upstream database name
    debezium_version: str = "3.6.1.Final"  # [debezium-version] the release whose layout is written (source.version)
    decimal_handling_mode: str = "precise"  # [decimal-handling-mode] precise | string | double
    binary_handling_mode: str = "bytes"  # [binary-handling-mode] bytes | base64 | base64-url-safe | hex
    interval_handling_mode: str = "numeric"  # [interval-handling-mode] numeric (MicroDuration) | string (ISO 8601)
    schemas_enable: bool = True  # [schemas-enable] Debezium JSON with "schema"/"payload" (JsonConverter default)
    debezium_watermarks: bool = True  # [debezium-watermarks] heartbeat-shaped watermark records
    # [skipped-operations] Debezium's skipped.operations: c, u, d, t (comma-separated) or none. Debezium's default
    # is t; Tidewater's none: a skipped change is a consumer's table differing from the upstream (docs/sinks.md)
    skipped_operations: str = "none"
    include_schema_changes: bool = True  # [include-schema-changes] Debezium schema-change (DDL) records
    # CSV (TiCDC storage sink)
    csv_delimiter: str = ","  # [csv-delimiter]
    csv_quote: str = '"'  # [csv-quote] empty: no quoting, special characters are backslash-escaped
    csv_null: str = "\\N"  # [csv-null]
    csv_terminator: str = "\r\n"  # [csv-terminator]
    csv_include_commit_ts: bool = True  # [csv-include-commit-ts]
    csv_output_old_value: bool = False  # [csv-output-old-value] an update is a D row (old) then an I row (new)
    csv_binary_encoding: str = "base64"  # [csv-binary-encoding-method] base64 | hex
    csv_output_field_header: bool = False  # [csv-output-field-header]

    def __post_init__(self) -> None:
        if self.max_message_bytes <= 0:
            raise InvalidConfig(f"max-message-bytes must be positive, not {self.max_message_bytes}")
        if self.max_batch_size <= 0:
            raise InvalidConfig(f"max-batch-size must be positive, not {self.max_batch_size}")
        for name, value, allowed in (("decimal-handling-mode", self.decimal_handling_mode, DECIMAL_MODES),
                                     ("binary-handling-mode", self.binary_handling_mode, BINARY_MODES),
                                     ("interval-handling-mode", self.interval_handling_mode, INTERVAL_MODES),
                                     ("csv-binary-encoding-method", self.csv_binary_encoding, CSV_BINARY_ENCODINGS)):
            if value not in allowed:
                raise InvalidConfig(f"{name} must be one of {', '.join(allowed)}, not {value!r}")
        if not self.csv_delimiter or any(c in self.csv_delimiter for c in "\r\n"):
            raise InvalidConfig(f"csv-delimiter {self.csv_delimiter!r} must be non-empty and without CR/LF")
        if len(self.csv_quote) > 1 or (self.csv_quote and self.csv_quote in self.csv_delimiter):
            raise InvalidConfig(f"csv-quote {self.csv_quote!r} must be one character (or empty) not in the delimiter")
        if self.csv_terminator not in ("\r\n", "\n"):
            raise InvalidConfig(f"csv-terminator must be \\r\\n or \\n, not {self.csv_terminator!r}")
        if not self.unavailable_value_placeholder:
            raise InvalidConfig("unavailable-value-placeholder must not be empty")
        self.skipped  # noqa: B018 - validates skipped-operations

    @property
    def skipped(self) -> frozenset[str]:
        """The operations ``skipped-operations`` names (``c``, ``u``, ``d``, ``t``); empty for ``none``."""
        ops = {o.strip().lower() for o in self.skipped_operations.split(",") if o.strip()}
        if ops == {"none"} or not ops:
            return frozenset()
        bad = ops - set(SKIPPABLE)
        if bad:
            raise InvalidConfig(f"skipped-operations={self.skipped_operations!r}: {', '.join(sorted(bad))} is not an "
                                f"operation; use a comma-separated list of {', '.join(SKIPPABLE)} (c create, u update, "
                                "d delete, t truncate), or none")
        return frozenset(ops)

    @classmethod
    def from_params(cls, params: Mapping[str, str], base: EncoderConfig | None = None) -> EncoderConfig:
        """``base`` (default: the defaults) with the options named in ``params`` (URI query parameters, kebab-case
        names as in the field comments); other keys are left to the transport. Raises InvalidConfig on a bad
        value."""
        base = base or cls()
        names = {f.name.replace("_", "-"): f for f in fields(cls)}
        names["csv-binary-encoding-method"] = names.pop("csv-binary-encoding")
        changes: dict[str, Any] = {}
        for key, raw in params.items():
            f = names.get(key)
            if f is None:
                continue
            current = getattr(base, f.name)
            try:
                if isinstance(current, bool):
                    value: Any = _BOOL_TEXT[raw.strip().lower()]
                elif isinstance(current, int):
                    value = int(raw)
                else:
                    value = raw
            except (KeyError, ValueError):
                raise InvalidConfig(f"{key}={raw!r} is not a valid {type(current).__name__}") from None
            changes[f.name] = value
        return replace(base, **changes) if changes else base


@dataclass(slots=True)
class DecodedEvent:
    """One event read back from a message, in a protocol-neutral form.

    - ROW: ``op`` is INSERT/UPDATE/DELETE (TRUNCATE for Debezium ``t``); ``values`` the new row (None for a delete),
      ``old`` what the message says about the old row (None when nothing), ``key`` the row's key columns (the old
      key for a delete). A value the message marks as unavailable is ``cdc.events.UNCHANGED``. ``snapshot`` is True
      for a row of the initial copy where the protocol says so (Debezium ``op: "r"``).
    - DDL: ``query`` and ``table``; ``op`` is TRUNCATE for a truncate written as DDL.
    - WATERMARK: ``commit_ts`` is the watermark's Ts.
    - TOMBSTONE: ``key`` only.
    ``commit_ts``/``commit_time`` are None where the message does not carry them.
    """

    kind: MessageKind
    table: TableName | None = None
    op: OpType | None = None
    commit_ts: int | None = None
    commit_time: float | None = None
    key: dict[str, Any] | None = None
    values: dict[str, Any] | None = None
    old: dict[str, Any] | None = None
    snapshot: bool = False
    query: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


SchemaLookup = Callable[[TableName], TableSchema | None]
"""The table's schema, if the reader knows it: lets a decoder return exact Python values (see :class:`Decoder`)."""


class RowEventEncoder(ABC):
    """Encodes row changes, DDL and watermarks of one destination (see the module docstring for the guarantees).

    Usage: ``append_row`` each change of the batch (whole transactions, in commit order), then ``build()`` the
    messages and send them in order; ``encode_ddl`` / ``encode_watermark`` return their message at once (or None
    when the protocol has none, e.g. CSV, whose DDL lives in the storage sink's schema files).
    """

    protocol: ClassVar[str]
    batching: ClassVar[bool] = False
    """True when several events share one message (open-protocol, CSV)."""

    def __init__(self, config: EncoderConfig | None = None, *, clock: Callable[[], float] = time.time) -> None:
        self.config = config or EncoderConfig()
        self.clock = clock
        self._out: list[Message] = []

    @abstractmethod
    def append_row(self, change: RowChange) -> None:
        """Buffer ``change`` (INSERT, UPDATE, DELETE or TRUNCATE); raises EncodeError for what the protocol cannot
        carry."""

    def append_rows(self, changes: Sequence[RowChange]) -> None:
        for change in changes:
            self.append_row(change)

    def build(self) -> list[Message]:
        """The messages of everything appended since the last call, in order (and forget them)."""
        out = self._out
        self._out = []
        return out

    def encode_key_only(self, change: RowChange, claim_check_location: str | None = None) -> Message:
        """The row's message with its key columns only, for a row too large for ``max-message-bytes``: TiCDC's
        ``handle-key-only`` (marked so; the consumer re-reads the row) or, with ``claim_check_location``, its
        claim-check message (the full message is stored there by the transport). Returned at once, not buffered.
        Raises EncodeError when the protocol (or a table without a key) has no such form."""
        raise EncodeError(f"{self.protocol} has no key-only message form (table {change.schema.name})")

    @abstractmethod
    def encode_ddl(self, event: DdlEvent) -> Message | None:
        """The schema change's message (None: the protocol carries no DDL in band)."""

    @abstractmethod
    def encode_watermark(self, watermark: Watermark) -> Message | None:
        """A watermark (resolved Ts) message, or None when the protocol (or its configuration) has none."""


class Decoder(ABC):
    """Parses the protocol's messages back into :class:`DecodedEvent`\\ s (see the module docstring).

    ``schemas`` returns the table's :class:`TableSchema` when the reader knows it (the consumer's own table, the
    storage sink's schema file): values are then converted to the mounter's Python types exactly. Stateless apart
    from caches; one decoder may read several topics. Raises :class:`MessageDecodeError` for bytes that are not a
    message of the protocol.
    """

    protocol: ClassVar[str]

    def __init__(self, config: EncoderConfig | None = None, *, schemas: SchemaLookup | None = None) -> None:
        self.config = config or EncoderConfig()
        self.schemas = schemas

    @abstractmethod
    def decode(self, key: bytes | None, value: bytes | None) -> list[DecodedEvent]:
        """The events of one record (several for a batched open-protocol message or a CSV file)."""

    def schema_of(self, table: TableName) -> TableSchema | None:
        return self.schemas(table) if self.schemas is not None else None


def split_key_change(change: RowChange) -> tuple[RowChange, RowChange] | None:
    """A DELETE of the old key and an INSERT of the new row for an UPDATE that changes the row's key, else None.

    TiCDC splits such updates before dispatching them by key (the two halves may go to different partitions), so
    that every later change of either key follows its own half; the Kafka sink does the same. The delete carries
    what is known of the old row (``old_values``); the insert the new row, which must be complete (an update with
    unsent values cannot be split: None is returned, and the encoder writes it as one update).
    """
    if change.op is not OpType.UPDATE or change.old_values is None or not change.schema.has_key:
        return None
    new, old = change.values, change.old_values
    assert new is not None
    key = change.schema.key
    if all(old.get(k) == new.get(k) for k in key):
        return None
    if any(v is UNCHANGED for v in new.values()):
        return None
    delete = RowChange(OpType.DELETE, change.schema, change.commit_ts, change.commit_time, None, dict(old),
                       dict(change.extra))
    insert = RowChange(OpType.INSERT, change.schema, change.commit_ts, change.commit_time, dict(new), None,
                       dict(change.extra))
    return delete, insert


def row_key(change: RowChange, key_idx: Sequence[int]) -> tuple[Any, ...] | None:
    """The key of the row ``change`` touches (old key for deletes and key changes), as ``RowChange.key_values()``
    gives it, using the key's column positions ``key_idx`` (cheap for a positional row); None without a key."""
    schema = change.schema
    if not schema.has_key:
        return None
    row = change.row
    if row is not None and change.old_values is None:
        return tuple(row[i] for i in key_idx)
    src = change.old_values if change.old_values is not None else change.values
    if src is None:
        return None
    return tuple(src.get(k) for k in schema.key)


def has_full_row(schema: TableSchema, values: Mapping[str, Any]) -> bool:
    """True when ``values`` holds every column of ``schema`` (an old row sent in full: REPLICA IDENTITY FULL)."""
    return len(values) >= len(schema.columns)


def quoted_name(table: TableName) -> str:
    """``"schema"."table"`` in PostgreSQL's quoting (for synthesized statements such as TRUNCATE TABLE)."""
    return '"' + table.schema.replace('"', '""') + '"."' + table.table.replace('"', '""') + '"'

