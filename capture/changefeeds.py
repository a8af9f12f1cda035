"""Changefeed operations behind the HTTP API: create (validate everything up front), query, list,
pause, resume, remove.

Creation validates, in order, before anything is created: the id, both URIs, the config, that the id is
free, that the sink is reachable and usable, that the upstream is reachable with ``wal_level=logical``,
that the filter matches tables, that every matched table has a key (or REPLICA IDENTITY FULL) and that
no two tables land on the same target name, and that no slot of that name exists yet. Only then are the
publications and slots created (one per span) and the changefeed stored; if anything fails, what this
create made (and only that: never a slot or publication that already existed) is dropped again.

Every state change is a compare-and-swap on the changefeed's info key; the owner does the rest
(assignments, upstream cleanup on remove).
"""

from __future__ import annotations

import logging
import re
import time
import tomllib
from dataclasses import dataclass, is_dataclass
from typing import Any

from cdc.config import ChangefeedConfig
from cdc.errors import (
    ChangefeedNotFound,
    ChangefeedStateConflict,
    InvalidArgument,
    InvalidConfig,
    TargetNameConflict,
    TidewaterError,
)
from cdc.events import TableName
from cdc.filter import TableFilter
from cdc.meta.store import MetaStore
from cdc.model import ChangefeedInfo, ChangefeedStatus, FeedState, SpanInfo
from cdc.serde import to_dict
from cdc.spans import resource_name, span_of
from cdc.ts import lsn_to_str
from cdc.uri import parse_sink_uri, parse_upstream_uri
from sinks.factory import open_sink
from upstream.postgres import admin, catalog
from upstream.postgres.conn import connect

log = logging.getLogger(__name__)

ID_RE = re.compile(r"^[a-zA-Z0-9]+(-[a-zA-Z0-9]+)*$")


@dataclass(frozen=True)
class CreateRequest:
    changefeed_id: str
    upstream_uri: str
    sink_uri: str
    config: str = ""  # changefeed TOML
    target_ts: int = 0


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
    for key, value in raw.items():
        name = key.replace("-", "_")
        if not hasattr(defaults, name):
            continue  # from_toml names unknown keys
        expected = getattr(defaults, name)
        if is_dataclass(expected):
            if not isinstance(value, dict):
                raise InvalidConfig(f"{where}{key} in the changefeed config must be a table ([{where}{key}])")
            _check_types(value, expected, f"{where}{key}.")
        elif isinstance(expected, tuple):
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise InvalidConfig(f"{where}{key} in the changefeed config must be an array of strings, "
                                    f"got {value!r}")
        elif isinstance(expected, int) and (not isinstance(value, int) or isinstance(value, bool)):
            raise InvalidConfig(f"{where}{key} in the changefeed config must be an integer, got {value!r}")


