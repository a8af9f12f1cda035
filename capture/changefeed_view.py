"""What the API and the CLI show of changefeeds, spans and processors (views over the stored state; no I/O).

``describe`` is a changefeed as ``GET /api/v2/changefeeds/{id}`` answers it: state, redacted URIs, watermarks and
their lags, the data warnings, each span with its phase and table copy (docs/api.md)."""

from __future__ import annotations

import time
from typing import Any

from cdc.config import ChangefeedConfig
from cdc.meta.store import ClusterSnapshot
from cdc.model import (
    ChangefeedInfo,
    ChangefeedStatus,
    DataWarning,
    SpanStatus,
    VerifyHold,
    VerifyRun,
    span_copying,
)
from cdc.serde import to_dict
from cdc.snapshot import SnapshotProgress
from cdc.ts import lsn_to_str
from cdc.uri import redact


def span_load(snap: ClusterSnapshot) -> dict[str, int]:
    load: dict[str, int] = {}
    for spans in snap.assignments.values():
        for a in spans.values():
            load[a.capture_id] = load.get(a.capture_id, 0) + 1
    return load


def processor_spans(snap: ClusterSnapshot) -> dict[tuple[str, str], list[int]]:
    out: dict[tuple[str, str], list[int]] = {}
    for cf, spans in snap.assignments.items():
        if cf not in snap.changefeeds:
            continue
        for index, a in sorted(spans.items()):
            out.setdefault((cf, a.capture_id), []).append(index)
    return out


def processor_view(cf: str, capture_id: str, indexes: list[int], snap: ClusterSnapshot) -> dict[str, Any]:
    """A processor's view: its spans with their stored checkpoint/resolved Ts; ``running`` and ``error``
    count only when reported under the current assignment (same capture and epoch)."""
    statuses = snap.span_statuses.get(cf, {})
    spans: list[dict[str, Any]] = []
    errors: list[dict[str, Any]] = []
    for index in indexes:
        a = snap.assignments[cf][index]
        ss = statuses.get(index)
        current = ss is not None and ss.capture_id == a.capture_id and ss.epoch == a.epoch
        err = to_dict(ss.error) if current and ss is not None and ss.error else None
        if err:
            errors.append({"span": index, **err})
        spans.append({
            "index": index, "epoch": a.epoch, "stopping": a.stopping,
            "checkpoint_ts": ss.checkpoint_ts if ss else None,
            "checkpoint": lsn_to_str(ss.checkpoint_ts) if ss else None,
            "checkpoint_lag": lag(ss.checkpoint_time) if ss else None,
            "resolved_ts": ss.resolved_ts if ss else None,
            "resolved_lag": lag(ss.resolved_time) if ss else None,
            "running": bool(current and ss is not None and ss.running),
            "rows": ss.rows if current and ss is not None else 0,
            "error": err,
        })
    checkpoints = [s["checkpoint_ts"] for s in spans if s["checkpoint_ts"] is not None]
    resolved = [s["resolved_ts"] for s in spans if s["resolved_ts"] is not None]
    checkpoint = min(checkpoints) if len(checkpoints) == len(spans) else None
    return {
        "changefeed_id": cf, "capture_id": capture_id,
        "address": snap.captures[capture_id].advertise_addr if capture_id in snap.captures else None,
        "checkpoint_ts": checkpoint,
        "checkpoint": lsn_to_str(checkpoint) if checkpoint is not None else None,
        "resolved_ts": min(resolved) if len(resolved) == len(spans) else None,
        "spans": spans, "errors": errors,
    }


def lag(t: float) -> float | None:
    return round(max(0.0, time.time() - t), 3) if t else None


ONE_WRITER_SINKS = ("sqlite", "blackhole", "kafka", "file")  # sinks that ignore [sink] worker-count


