"""The operations behind the HTTP API: changefeed create (validate everything up front), query, list,
pause, resume, update, remove; capture list and drain; processor list and query.

Creation validates, in order, before anything is created: the id, both URIs, the config, that the id is
free, that the sink is reachable and usable, that the upstream is ready (``Upstream.check_ready``;
PostgreSQL: ``wal_level=logical``, privileges, free slots), that the filter matches tables, that every
matched table can be replicated without harm (``Upstream.check_tables``; PostgreSQL: a replica identity it
can use once the table is published — a non-deferrable primary key, an identity index or REPLICA IDENTITY
FULL: otherwise the application's UPDATEs and DELETEs would fail upstream — and columns that can all be
published), that no two tables land on the same target name, and that no slot of that name exists yet (the
owner's pick-up of later tables applies the same checks, see ``owner.upstream_watch``). Only then are the
span resources created (``Upstream.create_spans``: a publication and a slot per span) and the changefeed
stored; if anything fails, what this create made (and only that: never a slot or publication that already
existed) is dropped again. All upstream access goes through :mod:`upstream.base` (``open_upstream``).

Every state change is a compare-and-swap on the changefeed's info key; the owner does the rest
(assignments, upstream cleanup on remove).
"""

from __future__ import annotations

import logging
import re
import time
import tomllib
from dataclasses import dataclass, fields, is_dataclass, replace
from typing import Any

from capture.changefeed_view import (
    describe,
    hold_view,
    lag,
    processor_spans,
    processor_view,
    snapshot_view,
    span_load,
    verify_runs_view,
)
from capture.snapshot_launcher import check_copy_possible
from capture.table_copy import request_resync
from capture.verify_runs import VerifyRuns
from cdc.config import TABLE_ARRAYS, ChangefeedConfig
from cdc.errors import (
    ChangefeedNotFound,
    ChangefeedStateConflict,
    GCTTLExceeded,
    InvalidArgument,
    InvalidConfig,
    TargetNameConflict,
    TidewaterError,
)
from cdc.events import TableName, TableSchema
from cdc.filter import TableFilter
from cdc.meta.snapshot_progress import SnapshotProgressStore
from cdc.meta.store import MetaStore
from cdc.model import (
    ChangefeedInfo,
    ChangefeedStatus,
    FeedState,
    SchemaHistory,
    SpanInfo,
    still_copying,
)
from cdc.serde import to_dict
from cdc.spans import resource_name, span_of
from cdc.ts import lsn_to_str
from cdc.uri import parse_sink_uri, parse_upstream_uri, redact
from owner.table_pickup import collision_key
from owner.upstream_watch import can_resume
from sinks.base import BarrierSink, TxnSink
from sinks.copy_roles import CopyTargets, ExistingRows
from sinks.factory import open_sink, supports
from upstream import open_upstream
from upstream.base import JoinRule, SpanPlan, Upstream

log = logging.getLogger(__name__)


class CaptureNotFound(TidewaterError):
    code = "CDC:ErrCaptureNotFound"
    http_status = 404


class ProcessorNotFound(TidewaterError):
    code = "CDC:ErrProcessorNotFound"
    http_status = 404


class CaptureStateConflict(TidewaterError):
    code = "CDC:ErrCaptureStateConflict"
    http_status = 409


ID_RE = re.compile(r"^[a-zA-Z0-9]+(-[a-zA-Z0-9]+)*$")


@dataclass(frozen=True)
class UpdateRequest:
    """Fields to change; None keeps the current value. ``config`` is a whole changefeed TOML."""

    sink_uri: str | None = None
    upstream_uri: str | None = None
    config: str | None = None
    target_ts: int | None = None
    skip_ddl_ts: int | None = None  # add this commit Ts to [ddl] skip-ts: that transaction's DDL is skipped

    def is_empty(self) -> bool:
        return (self.sink_uri is None and self.upstream_uri is None and self.config is None and self.target_ts is None
                and self.skip_ddl_ts is None)


@dataclass(frozen=True)
class CreateRequest:
    changefeed_id: str
    upstream_uri: str
    sink_uri: str
    config: str = ""  # changefeed TOML
    target_ts: int = 0
    snapshot: str | None = None  # overrides [snapshot] mode of the TOML ("initial" | "none")