class ChangefeedService:
    def __init__(self, store: MetaStore) -> None:
        self.store = store

    # ---- create ----------------------------------------------------------------------------------
    def create(self, req: CreateRequest) -> dict[str, Any]:
        if not ID_RE.match(req.changefeed_id or "") or len(req.changefeed_id) > 64:
            raise InvalidArgument(
                f"invalid changefeed id {req.changefeed_id!r}: use letters, digits and single dashes "
                f"(^[a-zA-Z0-9]+(-[a-zA-Z0-9]+)*$, at most 64 characters)")
        parse_upstream_uri(req.upstream_uri)
        sink_uri = parse_sink_uri(req.sink_uri)
        config = load_config(req.config)
        table_filter = TableFilter(config.filter.rules)
        if req.target_ts < 0:
            raise InvalidArgument("target-ts must be >= 0")
        if self.store.get_changefeed(req.changefeed_id) is not None:
            from cdc.errors import ChangefeedExists

            raise ChangefeedExists(f"changefeed {req.changefeed_id!r} already exists")

        sink = open_sink(req.sink_uri, config.sink)
        try:
            sink.check()
            conn = connect(req.upstream_uri)
            try:
                admin.check_upstream(conn)
                tables = table_filter.select(catalog.list_tables(conn))
                if not tables:
                    raise InvalidArgument(
                        f"the filter {list(config.filter.rules)!r} matches no table in the upstream database "
                        f"{parse_upstream_uri(req.upstream_uri).path!r}")
                admin.check_tables(conn, tables)
                targets: dict[str, TableName] = {}
                for t in tables:
                    target = sink.target_name(t)
                    if target in targets:
                        raise TargetNameConflict(
                            f"tables {targets[target]} and {t} would both land on {target!r} in the sink "
                            f"{sink_uri.redacted()}: exclude one of them with the filter")
                    targets[target] = t
                spans = self._create_spans(conn, req.changefeed_id, config.span_count, tables)
            finally:
                conn.close()
        finally:
            sink.close()

        now = time.time()
        start_ts = min(s.start_ts for s in spans)
        info = ChangefeedInfo(
            id=req.changefeed_id, upstream_uri=req.upstream_uri, sink_uri=req.sink_uri, config=config.to_dict(),
            start_ts=start_ts, start_time=now, create_time=now, spans=tuple(spans), target_ts=req.target_ts,
            state=FeedState.NORMAL, state_since=now)
        try:
            self.store.create_changefeed(info, ChangefeedStatus(start_ts, now, start_ts, now, now))
        except TidewaterError:
            self._drop_spans(req.upstream_uri, spans)
            raise
        log.info("changefeed=%s created: %d tables in %d spans, start=%s sink=%s", info.id, len(tables),
                 len(spans), lsn_to_str(start_ts), sink_uri.redacted())
        return self.describe(info.id)

    def _create_spans(self, conn: Any, cf_id: str, span_count: int, tables: list[TableName]) -> list[SpanInfo]:
        names = [(resource_name("pub", cf_id, i), resource_name("slot", cf_id, i)) for i in range(span_count)]
        for _, slot in names:
            if admin.slot_info(conn, slot) is not None:
                raise InvalidArgument(
                    f"replication slot {slot!r} already exists upstream: it belongs to another changefeed whose id "
                    f"maps to the same name (names are lower-case) or to another Tidewater cluster, or it was "
                    f"left behind; choose another changefeed id, or drop it with "
                    f"SELECT pg_drop_replication_slot('{slot}') if nothing uses it")
        # Clean up only what this call created: a slot or publication that already existed may belong to a
        # running changefeed, and dropping it would break that one.
        created_pubs: list[str] = []
        created_slots: list[str] = []
        spans: list[SpanInfo] = []
        try:
            for i, (pub, slot) in enumerate(names):
                if admin.create_publication(conn, pub, [t for t in tables if span_of(t, span_count) == i]):
                    created_pubs.append(pub)
                lsn = admin.create_slot(conn, slot)
                created_slots.append(slot)
                spans.append(SpanInfo(i, slot, pub, lsn))
        except BaseException:
            for slot in created_slots:
                try:
                    admin.drop_slot(conn, slot)
                except TidewaterError as exc:
                    log.error("cleanup after failed create: %s", exc)
            for pub in created_pubs:
                try:
                    admin.drop_publication(conn, pub)
                except TidewaterError as exc:
                    log.error("cleanup after failed create: %s", exc)
            raise
        return spans

    def _drop_spans(self, upstream_uri: str, spans: list[SpanInfo]) -> None:
        try:
            conn = connect(upstream_uri)
            try:
                for s in spans:
                    admin.drop_slot(conn, s.slot)
                    admin.drop_publication(conn, s.publication)
            finally:
                conn.close()
        except TidewaterError as exc:
            log.error("could not drop slots %s after a failed create: %s", [s.slot for s in spans], exc)

    # ---- read ------------------------------------------------------------------------------------
    def describe(self, cf_id: str) -> dict[str, Any]:
        snap = self.store.snapshot()
        entry = snap.changefeeds.get(cf_id)
        if entry is None:
            raise ChangefeedNotFound(f"changefeed {cf_id!r} does not exist")
        return describe(entry.value, snap.statuses.get(cf_id), snap.assignments.get(cf_id, {}),
                        snap.span_statuses.get(cf_id, {}))

    def list(self) -> list[dict[str, Any]]:
        snap = self.store.snapshot()
        out = []
        for cf_id in sorted(snap.changefeeds):
            info = snap.changefeeds[cf_id].value
            st = snap.statuses.get(cf_id) or ChangefeedStatus()
            out.append({"id": cf_id, "state": info.state.value, "checkpoint_ts": st.checkpoint_ts,
                        "checkpoint": lsn_to_str(st.checkpoint_ts), "checkpoint_lag": _lag(st.checkpoint_time),
                        "error": to_dict(info.error)})
        return out

    # ---- state changes ---------------------------------------------------------------------------
    def pause(self, cf_id: str) -> dict[str, Any]:
        return self._transition(cf_id, FeedState.STOPPED,
                                allowed=(FeedState.NORMAL, FeedState.WARNING, FeedState.FAILED, FeedState.STOPPED))

    def resume(self, cf_id: str) -> dict[str, Any]:
        return self._transition(cf_id, FeedState.NORMAL,
                                allowed=(FeedState.STOPPED, FeedState.FAILED, FeedState.WARNING, FeedState.NORMAL))

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
            if info.state is state:
                return self.describe(cf_id)
            new = info.with_state(state, error=None, retries=0, backoff_until=0.0)
            if self.store.update_changefeed(new, entry.mod_revision, []):
                log.info("changefeed=%s %s -> %s (API)", cf_id, info.state.value, state.value)
                return self.describe(cf_id)
        raise ChangefeedStateConflict(f"changefeed {cf_id!r} kept changing; retry")


def _lag(t: float) -> float | None:
    return round(max(0.0, time.time() - t), 3) if t else None


def describe(info: ChangefeedInfo, status: ChangefeedStatus | None, assignments: dict[int, Any],
             span_statuses: dict[int, Any]) -> dict[str, Any]:
    st = status or ChangefeedStatus()
    spans = []
    for s in info.spans:
        a = assignments.get(s.index)
        ss = span_statuses.get(s.index)
        spans.append({
            "index": s.index, "slot": s.slot, "publication": s.publication, "start_ts": s.start_ts,
            "capture": a.capture_id if a else None,
            "checkpoint_ts": ss.checkpoint_ts if ss else None,
            "checkpoint": lsn_to_str(ss.checkpoint_ts) if ss else None,
            "resolved_ts": ss.resolved_ts if ss else None,
            "running": ss.running if ss else False,
            "rows": ss.rows if ss else 0,
            "error": to_dict(ss.error) if ss and ss.error else None,
        })
    return {
        "id": info.id,
        "state": info.state.value,
        "upstream_uri": parse_upstream_uri(info.upstream_uri).redacted(),
        "sink_uri": parse_sink_uri(info.sink_uri).redacted(),
        "config": info.config,
        "start_ts": info.start_ts,
        "target_ts": info.target_ts,
        "create_time": info.create_time,
        "checkpoint_ts": st.checkpoint_ts,
        "checkpoint": lsn_to_str(st.checkpoint_ts),
        "checkpoint_time": st.checkpoint_time,
        "checkpoint_lag": _lag(st.checkpoint_time),
        "resolved_ts": st.resolved_ts,
        "resolved_lag": _lag(st.resolved_time),
        "error": to_dict(info.error) if info.error else None,
        "spans": spans,
    }
