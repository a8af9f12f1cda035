"""The sink contract, split by role (DESIGN.md sections 3.4, 4 and 7).

A sink is an object that implements :class:`TxnSink` and whichever other roles its target supports; a caller
depends only on the role it uses and asks for any other one with ``isinstance`` (``sinks.factory.supports`` asks
the class of a URI's scheme, without opening a sink). There are no no-op defaults: a sink that cannot do
something does not claim the role, and the caller does what the contract says for sinks without it.

| role | methods | caller | sinks |
|---|---|---|---|
| :class:`TxnSink` | ``write``, ``check``, ``probe``, ``target_name``, ``take_warnings``, ``open_position``, ``close`` | span (sink thread), create, copy | all |
| :class:`AtomicTxnSink` | (a ``TxnSink`` whose refused write leaves nothing) | copy (``spark_jobs.rejected``) | SQL |
| :class:`BufferedSink` | ``flush_interval``, ``flush`` | span, copy | storage |
| :class:`PositionStore` | ``forget`` | owner (remove) | SQL, storage |
| :class:`DdlSink` | ``apply_ddl`` | span (at a barrier) | all |
| :class:`DdlSettings` | ``set_ddl_config`` | ``sinks.factory.open_sink`` | SQL |
| :class:`RowSourceUser` | ``set_row_source`` | span | SQL |
| :class:`TableShapes` | ``table_shape`` | Kafka consumer (``sinks.kafka.applier``) | SQL |
| :class:`CheckpointSink` | ``publish_checkpoint`` | owner (``owner.checkpoint_publish``) | Kafka, storage |
| :class:`WatermarkSink` | ``watermark_interval``, ``bind_span``, ``publish_resolved`` | span | Kafka |
| :class:`BarrierSink` | ``stage_barriers``, ``apply_barrier``, ``applied_barrier`` | span, owner (``owner.barrier_apply``) | SQL |

The roles of the initial copy are in :mod:`sinks.copy_roles`; in-memory twins of every role for unit tests are
in :mod:`sinks.testing`.

Threading, for every role: one caller thread at a time per sink instance; the roles of one instance share that
rule (the span's sink thread calls ``write``, ``apply_ddl``, ``flush`` and ``publish_resolved`` of one sink in
turn). ``close`` releases connections; no call of any role after ``close``.

Errors, for every role: a transient failure (target unreachable) raises ``cdc.errors.SinkUnavailable``; a failure
that retrying cannot fix raises ``cdc.errors.SinkError`` (or a subclass). After an exception nothing from that
call is assumed durable; the caller retries from its checkpoint.

Fencing, for every method that takes ``fence``: it is called immediately before the downstream commit; if it
raises, the downstream transaction is rolled back (where the target has one) and the exception propagates. A span
uses it to refuse to commit once its capture may have lost the span (lease expired while the process was frozen).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from cdc.config import DdlConfig, SinkConfig
from cdc.errors import DdlRejected
from cdc.events import DdlEvent, DdlKind, RowChange, TableName, TableSchema
from cdc.model import DataWarning
from cdc.ts import Watermark

RowSource = Callable[[TableSchema, Sequence[tuple[Any, ...]]], list[dict[str, Any] | None]]
"""``fetch(schema, keys)``: the current upstream row (all columns by name) for each key, in order, or None
where the upstream no longer has that row. Raises ``cdc.errors.TidewaterError`` when the upstream cannot
be read."""

Fence = Callable[[], None]
"""Called right before a downstream commit; raises to refuse it (module docstring)."""


class TxnSink(ABC):
    """Writes whole upstream transactions, with exactly-once positions where the target keeps them.

    Guarantees:
    - ``write(changes)`` receives changes ordered by ``commit_ts`` that form *whole* upstream transactions (one or
      several). It applies them in order and returns only once they are durable downstream (a
      :class:`BufferedSink`: once its next ``flush`` returned); for transactional targets all of them are applied
      in one downstream transaction. The caller advances its checkpoint to the last ``commit_ts`` only after
      ``write`` (and, for a buffered sink, ``flush``) returned.
    - Idempotence: applying the same changes again (a replay after a crash) converges to the same state: inserts
      and updates are upserts by key, deletes by key.
    - An UPDATE column whose value is ``cdc.events.UNCHANGED`` keeps its downstream value.
    - Missing rows: an UPDATE whose row is missing downstream and that does not carry every column (unsent
      ``UNCHANGED`` values) is never completed with NULLs: a :class:`RowSourceUser` re-reads the row; any other
      sink, or when the upstream no longer has the row, raises a data warning.
    - Data warnings: anything the sink had to do that can make the target differ from the source (a row missing
      downstream, a value it could not store exactly) is returned by ``take_warnings`` as a
      ``cdc.model.DataWarning`` (the caller puts it into the changefeed's state), never only logged.
    - Exactly-once (``open_position``): called at most once, after ``check`` and before the first ``write``. A
      sink that stores positions keeps, per (changefeed, span), the commit Ts of the last transaction it applied,
      written in the same downstream transaction as that transaction's rows. After ``open_position`` every
      ``write`` records its last commit Ts that way and silently drops the changes whose ``commit_ts`` is at or
      below the stored one (they are already downstream; ``commit_ts`` is unique per upstream transaction and
      transactions are whole in a call, so this is exact). The count ``write`` returns excludes dropped changes.
      ``open_position`` returns the highest commit Ts the target holds for the span (a sink that applies on several
      connections may hold some transactions above its position after a crash: the highest of those). A sink
      without positions returns 0 and stays at-least-once (idempotent by key only).
    - Construction does no I/O; ``check`` connects. ``probe`` may be called on an instance opened only for it.
    """

    @abstractmethod
    def write(self, changes: Iterable[RowChange], fence: Fence | None = None) -> int:
        """Apply whole transactions durably; return the number of row changes applied."""

    @abstractmethod
    def check(self) -> None:
        """Connect and verify the target is usable; raise SinkUnavailable/SinkError naming the problem."""

    def probe(self) -> None:
        """Cheap reachability check, called about once a second while a failed span waits to restart (on a sink
        opened for that purpose only): raise ``SinkUnavailable`` while the target cannot be reached. ``check``
        unless a sink has a cheaper one."""
        self.check()

    def target_name(self, table: TableName) -> str:
        """Where ``table`` lands downstream, as a display string (used to refuse name collisions): the upstream
        name unless a sink maps names."""
        return str(table)

    @abstractmethod
    def take_warnings(self) -> list[DataWarning]:
        """The data warnings raised since the last call (and forget them)."""

    @abstractmethod
    def open_position(self, changefeed: str, span: int, origin: int = 0) -> int:
        """Start exactly-once delivery for span ``span`` of ``changefeed``: return the commit Ts the target
        already holds (0: none, or a sink without positions). ``origin`` is the span's start Ts; a stored position
        with another origin is from an earlier changefeed of the same id and is reset."""

    @abstractmethod
    def close(self) -> None:
        """Release connections (idempotent); nothing may be called after it."""


class AtomicTxnSink(TxnSink):
    """A :class:`TxnSink` whose ``write`` is one downstream transaction, rolled back when it fails or its ``fence``
    raises: nothing of a refused write stays downstream (the SQL sinks). The initial copy then writes a refused
    chunk's rows again in small batches that are always rolled back, to name the row the target refuses
    (``spark_jobs.rejected``)."""


class BufferedSink(ABC):
    """A sink whose ``write`` may return before its changes are durable (the storage sink's files).

    Guarantees: the changes of every ``write`` before a ``flush`` are durable (and visible) once that ``flush``
    returned. The caller calls ``flush`` at most every ``flush_interval`` seconds while it holds unflushed changes,
    before every ``apply_ddl`` and after each chunk of the initial copy; its checkpoint moves past written changes
    only after a ``flush``. A crash loses what was not flushed, which the caller replays from its checkpoint.
    ``flush`` with nothing written does nothing. Same thread as ``write``.
    """

    flush_interval: float
    """Seconds written changes may stay unflushed (set by the sink at construction, never changed)."""

    @abstractmethod
    def flush(self, fence: Fence | None = None) -> None:
        """Make everything written so far durable and visible; ``fence`` as for ``write``."""


class PositionStore(ABC):
    """A sink whose exactly-once positions (``TxnSink.open_position``) outlive the changefeed in the target until
    they are forgotten (the SQL sinks' position table, the storage sink's publish records)."""

    @abstractmethod
    def forget(self, changefeed: str) -> int:
        """Delete the stored positions of ``changefeed`` (after ``remove``, by the owner, on an instance of its own
        that was not ``check``ed); return how many went. Idempotent."""


class DdlSink(ABC):
    """Applies schema changes at a barrier (docs/ddl.md).

    Guarantees: ``apply_ddl`` is called only at a barrier, i.e. once every row change with ``commit_ts <
    event.commit_ts``, and those of the DDL's own transaction that come before it, were written (and, for a
    :class:`BufferedSink`, flushed); rows after it are written after it returns, with the new ``TableSchema``. A
    transaction may thus be split around its DDL into two ``write`` calls: the sink still applies the second part
    (it does not count the transaction as downstream because its first part is). The DDL takes effect at most
    once: ``apply_ddl`` returns False when the target already holds it (a replay after a crash). Errors:
    ``SinkUnavailable`` (transient, retry), ``cdc.errors.DdlRejected`` (untranslatable or refused by the target:
    names the DDL text, the table and the reason). An ADD COLUMN's ``DdlEvent.fills`` say what the rows that
    existed hold upstream in the new column: a sink gives them that value, or reads per-row values back through
    its row source (:class:`RowSourceUser`), else raises ``CDC:WarnDdlDefault``. ``skip=True`` records a DDL the
    operator skips knowingly: the target is left as it is, the rest behaves as if applied.

    A sink without this role applies no schema change: the caller treats every DDL as rejected by it (and a
    skipped one as not applied).
    """

    @abstractmethod
    def apply_ddl(self, event: DdlEvent, fence: Fence | None = None, *, skip: bool = False) -> bool:
        """Apply schema change ``event`` downstream once: True when applied now, False when the target already had
        it (or ``skip``: nothing changes downstream, a replay does not apply it)."""


def apply_ddl(sink: TxnSink, event: DdlEvent, fence: Fence | None = None, *, skip: bool = False) -> bool:
    """``sink.apply_ddl`` of a :class:`DdlSink`; a sink without that role rejects every schema change
    (``DdlRejected`` naming it), and a skipped one is not applied (False)."""
    if isinstance(sink, DdlSink):
        return sink.apply_ddl(event, fence, skip=skip)
    if skip:
        return False
    raise DdlRejected(event.query or ", ".join(event.kinds), str(event.table),
                      f"{type(sink).__name__} does not apply schema changes", commit_ts=event.commit_ts)


class DdlSettings(ABC):
    """A :class:`DdlSink` whose translation takes the changefeed's ``[ddl]`` settings (``replicate-indexes``)."""

    @abstractmethod
    def set_ddl_config(self, config: DdlConfig) -> None:
        """The changefeed's ``[ddl]`` settings; called before the first ``apply_ddl`` (by ``open_sink``)."""


class RowSourceUser(ABC):
    """A sink that completes a partial UPDATE whose row is missing downstream by re-reading the row upstream.

    Guarantees: given a :data:`RowSource` (``set_row_source``, before ``check``), such an UPDATE writes the current
    upstream row (later changes in the stream converge it); where the upstream no longer has the row, or without a
    row source, it raises a data warning. The row source is called from the caller's thread, inside ``write`` or
    ``apply_ddl``; the caller closes it after the sink.
    """

    @abstractmethod
    def set_row_source(self, fetch: RowSource | None) -> None:
        """Where to read a full upstream row when a partial UPDATE finds no row downstream (None: nowhere)."""


class TextRows(ABC):  # noqa: B024 - a marker role: what it changes is how the caller mounts rows
    """A sink that writes rows by their upstream text (``RowChange.row_text``: COPY, ``LOAD DATA``) where it can and
    reads their typed values (``RowChange.row``) only on its other paths.

    Guarantees: the sink takes an insert's ``RowChange.row`` as a tuple or as a deferred row (a sequence of the same
    values that parses ``row_text`` on first use; ``cdc.events.parsed_rows`` gives the tuples) and never hands a
    deferred row on. The caller mounts its rows with ``processor.mounter.Mounter(decoder, defer=True)`` (the decoder
    defers only rows whose values parse later exactly as now). Without this role, every ``row`` is a tuple. No
    methods.
    """


@dataclass(frozen=True, slots=True)
class TableShape:
    """A target table as its catalog shows it: ``name`` (as ``TxnSink.target_name`` gives it), its column names in
    order, and each unique key (the primary key, unique constraints and indexes) as a set of column names."""

    name: str
    columns: tuple[str, ...]
    uniques: tuple[frozenset[str], ...]

    def fits(self, schema: TableSchema) -> bool:
        """The table has exactly ``schema``'s columns, in its order, and, when ``schema`` has a key, a unique key on
        exactly those columns (the column types are not compared: a target dialect maps them its own way)."""
        return self.columns == schema.column_names and (not schema.has_key or frozenset(schema.key) in self.uniques)

    def __str__(self) -> str:
        keys = "; ".join("unique (" + ", ".join(sorted(u)) + ")" for u in self.uniques)
        return f"{self.name} ({', '.join(self.columns)}{'; ' + keys if keys else ''})"


class TableShapes(ABC):
    """A sink that reads the shape of a target table from the target's catalog, now (no cache): the Kafka consumer
    tells a replayed CREATE TABLE (the table is there, same shape) from a conflicting one."""

    @abstractmethod
    def table_shape(self, table: TableName) -> TableShape | None:
        """The target table upstream ``table`` is written to, None when the target has no such table."""


class CheckpointSink(ABC):
    """A sink that shows the changefeed's checkpoint downstream (the storage sink's ``metadata`` file, the Kafka
    sink's watermarks).

    Guarantees: the owner calls ``publish_checkpoint(ts, time)`` on an instance of its own, from a thread of its
    own (never from its control loop), each time the changefeed's checkpoint (the minimum over its spans) advances:
    every commit at or below ``ts`` is durable downstream. Only the latest value is published (calls may skip
    values, never go backwards); a failure is raised as for ``write``, logged and retried by the owner, and shown
    in the changefeed's state when it persists (docs/sinks.md). That instance gets no ``write``.
    """

    @abstractmethod
    def publish_checkpoint(self, ts: int, commit_time: float = 0.0) -> None:
        """Publish the changefeed checkpoint ``ts`` (upstream commit time ``commit_time``) downstream."""


@dataclass(frozen=True)
class BarrierApplied:
    """What :meth:`BarrierSink.apply_barrier` did: the barrier the target now shows (``barrier_ts``), the staged changes
    and pieces it applied in that call (0 when the barrier was applied already)."""

    barrier_ts: int
    changes: int = 0
    pieces: int = 0


BARRIER_FREE_DDL = frozenset({DdlKind.CREATE_TABLE, DdlKind.CREATE_INDEX, DdlKind.DROP_INDEX, DdlKind.OTHER})
"""Schema changes a staging sink (:class:`BarrierSink`) applies at once: none changes the shape of a table that staged
rows may be waiting for. Any other one waits until the target shows the barrier just before its transaction."""


def waits_for_barrier(event: DdlEvent) -> bool:
    """Whether a staging sink applies ``event`` only after the barrier just before its transaction
    (:data:`BARRIER_FREE_DDL`)."""
    return not BARRIER_FREE_DDL.issuperset(event.kinds)


class BarrierSink(ABC):
    """A sink that applies a changefeed in whole barriers (``[consistency] mode = "snapshot"``, docs/consistency.md).

    Guarantees:

    - A span's instance on which ``stage_barriers(origin)`` was called (before ``open_position``) stages each ``write``
      instead of applying it: exactly once, the staged changes and the span's position in one downstream transaction,
      invisible to readers of the target. ``apply_ddl`` on it applies a schema change that is in
      :data:`BARRIER_FREE_DDL` at once; any other one only once the target shows a barrier at or above the commit Ts
      just before the DDL's transaction (``applied_barrier``: every staged row of the old shape is then in the real
      tables), which the caller waits for (the span moves its checkpoint to just below the DDL's transaction, so the
      barrier can get there). Called before that, it refuses (``SinkError``, internal), and it refuses (``SinkError``
      naming the table, commit Ts and statement) a DDL whose transaction staged rows of the DDL's table(s) before it in
      this span: those rows have the old shape and would reach the real table with the barrier of that transaction,
      after the DDL.
    - ``apply_barrier(changefeed, origin, barrier_ts, barrier_time, history=...)`` (the coordinator: the owner's
      instance, which gets no ``write``): in ONE downstream transaction, applies every staged change of the changefeed
      at or below ``barrier_ts`` to the real tables in commit order, records the barrier (``tidewater_syncpoint``:
      barrier Ts, upstream and downstream time; earlier rows kept only with ``history``) and drops the staged changes
      it applied. The caller must pass only a barrier every span has staged up to (the changefeed checkpoint of
      a changefeed whose spans all stage). A crash or error leaves the target at the previous barrier; the same or a
      later barrier applied again finishes it. A barrier at or below the one applied does nothing. Two coordinators
      racing on one changefeed: one commits, the other rolls back with ``SinkUnavailable``. ``origin`` is the
      changefeed's start Ts: a barrier record of an earlier changefeed with the same id is not trusted.
    - ``applied_barrier(changefeed, origin)``: the barrier the target shows (0: none yet).
    """

    @abstractmethod
    def stage_barriers(self, origin: int = 0) -> None:
        """From now on ``write`` stages (see the class docstring); before ``open_position``. ``origin``: the
        changefeed's start Ts, the one its coordinator passes to ``apply_barrier`` (``apply_ddl`` reads the applied
        barrier with it)."""

    @abstractmethod
    def apply_barrier(self, changefeed: str, origin: int, barrier_ts: int, barrier_time: float, *, history: bool,
                      fence: Fence | None = None) -> BarrierApplied:
        """Make everything staged at or below ``barrier_ts`` visible at once (class docstring)."""

    @abstractmethod
    def applied_barrier(self, changefeed: str, origin: int) -> int:
        """The barrier the target shows for ``changefeed`` (0: none)."""


class WatermarkSink(ABC):
    """A sink that tells its readers, per span, how far the span is durable downstream (the Kafka sink).

    Guarantees: ``bind_span(changefeed, span, spans)`` tells the sink which span of how many it writes for, before
    ``open_position`` and the first ``write``; it may set ``watermark_interval`` (0: this binding publishes no
    watermarks). After the caller's checkpoint moved, at most every ``watermark_interval`` seconds, it calls
    ``publish_resolved(checkpoint)``: every change of the span with ``commit_ts <= checkpoint.ts`` is durable
    downstream (so, for a :class:`BufferedSink`, flushed). Calls never go backwards. Same thread as ``write``.
    """

    watermark_interval: float
    """Seconds between ``publish_resolved`` calls; 0: none (read after ``bind_span``)."""

    @abstractmethod
    def bind_span(self, changefeed: str, span: int, spans: int) -> None:
        """This sink writes for span ``span`` (0-based) of the ``spans`` spans of ``changefeed``."""

    @abstractmethod
    def publish_resolved(self, watermark: Watermark, fence: Fence | None = None) -> None:
        """Every change of the span up to ``watermark.ts`` is durable downstream; ``fence`` as for ``write``."""


class SinkOpener(Protocol):
    """How the owner and the processor get sinks: given to them by the capture (``sinks.factory.SinkFactory``), so
    that they depend on the roles only, never on the registry of sink classes."""

    def open(self, uri: str, config: SinkConfig | None = None, ddl: DdlConfig | None = None) -> TxnSink:
        """A new, unconnected sink for ``uri`` (no I/O until ``check``); ``InvalidURI`` for a URI no sink takes."""
        ...

    def supports(self, uri: str, role: type) -> bool:
        """The sink of ``uri`` implements ``role``, asked without opening one; ``InvalidURI`` as for ``open``."""
        ...