def consistency_view(info: ChangefeedInfo) -> dict[str, Any]:
    """What a reader of the target may see (docs/architecture.md, "What a reader downstream sees"; docs/consistency.md):
    ``snapshot`` (``[consistency] mode = "snapshot"``: whole barriers only, with its interval and syncpoint setting),
    ``transaction``
    (every state it sees existed upstream: one span, one apply connection) or ``per-key`` (each key's changes in
    upstream order; across spans or apply workers a later transaction may become visible before an unrelated
    earlier one), with the span count and the apply workers of the sink."""
    try:
        config = ChangefeedConfig.from_dict(info.config)
    except Exception:  # noqa: BLE001 - a config stored by an older version: its default
        config = ChangefeedConfig()
    workers = config.sink.worker_count
    spans = len(info.spans)
    scheme = info.sink_uri.split(":", 1)[0].split("+", 1)[0].lower()
    if scheme in ONE_WRITER_SINKS:
        workers = 1  # SQLite has one writer per file; Kafka and files write in order per span (a sealed URI: as set)
    if config.consistency.snapshot:
        # (apply_workers: the connections each span stages on; every barrier is applied by one coordinator)
        return {"mode": "snapshot", "spans": spans, "apply_workers": workers, "interval": config.consistency.interval,
                "syncpoint": config.consistency.syncpoint,
                "detail": f"the target moves from one upstream state to the next: every {config.consistency.interval:g}"
                          "s, everything up to a barrier (the changefeed checkpoint) becomes visible in one "
                          "transaction; the barrier it shows is the latest barrier_ts of this changefeed in "
                          "tidewater_syncpoint (docs/consistency.md)"}
    if spans <= 1 and workers <= 1:
        return {"mode": "transaction", "spans": spans, "apply_workers": workers,
                "detail": "every state a reader of the target sees existed upstream (one span, one apply connection)"}
    why = " and ".join(w for w in (f"{spans} spans" if spans > 1 else "", f"{workers} apply workers"
                                   if workers > 1 else "") if w)
    return {"mode": "per-key", "spans": spans, "apply_workers": workers,
            "detail": f"each key's changes in upstream order; across keys ({why}) a later transaction may become "
                      "visible before an unrelated earlier one"}


def barrier_view(view: dict[str, Any], status: ChangefeedStatus) -> dict[str, Any]:
    """Snapshot mode: the consistency view with the barrier readers of the target see (``barrier_ts``, ``barrier``,
    ``barrier_lag``: seconds since its upstream commit; None before the first one), as the owner last stored it."""
    if view["mode"] != "snapshot":
        return view
    ts = status.barrier_ts or None
    return {**view, "barrier_ts": ts, "barrier": lsn_to_str(ts) if ts else None,
            "barrier_lag": lag(status.barrier_time) if ts and status.barrier_time else None}


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
            # the upstream's own position after the checkpoint (opaque: MySQL's GTID state and binlog file/position)
            "resume_token": ss.resume_token if ss else None,
            "resolved_ts": ss.resolved_ts if ss else None,
            "running": ss.running if ss else False,
            "rows": ss.rows if ss else 0,
            "retained_wal_bytes": st.retained_wal.get(str(s.index)),
            "error": to_dict(ss.error) if ss and ss.error else None,
            "warnings": len(ss.warnings) if ss else 0,
            "phase": span_phase(info, ss),
            "table_copy": table_copy_view(ss),
            "watermark_hold_ts": (ss.hold_ts or None) if ss else None,
            "verify_held_ts": (ss.held_ts or None) if ss and ss.held_id else None,
        })
    phases = {s["phase"] for s in spans}
    return {
        "id": info.id,
        "state": info.state.value,
        "phase": "snapshot" if "snapshot" in phases else "streaming",
        "upstream_uri": redact(info.upstream_uri),  # also when sealed with a key this capture lacks
        "sink_uri": redact(info.sink_uri),
        "config": info.config,
        "consistency": barrier_view(consistency_view(info), st),
        "start_ts": info.start_ts,
        "target_ts": info.target_ts,
        "create_time": info.create_time,
        "checkpoint_ts": st.checkpoint_ts,
        "checkpoint": lsn_to_str(st.checkpoint_ts),
        "checkpoint_time": st.checkpoint_time,
        "checkpoint_lag": lag(st.checkpoint_time),
        "resolved_ts": st.resolved_ts,
        "resolved_lag": lag(st.resolved_time),
        # what the sink's published checkpoint (Kafka watermarks, the storage sink's metadata) is held at while a
        # table copy runs (None: not held)
        "published_checkpoint_hold_ts": st.hold_ts if st.hold_ts and st.hold_ts < st.checkpoint_ts else None,
        "error": to_dict(info.error) if info.error else None,
        "warnings": [warning_view(w) for w in st.warnings],
        "spans": spans,
        "table_copies": [{"table": c.table, "span": c.span, "reason": c.reason, "requested_at": c.requested_at}
                         for c in info.table_copies],
    }