def load_config(text: str) -> ChangefeedConfig:
    """Parse a changefeed TOML; :class:`InvalidConfig` for bad syntax, unknown keys, wrong types or values.

    The value types are checked here against the defaults' types, before conversion: a string where a list
    is expected would otherwise become a tuple of characters, and a string where a number is expected
    would fail later with a TypeError instead of a message naming the key.
    """
    if not text:
        return ChangefeedConfig().validate()
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        raw = {}  # from_toml reports the syntax error
    _check_types(raw, ChangefeedConfig(), "")
    return ChangefeedConfig.from_toml(text)


def _check_types(raw: dict[str, Any], defaults: Any, where: str) -> None:
    annotations = {f.name: str(f.type) for f in fields(defaults)} if is_dataclass(defaults) else {}
    for key, value in raw.items():
        name = key.replace("-", "_")
        if not hasattr(defaults, name):
            continue  # from_toml names unknown keys
        expected = getattr(defaults, name)
        if is_dataclass(expected):
            if not isinstance(value, dict):
                raise InvalidConfig(f"{where}{key} in the changefeed config must be a table ([{where}{key}])")
            _check_types(value, expected, f"{where}{key}.")
        elif isinstance(expected, tuple) and (type(defaults), name) in TABLE_ARRAYS:
            item = TABLE_ARRAYS[(type(defaults), name)]
            if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
                raise InvalidConfig(f"{where}{key} in the changefeed config must be an array of tables "
                                    f"([[{where}{key}]]), got {value!r}")
            for v in value:
                _check_types(v, item(), f"{where}{key}.")
        elif isinstance(expected, tuple):
            if "int" in annotations.get(name, ""):
                if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool)
                                                          for v in value):
                    raise InvalidConfig(f"{where}{key} in the changefeed config must be an array of integers, "
                                        f"got {value!r}")
            elif not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise InvalidConfig(f"{where}{key} in the changefeed config must be an array of strings, "
                                    f"got {value!r}")
        elif isinstance(expected, bool):
            if not isinstance(value, bool):
                raise InvalidConfig(f"{where}{key} in the changefeed config must be true or false, got {value!r}")
        elif isinstance(expected, int) and (not isinstance(value, int) or isinstance(value, bool)):
            raise InvalidConfig(f"{where}{key} in the changefeed config must be an integer, got {value!r}")


def check_consistency(config: ChangefeedConfig, sink_uri: str) -> None:
    """``[consistency] mode = "snapshot"`` needs a sink that applies whole barriers (``sinks.base.BarrierSink``):
    :class:`InvalidConfig` naming the sink otherwise (docs/consistency.md)."""
    if not config.consistency.snapshot:
        return
    if not supports(sink_uri, BarrierSink):
        scheme = parse_sink_uri(sink_uri).scheme
        raise InvalidConfig(
            f"[consistency] mode = \"snapshot\" is not available for {scheme}:// sinks in this version: only SQL "
            "targets (postgresql://, mysql://, mariadb://, sqlite://) apply whole barriers so far; use mode = "
            "\"default\" (docs/consistency.md)")


def old_image_notice(scheme: str, schemas: list[TableSchema]) -> str | None:
    """For a sink that writes each change as a message (Kafka, files): the tables whose UPDATE and DELETE messages
    cannot carry the whole old row (PostgreSQL sends it only under REPLICA IDENTITY FULL), so that a consumer that
    needs before-images (retractions, audit) knows before it reads them (docs/sinks.md, "Old rows")."""
    if scheme not in ("kafka", "file"):
        return None
    partial = sorted(str(s.name) for s in schemas if s.replica_identity != "f")
    if not partial:
        return None
    shown = ", ".join(partial[:10]) + (f" and {len(partial) - 10} more" if len(partial) > 10 else "")
    return (f"CDC:NoticePartialOldImage: {shown} do not have REPLICA IDENTITY FULL: their UPDATE and DELETE messages "
            "carry the old key only (Debezium 'before' null for an update, canal-json 'old' the key columns) and "
            "unchanged TOAST values as the unavailable-value placeholder. Rebuilding tables by key is exact; a consumer "
            "that needs whole before-images needs ALTER TABLE ... REPLICA IDENTITY FULL on them")


