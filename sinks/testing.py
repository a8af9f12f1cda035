"""In-memory twins of the sink roles (``sinks.base``, ``sinks.copy_roles``), for unit tests (bytewax's ``testing.py``).

Each twin keeps what it was given in plain lists, so a pipeline test reads what reached the "target"; each keeps
its role's guarantees (and refuses, with ``SinkError``, a call its role's contract forbids: a call after ``close``,
a schema change over unflushed rows, a watermark over rows not yet durable), so a caller that breaks a contract
fails its test. Subclass a twin to record more or to refuse something; combine twins by listing them as bases.

| twin | roles |
|---|---|
| :class:`MemorySink` | ``TxnSink`` (positions kept in memory), ``PositionStore`` |
| :class:`MemoryAtomicSink` | ``AtomicTxnSink``: refuses rows (``refuse``) as ``DataRejected``, nothing of a refused write stays |
| :class:`MemoryDdlSink` | ``MemorySink`` + ``DdlSink`` (``reject`` refuses every DDL) |
| :class:`MemoryRowSourceSink` | ``MemoryDdlSink`` + ``RowSourceUser`` |
| :class:`MemoryBufferedSink` | ``MemoryDdlSink`` + ``BufferedSink`` |
| :class:`MemoryWatermarkSink` | ``MemoryBufferedSink`` + ``WatermarkSink`` (``flush_interval`` 0: every write durable) |
| :class:`MemoryCheckpointSink` | ``MemorySink`` + ``CheckpointSink`` (``fail`` makes a publish raise) |
| :class:`MemoryBarrierSink` | ``MemoryDdlSink`` + ``BarrierSink`` over a shared :class:`MemoryStage` (``fail``: apply raises) |
| :class:`MemoryCopySink` | ``MemorySink`` + ``BulkLoad``, ``CopyTargets``, ``ExistingRows``, ``RowCounts`` |
| :class:`MemoryTextCopySink` | ``MemoryCopySink`` + ``TextCopy`` |
| :class:`MemoryAnnouncerSink` | ``MemorySink`` + ``CopyAnnouncer`` |
| :class:`MemoryDeferredKeySink` | ``MemorySink`` + ``DeferredKeyCopy`` |
| :class:`MemorySinks` | a ``SinkOpener`` (the factory the capture hands to the owner and the processor) of twins |

Threading: like the sinks they stand for, one caller thread at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from cdc.errors import DataRejected, DdlRejected, SinkError, SinkUnavailable
from cdc.events import DdlEvent, RowChange, TableName, TableSchema
from cdc.model import DataWarning
from cdc.snapshot import ChunkMarker, CopiedChunk, CopyText
from cdc.ts import Watermark
from sinks.base import (
    AtomicTxnSink,
    BarrierApplied,
    BarrierSink,
    BufferedSink,
    CheckpointSink,
    DdlSink,
    Fence,
    PositionStore,
    RowSource,
    RowSourceUser,
    TxnSink,
    WatermarkSink,
    waits_for_barrier,
)
from sinks.copy_roles import (
    BulkLoad,
    CopyAnnouncer,
    CopyTargets,
    DeferredKeyCopy,
    ExistingRows,
    RowCounts,
    TextCopy,
)


class MemorySink(TxnSink, PositionStore):
    """The write role in memory: ``writes`` holds the changes of every committed ``write`` (one list per call),
    ``calls`` every role call in order (``("write", n)``, ``("ddl", column-or-query, skip)``, ``("flush",)``, ...).
    Positions per (changefeed, span) with their origin, as ``open_position`` specifies; ``fence`` is called before
    the "commit", and nothing of a write whose fence raised is kept. ``unavailable``: ``check``, ``probe`` and
    ``write`` raise ``SinkUnavailable`` with that message. ``warn`` queues a data warning for ``take_warnings``."""

    def __init__(self) -> None:
        self.writes: list[list[RowChange]] = []
        self.calls: list[tuple[Any, ...]] = []
        self.positions: dict[tuple[str, int], tuple[int, int]] = {}  # (changefeed, span) -> (origin, commit Ts)
        self.unavailable: str | None = None
        self.checks = 0
        self.closed = False
        self._warnings: list[DataWarning] = []
        self._position: tuple[str, int] | None = None

    # ---- helpers for tests -----------------------------------------------------------------------------------
    @property
    def rows(self) -> list[RowChange]:
        """Every change committed, in order."""
        return [c for w in self.writes for c in w]

    def warn(self, warning: DataWarning) -> None:
        self._warnings.append(warning)

    def _usable(self) -> None:
        if self.closed:
            raise SinkError(f"{type(self).__name__} is closed")
        if self.unavailable is not None:
            raise SinkUnavailable(self.unavailable)

    def _applied(self) -> int:
        return self.positions.get(self._position, (0, 0))[1] if self._position is not None else 0

    def _commit(self, changes: list[RowChange]) -> None:
        """Where a committed write goes (a buffered twin: its pending list)."""
        self.writes.append(changes)

    # ---- TxnSink ---------------------------------------------------------------------------------------------
    def write(self, changes: Iterable[RowChange], fence: Fence | None = None) -> int:
        self._usable()
        floor = self._applied()
        got = [c for c in changes if c.commit_ts > floor]
        if fence is not None:
            fence()
        self._commit(got)
        self.calls.append(("write", len(got)))
        if self._position is not None and got:
            self.positions[self._position] = (self.positions[self._position][0], got[-1].commit_ts)
        return len(got)

    def check(self) -> None:
        self._usable()
        self.checks += 1

    def take_warnings(self) -> list[DataWarning]:
        out, self._warnings = self._warnings, []
        return out

    def open_position(self, changefeed: str, span: int, origin: int = 0) -> int:
        self._usable()
        self.calls.append(("position", changefeed, span))
        key = (changefeed, span)
        stored = self.positions.get(key)
        if stored is None or stored[0] != origin:
            self.positions[key] = (origin, 0)
        self._position = key
        return self.positions[key][1]

    def close(self) -> None:
        self.closed = True

    # ---- PositionStore ---------------------------------------------------------------------------------------
    def forget(self, changefeed: str) -> int:
        gone = [k for k in self.positions if k[0] == changefeed]
        for k in gone:
            del self.positions[k]
        return len(gone)


class MemoryAtomicSink(MemorySink, AtomicTxnSink):
    """An ``AtomicTxnSink``: a write with a row that ``refuse`` names (its reason) raises ``DataRejected`` and keeps
    nothing of the write, as a target's CHECK constraint would; ``attempts`` counts every write, committed or not."""

    def __init__(self, refuse: Callable[[RowChange], str | None] | None = None) -> None:
        super().__init__()
        self.refuse = refuse or (lambda _change: None)
        self.attempts = 0

    def write(self, changes: Iterable[RowChange], fence: Fence | None = None) -> int:
        self.attempts += 1
        got = list(changes)
        for i, c in enumerate(got, start=1):
            why = self.refuse(c)
            if why is not None:
                raise DataRejected(f"target memory, writing table {c.schema.name}: {why} at row {i} of the statement",
                                   reason=why)
        return super().write(got, fence)


