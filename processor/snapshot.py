"""The initial copy of a span's existing rows, run by its :class:`processor.span.SpanRunner` before it streams.

Protocol (docs/snapshot.md, "The copy and the stream"):

1. The span's slot was created by ``changefeed create`` at Ts ``S`` and is not read during the copy.
2. Each copy run takes a fresh exported snapshot of the upstream (:meth:`upstream.base.Upstream.export_snapshot`)
   at Ts ``C`` >= ``S`` and records ``(name, C)`` in the span's status (:class:`cdc.model.SpanSnapshot`)
   *before* the job may write a row, then has the :class:`CopyLauncher` (the Spark job, launched by the
   capture) copy every table chunk not yet recorded as done, under that snapshot.
3. When the job succeeds, the run fence is removed (a process of the job that outlived it commits nothing
   more), every table whose key the copy deferred must have it built (else ``SinkError``: never streamed without
   its key; such a table counts as pending, so the next run's job builds it), each table gets its *floor* and
   the span's snapshot is ``done`` (after the copy is announced to the sink's readers: ``announce``, a Kafka sink's
   consumers check that every chunk arrived): the span streams from its checkpoint ``S``, and a change of a table at or below its floor is dropped, being in the copy already.

Floors: a keyed table's chunks may have been copied under several snapshots (a run died and another took a new
snapshot): its floor is the Ts of the export its plan was made under (the *first* run's, unless the table was
planned in a later run: new, or copied again because its columns or key changed), so every change after any
chunk's snapshot is applied again in commit order, which converges because rows are upserted and deleted by key. A key-less table is copied whole
under one snapshot (its single chunk replaces the table's rows), and its floor is exactly that snapshot's Ts, so
not one of its rows is applied twice: the Ts its ``ChunkDone`` records, checked to be one of the span's exports
together with the snapshot name (names repeat after an upstream restart); a record that is not one export is
refused (:class:`cdc.errors.SnapshotPositionUnknown`) and dropped, so the next run copies the table again.

Guarantees: nothing is written downstream by the span itself during the copy; a stop request ends the job and
returns promptly (:class:`CopyStopped`); every failure is a ``TidewaterError`` naming what to fix.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from cdc.errors import (
    InvalidArgument,
    SinkError,
    SnapshotPositionUnknown,
    SnapshotTableChanged,
    TidewaterError,
)
from cdc.events import TableName, TableSchema
from cdc.meta.snapshot_progress import SnapshotProgressStore
from cdc.model import ChangefeedInfo, SpanInfo, SpanSnapshot
from cdc.snapshot import (
    KEY_DEFERRED,
    ChunkDone,
    CopiedChunk,
    TablePlan,
    may_leave_values_unsent,
    table_definition,
)
from cdc.ts import Watermark
from processor.merged_rows import MergedRows
from upstream.base import Upstream, planned_schema

log = logging.getLogger(__name__)


RestartTarget = Callable[[TableSchema, int, float], None]
"""``restart(schema, ts, time)``: remove what earlier runs copied of ``schema``'s table downstream, so that its copy
starts over under the definition ``schema`` (``CopyTargets.restart_copy_target``; ``ts``/``time``: the current export)."""

Announce = Callable[[Sequence[CopiedChunk]], None]
"""``announce(chunks)``: the copies of the tables of ``chunks`` are complete, these being all their chunks as recorded
(``CopyAnnouncer.announce_copy``: a Kafka sink tells its consumers, who check that every chunk arrived)."""

PLAN_READERS = 4
"""Upstream connections that plan a span's new tables in parallel (each imports the run's exported snapshot)."""

JOIN_POLL = 0.2
"""Seconds between a table copy's looks at its span's publication while it waits for a table to join it."""
JOIN_SLACK = 10.0
"""Seconds a table copy waits for a table to join its publication beyond the owner's looks (:func:`join_wait`)."""


def join_wait(upstream_check_interval: float) -> float:
    """How long a table copy waits, quietly, for a table of it to join the span's publication
    (:meth:`InitialCopy._joined`): two of the owner's looks at the upstream (``upstream-check-interval``: an add that
    waited in vain for the table's writers is tried again at the next look) and :data:`JOIN_SLACK` for a slow host."""
    return 2 * upstream_check_interval + JOIN_SLACK


class CopyStopped(TidewaterError):
    """The span was asked to stop (pause, move, remove) during its copy: the job was ended."""

    code = "CDC:ErrSnapshotStopped"
    retryable = True


class CopyIncomplete(TidewaterError):
    """The copy job ended successfully, yet a planned chunk is not recorded as copied: never streamed over (the
    table would be short downstream); the next run copies what is left."""

    code = "CDC:ErrSnapshotIncomplete"
    retryable = True


class TableCopyWaiting(TidewaterError):
    """A table copy names a table that exists upstream but is not in its span's publication yet, and did not join it
    within the copy's ``join_wait`` (:meth:`InitialCopy._joined`)."""

    code = "CDC:ErrTableCopyWaiting"
    retryable = True


