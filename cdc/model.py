"""Typed models of everything Tidewater stores in etcd (see docs/etcd-layout.md).

Each model is a dataclass serialised with ``cdc.serde`` as JSON. Who writes what:
- ``CaptureInfo``: the capture itself, under its session lease.
- ``ChangefeedInfo``: the API (create / pause / resume / remove / update) and the owner (state, error).
- ``ChangefeedStatus``: the owner only (global resolved and checkpoint Ts; the changefeed's data warnings).
- ``SpanAssignment``: the owner only.
- ``SpanStatus``: the processor running the span (checkpoint and resolved Ts of the span, and the
  ``DataWarning``s its sink raised).
- ``VerifyHold``: ``changefeed verify`` (spark_jobs.verify_hold), read by the processors and the API.
- ``VerifyRun``: a ``changefeed verify`` job: the capture that launched it, then the job itself (its report).
"""

from __future__ import annotations

import enum
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from cdc.events import TableSchema


class FeedState(enum.StrEnum):
    NORMAL = "normal"
    WARNING = "warning"
    STOPPED = "stopped"
    FAILED = "failed"
    FINISHED = "finished"
    REMOVED = "removed"

    @property
    def runs(self) -> bool:
        """Spans of the changefeed should be running in this state."""
        return self in (FeedState.NORMAL, FeedState.WARNING)


@dataclass(frozen=True)
class RunningError:
    code: str
    message: str
    time: float = field(default_factory=time.time)
    capture_id: str = ""
    span: int = -1
    retryable: bool = True
    data_warning: bool = False  # records a divergence DataWarning (changefeed in ``warning``), not a failure


class WarningSeverity(enum.StrEnum):
    """How bad a :class:`DataWarning` is.

    ``divergence``: rows downstream may differ from upstream (the changefeed shows ``warning`` until an
    operator acts); ``notice``: something unusual happened that Tidewater repaired (for example a row
    missing downstream was re-read from the upstream) - shown, counted, but the state stays ``normal``.
    """

    DIVERGENCE = "divergence"
    NOTICE = "notice"


WARN_TABLE_INELIGIBLE = "CDC:WarnTableIneligible"
WARN_TARGET_NAME_CONFLICT = "CDC:WarnTargetNameConflict"
NOT_JOINED_WARNINGS = frozenset({WARN_TABLE_INELIGIBLE, WARN_TARGET_NAME_CONFLICT})
"""Codes of the warnings that say a table matched by the filter was left out of its span's publication. Their
condition ends when the table joins (its key fixed, the name clash excluded...): the owner drops them once an upstream
inspection finds the table published (:func:`ended_by_joining`); what the table missed meanwhile is the table copy's
or a ``CDC:WarnUnreplicatedRows`` warning's business."""


def ended_by_joining(code: str, table: str, published: frozenset[str]) -> bool:
    """Whether the warning ``(code, table)`` says ``table`` was left out of its publication, and ``published`` (the
    tables of the changefeed's publications now) shows it joined since: the warning's condition has ended."""
    return code in NOT_JOINED_WARNINGS and table in published


@dataclass(frozen=True)
class DataWarning:
    """A condition that can make (or made) the target differ from the source, per table and kind.

    Raised by sinks (``sinks.base.TxnSink.take_warnings``), by the owner's upstream watcher (rows of a newly
    added table, a target-name collision) and by the processor; stored in ``SpanStatus.warnings`` /
    ``ChangefeedStatus.warnings`` and shown by ``changefeed query``, the API and the metric
    ``tidewater_data_warnings``. Never only a log line (the first rule: never silently wrong).

    ``code`` names the kind (``CDC:WarnMissingRow``, ``CDC:WarnUnreplicatedRows``, ...), ``table`` the
    upstream table (``schema.name``), ``count`` how many rows (or events) so far, ``keys`` the first few
    keys as text (at most ``MAX_KEYS``), ``first_time``/``last_time`` when it was first and last seen.
    Two warnings with the same (code, table) merge (:meth:`merge`).
    """

    MAX_KEYS = 5

    code: str
    table: str
    message: str
    severity: WarningSeverity = WarningSeverity.DIVERGENCE
    count: int = 1
    keys: tuple[str, ...] = ()
    first_time: float = field(default_factory=time.time)
    last_time: float = 0.0

    @property
    def ident(self) -> tuple[str, str]:
        return (self.code, self.table)

    @property
    def seen(self) -> float:
        """When this warning was last raised (``last_time``, or ``first_time`` for a single occurrence)."""
        return max(self.first_time, self.last_time)

    def merge(self, later: DataWarning) -> DataWarning:
        """This warning updated by a later one of the same (code, table): counts add up, first keys kept."""
        keys = self.keys + tuple(k for k in later.keys if k not in self.keys)
        return replace(self, message=later.message, severity=later.severity, count=self.count + later.count,
                       keys=keys[: self.MAX_KEYS], first_time=min(self.first_time, later.first_time),
                       last_time=max(self.last_time, later.last_time, later.first_time))