class MemoryDdlSink(MemorySink, DdlSink):
    """Applies schema changes in memory: ``ddls`` holds (event, skip) per DDL taken effect; a replayed DDL (same
    commit Ts, table and text) returns False. ``reject``: every DDL not skipped raises ``DdlRejected`` with it."""

    def __init__(self, reject: str | None = None) -> None:
        super().__init__()
        self.reject = reject
        self.ddls: list[tuple[DdlEvent, bool]] = []
        self._seen: set[tuple[int, str, str]] = set()

    def apply_ddl(self, event: DdlEvent, fence: Fence | None = None, *, skip: bool = False) -> bool:
        self._usable()
        if self.reject is not None and not skip:
            raise DdlRejected(event.query, str(event.table), self.reject, commit_ts=event.commit_ts)
        key = (event.commit_ts, str(event.table), event.query)
        if key in self._seen:
            return False
        if fence is not None:
            fence()
        self._seen.add(key)
        self.ddls.append((event, skip))
        self.calls.append(("skip" if skip else "ddl", event.changes[0].column if event.changes else event.query))
        return True


class MemoryRowSourceSink(MemoryDdlSink, RowSourceUser):
    """Keeps the row source it is given (``row_source``)."""

    def __init__(self, reject: str | None = None) -> None:
        super().__init__(reject)
        self.row_source: RowSource | None = None

    def set_row_source(self, fetch: RowSource | None) -> None:
        self.row_source = fetch