class ChangefeedService:
    def __init__(self, store: MetaStore, stop_wait: float = 15.0) -> None:
        self.store = store
        self.stop_wait = stop_wait  # update: how long to wait for the spans of a paused changefeed to stop
        self.verify_runs: VerifyRuns | None = None  # changefeed verify jobs (wired by the capture's server)
        self.gc_ttl = 86400.0  # the servers' gc-ttl (wired and reloaded by the capture's server): create's notices

    # ---- create ----------------------------------------------------------------------------------
    def create(self, req: CreateRequest) -> dict[str, Any]:
        if not ID_RE.match(req.changefeed_id or "") or len(req.changefeed_id) > 64:
            raise InvalidArgument(
                f"invalid changefeed id {req.changefeed_id!r}: use letters, digits and single dashes "
                f"(^[a-zA-Z0-9]+(-[a-zA-Z0-9]+)*$, at most 64 characters)")
        parse_upstream_uri(req.upstream_uri)
        sink_uri = parse_sink_uri(req.sink_uri)
        config = load_config(req.config)
        if req.snapshot is not None:
            config = replace(config, snapshot=replace(config.snapshot, mode=req.snapshot)).validate()
        if req.target_ts and config.snapshot.mode == "initial":
            raise InvalidArgument(
                "target-ts cannot go with an initial copy: the copy reads the tables as they are when it runs, which "
                "may be after target-ts, so rows committed after it would reach the target; create the changefeed "
                "with --snapshot none (the rows that exist are then not copied) or without target-ts")
        check_consistency(config, req.sink_uri)
        table_filter = TableFilter(config.filter.rules)
        if req.target_ts < 0:
            raise InvalidArgument("target-ts must be >= 0")
        if self.store.get_changefeed(req.changefeed_id) is not None:
            from cdc.errors import ChangefeedExists

            raise ChangefeedExists(f"changefeed {req.changefeed_id!r} already exists")

        sink = open_sink(req.sink_uri, config.sink)
        try:
            sink.check()
            with open_upstream(req.upstream_uri) as up:
                tables, schemas = _eligible_tables(up, sink, table_filter, req.upstream_uri, sink_uri.redacted(),
                                                   config.sink.delivery)
                existing: list[TableName] = []
                if config.snapshot.mode == "initial":
                    up.check_copy()
                    check_copy_possible(config.snapshot.spark_master)
                    existing = _existing_rows(sink, tables, schemas, config)
                spans = up.create_spans(_span_plans(req.changefeed_id, config.span_count, tables,
                                                    _join_rule(table_filter, config.span_count, sink,
                                                               req.sink_uri, config.sink.delivery)))
                notices = [n for n in (up.capture_notice, old_image_notice(sink_uri.scheme, schemas),
                                       up.retention_notice(self.gc_ttl)) if n]
                if existing and config.snapshot.on_existing_rows == "truncate" and isinstance(sink, CopyTargets):
                    try:
                        sink.truncate_targets(existing)
                    except TidewaterError:
                        self._drop_spans(req.upstream_uri, spans)
                        raise
                    log.info("changefeed=%s: emptied the target tables of %s before the initial copy "
                             "([snapshot] on-existing-rows = \"truncate\")", req.changefeed_id,
                             ", ".join(map(str, existing)))
        finally:
            sink.close()

        now = time.time()
        start_ts = min(s.start_ts for s in spans)
        info = ChangefeedInfo(
            id=req.changefeed_id, upstream_uri=req.upstream_uri, sink_uri=req.sink_uri, config=config.to_dict(),
            start_ts=start_ts, start_time=now, create_time=now, spans=tuple(spans), target_ts=req.target_ts,
            state=FeedState.NORMAL, state_since=now, initial_copy=config.snapshot.mode == "initial")
        # each table's schema as the changefeed starts (read before the slots: never newer than the start), stored
        # with the info, never after it: a span that started without them and has streamed no row of a table took
        # the table's DROP for one from before it joined the span and left it out (the old rows stayed downstream)
        histories = [SchemaHistory(s.relation_id).with_version(start_ts, s, 0, span=span_of(s.name, len(spans)))
                     for s in schemas if s.relation_id]
        try:
            # with an initial copy, nothing is downstream yet: no checkpoint until every span's copy is done
            ck = 0 if info.initial_copy else start_ts
            self.store.create_changefeed(info, ChangefeedStatus(ck, now, ck, now, now), histories)
        except TidewaterError:
            self._drop_spans(req.upstream_uri, spans)
            raise
        log.info("changefeed=%s created: %d tables in %d spans, start=%s sink=%s", info.id, len(tables),
                 len(spans), lsn_to_str(start_ts), sink_uri.redacted())
        out = self.describe(info.id)
        if notices:
            out["notices"] = notices
        return out

    def _drop_spans(self, upstream_uri: str, spans: list[SpanInfo]) -> None:
        try:
            with open_upstream(upstream_uri) as up:
                up.drop_spans(spans)
        except TidewaterError as exc:
            log.error("could not drop slots %s after a failed create: %s", [s.slot for s in spans], exc)

    # ---- update ----------------------------------------------------------------------------------
    def update(self, cf_id: str, req: UpdateRequest) -> dict[str, Any]:
        """Change a *stopped* changefeed's sink URI, config, target Ts or upstream credentials.

        Refused (:class:`ChangefeedStateConflict`) unless the changefeed is ``stopped``; pause is
        asynchronous, so this first waits (up to ``stop_wait``) until the owner has taken every span
        away from its capture: no processor still writes with the old settings. The result is
        validated like a create (sink reachable, filter matches eligible tables, no target-name
        conflict); ``span-count`` and the upstream's host/port/database cannot change (the slots live
        there). If the filter's table set changes, each span's publication gets exactly the tables that
        hash to it, in one upstream transaction committed only after the new info was stored with a
        compare-and-swap (a concurrent change refuses the update and rolls the publications back).
        Re-running the same update is harmless: publication changes are computed from the actual
        publications. Changes made upstream while the changefeed was stopped go to the new sink on
        resume (it restarts from the span checkpoints); a newly included table contributes changes
        committed after the update. Returns ``{"changefeed": describe, "diff": {field: {"old", "new"}}}``
        with passwords redacted.
        """
        if req.is_empty():
            raise InvalidArgument("nothing to update: give at least one of sink_uri, upstream_uri, config, target_ts, skip_ddl_ts")
        entry = self.store.get_changefeed(cf_id)
        if entry is None:
            raise ChangefeedNotFound(f"changefeed {cf_id!r} does not exist")
        old = entry.value
        if old.state not in (FeedState.STOPPED, FeedState.FAILED):  # failed: e.g. --skip-ddl-ts, then resume
            raise ChangefeedStateConflict(
                f"changefeed {cf_id!r} is {old.state.value}: only a stopped or failed changefeed can be updated; pause it "
                f"first (cdc cli changefeed pause -c {cf_id}), update it, then resume it")
        sink_raw = old.sink_uri if req.sink_uri is None else req.sink_uri
        upstream_raw = old.upstream_uri if req.upstream_uri is None else req.upstream_uri
        sink_uri = parse_sink_uri(sink_raw)
        parse_upstream_uri(upstream_raw)
        takeover = _check_same_upstream(old.upstream_uri, upstream_raw)
        config = ChangefeedConfig.from_dict(old.config) if req.config is None else load_config(req.config)
        if req.skip_ddl_ts is not None:  # TiCDC's ignore-txn-start-ts, for one DDL the target rejects
            if req.skip_ddl_ts <= 0:
                raise InvalidArgument(f"skip-ddl-ts must be a positive commit Ts, got {req.skip_ddl_ts}")
            config = replace(config, ddl=replace(config.ddl, skip_ts=tuple(sorted({*config.ddl.skip_ts,
                                                                                   req.skip_ddl_ts}))))
        if config.span_count != len(old.spans):
            raise InvalidConfig(
                f"span-count is fixed when a changefeed is created: {cf_id!r} has {len(old.spans)} span(s), the "
                f"new config says {config.span_count}; set span-count = {len(old.spans)} (to change it, create a "
                f"new changefeed)")
        old_mode = ChangefeedConfig.from_dict(old.config).consistency.mode
        if config.consistency.mode != old_mode:
            raise InvalidConfig(
                f"consistency.mode is fixed when a changefeed is created: {cf_id!r} has {old_mode!r}, the new config "
                f"says {config.consistency.mode!r} (changes staged for a barrier would be left behind, or applied "
                f"outside one); to change it, create a new changefeed")
        check_consistency(config, sink_raw)
        target_ts = old.target_ts if req.target_ts is None else req.target_ts
        if target_ts < 0:
            raise InvalidArgument("target-ts must be >= 0")
        status = self.store.get_status(cf_id)
        checkpoint = status.value.checkpoint_ts if status else 0
        if target_ts and target_ts != old.target_ts and still_copying(
                old, self.store.snapshot().span_statuses.get(cf_id, {})):
            raise InvalidArgument(
                f"changefeed {cf_id!r} is still copying its existing rows, which are read as they are when the copy "
                f"runs (possibly after target-ts): set target-ts once `changefeed query` shows phase streaming")
        if target_ts and target_ts != old.target_ts and target_ts <= checkpoint:
            raise InvalidArgument(
                f"target-ts {target_ts} ({lsn_to_str(target_ts)}) is not after the changefeed's checkpoint "
                f"{checkpoint} ({lsn_to_str(checkpoint)}); use 0 for no target")
        table_filter = TableFilter(config.filter.rules)
        self._wait_spans_stopped(cf_id)

        sink = open_sink(sink_raw, config.sink)
        try:
            sink.check()
            with open_upstream(upstream_raw) as up:
                if takeover:  # another server (a promoted replica): it must hold every span's resume position
                    statuses = self.store.snapshot().span_statuses.get(cf_id, {})
                    up.check_takeover(old.spans, {s.index: statuses[s.index].resume_token if s.index in statuses
                                                  else None for s in old.spans})
                tables, _ = _eligible_tables(up, sink, table_filter, upstream_raw, sink_uri.redacted(),
                                             config.sink.delivery)
                new = replace(old, sink_uri=sink_raw, upstream_uri=upstream_raw, config=config.to_dict(),
                              target_ts=target_ts)
                n = len(old.spans)
                wanted = {s.index: [t for t in tables if span_of(t, n) == s.index] for s in old.spans}
                # the span table sets change in one upstream transaction, committed only after the CAS below
                join = _join_rule(table_filter, n, sink, sink_raw, config.sink.delivery)
                with up.align_spans(old.spans, wanted, label=cf_id, join=join) as before:
                    if not self.store.update_changefeed(new, entry.mod_revision, []):
                        raise ChangefeedStateConflict(
                            f"changefeed {cf_id!r} was changed concurrently while it was being updated; nothing "
                            f"was changed, retry")
                after = sorted(tables)
        finally:
            sink.close()

        diff = _diff(old, new)
        if before != after:
            diff["tables"] = {"old": [str(t) for t in before], "new": [str(t) for t in after]}
        log.info("changefeed=%s updated: %s", cf_id, ", ".join(sorted(diff)) or "no change")
        return {"changefeed": self.describe(cf_id), "diff": diff}

    def _wait_spans_stopped(self, cf_id: str) -> None:
        """Pause is asynchronous: wait (up to ``stop_wait``) until the owner has taken every span of the
        changefeed away from its capture, i.e. no processor can still write with the old settings."""
        deadline = time.monotonic() + self.stop_wait
        while True:
            assigned = self.store.get_assignments(cf_id)
            if not assigned:
                return
            if time.monotonic() >= deadline:
                where = sorted({f"{i}@{a.capture_id}" for i, a in assigned.items()})
                raise ChangefeedStateConflict(
                    f"changefeed {cf_id!r} is stopped but its spans are still stopping ({', '.join(where)}); "
                    f"retry in a few seconds")
            time.sleep(0.2)

    # ---- read ------------------------------------------------------------------------------------
    def describe(self, cf_id: str) -> dict[str, Any]:
        snap = self.store.snapshot()
        entry = snap.changefeeds.get(cf_id)
        if entry is None:
            raise ChangefeedNotFound(f"changefeed {cf_id!r} does not exist")
        info = entry.value
        out = describe(info, snap.statuses.get(cf_id), snap.assignments.get(cf_id, {}),
                       snap.span_statuses.get(cf_id, {}))
        out["verify_hold"] = hold_view(snap.holds.get(cf_id), time.time())
        out["verify_runs"] = verify_runs_view(self.store.list_verify_runs(cf_id))
        if info.initial_copy:
            out["snapshot"] = snapshot_view(SnapshotProgressStore(self.store.client, self.store.cluster_id)
                                            .progress(cf_id))
        return out

    def list(self) -> list[dict[str, Any]]:
        snap = self.store.snapshot()
        out = []
        for cf_id in sorted(snap.changefeeds):
            info = snap.changefeeds[cf_id].value
            st = snap.statuses.get(cf_id) or ChangefeedStatus()
            out.append({"id": cf_id, "state": info.state.value, "checkpoint_ts": st.checkpoint_ts,
                        "checkpoint": lsn_to_str(st.checkpoint_ts), "checkpoint_lag": lag(st.checkpoint_time),
                        "error": to_dict(info.error), "warnings": len(st.warnings)})
        return out

    # ---- captures and processors (read from one etcd snapshot) -------------------------------------
    def captures(self) -> list[dict[str, Any]]:
        """Every registered capture (sorted by id) with whether it is the owner, whether it is
        draining, and how many spans are assigned to it."""
        snap = self.store.snapshot()
        owner = snap.owner
        owner_id = owner.capture_id if owner else None
        load = span_load(snap)
        return [{"id": c.id, "address": c.advertise_addr, "is_owner": c.id == owner_id, "draining": c.draining,
                 "version": c.version, "start_time": c.start_time, "pid": c.pid, "spans": load.get(c.id, 0)}
                for _, c in sorted(snap.captures.items())]

    def drain_capture(self, capture_id: str) -> dict[str, Any]:
        """Mark ``capture_id`` draining; the owner then moves its spans to the other captures. Refused
        (:class:`CaptureStateConflict`) when no other capture could take them; :class:`CaptureNotFound`
        for an unknown capture. Idempotent."""
        snap = self.store.snapshot()
        cap = snap.captures.get(capture_id)
        if cap is None:
            raise CaptureNotFound(f"capture {capture_id!r} is not registered (cdc cli capture list shows the live ones)")
        if not cap.draining and not any(not c.draining for cid, c in snap.captures.items() if cid != capture_id):
            raise CaptureStateConflict(
                f"capture {capture_id!r} is the only capture that is not draining: its spans would have nowhere to "
                f"go; start another capture first")
        if not self.store.set_capture_draining(capture_id):
            raise CaptureNotFound(f"capture {capture_id!r} is no longer registered")
        remaining = span_load(self.store.snapshot()).get(capture_id, 0)
        return {"id": capture_id, "draining": True, "remaining_spans": remaining}

    def processors(self) -> list[dict[str, Any]]:
        """One item per (changefeed, capture) that has spans assigned, sorted."""
        snap = self.store.snapshot()
        return [processor_view(cf, cap, spans, snap) for (cf, cap), spans in sorted(processor_spans(snap).items())]

    def processor(self, cf_id: str, capture_id: str) -> dict[str, Any]:
        snap = self.store.snapshot()
        if cf_id not in snap.changefeeds:
            raise ChangefeedNotFound(f"changefeed {cf_id!r} does not exist")
        spans = processor_spans(snap).get((cf_id, capture_id))
        if not spans:
            if capture_id not in snap.captures:
                raise CaptureNotFound(f"capture {capture_id!r} is not registered")
            raise ProcessorNotFound(f"capture {capture_id!r} runs no span of changefeed {cf_id!r}")
        return processor_view(cf_id, capture_id, spans, snap)

    # ---- state changes ---------------------------------------------------------------------------
    def pause(self, cf_id: str) -> dict[str, Any]:
        return self._transition(cf_id, FeedState.STOPPED,
                                allowed=(FeedState.NORMAL, FeedState.WARNING, FeedState.FAILED, FeedState.STOPPED))

    def resume(self, cf_id: str) -> dict[str, Any]:
        entry = self.store.get_changefeed(cf_id)
        if entry is not None:
            refusal = can_resume(entry.value)
            if refusal is not None:
                raise GCTTLExceeded(refusal)
            if entry.value.error is not None and entry.value.error.code == "CDC:ErrSlotLost":
                raise ChangefeedStateConflict(
                    f"changefeed {cf_id!r} lost its replication slot ({entry.value.error.message}); resuming would "
                    f"silently skip changes: remove it and create it again")
        return self._transition(cf_id, FeedState.NORMAL,
                                allowed=(FeedState.STOPPED, FeedState.FAILED, FeedState.WARNING, FeedState.NORMAL))

    def resync(self, cf_id: str, tables: list[str]) -> dict[str, Any]:
        """Copy ``tables`` again while the changefeed streams (``capture.table_copy``); the changefeed after it."""
        request_resync(self.store, cf_id, tables)
        return self.describe(cf_id)

    def remove(self, cf_id: str) -> dict[str, Any]:
        return self._transition(cf_id, FeedState.REMOVED, allowed=tuple(FeedState))

    def _transition(self, cf_id: str, state: FeedState, allowed: tuple[FeedState, ...]) -> dict[str, Any]:
        for _ in range(10):
            entry = self.store.get_changefeed(cf_id)
            if entry is None:
                raise ChangefeedNotFound(f"changefeed {cf_id!r} does not exist")
            info = entry.value
            if info.state not in allowed:
                raise ChangefeedStateConflict(
                    f"changefeed {cf_id!r} is {info.state.value}; cannot move it to {state.value}")
            if info.state is state and state is not FeedState.NORMAL:
                return self.describe(cf_id)  # (resume of a normal changefeed acknowledges its data warnings)
            extra = {"resumed_at": time.time()} if state is FeedState.NORMAL else {}
            new = info.with_state(state, error=None, retries=0, backoff_until=0.0, **extra)
            if self.store.update_changefeed(new, entry.mod_revision, []):
                log.info("changefeed=%s state %s -> %s: API request", cf_id, info.state.value, state.value)
                return self.describe(cf_id)
        raise ChangefeedStateConflict(f"changefeed {cf_id!r} kept changing; retry")