def merge_warnings(current: tuple[DataWarning, ...], new: list[DataWarning] | tuple[DataWarning, ...],
                   limit: int = 50) -> tuple[DataWarning, ...]:
    """``current`` with ``new`` merged in by (code, table), oldest first, at most ``limit`` entries (the
    oldest go first when over; a dropped warning's table stays in the log)."""
    by_ident = {w.ident: w for w in current}
    for w in new:
        prev = by_ident.get(w.ident)
        by_ident[w.ident] = w if prev is None else prev.merge(w)
    merged = sorted(by_ident.values(), key=lambda w: w.first_time)
    return tuple(merged[-limit:])


@dataclass(frozen=True)
class CaptureInfo:
    id: str
    advertise_addr: str
    version: str
    start_time: float
    pid: int = 0
    draining: bool = False


@dataclass(frozen=True)
class SpanInfo:
    """A span's fixed upstream resources, created with the changefeed."""

    index: int
    slot: str
    publication: str
    start_ts: int = 0


@dataclass(frozen=True)
class ChangefeedInfo:
    id: str
    upstream_uri: str
    sink_uri: str
    config: dict[str, Any]
    start_ts: int
    start_time: float
    create_time: float
    spans: tuple[SpanInfo, ...] = ()
    target_ts: int = 0
    state: FeedState = FeedState.NORMAL
    error: RunningError | None = None
    state_since: float = 0.0  # when the current state (or first error of a warning streak) began
    backoff_until: float = 0.0  # warning: spans are not rescheduled before this time
    retries: int = 0
    released: bool = False  # slots dropped after gc-ttl: the changefeed can never resume
    resumed_at: float = 0.0  # span errors older than this (the last create/resume) are history
    # the existing rows are copied before the spans stream ([snapshot] mode = "initial" at create; changefeeds
    # created before the snapshot existed have False)
    initial_copy: bool = False
    # table copies requested and not yet served by their span (the owner drops them once served)
    table_copies: tuple[TableCopy, ...] = ()
    table_copy_seq: int = 0  # the last TableCopy.request given (never reused: a span compares against it)

    def with_state(self, state: FeedState, *, error: RunningError | None = None, now: float | None = None,
                   **changes: Any) -> ChangefeedInfo:
        return replace(self, state=state, error=error, state_since=time.time() if now is None else now,
                       **changes)


@dataclass(frozen=True)
class ChangefeedStatus:
    checkpoint_ts: int = 0
    checkpoint_time: float = 0.0
    resolved_ts: int = 0
    resolved_time: float = 0.0
    updated: float = 0.0
    retained_wal: dict[str, int] = field(default_factory=dict)  # span index -> WAL bytes its slot retains
    # The changefeed's data warnings not yet acknowledged (raised after ``ChangefeedInfo.resumed_at``): every
    # span's ``SpanStatus.warnings`` merged with the owner's own ``upstream_warnings``. What query/API/metrics show.
    warnings: tuple[DataWarning, ...] = ()
    # The owner's own warnings (upstream watch: unreplicated rows of a picked-up table, ineligible tables, ...),
    # kept here so that they survive owner changes; one per (code, table), refreshed by each inspection.
    upstream_warnings: tuple[DataWarning, ...] = ()
    # The lowest ``SpanStatus.hold_ts`` of its spans (0: none): while a table copy runs, the checkpoint the owner
    # publishes to the sink (Kafka watermarks, the storage sink's ``metadata``) stays at or below it
    hold_ts: int = 0
    hold_time: float = 0.0
    # [consistency] mode = "snapshot": the latest barrier the owner's coordinator applied downstream (what readers of
    # the target see; docs/consistency.md) and its upstream commit time; carried by the owner's next status write
    barrier_ts: int = 0
    barrier_time: float = 0.0