class MemoryBufferedSink(MemoryDdlSink, BufferedSink):
    """Holds written changes in ``pending`` until ``flush`` commits them to ``writes`` (one list per flush);
    ``flush_interval`` 0 behaves as a sink that does not buffer (every write committed on return)."""

    def __init__(self, flush_interval: float = 0.0, reject: str | None = None) -> None:
        super().__init__(reject)
        self.flush_interval = flush_interval
        self.pending: list[RowChange] = []

    def _commit(self, changes: list[RowChange]) -> None:
        if self.flush_interval > 0:
            self.pending += changes
        else:
            super()._commit(changes)

    def flush(self, fence: Fence | None = None) -> None:
        self._usable()
        if fence is not None:
            fence()
        self.calls.append(("flush",))
        if self.pending:
            self.writes.append(self.pending)
            self.pending = []

    def apply_ddl(self, event: DdlEvent, fence: Fence | None = None, *, skip: bool = False) -> bool:
        if self.pending:
            raise SinkError("a schema change over unflushed rows (the caller must flush before apply_ddl)")
        return super().apply_ddl(event, fence, skip=skip)


class MemoryWatermarkSink(MemoryBufferedSink, WatermarkSink):
    """Publishes span watermarks into ``published`` (watermark, monotonic time) every ``interval`` seconds; refuses
    one over rows not yet flushed or going backwards."""

    def __init__(self, interval: float, flush_interval: float = 0.0) -> None:
        super().__init__(flush_interval)
        self.interval = interval
        self.watermark_interval = 0.0
        self.published: list[Watermark] = []

    def bind_span(self, changefeed: str, span: int, spans: int) -> None:
        self.calls.append(("bind", changefeed, span, spans))
        self.watermark_interval = self.interval

    def publish_resolved(self, watermark: Watermark, fence: Fence | None = None) -> None:
        self._usable()
        if any(c.commit_ts <= watermark.ts for c in self.pending):
            raise SinkError(f"a watermark at {watermark.ts} over rows not yet durable")
        if self.published and watermark.ts < self.published[-1].ts:
            raise SinkError(f"a watermark going backwards: {watermark.ts} after {self.published[-1].ts}")
        if fence is not None:
            fence()
        self.published.append(watermark)
        self.calls.append(("resolved", watermark.ts))


class MemoryCheckpointSink(MemorySink, CheckpointSink):
    """Records every published changefeed checkpoint in ``checkpoints`` (as called: a test sees a value published
    twice or going backwards); while ``fail()`` is true a publish raises ``SinkUnavailable`` (``failure``)."""

    def __init__(self, fail: Callable[[], bool] | None = None, checkpoints: list[int] | None = None,
                 failure: str = "memory sink: no space left on the device writing /lake/metadata") -> None:
        super().__init__()
        self.fail = fail or (lambda: False)
        self.failure = failure
        self.checkpoints = checkpoints if checkpoints is not None else []

    def publish_checkpoint(self, ts: int, commit_time: float = 0.0) -> None:
        self._usable()
        if self.fail():
            raise SinkUnavailable(self.failure)
        self.checkpoints.append(ts)


class MemoryStage:
    """The target of :class:`MemoryBarrierSink` twins, shared by a changefeed's span sinks and its coordinator's:
    ``staged`` changes (not visible), ``visible`` changes (applied by barriers, in order), ``barriers`` applied (as
    ``(changefeed, barrier Ts, history)``, one per applying call), ``applied`` per changefeed with its origin."""

    def __init__(self) -> None:
        self.staged: list[tuple[str, RowChange]] = []
        self.visible: list[RowChange] = []
        self.barriers: list[tuple[str, int, bool]] = []
        self.applied: dict[str, tuple[int, int]] = {}  # changefeed -> (origin, barrier)


