"""The sink contract (see DESIGN.md sections 3.4 and 4).

Guarantees a sink gives its caller:
- ``write(changes)`` receives changes ordered by ``commit_ts`` that form *whole* upstream transactions
  (one or several). It applies them in order and returns only once they are durable downstream; for
  transactional targets all of them are applied in one downstream transaction. The caller advances its
  checkpoint to the last ``commit_ts`` only after ``write`` returned.
- Idempotence: applying the same changes again (a replay after a crash) converges to the same state:
  inserts and updates are upserts by key, deletes by key.
- An UPDATE column whose value is ``cdc.events.UNCHANGED`` keeps its downstream value.
- Errors: a transient failure (target unreachable) raises ``cdc.errors.SinkUnavailable``; a failure that
  retrying cannot fix raises ``cdc.errors.SinkError``. After an exception nothing from that call is
  assumed durable; the caller retries from its checkpoint.
- Fencing: ``fence`` (if given) is called immediately before the downstream commit; if it raises, the
  downstream transaction is rolled back and the exception propagates. A span uses it to refuse to
  commit once its capture may have lost the span (lease expired while the process was frozen).
- Data warnings: anything the sink had to do that can make the target differ from the source (a row
  missing downstream, a value it could not store exactly) is returned by ``take_warnings`` as a
  ``cdc.model.DataWarning`` (the caller puts it into the changefeed's state), never only logged.
- Missing rows: an UPDATE whose row is missing downstream and that does not carry every column (unsent
  ``UNCHANGED`` values) is never completed with NULLs. If the caller gave a ``RowSource``
  (``set_row_source``), the sink asks it for the current upstream row and writes that (later changes in
  the stream converge it); otherwise, or when the upstream no longer has the row, it raises a warning.
- Exactly-once (``open_position``): a sink that stores positions keeps, per (changefeed, span), the commit
  Ts of the last transaction it applied, written in the same downstream transaction as that
  transaction's rows. After ``open_position`` every ``write`` records its last commit Ts that way and
  silently drops the changes whose ``commit_ts`` is at or below the stored one (they are already
  downstream; ``commit_ts`` is unique per upstream transaction and transactions are whole in a call, so
  this is exact). The count ``write`` returns excludes dropped changes. Sinks without positions return 0
  and stay at-least-once (idempotent by key only).
- Schema changes (``apply_ddl``, docs/ddl.md): called only at a barrier, i.e. once every row change with
  ``commit_ts < event.commit_ts``, and those of the DDL's own transaction that come before it, were
  written; rows after it are written after it returns, with the new ``TableSchema``. A transaction may
  thus be split around its DDL into two ``write`` calls: the sink still applies the second part (it does
  not count the transaction as downstream because its first part is). The DDL takes effect at most once:
  ``apply_ddl`` returns False when the target already holds it (a replay after a crash). Errors:
  ``SinkUnavailable`` (transient, retry), ``cdc.errors.DdlRejected`` (untranslatable or refused by the
  target: names the DDL text, the table and the reason). ``fence`` as for ``write``. An ADD COLUMN's
  ``DdlEvent.fills`` say what the rows that existed hold upstream in the new column: a sink gives them that value,
  or reads per-row values back through the row source (``set_row_source``), else raises ``CDC:WarnDdlDefault``. ``skip=True`` records
  a DDL the operator skips knowingly: the target is left as it is, the rest behaves as if applied.
- Buffering (``flush_interval`` > 0; the storage sink's files): ``write`` may return before its changes are
  durable; they are durable (and visible) only once ``flush`` returned, which the caller calls at most every
  ``flush_interval`` seconds while it holds unflushed changes and before every ``apply_ddl``. The caller's
  checkpoint moves past written changes only after a ``flush``. A crash loses what was not flushed, which the
  caller replays from its checkpoint. Default: 0, every ``write`` is durable on return and ``flush`` does nothing.
- Published checkpoints (``publishes_checkpoints``; the storage sink's ``metadata`` file, the Kafka sink's
  watermarks): the owner calls ``publish_checkpoint(ts, time)`` on a sink instance of its own, from a thread of its
  own (never from its control loop), each time the changefeed's checkpoint (the minimum over its spans) advances:
  every commit at or below ``ts`` is durable downstream. Only the latest value is published (calls may skip
  values, never go backwards); a failure is raised as for ``write``, logged and retried by the owner, and shown in
  the changefeed's state when it persists (docs/sinks.md). Default: False, never called.
- Span watermarks (``watermark_interval`` > 0; the Kafka sink): after the caller's checkpoint moved, at most every
  ``watermark_interval`` seconds, it calls ``publish_resolved(checkpoint)``: every change of the span with
  ``commit_ts <= checkpoint.ts`` is durable downstream, so the sink may tell its readers (a watermark message).
  ``bind_span(changefeed, span, spans)`` tells the sink which span of how many it writes for, before the first
  ``write`` (and before ``open_position``). Default: 0, no watermarks; ``bind_span`` does nothing.
- Threading: one caller thread at a time. ``close`` releases connections; no call after ``close``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from typing import Any, ClassVar

from cdc.config import DdlConfig
from cdc.errors import DdlRejected, SinkError
from cdc.events import DdlEvent, RowChange, TableName, TableSchema
from cdc.model import DataWarning
from cdc.snapshot import ChunkMarker, CopiedChunk, CopyText
from cdc.ts import Watermark

RowSource = Callable[[TableSchema, Sequence[tuple[Any, ...]]], list[dict[str, Any] | None]]
"""``fetch(schema, keys)``: the current upstream row (all columns by name) for each key, in order, or None
where the upstream no longer has that row. Raises ``cdc.errors.TidewaterError`` when the upstream cannot
be read."""


class Sink(ABC):
    @abstractmethod
    def write(self, changes: Iterable[RowChange], fence: Callable[[], None] | None = None) -> int:
        """Apply whole transactions durably; return the number of row changes applied."""

    flush_interval: float = 0.0
    """Seconds a buffering sink may hold written changes before ``flush`` (module docstring); 0: none."""

    def flush(self, fence: Callable[[], None] | None = None) -> None:  # noqa: B027 - optional hook
        """Make everything written so far durable and visible (a buffering sink); ``fence`` as for ``write``."""

    watermark_interval: float = 0.0
    """Seconds between the span's ``publish_resolved`` calls (module docstring); 0: none."""

    def bind_span(self, changefeed: str, span: int, spans: int) -> None:  # noqa: B027 - optional hook
        """This sink writes for span ``span`` (0-based) of the ``spans`` spans of ``changefeed``."""

    def publish_resolved(self, watermark: Watermark, fence: Callable[[], None] | None = None) -> None:  # noqa: B027
        """Every change of the span up to ``watermark.ts`` is durable downstream (``watermark_interval`` > 0 only);
        ``fence`` as for ``write``."""

    publishes_checkpoints: ClassVar[bool] = False
    """True when the owner should call :meth:`publish_checkpoint` as the changefeed's checkpoint advances."""

    def publish_checkpoint(self, ts: int, commit_time: float = 0.0) -> None:
        """Publish the changefeed checkpoint ``ts`` (upstream commit time ``commit_time``) downstream (module
        docstring). Only called when ``publishes_checkpoints``."""
        raise NotImplementedError(f"{type(self).__name__} publishes no checkpoints")

    rolls_back: ClassVar[bool] = False
    """True when a ``write`` whose ``fence`` raises leaves nothing of it downstream (one downstream transaction,
    rolled back: the SQL sinks). The initial copy then writes a refused chunk's rows again in small batches that
    are always rolled back, to name the row the target refuses (``spark_jobs.rejected``)."""

    def check(self) -> None:  # noqa: B027 - optional hook, no-op by default
        """Connect and verify the target is usable; raise SinkUnavailable/SinkError naming the problem."""

    def probe(self) -> None:
        """Cheap reachability check, called about once a second while a failed span waits to restart
        (on a sink opened for that purpose only): raise ``SinkUnavailable`` while the target cannot be
        reached. Default: ``check()``."""
        self.check()

    def target_name(self, table: TableName) -> str:
        """Where ``table`` lands downstream, as a display string (used to refuse name collisions)."""
        return str(table)

    def take_warnings(self) -> list[DataWarning]:
        """The data warnings raised since the last call (and forget them)."""
        return []

    def tables_with_rows(self, tables: Sequence[TableName]) -> list[TableName]:
        """Those of ``tables`` whose target already holds rows (``changefeed create`` refuses to copy the
        existing rows over them unless told what to do: ``[snapshot] on-existing-rows``). Default: a sink
        without tables (none)."""
        return []

    def count_rows(self, tables: Sequence[TableName]) -> dict[TableName, int] | None:
        """How many rows the target of each of ``tables`` holds (0 for a target that does not exist), or None
        when this sink's targets are not tables it can count (a log: Kafka, files). Reads whole tables: not for
        the hot path (``processor.merged_rows``, once after a merge copy)."""
        return None

    def set_bulk_load(self) -> None:  # noqa: B027 - optional hook
        """This sink writes the initial copy: chunks of one consistent image, in any order and in parallel, so the
        target's foreign keys are not checked while they are written, where the target allows it (they hold again
        once every chunk is written). Call before the first write."""

    def write_copy_text(self, schema: TableSchema, open_text: Callable[[], CopyText | None],
                        fence: Callable[[], None] | None = None, *, replace: bool = False) -> int | None:
        """The initial copy's bulk path: write one chunk of ``schema``'s rows given as text
        (:class:`cdc.snapshot.CopyText`, from ``open_text()``) in one downstream transaction, as ``write`` would
        write the same rows as INSERTs (after a TRUNCATE of the table when ``replace``: a key-less table's whole
        chunk), but without parsing them; ``fence`` as for ``write``. Returns the rows written, or None when nothing
        was written: this sink cannot store that text exactly as ``write`` stores the parsed rows, or the target
        already holds rows of the chunk (a chunk copied again, a merged target); the caller then writes the chunk
        with ``write``. ``open_text`` is called only when the text may be used (its blocks may be left unread).
        Default: never (None, ``open_text`` not called)."""
        return None

    def write_copy_chunk(self, changes: Iterable[RowChange], chunk: CopiedChunk,
                         fence: Callable[[], None] | None = None) -> int:
        """The copy's parsed path: ``write(changes, fence)`` of the rows of one chunk (``chunk``: its table, index
        and the commit Ts its rows carry). A sink whose readers replay a log (Kafka) also tells them, after the rows
        are durable, how many rows of the chunk went where (a *chunk marker*), so that a reader can tell a chunk it
        received short or not at all. Default: ``write``."""
        return self.write(changes, fence)

    def announce_copy(self, chunks: Sequence[CopiedChunk]) -> None:  # noqa: B027 - optional hook
        """The copies of the tables of ``chunks`` are complete: ``chunks`` are all their chunks as recorded (table,
        index, the commit Ts of the run that wrote each, rows). Called by the span before any change of those tables
        after the copy is written (and so before any watermark covering it), possibly more than once for one copy (a
        span restarted after it). A sink whose readers replay a log writes it for them (Kafka: docs/sinks.md, "Copy
        markers"). Default: nothing to tell."""

    def defer_key_refusal(self, schema: TableSchema) -> str | None:
        """Why the initial copy of ``schema`` cannot create its target table without the primary key and build the
        key after the load (None: it can, provided the target table does not exist yet: :meth:`copy_target_exists`).
        A sink that can (PostgreSQL: ``sinks.sql.deferred_key``) implements :meth:`create_deferred_target`,
        :meth:`copy_markers`, :meth:`write_marked_chunk` and :meth:`build_deferred_key` with the guarantees stated
        there: every chunk commits at most once, with its marker; the key is built exactly as streaming creates it.
        Default: never."""
        return "this sink keeps the key while chunks arrive"

    def copy_target_exists(self, schema: TableSchema) -> bool:
        """Whether ``schema``'s target table exists. Default: True (nothing is created by the copy)."""
        return True

    def create_deferred_target(self, schema: TableSchema) -> None:
        """Create ``schema``'s target table without its primary key (and the marker table), if missing."""
        raise SinkError("this sink cannot defer a table's key")

    def copy_markers(self, changefeed: str, span: int, table: TableName) -> dict[int, ChunkMarker]:
        """The chunks of ``table`` committed with a marker and not yet cleared by :meth:`build_deferred_key`."""
        return {}

    def write_marked_chunk(self, schema: TableSchema, open_text: Callable[[], CopyText | None], marker: ChunkMarker,
                           fence: Callable[[], None] | None = None) -> tuple[int, bool]:
        """Write one chunk of a table whose key is deferred together with its ``marker``, in one transaction; return
        (rows, False), or (rows of the committed marker, True) when that chunk was committed before (nothing
        written now)."""
        raise SinkError("this sink cannot defer a table's key")

    def build_deferred_key(self, schema: TableSchema, changefeed: str, span: int,
                           fence: Callable[[], None] | None = None) -> bool:
        """Build the primary key of ``schema``'s target table as streaming creates it and delete its markers, in one
        transaction; idempotent (False: the key was there already). A duplicate key raises ``SinkError``."""
        raise SinkError("this sink cannot defer a table's key")

    def truncate_targets(  # noqa: B027 - optional hook
            self, tables: Sequence[TableName], *, schemas: Sequence[TableSchema] = (), at: Watermark | None = None
    ) -> None:
        """Empty the targets of ``tables`` that exist (``on-existing-rows = "truncate"``, and a resync before its copy),
        in one transaction where the target has them. A sink whose readers replay a log (Kafka) writes a TRUNCATE
        event instead, ordered before the copy's rows: ``schemas`` are the tables' schemas and ``at`` the copy's
        snapshot (its rows carry ``at.ts`` as commit Ts); such a sink refuses (``SinkError``) when it lacks them
        rather than leave old rows its readers would keep. Default: nothing to empty (a sink without tables)."""

    @classmethod
    def resync_refusal(cls, uri: str) -> str | None:
        """Why a resync (``cdc cli changefeed snapshot --table``) cannot work with the sink of ``uri``, naming the fix
        (None: it can); asked before the resync is stored, without opening the sink. Default: None."""
        return None

    def restart_copy_target(self, schema: TableSchema, changefeed: str, span: int, commit_ts: int,
                            commit_time: float) -> None:
        """The copy of ``schema``'s table starts over under a new definition (its columns or key changed upstream
        between two runs of its copy; ``schema`` is the new one): remove what the earlier runs wrote of it, so that
        every row the target ends with is read at one definition, and the copy creates the target from ``schema``
        as streaming would. Idempotent (a run that dies after it does it again). Default (sinks without tables:
        Kafka, files): the TRUNCATE a resync writes, :meth:`truncate_targets` at the new run's snapshot
        (``commit_ts``/``commit_time``; its copied rows carry that Ts, and the TRUNCATE is ordered before them), then
        a :meth:`flush`, so a consumer empties the table before the rows come again."""
        self.truncate_targets([schema.name], schemas=[schema], at=Watermark(commit_ts, commit_time))
        self.flush()

    def set_row_source(self, fetch: RowSource | None) -> None:  # noqa: B027 - optional hook
        """Where to read a full upstream row when a partial UPDATE finds no row downstream."""

    def open_position(self, changefeed: str, span: int, origin: int = 0) -> int:
        """Start exactly-once delivery for span ``span`` of ``changefeed``: return the commit Ts the target
        already holds (0: none). ``origin`` is the span's start Ts; a stored position with another origin
        is from an earlier changefeed of the same id and is reset. Default: at-least-once, returns 0."""
        return 0

    def forget(self, changefeed: str) -> int:
        """Delete the stored positions of ``changefeed`` (after ``remove``); return how many went."""
        return 0

    def set_ddl_config(self, config: DdlConfig) -> None:  # noqa: B027 - optional hook
        """The changefeed's ``[ddl]`` settings (``replicate-indexes``); before the first ``apply_ddl``."""

    def apply_ddl(self, event: DdlEvent, fence: Callable[[], None] | None = None, *, skip: bool = False) -> bool:
        """Apply schema change ``event`` downstream once (see the module docstring): True when applied now,
        False when the target already had it. ``skip``: the operator skips this DDL knowingly; nothing
        changes downstream, but the sink treats it as applied (the rows after it are written, a replay does
        not apply it). Default: this sink cannot apply DDL (DdlRejected); skipping returns False."""
        if skip:
            return False
        raise DdlRejected(event.query or ", ".join(event.kinds), str(event.table),
                          f"{type(self).__name__} does not apply schema changes", commit_ts=event.commit_ts)

    @abstractmethod
    def close(self) -> None: ...