@dataclass(frozen=True)
class SpanAssignment:
    """Which capture runs a span. ``epoch`` is bumped on every (re)assignment and fences stale
    processors. ``stopping`` is the first phase of a move (rebalance, drain): the holder must stop the
    span and report ``running=False`` for this epoch before the owner assigns it elsewhere."""

    capture_id: str
    epoch: int
    stopping: bool = False


@dataclass(frozen=True)
class SpanSnapshot:
    """The initial copy of a span's existing rows (docs/snapshot.md), kept in its :class:`SpanStatus`.

    ``phase``: ``"copying"`` until every table is copied, then ``"done"`` (the span streams only then).
    ``exports``: ``(snapshot name, Ts)`` of every exported snapshot a copy run read under, in order, recorded
    *before* the run may write a row. ``floors``: per table (``schema.table``), the Ts at or below which its
    changes are already in the copy and are not applied again (keyed tables: the first export's Ts, so every
    change after any chunk's snapshot is replayed, idempotently; a key-less table: the Ts of the one snapshot
    its whole copy was read under -- the Ts its ``ChunkDone`` records, which must be one export here together with
its name -- so not one of its rows is applied twice). ``oids``: each of those tables' relation oid, by which the
    stream finds its floor whatever the table is called by then (a rename inside the copy's window).

    ``tables``: the tables this copy covers; empty for the initial copy (every table of the span), else the
    tables of a *table copy* (:class:`TableCopy`: a table that joined with rows, or a resync), which runs while
    the span streams its other tables. ``request``: the highest :attr:`TableCopy.request` the span took up.
    """

    phase: str = "copying"
    exports: tuple[tuple[str, int], ...] = ()
    floors: dict[str, int] = field(default_factory=dict)
    tables: tuple[str, ...] = ()
    request: int = 0
    # per keyed table whose chunks were read under a snapshot later than its floor: the highest of their Ts. Its
    # changes in (floor, ceiling] are replayed over rows that may already be newer, one transaction per write
    # (processor.batcher). A table whose stream may leave values unsent (cdc.snapshot.may_leave_values_unsent) never
    # has one: it is copied again whole under one snapshot instead (processor.snapshot)
    ceilings: dict[str, int] = field(default_factory=dict)
    # per table of ``floors`` (and ``ceilings``): its relation oid at the snapshot its copy was read under. The stream
    # finds a change's floor by the oid its Relation message carries, so a table renamed (ALTER TABLE .. RENAME,
    # SET SCHEMA) inside its copy's window keeps its floor (processor.floors). A table without one here (records
    # stored before oids were) is found by name
    oids: dict[str, int] = field(default_factory=dict)
    # ``[snapshot] on-existing-rows = "merge"``: the tables whose target already held rows when the copy began
    # (recorded by the first run, before it writes). After the copy their target rows are counted against the
    # upstream's (processor.merged_rows): rows the upstream does not have stay, and the changefeed says so
    merged: tuple[str, ...] = ()
    # a table copy's tables that its first run found renamed (ALTER TABLE .. RENAME, SET SCHEMA) since they were asked
    # for: the name asked for -> the name at the first export ``B``, which the stream has given the target by then. A
    # later run that finds the table under yet another name knows the stream still holds that rename (above ``B``):
    # the target under this name is removed and the table copied under its new one (processor.snapshot)
    names: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class TableCopy:
    """A request to copy one table's existing rows while its span goes on streaming (docs/snapshot.md, "Table
    copies"): ``reason`` ``"joined"`` (the owner added a table that already held rows to the span's publication)
    or ``"resync"`` (``cdc cli changefeed snapshot --table``). ``request`` increases with every request of the
    changefeed; the span serves every request up to the one in its ``SpanSnapshot.request``. ``oid``: the table's
    relation oid when it was asked for (0: unknown), by which the span finds it if it is renamed before its copy
    takes it up (docs/snapshot.md, "A table renamed while it is copied")."""

    table: str
    span: int
    request: int
    reason: str = "resync"
    requested_at: float = 0.0
    oid: int = 0