class MemoryBarrierSink(MemoryDdlSink, BarrierSink):
    """The barrier role in memory over a shared :class:`MemoryStage`: after ``stage_barriers`` a ``write`` stages (and
    moves the position); ``apply_barrier`` moves the staged changes at or below the barrier to ``visible`` in commit
    order, all or nothing (``fence`` runs before anything moves; while ``fail()`` is true it raises
    ``SinkUnavailable``)."""

    def __init__(self, stage: MemoryStage | None = None, fail: Callable[[], bool] | None = None) -> None:
        super().__init__()
        self.stage = stage if stage is not None else MemoryStage()
        self.fail = fail or (lambda: False)
        self.staging = False
        self._changefeed = ""
        self._origin = 0

    def stage_barriers(self, origin: int = 0) -> None:
        self.staging = True
        self._origin = origin

    def apply_ddl(self, event: DdlEvent, fence: Fence | None = None, *, skip: bool = False) -> bool:
        """As ``MemorySink``'s; staging, a DDL that waits for its barrier (``sinks.base.waits_for_barrier``) is refused
        until the stage shows the barrier just before its transaction (the order ``sinks.base.BarrierSink`` needs)."""
        if self.staging and not skip and waits_for_barrier(event):
            shown = self.applied_barrier(self._changefeed, self._origin)
            if shown < event.commit_ts - 1:
                raise SinkError(f"memory sink: schema change at commit {event.commit_ts} before barrier "
                                f"{event.commit_ts - 1} (the stage shows {shown})")
        return super().apply_ddl(event, fence, skip=skip)

    def open_position(self, changefeed: str, span: int, origin: int = 0) -> int:
        self._changefeed = changefeed
        return super().open_position(changefeed, span, origin)

    def _commit(self, changes: list[RowChange]) -> None:
        if self.staging:
            self.stage.staged.extend((self._changefeed, c) for c in changes)
        else:
            super()._commit(changes)

    def apply_barrier(self, changefeed: str, origin: int, barrier_ts: int, barrier_time: float, *, history: bool,
                      fence: Fence | None = None) -> BarrierApplied:
        self._usable()
        stage = self.stage
        done = self.applied_barrier(changefeed, origin)
        if barrier_ts <= done:
            return BarrierApplied(done)
        if self.fail():
            raise SinkUnavailable("memory sink: the target went away applying a barrier")
        if fence is not None:
            fence()
        mine = sorted((c for cf, c in stage.staged if cf == changefeed and c.commit_ts <= barrier_ts),
                      key=lambda c: c.commit_ts)
        stage.staged = [(cf, c) for cf, c in stage.staged if cf != changefeed or c.commit_ts > barrier_ts]
        stage.visible.extend(mine)
        stage.barriers.append((changefeed, barrier_ts, history))
        stage.applied[changefeed] = (origin, barrier_ts)
        return BarrierApplied(barrier_ts, len(mine), len(mine))

    def applied_barrier(self, changefeed: str, origin: int) -> int:
        held = self.stage.applied.get(changefeed)
        return held[1] if held is not None and held[0] == origin else 0


class MemoryCopySink(MemorySink, BulkLoad, CopyTargets, ExistingRows, RowCounts):
    """A target of tables: ``held`` is how many rows each table's target holds (set by the test; ``None`` for
    ``counts``: cannot count); ``truncate_targets`` empties and records them (``calls``: ``("truncate", table,
    at Ts)``); ``bulk`` once ``set_bulk_load`` was called."""

    def __init__(self, held: dict[str, int] | None = None, countable: bool = True) -> None:
        super().__init__()
        self.held = dict(held or {})
        self.countable = countable
        self.bulk = False

    def set_bulk_load(self) -> None:
        self.bulk = True

    def truncate_targets(self, tables: Sequence[TableName], *, schemas: Sequence[TableSchema] = (),
                         at: Watermark | None = None) -> None:
        self._usable()
        for t in tables:
            self.held.pop(str(t), None)
            self.calls.append(("truncate", str(t), at.ts if at is not None else None))

    def tables_with_rows(self, tables: Sequence[TableName]) -> list[TableName]:
        return [t for t in tables if self.held.get(str(t), 0) > 0]

    def count_rows(self, tables: Sequence[TableName]) -> dict[TableName, int] | None:
        return {t: self.held.get(str(t), 0) for t in tables} if self.countable else None