@dataclass(frozen=True)
class CopyRequest:
    """One run of the copy job for one span: what to copy from where to where, under which snapshot."""

    changefeed: str
    span: int
    upstream_uri: str
    sink_uri: str
    tables: tuple[TableName, ...]
    snapshot: str  # the exported snapshot every reader imports
    commit_ts: int  # its Ts: stamped on every copied row
    commit_time: float
    chunk_rows: int
    spark_master: str
    local: bool = False  # small enough to copy without starting Spark (in the job's own process)
    sink_config: dict[str, Any] = field(default_factory=dict)  # the changefeed's [sink] (e.g. Kafka dispatchers)
    # the initial copy (not a table copy, not merge): a keyed table whose target does not exist yet may be created
    # without its key, built after the load (docs/snapshot.md, "The key after the load")
    defer_keys: bool = False
    # the span's start Ts: the copy records the target tables it fills as the span's (``SnapshotJob.origin``)
    origin: int | None = None


Truncate = Callable[[Sequence[TableSchema], Watermark], None]
"""A table copy's emptying of targets before it copies (``CopyTargets.truncate_targets``): the tables' schemas and the run's
snapshot (its rows carry that commit Ts)."""


class CopyLauncher(Protocol):
    """Runs the copy job for a request and returns when it finished: raises a ``TidewaterError`` saying why it
    failed, or :class:`CopyStopped` after ending it when ``stop`` was set. The capture provides it (the Spark
    job is launched as a process of its own)."""

    def __call__(self, request: CopyRequest, stop: threading.Event) -> None: ...

    def prepare(self, changefeed: str, span: int, sink_uri: str = "") -> None:
        """A request for the span (into ``sink_uri``) is likely to come soon: start what it needs (a process) ahead
        of it. The caller calls :meth:`discard` when it makes no request after all."""

    def discard(self, changefeed: str, span: int) -> None:
        """No request is coming after :meth:`prepare`: free what it started."""


class StreamGate(Protocol):
    """The streaming span a table copy runs beside (``processor.span.SpanRunner``, through its
    :class:`processor.table_hold.TableHold`)."""

    def pass_up_to(self, boundary: int, drop: Mapping[str, int], oids: Mapping[str, int] | None = None) -> None:
        """Let the copied tables' changes at or below ``boundary`` pass (those at or below ``drop[table]``: drop;
        ``oids``: those tables' relation oids, by which the hold finds them)."""

    def caught_up(self, boundary: int) -> bool:
        """Everything the span streams up to ``boundary`` is written downstream (or it waits before a copied
        table's change above it, everything before that written)."""