@dataclass(frozen=True)
class SpanStatus:
    capture_id: str
    epoch: int
    checkpoint_ts: int = 0
    checkpoint_time: float = 0.0
    resolved_ts: int = 0
    resolved_time: float = 0.0
    running: bool = False
    error: RunningError | None = None
    rows: int = 0  # rows written to the sink by this span since it started on this capture
    updated: float = 0.0
    warnings: tuple[DataWarning, ...] = ()  # data warnings of this span (see DataWarning), merged
    snapshot: SpanSnapshot | None = None  # the initial copy (None: the changefeed has none, or not started)
    # While a table copy of the span runs (docs/snapshot.md, "Table copies"): watermarks downstream, the span's and
    # the changefeed's published checkpoint, stay at or below this Ts (its copied rows are not all written yet);
    # 0: no such limit
    hold_ts: int = 0
    hold_time: float = 0.0
    # While the span waits at a changefeed barrier (docs/ddl.md, "Changefeed barrier"), or in snapshot mode for the
    # barrier before a DDL (docs/consistency.md, "Schema changes in snapshot mode"): the commit Ts and the position in
    # its transaction (DdlEvent.seq; -1: no position known, DdlEvent.seq_local) of the DDL it waits to apply. It has
    # written everything before that commit Ts and applied every DDL of its own before that one (covered_ts). 0: not
    # waiting.
    barrier_ts: int = 0
    barrier_seq: int = 0
    # The verify hold this span obeys (docs/verify.md, "The hold"): ``held_id`` the VerifyHold.id, ``held_ts`` the
    # commit Ts up to which it applied everything and then stopped applying (its checkpoint). 0: not holding.
    held_id: int = 0
    held_ts: int = 0
    # The upstream's own resume position after checkpoint_ts (upstream.base.SpanSource.resume_token: opaque here;
    # MySQL/MariaDB: the GTID state and binlog file/position, upstream/mysql/resume.py), always the one of this
    # checkpoint_ts; None: the upstream needs none, or a status stored before tokens existed
    resume_token: str | None = None

    @property
    def covered_ts(self) -> int:
        """Every transaction of the span with a commit Ts at or below this is durable downstream: its checkpoint, or,
        while it waits at a barrier at commit Ts ``B`` (``barrier_ts``; it wrote everything before ``B`` first),
        ``B - 1``. The changefeed checkpoint and the changefeed barrier's rule count this; the span's own restart
        point stays ``checkpoint_ts``: ``B - 1`` is inside ``B``'s commit record, and PostgreSQL skips a transaction
        whose commit record starts before the point a slot is read from, so a span restarted from ``B - 1`` would
        lose ``B``."""
        return max(self.checkpoint_ts, self.barrier_ts - 1) if self.barrier_ts else self.checkpoint_ts


@dataclass(frozen=True)
class VerifyHold:
    """``changefeed verify`` asks the changefeed's spans to stop applying (docs/verify.md, "The hold").

    ``ts`` 0 (first phase): every span stops applying where it is (after its current downstream transaction); ``ts``
    > 0 (second phase): every span applies everything up to commit Ts ``ts``, nothing after it, and waits. Reading
    the upstream and sorting go on; no slot is confirmed past the span's checkpoint. Each span reports the hold it
    obeys in ``SpanStatus.held_id``/``held_ts`` once it holds. ``deadline`` (unix time): after it the hold is ignored
    (a verifier that died never stops a changefeed for longer); deleting the key releases it at once. ``id``: a new
    one per verification (a span never mistakes a later hold's phase for an earlier one); ``holder``: who holds it
    (host, pid), for ``changefeed query``."""

    id: int
    deadline: float
    ts: int = 0
    holder: str = ""
    created: float = 0.0

    def active(self, now: float) -> bool:
        return now < self.deadline


@dataclass(frozen=True)
class SchemaVersion:
    """One table's schema from commit Ts ``ts`` on; ``schema`` None: the table was dropped at ``ts``. ``span``: the
    index of the span that replicated the table from ``ts`` on (-1: not recorded, versions stored before it was)."""

    ts: int
    schema: TableSchema | None
    span: int = -1


