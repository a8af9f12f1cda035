"""The roles of a sink in the initial copy and in table copies (docs/snapshot.md); see :mod:`sinks.base` for the
rules every role shares (threading, errors, fencing, no call after ``close``).

| role | methods | caller | sinks |
|---|---|---|---|
| :class:`BulkLoad` | ``set_bulk_load`` | copy writer (``spark_jobs.copy``) | SQL, storage |
| :class:`TextCopy` | ``write_copy_text`` | copy writer | SQL |
| :class:`CopyAnnouncer` | ``write_copy_chunk``, ``announce_copy`` | copy writer, span (``processor.snapshot``) | Kafka |
| :class:`DeferredKeyCopy` | ``defer_key_refusal``, ``copy_target_exists``, ``create_deferred_target``, ``copy_markers``, ``write_marked_chunk``, ``build_deferred_key`` | ``spark_jobs.deferred``, copy writer | SQL |
| :class:`CopyTargets` | ``truncate_targets``, ``restart_copy_target`` | create (``on-existing-rows``), span (table copies, a copy that starts over) | SQL, Kafka, storage |
| :class:`ExistingRows` | ``tables_with_rows`` | create, merge copy (``processor.merged_rows``) | SQL, storage |
| :class:`RowCounts` | ``count_rows`` | merge copy | SQL |
| :class:`ResyncRefusal` | ``resync_refusal`` (class method) | ``cdc cli changefeed snapshot --table`` | Kafka |
| :class:`TablesHad` | ``bind_tables_had``, ``forget_tables_had`` | copy writer, ``cdc cli changefeed snapshot --table`` | SQL |

A sink without a role: the copy writes every chunk parsed with ``TxnSink.write`` (no text, no marker, the key kept
while chunks arrive); a table copy has nothing to empty; the sink has no tables that could hold rows; a resync is
not refused.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence

from cdc.events import RowChange, TableName, TableSchema
from cdc.snapshot import ChunkMarker, CopiedChunk, CopyText
from cdc.ts import Watermark
from sinks.base import BufferedSink, Fence


class BulkLoad(ABC):
    """A sink that loads the initial copy differently from a stream (chunks of one consistent image, in any order
    and in parallel, from several processes)."""

    @abstractmethod
    def set_bulk_load(self) -> None:
        """This instance writes the initial copy: the target's foreign keys are not checked while chunks are
        written, where the target allows it (they hold again once every chunk is written); no exactly-once
        position. Called before ``check`` and the first write."""


class TextCopy(ABC):
    """A sink that can store the upstream's text of a chunk without a Python object per row (PostgreSQL targets:
    ``sinks.sql.ops.bulk``; MySQL/MariaDB: literal rows rendered in C, ``sinks.sql.ops.literal_copy``)."""

    @abstractmethod
    def write_copy_text(self, schema: TableSchema, open_text: Callable[[], CopyText | None],
                        fence: Fence | None = None, *, replace: bool = False) -> int | None:
        """Write one chunk of ``schema``'s rows given as text (:class:`cdc.snapshot.CopyText`, from ``open_text()``)
        in one downstream transaction, as ``write`` would write the same rows as INSERTs (after a TRUNCATE of the
        table when ``replace``: a key-less table's whole chunk), but without parsing them; ``fence`` as for
        ``write``. Returns the rows written, or None when nothing was written: this sink cannot store that text
        exactly as ``write`` stores the parsed rows, or the target already holds rows of the chunk (a chunk copied
        again, a merged target); the caller then writes the chunk parsed. ``open_text`` is called only when the
        text may be used (its blocks may be left unread)."""


class CopyAnnouncer(ABC):
    """A sink whose readers replay a log (Kafka) and must be able to tell a copy's chunk they received short or not
    at all (docs/sinks.md, "Copy markers")."""

    @abstractmethod
    def write_copy_chunk(self, changes: Iterable[RowChange], chunk: CopiedChunk, fence: Fence | None = None) -> int:
        """``write(changes, fence)`` of the rows of one chunk (``chunk``: its table, index and the commit Ts its rows
        carry), then, once they are durable, a *chunk marker*: how many rows of the chunk went where."""

    @abstractmethod
    def announce_copy(self, chunks: Sequence[CopiedChunk]) -> None:
        """The copies of the tables of ``chunks`` are complete: ``chunks`` are all their chunks as recorded (table,
        index, the commit Ts of the run that wrote each, rows). Called by the span before any change of those
        tables after the copy is written (and so before any watermark covering it), possibly more than once for one
        copy (a span restarted after it)."""


class DeferredKeyCopy(ABC):
    """A sink that can create a copied table without its primary key and build the key after the load
    (PostgreSQL: ``sinks.sql.ops.deferred_key``).

    Guarantees: every chunk commits at most once, with its marker (``write_marked_chunk``); the key is built exactly
    as streaming creates it (``build_deferred_key``), and a duplicate key raises ``SinkError``.
    """

    @abstractmethod
    def defer_key_refusal(self, schema: TableSchema) -> str | None:
        """Why the copy of ``schema`` cannot defer its target table's key (None: it can, provided the target table
        does not exist yet: :meth:`copy_target_exists`)."""

    @abstractmethod
    def copy_target_exists(self, schema: TableSchema) -> bool:
        """Whether ``schema``'s target table exists."""

    @abstractmethod
    def create_deferred_target(self, schema: TableSchema) -> None:
        """Create ``schema``'s target table without its primary key (and the marker table), if missing."""

    @abstractmethod
    def copy_markers(self, changefeed: str, span: int, table: TableName) -> dict[int, ChunkMarker]:
        """The chunks of ``table`` committed with a marker and not yet cleared by :meth:`build_deferred_key`."""

    @abstractmethod
    def write_marked_chunk(self, schema: TableSchema, open_text: Callable[[], CopyText | None], marker: ChunkMarker,
                           fence: Fence | None = None) -> tuple[int, bool]:
        """Write one chunk of a table whose key is deferred together with its ``marker``, in one transaction; return
        (rows, False), or (rows of the committed marker, True) when that chunk was committed before (nothing
        written now)."""

    @abstractmethod
    def build_deferred_key(self, schema: TableSchema, changefeed: str, span: int, fence: Fence | None = None) -> bool:
        """Build the primary key of ``schema``'s target table as streaming creates it and delete its markers, in one
        transaction; idempotent (False: the key was there already)."""