def _span_plans(cf_id: str, span_count: int, tables: list[TableName], join: JoinRule | None = None) -> list[SpanPlan]:
    """The spans of a new changefeed: resource names from the id, each table in the span it hashes to."""
    return [SpanPlan(i, resource_name("slot", cf_id, i), resource_name("pub", cf_id, i),
                     tuple(t for t in tables if span_of(t, span_count) == i), join) for i in range(span_count)]


def _existing_rows(sink: TxnSink, tables: list[TableName], schemas: list[TableSchema],
                   config: ChangefeedConfig) -> list[TableName]:
    """The tables whose target already holds rows, when the initial copy may write over them; refused (naming
    them and the option) unless ``[snapshot] on-existing-rows`` says what to do. ``merge`` upserts by key over
    the rows there, which a table without a key cannot do (its copied rows would be added to them)."""
    existing = sink.tables_with_rows(tables) if isinstance(sink, ExistingRows) else []  # (else: no tables)
    how = config.snapshot.on_existing_rows
    if existing and how == "refuse":
        raise InvalidArgument(
            f"target table(s) of {', '.join(map(str, existing))} already hold rows, and the initial copy would "
            f"write the upstream's rows over them: empty them, or set [snapshot] on-existing-rows = \"truncate\" "
            f"(Tidewater empties them first) or \"merge\" (upserts by key over what is there), or create the "
            f"changefeed with --snapshot none (changes only, the existing rows are not copied)")
    if existing and how == "merge":
        keyless = [str(s.name) for s in schemas if s.name in set(existing) and not (s.has_key and s.key)]
        if keyless:
            raise InvalidArgument(
                f"[snapshot] on-existing-rows = \"merge\" cannot merge into the target table(s) of "
                f"{', '.join(keyless)}: they have no key, so the copied rows would be added to the rows there "
                f"(duplicates); empty them or use on-existing-rows = \"truncate\"")
    return existing