class InitialCopy:
    """The copy phase of one span (see the module doc). ``persist(state)`` must store the span's snapshot state
    durably (the span's status, under the processor's guard) before returning; ``state`` is what is stored.

    A *table copy* (``state.tables`` not empty: docs/snapshot.md, "Table copies") copies only those tables, while
    the span streams (``gate``): each run exports its snapshot, lets the tables' changes up to the first run's
    snapshot ``B`` pass, waits until the span has written them, empties the targets of the keyed tables it plans
    now (``truncate``; a key-less table's single chunk replaces its rows anyway), then copies. The floors are the
    initial copy's, ``B`` being the first export.

    A table whose columns or key at this run's snapshot differ from those it was planned with (an ``ALTER TABLE``
    upstream between two runs) is copied again from the start under this run's snapshot: ``restart_target`` removes
    its target (and what the copy kept there), its records go, and it is planned anew; its floor is then this run's
    Ts. With ``merge`` (the target holds the user's rows) that is refused: :class:`SnapshotTableChanged`."""

    def __init__(self, info: ChangefeedInfo, span: SpanInfo, upstream: Upstream, progress: SnapshotProgressStore,
                 launcher: CopyLauncher, persist: Callable[[SpanSnapshot], None], state: SpanSnapshot | None,
                 *, chunk_rows: int, spark_master: str, label: str, spark_min_rows: int = 0,
                 truncate: Truncate | None = None, defer_keys: bool = False,
                 restart_target: RestartTarget | None = None, merge: bool = False,
                 merged_rows: MergedRows | None = None, announce: Announce | None = None,
                 resume: str | None = None, join_wait: float = 0.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.info = info
        self.resume = resume  # the span's resume token at its start: the exports are numbered as its stream's Ts
        self.span = span
        self.upstream = upstream
        self.progress = progress
        self.launcher = launcher
        self.persist = persist
        self.state = state if state is not None else SpanSnapshot()
        self.ceilings: dict[str, int] = dict(self.state.ceilings)  # (set when the copy is done)
        self.oids: dict[str, int] = dict(self.state.oids)  # each floor's relation oid (set when the copy is done)
        self.chunk_rows = chunk_rows
        self.spark_master = spark_master
        self.spark_min_rows = spark_min_rows
        self.label = label
        self.truncate = truncate
        self.defer_keys = defer_keys and truncate is None
        self.restart_target = restart_target
        self.merge = merge or merged_rows is not None
        self.merged_rows = merged_rows  # merge: counts the rows kept that the upstream does not have (after the copy)
        self.announce = announce
        self.join_wait = join_wait  # a table copy: how long it waits for a table of it to join the publication
        self.clock = clock

    def __call__(self, stop: threading.Event, gate: StreamGate | None = None) -> dict[str, int]:
        """Copy what is left; return the floors (table -> Ts) once the span's snapshot is done. ``gate``: the
        span streams meanwhile (a table copy)."""
        if self.state.phase == "done":
            return dict(self.state.floors)
        tables = self._span_tables()
        kept: dict[str, int] = {}
        orphans: dict[int, TableName] = {}
        now: dict[str, str] = {}
        if self.state.tables:  # a table copy: the tables asked for that the span still publishes
            wanted = set(self.state.tables)
            tables, now = self._joined(wanted, tables, stop)
            for old, name in sorted(now.items()):
                log.warning("span=%s table %s (relation oid %d) to be copied is called %s now: copied under that "
                            "name", self.label, old, self.state.oids.get(old, 0), name)
            tables = [t for t in tables if str(t) in wanted or str(t) in now.values()]
            kept = {k: v for k, v in self.state.floors.items()
                    if k not in wanted and k not in now.values() and k not in self.state.names.values()}
            orphans = self._renamed_after_boundary(now)
            if not self.state.exports:  # the first run: the names the stream gives the targets up to B
                self.state = dataclasses.replace(self.state, names=now)
        elif self.state.exports:  # a later run of the initial copy
            tables = self._keep_renamed(tables)
        if tables:
            self.launcher.prepare(self.info.id, self.span.index, self.info.sink_uri)  # it starts while this one plans
            try:
                self._run(tables, kept, stop, gate, orphans)
            finally:
                self.launcher.discard(self.info.id, self.span.index)  # (unused: nothing was left to copy, or a failure)
            self._check_all_copied(tables)
        self.check_keys_built(tables)
        floors = {**kept, **self._forgetting_unplaced(self.floors, tables)}
        if self.announce is not None and tables:  # before the span streams (or releases its hold)
            self.announce(self.copied_chunks(tables))
        kept_ceilings = {k: v for k, v in self.state.ceilings.items() if k in kept}
        self.ceilings = {**kept_ceilings, **self.chunk_ceilings(tables, floors)}
        self.oids = {**{k: v for k, v in self.state.oids.items() if k in kept}, **self.table_oids(tables)}
        self.state = dataclasses.replace(self.state, phase="done", floors=floors, ceilings=self.ceilings,
                                         oids=self.oids)
        self.persist(self.state)
        log.info("span=%s initial copy done: %d table(s); streaming from checkpoint", self.label, len(tables))
        return floors

    def _run(self, tables: Sequence[TableName], kept: dict[str, int], stop: threading.Event,
             gate: StreamGate | None, orphans: Mapping[int, TableName] | None = None) -> None:
        """One copy run: export a snapshot, record it, plan, and have the launcher copy what is left under it."""
        with self.upstream.export_snapshot(label=self.label, resume=self.resume) as exp:
            merged = self.state.merged
            if self.merged_rows is not None and not self.state.exports and not self.state.tables:
                merged = self.merged_rows.holding_rows(tables)  # the first run, before it writes a row
            self.state = dataclasses.replace(self.state, phase="copying",
                                             exports=(*self.state.exports, (exp.name, exp.ts)), floors=kept,
                                             merged=merged)
            self.persist(self.state)  # before any row is written under it
            if gate is not None:
                self._catch_up(gate, tables, stop)
            pending, rows = self.plan_tables(tables, exp.name, exp.ts, exp.time, orphans)
            if pending:
                request = CopyRequest(self.info.id, self.span.index, self.info.upstream_uri, self.info.sink_uri,
                                      tuple(pending), exp.name, exp.ts, exp.time, self.chunk_rows,
                                      self.spark_master, local=rows < self.spark_min_rows,
                                      sink_config=dict(self.info.config.get("sink") or {}),
                                      defer_keys=self.defer_keys and gate is None, origin=self.span.start_ts)
                log.info("span=%s copying %d table(s) under snapshot %s (Ts %d)", self.label, len(pending),
                         exp.name, exp.ts)
                try:
                    self.launcher(request, stop)
                except BaseException:
                    # Spark's Python workers may outlive the job: fence them out, so no chunk commits after
                    # a stop (pause, move, remove) or a failure; the next run starts a new fence anyway
                    self.progress.end_run(self.info.id, self.span.index)
                    raise
            self._check_merged(tables, exp.name, exp.ts)
        self.progress.end_run(self.info.id, self.span.index)  # a late process of the job commits nothing more

    def _check_merged(self, tables: Sequence[TableName], snapshot: str, ts: int) -> None:
        """Merge: every chunk is copied; count the rows kept in the targets that held rows (processor.merged_rows),
        under this run's snapshot, before the span streams. A table is counted exactly when it was planned and all its
        chunks read under this snapshot; the warnings are stored with the span's ``done`` state."""
        held = sorted(set(self.state.merged) & {str(t) for t in tables})
        if self.merged_rows is None or not held:
            return
        cf, span = self.info.id, self.span.index
        exact: set[str] = set()
        schemas: dict[str, TableSchema] = {}
        with self.upstream.snapshot_reader(snapshot, label=self.label) as reader:
            for name in held:
                t = TableName.parse(name)
                schemas[name] = reader.table_schema(t)
                reader.release()
                plan = self.progress.get_plan(cf, span, t)
                if plan is not None and plan.ts == ts and all(
                        d.commit_ts == ts for d in self.progress.done_chunks(cf, span, t).values()):
                    exact.add(name)
            self.merged_rows.check(reader, schemas, exact)

    def _keep_renamed(self, tables: Sequence[TableName]) -> list[TableName]:
        """A later run of the initial copy: ``tables`` (the span's, by their names now), a table renamed since an
        earlier run planned it (``ALTER TABLE .. RENAME``, ``SET SCHEMA``; found by the plan's relation oid) given
        back its planned name where its copy can go on as planned. That is a keyed table whose definition is still
        the plan's and whose replay carries every value (not :func:`cdc.snapshot.may_leave_values_unsent`), outside
        ``merge``: its chunks left are read by oid under this run's snapshot into the target of the planned name, its
        floor stays the plan's Ts (below the rename), and the stream replays the rename over it, as any change after
        a chunk's snapshot ("A chunk read at a later snapshot converges"). The copy so writes no name the table took
        after its plan, and does not run ahead of another span's changefeed barrier at the rename (docs/ddl.md).
        Any other such table keeps its new name: it is copied again whole under it (:meth:`_forget_renamed`)."""
        cf, span = self.info.id, self.span.index
        names = {str(t) for t in tables}
        orphans = {p.oid: p for p in self.progress.all_plans(cf, span).values()
                   if p.oid and str(p.table_name) not in names}
        if not orphans:
            return list(tables)
        out: list[TableName] = []
        for t in tables:
            plan = None if self.progress.get_plan(cf, span, t) is not None else self._adoptable(t, orphans)
            if plan is not None:
                log.warning("span=%s table %s was renamed to %s since its copy was planned (relation oid %d): its "
                            "copy goes on as planned, under its planned name; the stream renames the target",
                            self.label, plan.table_name, t, plan.oid)
                out.append(plan.table_name)
            else:
                out.append(t)
        return sorted(out, key=str)

    def _adoptable(self, t: TableName, orphans: Mapping[int, TablePlan]) -> TablePlan | None:
        """The plan of ``orphans`` made for table ``t`` under its earlier name, if its copy can go on under it
        (:meth:`_keep_renamed`); else None."""
        if self.merge:
            return None
        try:
            schema = self.upstream.table_schema(t)
        except InvalidArgument:
            return None  # (gone meanwhile)
        plan = orphans.get(schema.relation_id)
        if (plan is None or not plan.has_key or not plan.definition or plan.definition != table_definition(schema)
                or self._values_may_be_unsent(schema)):
            return None
        return plan

    def _values_may_be_unsent(self, schema: TableSchema) -> bool:
        """:func:`cdc.snapshot.may_leave_values_unsent`, unless the upstream's stream always sends whole rows
        (``Upstream.sends_whole_rows``: MySQL/MariaDB), whose half-copied tables go on chunk by chunk."""
        return not self.upstream.sends_whole_rows and may_leave_values_unsent(schema)

    def _renamed_after_boundary(self, now: Mapping[str, str]) -> dict[int, TableName]:
        """A later run of a table copy: the tables of ``now`` (asked name -> name now) whose name at the first export
        ``B`` (:attr:`SpanSnapshot.names`, else the name asked for) is not their name now, by relation oid, with that
        name. They were renamed after ``B``: the hold keeps that rename back, so their target downstream still has the
        name of ``B`` (and what an earlier run copied into it); each is copied under its new name and this run's
        snapshot, whose floor drops the held rename, so the old target is removed first (:meth:`_forget_renamed`)."""
        out: dict[int, TableName] = {}
        if not self.state.exports:
            return out
        for asked, name in now.items():
            then = self.state.names.get(asked, asked)
            oid = self.state.oids.get(asked, 0)
            if then != name and oid:
                out[oid] = TableName.parse(then)
        return out

    def _span_tables(self) -> list[TableName]:
        tables = self.upstream.span_tables(self.span)
        if tables is None:
            raise InvalidArgument(f"span {self.label}: its publication {self.span.publication!r} no longer exists "
                                  "upstream; the changefeed cannot copy or stream: remove it and create it again")
        return tables

    def _joined(self, wanted: set[str], tables: list[TableName],
                stop: threading.Event) -> tuple[list[TableName], dict[str, str]]:
        """A table copy of ``wanted``, whose span publishes ``tables``: the span's tables once every table of
        ``wanted`` is published (under its name, or under the name it was renamed to: the second value,
        :meth:`_renamed_since`), dropped upstream, or ``join_wait`` seconds have passed.

        A table that exists upstream but is not in the publication yet is waited for, quietly (the span streams its
        other tables meanwhile, and the copy's hold holds nothing of a table it does not publish): the owner asks for
        a joining table's copy just *before* it adds the table (so that an owner dying in between leaves the request
        behind), and the add waits for the table's writers, or is deferred to the owner's next look; a span that
        takes the copy up meanwhile must not fail for it (docs/snapshot.md, "Table copies"). A table still out after
        ``join_wait``: :class:`TableCopyWaiting` (retryable; the changefeed shows it, and the owner's warnings say
        why a table is not added)."""
        deadline = self.clock() + self.join_wait
        waited: list[str] = []
        while True:
            published = {str(t) for t in tables}
            now = self._renamed_since(wanted - published, published)
            out = self._not_published(wanted - published - set(now))
            if not out:
                if waited:
                    log.info("span=%s: %s joined publication %s; the table copy goes on", self.label,
                             ", ".join(waited), self.span.publication)
                return tables, now
            if self.clock() >= deadline:
                raise TableCopyWaiting(
                    f"span {self.label}: table {out[0]} is to be copied but is not in publication "
                    f"{self.span.publication} yet (waited {self.join_wait:g}s); the copy starts once the owner has "
                    "added it (if it stays out, see the changefeed's warnings for why it is not eligible)")
            if not waited:
                log.info("span=%s: the table copy waits up to %gs for %s to join publication %s (the owner adds a "
                         "joining table right after asking for its copy)", self.label, self.join_wait,
                         ", ".join(out), self.span.publication)
                waited = out
            if stop.wait(JOIN_POLL):
                raise CopyStopped(f"span {self.label} stopped while its table copy waited for {', '.join(out)} to "
                                  "join its publication")
            tables = self._span_tables()

    def _renamed_since(self, missing: set[str], published: set[str]) -> dict[str, str]:
        """Of a table copy's tables that the span no longer publishes under the name they were asked for: those
        renamed since (``ALTER TABLE .. RENAME``, ``SET SCHEMA``), found by the relation oid recorded when the copy
        was asked for or taken up (:attr:`SpanSnapshot.oids`), with the name the span publishes them under now: they
        are copied under it (the hold holds them by oid). A table renamed out of the span's publication, or whose oid
        is not known: left to :meth:`_not_published`."""
        out: dict[str, str] = {}
        for old in sorted(missing):
            oid = self.state.oids.get(old, 0)
            if not oid:
                continue
            try:
                name = str(self.upstream.table_schema(oid).name)
            except InvalidArgument:
                continue  # gone upstream
            if name in published:
                out[old] = name
        return out

    def _not_published(self, missing: set[str]) -> list[str]:
        """Of a table copy's tables that the span does not publish: those not added yet (they exist upstream under
        that name), not those dropped since (nothing to copy: the stream replays the DROP)."""
        out: list[str] = []
        for name in sorted(missing):
            try:
                self.upstream.table_schema(TableName.parse(name))
            except InvalidArgument:
                continue  # gone upstream: nothing to copy
            out.append(name)
        return out

    def _catch_up(self, gate: StreamGate, tables: Sequence[TableName], stop: threading.Event) -> None:
        """A table copy's run, before it plans: the span writes the copied tables' changes up to the first
        export ``B`` (a key-less table whose copy is already committed: drops those up to its snapshot), then
        holds back the rest; once it has written everything up to ``B``, no change of theirs at or below ``B``
        is written any more by this run, and their copy may begin."""
        first = self.state.exports[0][1]
        gate.pass_up_to(first, self._forgetting_unplaced(self._copied_keyless, tables), self.table_oids(tables))
        while not gate.caught_up(first):
            if stop.wait(0.1):
                raise CopyStopped(f"span {self.label} stopped while its table copy waited for the stream")

    def _copied_keyless(self, tables: Sequence[TableName]) -> dict[str, int]:
        """The key-less ones of ``tables`` whose single chunk is already committed, with the Ts it was read at."""
        out: dict[str, int] = {}
        for t in tables:
            plan = self.progress.get_plan(self.info.id, self.span.index, t)
            copied_at = self._keyless_copied_at(t) if plan is not None and not plan.has_key else None
            if copied_at is not None:
                out[str(t)] = copied_at
        return out

    def _forgetting_unplaced(self, fn: Callable[[Sequence[TableName]], dict[str, int]],
                             tables: Sequence[TableName]) -> dict[str, int]:
        """``fn(tables)``; when it refuses a key-less table whose copy has no known place in the stream
        (:class:`SnapshotPositionUnknown`), that table's records go first, so the next run copies it again, whole,
        under its own snapshot (the whole chunk replaces the target's rows: exact again)."""
        try:
            return fn(tables)
        except SnapshotPositionUnknown as exc:
            if exc.table:
                self.progress.forget_table(self.info.id, self.span.index, TableName.parse(exc.table))
            log.error("span=%s %s", self.label, exc.message)
            raise

    def plan_tables(self, tables: Sequence[TableName], snapshot: str, ts: int, at: float = 0.0,
                    orphans: Mapping[int, TableName] | None = None) -> tuple[list[TableName], int]:
        """The tables with chunks left to copy (or a deferred key to build), and about how many rows those chunks
        hold (as planned). A table planned now (the first run to see it, or one whose definition changed since its
        plan: :meth:`_replan_changed`) is planned under ``snapshot`` and its plan stored (the job takes it as it is);
        one that is empty at ``snapshot`` is recorded as copied right away, so that a span of empty tables starts no
        job at all. Tables are planned in parallel, each reader importing ``snapshot`` (:data:`PLAN_READERS`
        connections): planning is an index scan per table on the upstream."""
        cf, span = self.info.id, self.span.index
        plans: dict[TableName, TablePlan | None] = {t: self.progress.get_plan(cf, span, t) for t in tables}
        for t in self._replan_changed(plans, snapshot, ts, at):
            plans[t] = None
        new = [t for t in tables if plans[t] is None]
        if new:
            # plans of tables the span no longer has under that name: a table renamed since it was planned is
            # found among them by its relation oid when it is planned under its new name (_forget_renamed). Only in
            # the initial copy: ``tables`` is then every table of the span, and nothing streamed yet, so the old
            # name's target holds only what the copy wrote (after it, the stream has renamed the target itself, and
            # a table copy's ``tables`` are only those it copies: another table's plan is not an orphan)
            # (a table copy: only its own tables renamed after its first export, ``orphans``)
            renamed = dict(orphans or {}) if self.state.tables else {
                p.oid: p.table_name for p in self.progress.all_plans(cf, span).values()
                if p.oid and p.table_name not in plans}
            # a table copy truncates targets through the span's sink (one caller): one reader, in order
            readers = 1 if self.truncate is not None else min(PLAN_READERS, len(new))
            groups = [new[i::readers] for i in range(readers)]
            if readers == 1:
                plans.update(self._plan_new(groups[0], snapshot, ts, at, renamed))
            else:
                with ThreadPoolExecutor(readers, thread_name_prefix="tidewater-plan") as pool:
                    for got in pool.map(lambda g: self._plan_new(g, snapshot, ts, at, renamed), groups):
                        plans.update(got)
        pending: list[TableName] = []
        rows = 0
        for t in tables:
            stored = plans[t]
            if stored is None:  # empty at the snapshot: recorded as copied
                continue
            done = len(self.progress.done_chunks(cf, span, t))
            if done < len(stored.chunks) or stored.key_state == KEY_DEFERRED:  # (the job builds the key)
                pending.append(t)
                rows += stored.rows * (len(stored.chunks) - done) // len(stored.chunks)
        return pending, rows

    def _replan_changed(self, plans: Mapping[TableName, TablePlan | None], snapshot: str, ts: int, at: float
                        ) -> list[TableName]:
        """The tables with chunks left whose definition (columns, types, key) at ``snapshot`` is not the one their
        plan was made with: their chunks so far hold rows of the old definition, in a target created for it, and
        the chunks left would bring rows of the new one (a target column missing, a key whose ranges mean nothing
        now). Each is started over: its target removed (``restart_target``, before its records go: a run that dies
        in between removes it again), its records forgotten; the caller plans it under ``snapshot``, so every row
        of it is read at one definition and its floor becomes ``ts``. Under ``merge`` the target holds the user's
        rows and is not removed: :class:`SnapshotTableChanged` names the fix (its records go, so the next run plans
        it anew). A plan stored without a definition (before it was recorded) is taken as it is."""
        cf, span = self.info.id, self.span.index
        done = {t: len(self.progress.done_chunks(cf, span, t)) for t, p in plans.items() if p is not None}
        left = [t for t, p in plans.items() if p is not None and (p.definition or p.has_key) and done[t] < len(p.chunks)]
        if not left:
            return []
        changed: list[TableName] = []
        with self.upstream.snapshot_reader(snapshot, label=self.label) as reader:
            for t in left:
                plan = plans[t]
                assert plan is not None
                schema = planned_schema(reader, t, plan.oid)  # (kept under its planned name: _keep_renamed)
                reader.release()
                now = table_definition(schema)
                if not plan.definition or now == plan.definition:
                    # rows of it may be downstream from an earlier run: chunks recorded, or written and not recorded
                    # (a SQL chunk committed just before a kill; Kafka and files keep whatever part was sent)
                    earlier = done[t] > 0 or 0 < plan.ts < ts
                    if earlier and plan.has_key and self._values_may_be_unsent(schema) and (
                            self.restart_target is not None or self.merge):
                        self._restart_split(t, schema, ts, at)
                        changed.append(t)
                    continue
                what = (f"table {t} changed upstream while it was being copied: planned as {plan.definition}, "
                        f"{now} at snapshot {snapshot} (Ts {ts})")
                if self.restart_target is None:
                    raise SnapshotTableChanged(f"span {self.label}: {what}, and this span cannot remove its target "
                                               "to copy it again")
                if self.merge:
                    self.progress.forget_table(cf, span, t)
                    raise SnapshotTableChanged(
                        f"span {self.label}: {what}. Its target holds rows of yours ([snapshot] on-existing-rows = "
                        f'"merge"), so the rows copied under the old definition cannot be replaced. Fix: give the '
                        f"target table the new columns and key, then `cdc cli changefeed resume -c {cf}`: the table is "
                        "planned again under a new snapshot and its rows merged again (rows the first copy wrote "
                        "that were deleted upstream since stay)")
                log.warning("span=%s %s: its copy starts over under this snapshot (target removed, planned again)",
                            self.label, what)
                self.restart_target(schema, ts, at)
                self.progress.forget_table(cf, span, t)
                changed.append(t)
        return changed

    def _restart_split(self, t: TableName, schema: TableSchema, ts: int, at: float) -> None:
        """A keyed table planned (and maybe partly copied) under an earlier snapshot, whose stream may leave values
        unsent (:func:`cdc.snapshot.may_leave_values_unsent`): its copy starts over under this run's snapshot, so that all
        of it is read at one snapshot and nothing is replayed over newer rows. (Chunks read at a later snapshot
        converge when every replayed change carries its values, one transaction at a time; a key change whose
        TOASTed values were not sent would take them from whatever row a later chunk put at its old key: measured,
        rows ended with other rows' values.) Under ``merge`` the target holds the user's rows and stays; the rows the
        first run copied that were deleted upstream since stay too, as documented for merge."""
        cf, span = self.info.id, self.span.index
        log.warning("span=%s table %s was planned under an earlier snapshot, not all of it copied, and its changes may leave values "
                    "unsent (no REPLICA IDENTITY FULL, columns of variable width): its copy starts over under this "
                    "snapshot (Ts %d)", self.label, t, ts)
        if not self.merge:
            assert self.restart_target is not None
            self.restart_target(schema, ts, at)
        self.progress.forget_table(cf, span, t)

    def _plan_new(self, tables: Sequence[TableName], snapshot: str, ts: int, at: float,
                  renamed: Mapping[int, TableName] | None = None) -> dict[TableName, TablePlan | None]:
        """Plan ``tables`` (not planned yet) under ``snapshot`` (exported at ``ts``, upstream time ``at``) on one
        reader and store their plans, with each table's relation oid; a table empty at the snapshot gets its chunks
        recorded as done (at ``ts``) and None. ``renamed``: by relation oid, names the span no longer has whose target
        holds what the copy (or, for a table copy, the stream) wrote; a table planned here under one of those oids
        was renamed since (:meth:`_forget_renamed`)."""
        cf, span = self.info.id, self.span.index
        out: dict[TableName, TablePlan | None] = {}
        with self.upstream.snapshot_reader(snapshot, label=self.label) as reader:
            for t in tables:
                schema = reader.table_schema(t)
                old = (renamed or {}).get(schema.relation_id) if schema.relation_id else None
                if old is not None:
                    self._forget_renamed(old, schema, ts, at)
                if self.truncate is not None and schema.has_key:
                    # a table copy replaces the rows: extra rows downstream go too (before the plan is
                    # stored: a run that dies in between empties it again; a key-less table's single chunk
                    # replaces its rows itself). A log-shaped target (Kafka) gets a TRUNCATE at the snapshot's Ts,
                    # ordered before the copied rows, which carry that Ts
                    self.truncate([schema], Watermark(ts, at))
                plan = dataclasses.replace(reader.plan(schema, self.chunk_rows), definition=table_definition(schema),
                                           snapshot=snapshot, ts=ts, oid=schema.relation_id)
                stored = self.progress.put_plan(cf, span, plan)
                reader.release()  # no lock held on this table while the next one is read (deadlocks)
                if stored is plan and plan.rows == 0:
                    now = time.time()
                    for chunk in plan.chunks:
                        self.progress.record_chunk(cf, span, t, chunk.index, ChunkDone(0, 0.0, now, snapshot, ts))
                    out[t] = None
                    continue
                out[t] = stored
        return out

    def _check_all_copied(self, tables: Sequence[TableName]) -> None:
        """Every chunk of every table's plan is recorded as copied once the job returned without an error; else a job
        that skipped a chunk would leave its rows out downstream with nothing saying so: :class:`CopyIncomplete`
        (retryable: the next run copies the chunks left)."""
        cf, span = self.info.id, self.span.index
        for t in tables:
            plan = self.progress.get_plan(cf, span, t)
            if plan is None:
                continue
            done = self.progress.done_chunks(cf, span, t)
            missing = [c.index for c in plan.chunks if c.index not in done]
            if missing:
                shown = ", ".join(map(str, missing[:10])) + (", ..." if len(missing) > 10 else "")
                raise CopyIncomplete(
                    f"span {self.label}: the copy job ended without error, yet {len(missing)} of the {len(plan.chunks)} "
                    f"chunks of table {t} are not recorded as copied (chunk {shown}): the span does not stream over "
                    "them; the next run copies what is left (if this repeats, the job loses chunks: report it)")

    def _forget_renamed(self, old_name: TableName, schema: TableSchema, ts: int, at: float) -> None:
        """``schema``'s table was planned by an earlier run under the name ``old_name`` (same relation oid; a table
        copy: had that name at its first export) and renamed since (``ALTER TABLE .. RENAME``, ``SET SCHEMA``). What
        that run copied (a table copy: what the stream wrote) went to a target of the old name;
        the table is copied again, whole, under its new name and this run's snapshot (its floor is then this run's
        Ts, found by oid, so its changes under the old name up to it, and the rename, are in the copy). So the old
        target is removed (``restart_target``, before the old records go: a run that dies in between removes it
        again) and the old records go. Under ``merge`` the old target holds the user's rows and is not removed:
        :class:`SnapshotTableChanged` names the fix (the old records go, so the resumed run merges it again)."""
        cf, span = self.info.id, self.span.index
        what = (f"table {old_name} was renamed to {schema.name} while it was being copied (relation oid "
                f"{schema.relation_id})")
        if self.merge or self.restart_target is None:
            self.progress.forget_table(cf, span, old_name)
            raise SnapshotTableChanged(
                f"span {self.label}: {what}, and its target {old_name} holds rows of yours ([snapshot] "
                f'on-existing-rows = "merge") or cannot be removed. Fix: rename the target table {old_name} to '
                f"{schema.name} too, then `cdc cli changefeed resume -c {cf}`: the table is planned again under a new "
                "snapshot and its rows merged again")
        log.warning("span=%s %s: its copy starts over under its new name (old target removed)", self.label, what)
        self.restart_target(dataclasses.replace(schema, name=old_name), ts, at)
        self.progress.forget_table(cf, span, old_name)

    def table_oids(self, tables: Sequence[TableName]) -> dict[str, int]:
        """Each table's relation oid at the snapshot its plan was made under (tables whose plan has none: left
        out; their floors are found by name)."""
        out: dict[str, int] = {}
        for t in tables:
            plan = self.progress.get_plan(self.info.id, self.span.index, t)
            if plan is not None and plan.oid:
                out[str(t)] = plan.oid
        return out

    def check_keys_built(self, tables: Sequence[TableName]) -> None:
        """Streaming must never start on a table whose key the copy deferred and did not build (replays are
        idempotent only by key): the job builds it after the table's last chunk; a job that returned without doing
        so is a bug, and fails the changefeed naming the table."""
        for t in tables:
            plan = self.progress.get_plan(self.info.id, self.span.index, t)
            if plan is not None and plan.key_state == KEY_DEFERRED:
                raise SinkError(f"span {self.label}: the copy of table {t} deferred its primary key and the job ended "
                                "without building it; the table cannot stream without its key. Resume the changefeed "
                                "(the next run builds it) or resync the table")

    def _keyless_copied_at(self, table: TableName) -> int | None:
        """The Ts of the exported snapshot a key-less table's single chunk was committed under (None: not copied
        yet). That is the commit Ts its :class:`ChunkDone` records, provided (snapshot name, Ts) is one of the
        span's exports: a name alone is not enough (PostgreSQL's ``procNumber-lxid-n`` names repeat after an
        upstream restart). Raises :class:`SnapshotPositionUnknown` when the record has no Ts or its name and Ts
        are not one export: the copy's place in the stream is unknown, and guessing would drop or duplicate
        changes."""
        done = self.progress.done_chunks(self.info.id, self.span.index, table).get(0)
        if done is None:
            return None
        exports = self.state.exports
        if done.commit_ts > 0 and done.snapshot is not None and (done.snapshot, done.commit_ts) in exports:
            return done.commit_ts
        listed = ", ".join(f"{n} at Ts {ts}" for n, ts in exports) or "none"
        if done.commit_ts <= 0:
            why = f"its copy was recorded without the Ts of its snapshot ({done.snapshot or 'no snapshot'})"
        elif any(ts == done.commit_ts for _, ts in exports) or any(n == done.snapshot for n, _ in exports):
            why = (f"its copy was recorded under snapshot {done.snapshot} at Ts {done.commit_ts}, and name and Ts "
                   f"disagree with the snapshots this span exported ({listed})")
        else:
            why = (f"its copy was recorded under snapshot {done.snapshot} at Ts {done.commit_ts}, which none of this "
                   f"span's copy runs exported ({listed})")
        raise SnapshotPositionUnknown(
            f"span {self.label}: key-less table {table}: {why}; it cannot be told which of its changes the copy "
            f"holds, so it does not stream. Its copy record was dropped: `cdc cli changefeed resume -c "
            f"{self.info.id}` copies it again, whole, under a new snapshot", table=str(table))

    def copied_chunks(self, tables: Sequence[TableName]) -> list[CopiedChunk]:
        """Every recorded chunk of ``tables``: index, the Ts of the run that wrote it, rows (what a copy's
        announcement lists)."""
        cf, span = self.info.id, self.span.index
        out = []
        for t in tables:
            plan = self.progress.get_plan(cf, span, t)
            of = len(plan.chunks) if plan is not None else 0
            out += [CopiedChunk(t, i, d.commit_ts, d.rows, of)
                    for i, d in sorted(self.progress.done_chunks(cf, span, t).items())]
        return out

    def chunk_ceilings(self, tables: Sequence[TableName], floors: Mapping[str, int]) -> dict[str, int]:
        """Per keyed table whose chunks were read under a snapshot later than its floor (a run restarted under a
        new export): the highest such Ts. Its changes between floor and ceiling are replayed over rows that may
        already be newer (:attr:`cdc.model.SpanSnapshot.ceilings`)."""
        out: dict[str, int] = {}
        for t in tables:
            plan = self.progress.get_plan(self.info.id, self.span.index, t)
            if plan is None or not plan.has_key:
                continue
            top = max((d.commit_ts for d in self.progress.done_chunks(self.info.id, self.span.index, t).values()),
                      default=0)
            if top > floors.get(str(t), 0):
                out[str(t)] = top
        return out

    def floors(self, tables: Sequence[TableName]) -> dict[str, int]:
        """Each table's floor from the stored plans and chunks (see the module doc): a keyed table's is the lowest
        of the Ts of the export its plan was made under and the Ts its chunks were read at (every change after it is
        replayed), else the first export's; a key-less table's is the Ts its whole chunk was read at.

        Why the plan's export even when every chunk was recorded under a later one: a run under the plan's export
        may have written rows of a chunk it never recorded (a SQL chunk committed just before a kill; Kafka and files
        keep whatever part of a chunk was sent), and a row of those deleted upstream before the later export is in
        no later chunk: only the replay of its DELETE removes it downstream. (A table whose stream may leave values
        unsent is copied again whole instead, target emptied: :meth:`_restart_split`, and planned anew.)"""
        exports = self.state.exports
        first = exports[0][1] if exports else 0
        out: dict[str, int] = {}
        for t in tables:
            plan = self.progress.get_plan(self.info.id, self.span.index, t)
            if plan is None or plan.has_key:
                read_at = [d.commit_ts for d in self.progress.done_chunks(self.info.id, self.span.index, t).values()]
                # the plan's export when it is one of this span's, and the chunks' own when each one is
                seen = [plan.ts] if plan is not None and plan.ts > 0 and (plan.snapshot, plan.ts) in exports else []
                if read_at and all(ts > 0 and any(ts == e for _, e in exports) for ts in read_at):
                    seen += read_at
                out[str(t)] = min(seen, default=first)
                continue
            ts = self._keyless_copied_at(t)
            if ts is None:
                raise SnapshotPositionUnknown(
                    f"span {self.label}: key-less table {t} has no recorded copy, yet its span's copy ended; it does "
                    f"not stream. `cdc cli changefeed resume -c {self.info.id}` copies it, whole, under a new "
                    "snapshot", table=str(t))
            out[str(t)] = ts
        return out