def hold_view(hold: VerifyHold | None, now: float) -> dict[str, Any] | None:
    """A ``changefeed verify`` hold of the changefeed (docs/verify.md, "The hold"): its point (``ts`` 0: the spans
    stop where they are), holder, deadline and whether it is still obeyed (an expired one is ignored); None if none."""
    if hold is None:
        return None
    return {"id": hold.id, "ts": hold.ts, "holder": hold.holder, "deadline": hold.deadline, "created": hold.created,
            "active": hold.active(now)}


VERIFY_RUNS_SHOWN = 5


def verify_runs_view(runs: list[VerifyRun]) -> list[dict[str, Any]]:
    """The changefeed's last ``changefeed verify`` runs (docs/verify.md), newest last: state, phase and chunks of a
    running one, whether a finished one found the tables equal (the whole report: GET .../verify/{id})."""
    out = []
    for r in runs[-VERIFY_RUNS_SHOWN:]:
        report = r.report or {}
        tables = report.get("tables") or []
        differs = [t.get("table") for t in tables
                   if any(t.get(k) for k in ("missing", "extra", "different", "inexact", "note"))]
        out.append({"id": r.id, "state": r.state, "phase": r.phase, "chunks": r.chunks, "chunks_done": r.chunks_done,
                    "started": r.started, "finished": r.finished or None,
                    "equal": (not differs and not report.get("error")) if r.report is not None else None,
                    "differing_tables": differs, "error": report.get("error") or r.error or None})
    return out


def table_copy_view(ss: SpanStatus | None) -> dict[str, Any] | None:
    """A span's table copy (docs/snapshot.md, "Table copies"): its tables and whether it is done; None if none."""
    snap = ss.snapshot if ss is not None else None
    if snap is None or not snap.tables:
        return None
    return {"tables": list(snap.tables), "phase": snap.phase}


def span_phase(info: ChangefeedInfo, ss: SpanStatus | None) -> str:
    """One span's phase: ``snapshot`` until it stored its initial copy as done."""
    return "snapshot" if span_copying(info, ss) else "streaming"


def snapshot_view(p: SnapshotProgress) -> dict[str, Any]:
    """The initial copy's progress as the API shows it: totals, then per table chunks done / total (the current
    plan's), rows copied (every row written, over all runs: never goes backwards), of which redone (written under
    plans dropped since: copied again), rows done of the current plan / planned, rows/s and ETA (None while unknown;
    never 0 while chunks are left), and ``chunking``: ``key ranges``, or ``whole table (no key)`` for a table copied
    as one chunk (cdc.meta.snapshot_progress.summarize)."""
    return {"chunks_done": p.chunks_done, "chunks_total": p.chunks_total, "rows_copied": p.rows_copied,
            "rows_redone": p.rows_redone, "rows_per_second": p.rows_per_second, "eta_seconds": p.eta_seconds,
            "tables": [{"table": t.table, "chunks_done": t.chunks_done, "chunks_total": t.chunks_total,
                        "rows_copied": t.rows_copied, "rows_redone": t.rows_redone, "rows_done": t.rows_done,
                        "rows_planned": t.rows_planned, "rows_per_second": t.rows_per_second,
                        "eta_seconds": t.eta_seconds, "chunking": t.chunking} for t in p.tables]}


def warning_view(w: DataWarning) -> dict[str, Any]:
    """A data warning as the API shows it (``last_time``: when last raised, ``first_time`` if only once)."""
    return {"code": w.code, "table": w.table, "severity": w.severity.value, "count": w.count, "keys": list(w.keys),
            "first_time": w.first_time, "last_time": w.seen, "message": w.message}