def _join_rule(table_filter: TableFilter, span_count: int, sink: TxnSink, sink_uri: str, delivery: str) -> JoinRule:
    """How a table created later joins a span in its creating transaction: the changefeed's filter and span
    count, whether the sink's names can clash (it drops the upstream schema; compared case-folded), and
    whether key-less tables may join (not under at-least-once delivery, as ``changefeed create`` refuses)."""
    probe = TableName("S", "T")
    target = sink.target_name(probe)
    return JoinRule(table_filter, span_count,
                    target_names="qualified" if target == str(probe) else "table",
                    fold_case=collision_key(sink_uri, target) != target,
                    keyless=delivery != "at-least-once" or sink_uri.startswith("blackhole:"))


def _eligible_tables(up: Upstream, sink: Any, table_filter: TableFilter, upstream_uri: str,
                     sink_shown: str, delivery: str = "exactly-once") -> tuple[list[TableName], list[TableSchema]]:
    """The upstream tables the filter selects, after checking the upstream (``wal_level``...), that the
    filter matches something, that every table can be published without breaking its writes or leaving
    columns out (:meth:`upstream.base.Upstream.check_tables`), that no two land on one target name, and
    - with ``delivery = "at-least-once"`` into a real target - that every table has a key (a replay would
    duplicate the rows of a key-less table)."""
    up.check_ready()
    tables = table_filter.select(up.list_tables())
    if not tables:
        raise InvalidArgument(
            f"the filter {list(table_filter.rules)!r} matches no table in the upstream database "
            f"{parse_upstream_uri(upstream_uri).path!r}")
    schemas = up.check_tables(tables)
    targets: dict[str, TableName] = {}
    for t in tables:
        target = sink.target_name(t)
        key = collision_key(sink_shown, target)
        if key in targets:
            other = targets[key]
            shown = repr(target) if sink.target_name(other) == target else \
                f"{sink.target_name(other)!r} and {target!r} (one table there: names differ only in case)"
            raise TargetNameConflict(
                f"tables {other} and {t} would both land on {shown} in the sink "
                f"{sink_shown}: exclude one of them with the filter")
        targets[key] = t
    if delivery == "at-least-once" and not sink_shown.startswith("blackhole:"):
        keyless = [str(s.name) for s in schemas if not s.has_key]
        if keyless:
            raise InvalidArgument(
                f"sink.delivery = \"at-least-once\" replays transactions after a fault, which duplicates rows of "
                f"tables without a key: {', '.join(keyless)}. Keep the default exactly-once delivery, give these "
                "tables a primary key, or exclude them with the filter")
    return tables, schemas