class MemoryTextCopySink(MemoryCopySink, TextCopy):
    """Takes a chunk as text when ``accept`` (``texts``: the bytes, ``replace``, fenced), else refuses it (None)
    without opening the text."""

    def __init__(self, accept: bool = True) -> None:
        super().__init__()
        self.accept = accept
        self.texts: list[tuple[bytes, bool, bool]] = []

    def write_copy_text(self, schema: TableSchema, open_text: Callable[[], CopyText | None],
                        fence: Fence | None = None, *, replace: bool = False) -> int | None:
        self._usable()
        if not self.accept:
            return None
        text = open_text()
        if text is None:
            return None
        data = b"".join(text.blocks)
        if fence is not None:
            fence()
        self.texts.append((data, replace, fence is not None))
        return data.count(b"\n")


class MemoryAnnouncerSink(MemorySink, CopyAnnouncer):
    """Records each copied chunk with its row count (``chunks``) and each announcement (``announced``)."""

    def __init__(self) -> None:
        super().__init__()
        self.chunks: list[tuple[CopiedChunk, int]] = []
        self.announced: list[list[CopiedChunk]] = []

    def write_copy_chunk(self, changes: Iterable[RowChange], chunk: CopiedChunk, fence: Fence | None = None) -> int:
        n = self.write(changes, fence)
        self.chunks.append((chunk, n))
        return n

    def announce_copy(self, chunks: Sequence[CopiedChunk]) -> None:
        self._usable()
        self.announced.append(list(chunks))


class MemoryDeferredKeySink(MemorySink, DeferredKeyCopy):
    """Tables whose key is deferred, in memory: ``exists`` (the target table is there), ``refusal`` (why a key
    cannot be deferred; None: it can), ``markers`` per chunk index (at most one commit per chunk), ``built`` the
    tables whose key was built; ``calls`` records ``("create", table)`` and ``("build", table)``."""

    def __init__(self, exists: bool = False, refusal: str | None = None,
                 markers: dict[int, ChunkMarker] | None = None) -> None:
        super().__init__()
        self.exists = exists
        self.refusal = refusal
        self.markers = dict(markers or {})
        self.built: list[TableName] = []

    def defer_key_refusal(self, schema: TableSchema) -> str | None:
        return self.refusal

    def copy_target_exists(self, schema: TableSchema) -> bool:
        return self.exists

    def create_deferred_target(self, schema: TableSchema) -> None:
        self._usable()
        if not self.exists:
            self.calls.append(("create", str(schema.name)))
        self.exists = True

    def copy_markers(self, changefeed: str, span: int, table: TableName) -> dict[int, ChunkMarker]:
        return dict(self.markers)

    def write_marked_chunk(self, schema: TableSchema, open_text: Callable[[], CopyText | None], marker: ChunkMarker,
                           fence: Fence | None = None) -> tuple[int, bool]:
        self._usable()
        if marker.chunk in self.markers:
            return self.markers[marker.chunk].rows, True
        text = open_text()
        rows = b"".join(text.blocks).count(b"\n") if text is not None else 0
        if fence is not None:
            fence()
        self.markers[marker.chunk] = ChunkMarker(marker.changefeed, marker.span, marker.table, marker.chunk,
                                                 marker.run, rows, marker.snapshot, marker.commit_ts)
        return rows, False

    def build_deferred_key(self, schema: TableSchema, changefeed: str, span: int, fence: Fence | None = None) -> bool:
        self._usable()
        if schema.name in self.built:
            return False
        if fence is not None:
            fence()
        self.built.append(schema.name)
        self.markers.clear()
        self.calls.append(("build", str(schema.name)))
        return True


class MemorySinks:
    """A ``sinks.base.SinkOpener`` handing out twins: ``open`` makes a ``kind`` (default :class:`MemorySink`; ``make``,
    if given, builds it from the URI instead) and keeps it in ``opened``; ``supports`` answers for ``kind``."""

    def __init__(self, kind: type[TxnSink] = MemorySink, make: Callable[[str], TxnSink] | None = None) -> None:
        self.kind = kind
        self.make = make or (lambda _uri: kind())
        self.opened: list[TxnSink] = []

    def open(self, uri: str, config: Any = None, ddl: Any = None) -> TxnSink:
        sink = self.make(uri)
        self.opened.append(sink)
        return sink

    def supports(self, uri: str, role: type) -> bool:
        return issubclass(self.kind, role)