class CopyTargets(ABC):
    """A sink whose targets hold rows that a copy may have to replace."""

    @abstractmethod
    def truncate_targets(self, tables: Sequence[TableName], *, schemas: Sequence[TableSchema] = (),
                         at: Watermark | None = None) -> None:
        """Empty the targets of ``tables`` that exist (``on-existing-rows = "truncate"``, and a resync before its
        copy), in one transaction where the target has them. A sink whose readers replay a log (Kafka) writes a
        TRUNCATE event instead, ordered before the copy's rows: ``schemas`` are the tables' schemas and ``at`` the
        copy's snapshot (its rows carry ``at.ts`` as commit Ts); such a sink refuses (``SinkError``) when it lacks
        them rather than leave old rows its readers would keep."""

    def restart_copy_target(self, schema: TableSchema, changefeed: str, span: int, commit_ts: int,
                            commit_time: float) -> None:
        """The copy of ``schema``'s table starts over under a new definition (its columns or key changed upstream
        between two runs of its copy; ``schema`` is the new one): remove what the earlier runs wrote of it, so that
        every row the target ends with is read at one definition, and the copy creates the target from ``schema``
        as streaming would. Idempotent (a run that dies after it does it again). Unless a sink drops the table
        (SQL): the TRUNCATE a resync writes, :meth:`truncate_targets` at the new run's snapshot
        (``commit_ts``/``commit_time``; its copied rows carry that Ts, and the TRUNCATE is ordered before them),
        then a flush of a :class:`sinks.base.BufferedSink`, so a consumer empties the table before the rows come
        again."""
        self.truncate_targets([schema.name], schemas=[schema], at=Watermark(commit_ts, commit_time))
        if isinstance(self, BufferedSink):
            self.flush()


class ExistingRows(ABC):
    """A sink whose targets are tables (or table folders) that can already hold rows before a copy."""

    @abstractmethod
    def tables_with_rows(self, tables: Sequence[TableName]) -> list[TableName]:
        """Those of ``tables`` whose target already holds rows (``changefeed create`` refuses to copy the existing
        rows over them unless told what to do: ``[snapshot] on-existing-rows``)."""


class RowCounts(ABC):
    """A sink that can count the rows of its target tables."""

    @abstractmethod
    def count_rows(self, tables: Sequence[TableName]) -> dict[TableName, int] | None:
        """How many rows the target of each of ``tables`` holds (0 for a target that does not exist). Reads whole
        tables: not for the hot path (``processor.merged_rows``, once after a merge copy)."""


class ResyncRefusal(ABC):
    """A sink class that may refuse a resync (``cdc cli changefeed snapshot --table``) for some URIs."""

    @classmethod
    @abstractmethod
    def resync_refusal(cls, uri: str) -> str | None:
        """Why a resync cannot work with the sink of ``uri``, naming the fix (None: it can); asked before the resync
        is stored, without opening the sink."""


class TablesHad(ABC):
    """A sink that records the target tables each changefeed has had and refuses to create one of them again when it is
    missing downstream (dropped behind the changefeed's back: SQL, ``sinks.sql.target.table_record``)."""

    @abstractmethod
    def bind_tables_had(self, changefeed: str, span: int, origin: int) -> None:
        """This instance writes for span ``span`` (started at ``origin``, as ``TxnSink.open_position`` takes them) of
        ``changefeed`` without a stream position (the copy job's: its chunks, its deferred-key targets): from now on
        every target table it creates or writes rows into is recorded as the changefeed's before its rows commit, and
        one the record shows that is missing downstream is refused (``CDC:ErrTargetTableDropped``), as the stream's
        sink does. Called once, before the first write."""

    @abstractmethod
    def forget_tables_had(self, changefeed: str, tables: Sequence[TableName]) -> int:
        """``tables`` (upstream names) are copied again for ``changefeed`` (a resync, stored just before): their target
        tables may be created anew from now on, a missing one included. Returns how many records went. Called on an
        instance of its own, before the span takes the copy up."""