def _check_same_upstream(old: str, new: str) -> bool:
    """False when ``new`` names the same upstream as ``old`` (host, port and database); True when it names another
    server with the same database and the same kind of upstream (a promoted replica: the caller asks it
    ``Upstream.check_takeover``); ``InvalidArgument`` otherwise."""
    up_old, up_new = open_upstream(old), open_upstream(new)  # no I/O
    was, now = up_old.server_identity(), up_new.server_identity()
    if was == now:
        return False
    if was[2] == now[2] and type(up_old) is type(up_new) and type(up_old).check_takeover is not Upstream.check_takeover:
        return True
    h, p, d = was
    raise InvalidArgument(
        f"the upstream URI may change only its user, password or options, not the server or database: the "
        f"changefeed's slots and publications live in {h}:{p}/{d} (new URI: "
        f"{parse_upstream_uri(new).redacted()}); create a new changefeed for another upstream")


def _flatten(prefix: str, value: Any, out: dict[str, Any]) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten(f"{prefix}.{k.replace('_', '-')}", v, out)
    else:
        out[prefix] = value


def _diff(old: ChangefeedInfo, new: ChangefeedInfo) -> dict[str, dict[str, Any]]:
    """Field-level differences ``{field: {"old", "new"}}``; URIs redacted, config flattened to
    ``config.section.key`` (TOML spelling)."""
    diff: dict[str, dict[str, Any]] = {}
    if old.sink_uri != new.sink_uri:
        diff["sink_uri"] = {"old": redact(old.sink_uri), "new": redact(new.sink_uri)}
    if old.upstream_uri != new.upstream_uri:
        diff["upstream_uri"] = {"old": redact(old.upstream_uri), "new": redact(new.upstream_uri)}
    if old.target_ts != new.target_ts:
        diff["target_ts"] = {"old": old.target_ts, "new": new.target_ts}
    before: dict[str, Any] = {}
    after: dict[str, Any] = {}
    _flatten("config", old.config, before)
    _flatten("config", new.config, after)
    for key in sorted(set(before) | set(after)):
        if before.get(key) != after.get(key):
            diff[key] = {"old": before.get(key), "new": after.get(key)}
    return diff

