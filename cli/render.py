"""Text output of ``cdc cli --output table``: lists as aligned tables, one object as ``key: value`` lines (plus a
table of its spans), and :func:`emit`, which prints either that or the JSON the API returned."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from typing import Any


def cell(value: Any) -> str:
    """One value as table text: None -> '-', bools lower-case, floats rounded, errors as 'CODE: message',
    other containers as compact JSON; newlines flattened."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.3f}".rstrip("0").rstrip(".")
    if isinstance(value, dict) and "code" in value and "message" in value:
        return f"{value['code']}: {value['message']}".replace("\n", " ")
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, separators=(",", ":"), default=str)
    return str(value).replace("\n", " ")


Column = tuple[str, Callable[[dict[str, Any]], Any]]


def col(header: str, key: str) -> Column:
    return header, lambda row: row.get(key)


def render_table(rows: Sequence[dict[str, Any]], columns: Sequence[Column]) -> str:
    """A plain text table: upper-case headers, columns left-aligned and separated by two spaces, no
    trailing blanks. Empty ``rows`` give the header line only."""
    grid = [[h.upper() for h, _ in columns]] + [[cell(get(r)) for _, get in columns] for r in rows]
    widths = [max(len(line[i]) for line in grid) for i in range(len(columns))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in grid)


def render_kv(pairs: Sequence[tuple[str, Any]]) -> str:
    """``key:  value`` lines with the values aligned."""
    if not pairs:
        return ""
    width = max(len(k) for k, _ in pairs) + 1
    return "\n".join(f"{(k + ':').ljust(width)}  {cell(v)}".rstrip() for k, v in pairs)


def _lag(seconds: Any) -> str | None:
    return None if seconds is None else f"{cell(float(seconds))}s"


def _time(unix: Any) -> str | None:
    """A unix time as UTC ``YYYY-MM-DD HH:MM:SS``."""
    if not unix:
        return None
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(float(unix)))


CHANGEFEED_COLUMNS: list[Column] = [
    col("id", "id"), col("state", "state"), col("checkpoint", "checkpoint"),
    ("checkpoint lag", lambda r: _lag(r.get("checkpoint_lag"))), col("warnings", "warnings"), col("error", "error")]
SPAN_COLUMNS: list[Column] = [
    col("span", "index"), col("capture", "capture"), col("slot", "slot"), col("publication", "publication"),
    col("checkpoint", "checkpoint"), col("running", "running"), col("rows", "rows"), col("error", "error")]
CAPTURE_COLUMNS: list[Column] = [
    col("id", "id"), col("address", "address"), col("owner", "is_owner"), col("draining", "draining"),
    col("spans", "spans"), col("version", "version"), col("pid", "pid")]
PROCESSOR_COLUMNS: list[Column] = [
    col("changefeed", "changefeed_id"), col("capture", "capture_id"),
    ("spans", lambda r: ",".join(str(s["index"]) for s in r.get("spans", []))), col("checkpoint", "checkpoint"),
    ("errors", lambda r: len(r.get("errors") or []))]
PROCESSOR_SPAN_COLUMNS: list[Column] = [
    col("span", "index"), col("epoch", "epoch"), col("checkpoint", "checkpoint"),
    ("checkpoint lag", lambda r: _lag(r.get("checkpoint_lag"))), ("resolved lag", lambda r: _lag(r.get("resolved_lag"))),
    col("running", "running"), col("rows", "rows"), col("error", "error")]
WARNING_COLUMNS: list[Column] = [
    col("severity", "severity"), col("code", "code"), col("table", "table"), col("count", "count"),
    ("keys", lambda r: ", ".join(r.get("keys") or []) or None),
    ("first", lambda r: _time(r.get("first_time"))), ("last", lambda r: _time(r.get("last_time"))),
    col("message", "message")]
DIFF_COLUMNS: list[Column] = [
    col("field", "field"), col("old", "old"), col("new", "new")]


def _consistency(c: dict[str, Any] | None) -> str | None:
    return f"{c.get('mode')}: {c.get('detail')}" if c else None