@dataclass(frozen=True)
class SchemaHistory:
    """The schemas one upstream table (``relid``, stable across renames) had over time, for one changefeed:
    stored in etcd so that a span restarted from an old checkpoint knows each table's schema *at* that
    checkpoint (docs/ddl.md, "Schema history"). ``versions`` are sorted by ``ts``, at most one per ``ts``
    (the last schema a transaction left)."""

    relid: int
    versions: tuple[SchemaVersion, ...] = ()

    def as_of(self, ts: int) -> TableSchema | None:
        """The schema valid at commit Ts ``ts`` (after every version with ``ts`` <= it), None if unknown or
        dropped."""
        found: TableSchema | None = None
        for v in self.versions:
            if v.ts > ts:
                break
            found = v.schema
        return found

    def span_as_of(self, ts: int) -> int:
        """The span that replicated the table at commit Ts ``ts`` (that of the version valid then); -1 if unknown."""
        found = -1
        for v in self.versions:
            if v.ts > ts:
                break
            found = v.span
        return found

    def with_version(self, ts: int, schema: TableSchema | None, keep_after: int, span: int = -1) -> SchemaHistory:
        """This history plus ``schema`` at ``ts`` as span ``span`` saw it (replacing one at the same ``ts``), without
        what no restart can need any more: of the versions at or below ``keep_after`` (the span's stored checkpoint)
        only the last is kept."""
        versions = sorted([v for v in self.versions if v.ts != ts] + [SchemaVersion(ts, schema, span)],
                          key=lambda v: v.ts)
        old = [v for v in versions if v.ts <= keep_after]
        return SchemaHistory(self.relid, tuple(old[-1:] + [v for v in versions if v.ts > keep_after]))

    @property
    def gone(self) -> bool:
        """Only a drop remains: no restart can need this table's schema."""
        return len(self.versions) == 1 and self.versions[0].schema is None


def still_copying(info: ChangefeedInfo, statuses: Mapping[int, SpanStatus | None]) -> bool:
    """Whether changefeed ``info`` still copies the rows that existed at its creation: it was created with an
    initial copy and a span has not stored its copy as ``done`` (or has not reported at all)."""
    return any(span_copying(info, statuses.get(s.index)) for s in info.spans)


def span_copying(info: ChangefeedInfo, status: SpanStatus | None) -> bool:
    """Whether one span of ``info`` still copies: an initial copy not stored as ``done`` in its status (or no
    status reported yet). A table copy (``SpanSnapshot.tables``) does not count: the span streams meanwhile."""
    if not info.initial_copy:
        return False
    snap = status.snapshot if status is not None else None
    return snap is None or (snap.phase != "done" and not snap.tables)


def pending_table_copies(info: ChangefeedInfo, span: int, status: SpanSnapshot | None) -> tuple[TableCopy, ...]:
    """The table copies of span ``span`` that it has not taken up yet (``request`` above its snapshot's)."""
    served = status.request if status is not None else 0
    return tuple(c for c in info.table_copies if c.span == span and c.request > served)


VERIFY_RUNNING = "running"
VERIFY_DONE = "done"
VERIFY_FAILED = "failed"


@dataclass(frozen=True)
class VerifyRun:
    """One ``changefeed verify`` job (docs/verify.md): ``state`` ``running``, then ``done`` with ``report`` (a
    ``cdc.verify.VerifyReport`` as a dict; its own ``error`` when it could not compare) or ``failed`` with ``error``
    (the job process died before it wrote a report). ``phase``, ``chunks_done``/``chunks``: progress of its comparison;
    ``capture``: the capture that launched it (it can stop it)."""

    id: str
    state: str = VERIFY_RUNNING
    started: float = 0.0
    finished: float = 0.0
    tables: tuple[str, ...] = ()
    capture: str = ""
    chunks: int = 0
    chunks_done: int = 0
    report: dict[str, Any] | None = None
    error: str = ""
    # what the job does now: "holding" (the changefeed), "checksums", "drill-down" (chunks_done of chunks); and the
    # rows of the tables planned (for a rate and an ETA)
    phase: str = ""
    rows: int = 0
