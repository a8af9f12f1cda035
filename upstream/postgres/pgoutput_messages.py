"""The message types of PostgreSQL's ``pgoutput`` protocol (what :func:`upstream.postgres.pgoutput.decode`
returns), one frozen dataclass per message kind, and PostgreSQL's time epoch.

Field meanings follow PostgreSQL's "Logical Replication Message Formats" (protocol.sgml). Immutable and
thread-safe; the decoder builds the per-row :class:`Change` without the dataclass ``__init__`` (same slots).
"""

from __future__ import annotations

from dataclasses import dataclass

#: 2000-01-01T00:00:00Z as a Unix timestamp (PostgreSQL's epoch).
PG_EPOCH_UNIX = 946_684_800


def pg_time_to_unix(us: int) -> float:
    """Convert a PostgreSQL TimestampTz (int64 microseconds since 2000-01-01 UTC) to Unix seconds."""
    return PG_EPOCH_UNIX + us / 1_000_000


# ---- messages -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Begin:
    """'B': start of a (non-streamed) transaction; ``final_lsn`` is its commit record's LSN."""

    final_lsn: int
    commit_time: float
    xid: int


@dataclass(frozen=True, slots=True)
class Commit:
    """'C': end of a (non-streamed) transaction; ``end_lsn`` is the LSN after the commit record."""

    flags: int
    commit_lsn: int
    end_lsn: int
    commit_time: float


@dataclass(frozen=True, slots=True)
class Origin:
    """'O': the transaction was replicated into this server from origin ``name`` at ``lsn``."""

    lsn: int
    name: str


@dataclass(frozen=True, slots=True)
class RelationColumn:
    """One column of a Relation message; ``flags & 1`` means it belongs to the replica identity."""

    flags: int
    name: str
    type_oid: int
    type_modifier: int

    @property
    def is_key(self) -> bool:
        return bool(self.flags & 1)


@dataclass(frozen=True, slots=True)
class Relation:
    """'R': the schema of a relation as the following changes encode it (sent before first use and
    after every change of it). ``replica_identity`` is relreplident: 'd', 'n', 'f' or 'i'.
    Dropped columns and virtual generated columns are not listed (nor sent in tuples); stored generated
    columns are listed and sent like plain ones when the publication has ``publish_generated_columns =
    stored`` (PostgreSQL 18+; Tidewater creates its publications so), else left out too."""

    xid: int | None
    relid: int
    namespace: str
    name: str
    replica_identity: str
    columns: tuple[RelationColumn, ...]


@dataclass(frozen=True, slots=True)
class TypeMsg:
    """'Y': name of a non-built-in type used by a following Relation (``namespace`` '' -> 'pg_catalog')."""

    xid: int | None
    oid: int
    namespace: str
    name: str


@dataclass(frozen=True, slots=True)
class LogicalMessage:
    """'M': a ``pg_logical_emit_message`` record; ``flags & 1`` means transactional."""

    xid: int | None
    flags: int
    lsn: int
    prefix: str
    content: bytes

    @property
    def transactional(self) -> bool:
        return bool(self.flags & 1)


@dataclass(frozen=True, slots=True)
class StreamStart:
    """'S': the following changes (up to Stream Stop) belong to in-progress top-level ``xid``."""

    xid: int
    first_segment: bool


@dataclass(frozen=True, slots=True)
class StreamStop:
    """'E': end of a block of streamed changes."""


@dataclass(frozen=True, slots=True)
class StreamCommit:
    """'c': streamed top-level transaction ``xid`` committed (all its streamed blocks apply)."""

    xid: int
    flags: int
    commit_lsn: int
    end_lsn: int
    commit_time: float


@dataclass(frozen=True, slots=True)
class StreamAbort:
    """'A': drop the streamed changes of ``subxid`` (== ``xid``: the whole top-level transaction).
    ``abort_lsn``/``abort_time`` are present only with protocol 4 and ``streaming = parallel``."""

    xid: int
    subxid: int
    abort_lsn: int | None
    abort_time: float | None


@dataclass(frozen=True, slots=True)
class Change:
    """'I' / 'U' / 'D', unparsed: ``raw`` is the message in non-streamed form (type byte, relid,
    tuple data; the streaming xid removed), ``xid`` the (sub)transaction it belongs to when streamed."""

    kind: str
    xid: int | None
    relid: int
    raw: bytes


@dataclass(frozen=True, slots=True)
class Truncate:
    """'T': truncate of ``relids`` in one statement; ``options`` bit 1 = CASCADE, bit 2 = RESTART IDENTITY."""

    xid: int | None
    options: int
    relids: tuple[int, ...]


Message = (
    Begin
    | Commit
    | Origin
    | Relation
    | TypeMsg
    | LogicalMessage
    | StreamStart
    | StreamStop
    | StreamCommit
    | StreamAbort
    | Change
    | Truncate
)