def _changefeed_text(cf: dict[str, Any]) -> str:
    pairs = [("id", cf.get("id")), ("state", cf.get("state")), ("upstream", cf.get("upstream_uri")),
             ("sink", cf.get("sink_uri")), ("start ts", cf.get("start_ts")), ("target ts", cf.get("target_ts")),
             ("checkpoint", cf.get("checkpoint")), ("checkpoint ts", cf.get("checkpoint_ts")),
             ("checkpoint lag", _lag(cf.get("checkpoint_lag"))), ("resolved ts", cf.get("resolved_ts")),
             ("resolved lag", _lag(cf.get("resolved_lag"))), ("consistency", _consistency(cf.get("consistency"))),
             ("error", cf.get("error"))]
    text = render_kv(pairs) + "\n\n" + render_table(cf.get("spans") or [], SPAN_COLUMNS)
    warnings = cf.get("warnings") or []
    if warnings:
        text += "\n\ndata warnings (cdc cli changefeed resume acknowledges them):\n"
        text += render_table(warnings, WARNING_COLUMNS)
    return text


def _processor_text(p: dict[str, Any]) -> str:
    pairs = [("changefeed", p.get("changefeed_id")), ("capture", p.get("capture_id")),
             ("address", p.get("address")), ("checkpoint", p.get("checkpoint")),
             ("checkpoint ts", p.get("checkpoint_ts")), ("resolved ts", p.get("resolved_ts")),
             ("errors", len(p.get("errors") or []))]
    return render_kv(pairs) + "\n\n" + render_table(p.get("spans") or [], PROCESSOR_SPAN_COLUMNS)


def _update_text(result: dict[str, Any]) -> str:
    diff = result.get("diff") or {}
    if not diff:
        return f"changefeed {result.get('changefeed', {}).get('id')}: nothing changed"
    rows = [{"field": k, "old": v.get("old"), "new": v.get("new")} for k, v in sorted(diff.items())]
    return render_table(rows, DIFF_COLUMNS)


VERIFY_COLUMNS: list[Column] = [
    col("table", "table"), col("source rows", "source_rows"), col("target rows", "target_rows"),
    col("chunks", "chunks"), col("differing", "chunks_differing"), col("missing", "missing"), col("extra", "extra"),
    col("different", "different"), col("inexact", "inexact"), col("note", "note")]
VERIFY_DIFF_COLUMNS: list[Column] = [
    col("table", "table"), col("kind", "kind"), ("key", lambda r: ", ".join("NULL" if k is None else str(k)
                                                                         for k in r.get("key") or [])),
    ("columns", lambda r: ", ".join(r.get("columns") or []) or None)]


def _verify_text(run: dict[str, Any]) -> str:
    """A verify run: its outcome, a table per table, then the differing keys (capped per table)."""
    report = run.get("report") or {}
    tables = report.get("tables") or []
    pairs = [("run", run.get("id")), ("state", run.get("state")), ("changefeed", report.get("changefeed")),
             ("compared at ts", report.get("ts")), ("consistency", report.get("consistency")),
             ("hold seconds", report.get("hold_seconds")), ("seconds", report.get("seconds")),
             ("note", report.get("note") or None), ("error", report.get("error") or run.get("error") or None),
             ("repaired (resynced, then verified again)", ", ".join(run.get("repaired") or []) or None)]
    text = render_kv(pairs)
    if tables:
        text += "\n\n" + render_table(tables, VERIFY_COLUMNS)
        diffs = [{"table": t.get("table"), **d} for t in tables for d in t.get("diffs") or []]
        if diffs:
            text += "\n\n" + render_table(diffs, VERIFY_DIFF_COLUMNS)
        more = {t.get("table"): t.get("more") for t in tables if t.get("more")}
        for table, n in more.items():
            text += f"\n... and {n} more differing key(s) of {table} (--output json lists the same)"
    return text


def format_table(kind: str, result: Any) -> str:
    """The ``--output table`` text of a command result (``kind`` from the command)."""
    if kind == "changefeeds":
        return render_table(result, CHANGEFEED_COLUMNS)
    if kind == "changefeed":
        return _changefeed_text(result)
    if kind == "captures":
        return render_table(result, CAPTURE_COLUMNS)
    if kind == "processors":
        return render_table(result, PROCESSOR_COLUMNS)
    if kind == "processor":
        return _processor_text(result)
    if kind == "update":
        return _update_text(result)
    if kind == "verify":
        return _verify_text(result)
    if isinstance(result, dict):
        return render_kv(list(result.items()))
    return cell(result)


def emit(kind: str, result: Any, output: str) -> str:
    if output == "table":
        return format_table(kind, result)
    return json.dumps(result, indent=2, default=str)


# ---- argument parsing --------------------------------------------------------------------------------
