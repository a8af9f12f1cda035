"""The Tidewater Grafana dashboard as code (grafanalib): ``python deploy/grafana/dashboard.py`` rewrites
``deploy/grafana/tidewater.json``; ``--check`` exits 1 if the committed JSON differs from what this file builds
(tests/deploy/test_grafana_dashboard.py runs both, and checks every query against a real Prometheus and the
metrics a real ``cdc server`` exports).

Rows: overview, changefeed lag and throughput, spans, sink, sorter, upstream retention, captures and owner.
Every query selects ``$changefeed`` where it has a changefeed label; rates use ``$__rate_interval``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from grafanalib._gen import DashboardEncoder
from grafanalib.core import (
    BYTES_FORMAT,
    BYTES_PER_SEC_FORMAT,
    OPS_FORMAT,
    SECONDS_FORMAT,
    Dashboard,
    DataSourceInput,
    GridPos,
    Heatmap,
    RowPanel,
    Stat,
    Table,
    Target,
    Template,
    Templating,
    TimeSeries,
    YAxis,
)

OUT = Path(__file__).resolve().parent / "tidewater.json"
DS = "${DS_PROMETHEUS}"
CF = 'changefeed=~"$changefeed"'
RATE = "$__rate_interval"


def t(expr: str, legend: str = "", ref: str = "A", *, instant: bool = False, fmt: str = "time_series") -> Target:
    return Target(expr=expr, legendFormat=legend, refId=ref, instant=instant, format=fmt, datasource=DS)


def series(title: str, targets: list[Target], unit: str = "short", description: str = "") -> TimeSeries:
    return TimeSeries(title=title, dataSource=DS, targets=targets, unit=unit, description=description,
                      legendDisplayMode="table", legendPlacement="bottom", legendCalcs=["lastNotNull", "max"])


def stat(title: str, expr: str, legend: str = "", unit: str = "none", description: str = "") -> Stat:
    return Stat(title=title, dataSource=DS, targets=[t(expr, legend)], format=unit, description=description,
                reduceCalc="lastNotNull", graphMode="none")


def _layout(rows: list[tuple[str, list[Any], int]]) -> list[Any]:
    """Rows of panels, ``width`` grid units each (24 per line), 8 high, flowing left to right."""
    panels: list[Any] = []
    y = 0
    for title, row_panels, width in rows:
        panels.append(RowPanel(title=title, gridPos=GridPos(h=1, w=24, x=0, y=y)))
        y += 1
        x = 0
        for p in row_panels:
            if x + width > 24:
                x, y = 0, y + 8
            p.gridPos = GridPos(h=8, w=width, x=x, y=y)
            panels.append(p)
            x += width
        y += 8
    return panels


def stages(unit: str) -> list[Target]:
    kind = "rows" if unit == "rows" else "bytes"
    names = [("puller_received", "received"), ("sorter_input", "sorter in"), ("sorter_output", "sorter out"),
             ("sink", "written")]
    return [t(f"sum by (changefeed) (rate(tidewater_{n}_{kind}_total{{{CF}}}[{RATE}]))", f"{{{{changefeed}}}} {label}",
              chr(ord("A") + i)) for i, (n, label) in enumerate(names)]


def quantiles(metric: str, by: str) -> list[Target]:
    return [t(f"histogram_quantile({q}, sum by (le, {by}) (rate({metric}_bucket{{{CF}}}[{RATE}])))",
              f"{{{{{by.split(',')[0].strip()}}}}} p{int(q * 100)}", chr(ord("A") + i))
            for i, q in enumerate((0.5, 0.99))]


def build() -> Dashboard:
    overview = [
        stat("Changefeeds by state", "sum by (state) (tidewater_changefeed_state)", "{{state}}",
             description="From the owner; alerts: TidewaterChangefeedWarning/Failed"),
        stat("Worst checkpoint lag", f"max(tidewater_changefeed_checkpoint_lag_seconds{{{CF}}})", unit=SECONDS_FORMAT,
             description="Alerts at 5 min (warning) and 30 min (critical)"),
        stat("Rows written /s", f"sum(rate(tidewater_sink_rows_total{{{CF}}}[{RATE}]))", unit=OPS_FORMAT),
        stat("Captures", "sum by (state) (tidewater_captures)", "{{state}}"),
        stat("Owner", "max by (capture) (tidewater_owner) == 1", "{{capture}}",
             description="The capture id of the owner; empty: no owner (TidewaterNoOwner)"),
        stat("Data divergence warnings", f'sum(tidewater_data_warnings{{severity="divergence",{CF}}}) or vector(0)'),
    ]
    changefeeds = [
        series("Initial copy: rows done / planned",
               [t(f"(sum by (changefeed) (tidewater_snapshot_rows_copied{{{CF}}}) - "
                  f"sum by (changefeed) (tidewater_snapshot_rows_redone{{{CF}}})) / "
                  f"sum by (changefeed) (tidewater_snapshot_rows_planned{{{CF}}})", "{{changefeed}}"),
                t(f"max by (changefeed) (tidewater_changefeed_snapshot_copying{{{CF}}})", "{{changefeed}} copying",
                  "B")], "percentunit",
               "while a changefeed copies the rows that existed at its creation (it has no checkpoint until then); "
               "alert TidewaterSnapshotStalled"),
        series("Checkpoint lag", [t(f"max by (changefeed) (tidewater_changefeed_checkpoint_lag_seconds{{{CF}}})",
                                    "{{changefeed}}")], SECONDS_FORMAT,
               "now - upstream commit time of the newest change certainly downstream"),
        series("Resolved lag", [t(f"max by (changefeed) (tidewater_changefeed_resolved_lag_seconds{{{CF}}})",
                                  "{{changefeed}}")], SECONDS_FORMAT,
               "low resolved lag with high checkpoint lag: the sink is the bottleneck"),
        series("Rows /s by stage", stages("rows"), OPS_FORMAT),
        series("Bytes /s by stage", stages("bytes"), BYTES_PER_SEC_FORMAT),
    ]
    span_table = Table(
        title="Spans", dataSource=DS, targets=[
            t(f"max by (changefeed, span, instance) (tidewater_span_checkpoint_lag_seconds{{{CF}}})", "", "A",
              instant=True, fmt="table"),
            t(f"max by (changefeed, span, instance) (tidewater_span_resolved_lag_seconds{{{CF}}})", "", "B",
              instant=True, fmt="table"),
            t(f"sum by (changefeed, span, instance) (rate(tidewater_sink_rows_total{{{CF}}}[5m]))", "", "C",
              instant=True, fmt="table"),
            t(f"max by (changefeed, span, instance) (tidewater_span_backoff_seconds{{{CF}}})", "", "D",
              instant=True, fmt="table"),
            t(f"sum by (changefeed, span, instance) (tidewater_span_restarts_total{{{CF}}})", "", "E",
              instant=True, fmt="table"),
        ],
        transformations=[{"id": "merge", "options": {}},
                         {"id": "organize", "options": {"excludeByName": {"Time": True}, "renameByName": {
                             "Value #A": "checkpoint lag (s)", "Value #B": "resolved lag (s)", "Value #C": "rows/s",
                             "Value #D": "backoff (s)", "Value #E": "restarts"}}}],
        description="One line per span: the capture (instance) running it, lags, rate, backoff and restarts")
    spans = [
        span_table,
        series("Span failures (10 min) by stage and code",
               [t(f"sum by (changefeed, stage, code) (increase(tidewater_span_errors_total{{{CF}}}[10m]))",
                  "{{changefeed}} {{stage}} {{code}}")]),
        series("Span restarts (10 min)", [t(f"sum by (changefeed, span) (increase(tidewater_span_restarts_total{{{CF}}}[10m]))",
                                            "{{changefeed}}/{{span}}")]),
    ]
    sink = [
        Heatmap(title="Sink write latency", dataSource=DS, dataFormat="tsbuckets", hideZeroBuckets=True,
                targets=[t(f"sum by (le) (increase(tidewater_sink_write_duration_seconds_bucket{{{CF}}}[{RATE}]))",
                           "{{le}}", fmt="heatmap")],
                yAxis=YAxis(format=SECONDS_FORMAT, decimals=3),
                description="One sink write = one downstream transaction, mount to commit"),
        series("Sink write latency p50 / p99", quantiles("tidewater_sink_write_duration_seconds", "changefeed"),
               SECONDS_FORMAT),
        series("Rows per sink write p50 / p99", quantiles("tidewater_sink_batch_rows", "changefeed")),
        series("Transactions written /s", [t(f"sum by (changefeed) (rate(tidewater_sink_txns_total{{{CF}}}[{RATE}]))",
                                             "{{changefeed}}")], OPS_FORMAT),
    ]
    sorter = [
        series("Sorter memory", [t(f"sum by (changefeed) (tidewater_sorter_memory_bytes{{{CF}}})", "{{changefeed}}")],
               BYTES_FORMAT),
        series("Sorter disk and quota", [t("max by (instance) (tidewater_sorter_disk_bytes)", "{{instance}} used"),
                                         t("max by (instance) (tidewater_sorter_disk_quota_bytes > 0)",
                                           "{{instance}} quota", "B"),
                                         t("max by (instance) (tidewater_sorter_filesystem_free_bytes)",
                                           "{{instance}} fs free", "C")], BYTES_FORMAT),
        series("Spill files and open transactions",
               [t(f"sum by (changefeed) (tidewater_sorter_spill_files{{{CF}}})", "{{changefeed}} spill files"),
                t(f"sum by (changefeed) (tidewater_sorter_pending_txns{{{CF}}})", "{{changefeed}} open txns", "B")]),
    ]
    upstream = [
        series("Retained WAL per slot", [t(f"max by (changefeed, slot) (tidewater_slot_retained_wal_bytes{{{CF}}})",
                                           "{{slot}}")], BYTES_FORMAT,
               "WAL PostgreSQL keeps for the slot; alert TidewaterRetainedWalHigh"),
        series("Slot health", [t(f"min by (changefeed, slot) (tidewater_slot_usable{{{CF}}})", "{{slot}} usable"),
                               t(f"max by (changefeed, slot) (tidewater_slot_active{{{CF}}})", "{{slot}} active", "B"),
                               t(f"max by (changefeed, slot, status) (tidewater_slot_wal_status{{{CF}}})",
                                 "{{slot}} {{status}}", "C")]),
        series("Upstream reachable", [t(f"min by (changefeed) (tidewater_upstream_reachable{{{CF}}})",
                                        "{{changefeed}}")]),
    ]
    captures = [
        series("Owner", [t("max by (instance, capture) (tidewater_owner)", "{{instance}} {{capture}}")]),
        series("Owner changes and lost sessions (15 min)",
               [t("sum(increase(tidewater_owner_elections_total[15m]))", "owner elections"),
                t("sum by (instance) (increase(tidewater_capture_sessions_total[15m]))", "{{instance}} sessions",
                  "B")]),
        series("etcd request p99 by operation",
               [t(f"histogram_quantile(0.99, sum by (le, op) (rate(tidewater_etcd_request_duration_seconds_bucket[{RATE}])))",
                  "{{op}}")], SECONDS_FORMAT),
        series("etcd errors and lease refreshes /s",
               [t(f"sum by (op, code) (rate(tidewater_etcd_request_errors_total[{RATE}]))", "{{op}} {{code}}"),
                t(f"sum by (result) (rate(tidewater_etcd_lease_refreshes_total[{RATE}]))", "lease {{result}}", "B")],
               OPS_FORMAT),
        series("API requests /s by route and code",
               [t(f"sum by (route, code) (rate(tidewater_api_requests_total[{RATE}]))", "{{route}} {{code}}")],
               OPS_FORMAT),
        series("Capture CPU and memory",
               [t(f'rate(process_cpu_seconds_total{{job=~"tidewater.*"}}[{RATE}])', "{{instance}} cpu"),
                t('process_resident_memory_bytes{job=~"tidewater.*"} / 2^30', "{{instance}} RSS GiB", "B")]),
    ]
    panels = _layout([("Overview", overview, 4), ("Changefeeds", changefeeds, 12), ("Spans", spans, 8),
                      ("Sink", sink, 12), ("Sorter", sorter, 8), ("Upstream retention", upstream, 8),
                      ("Captures and owner", captures, 8)])
    template = Template(name="changefeed", label="changefeed", dataSource=DS, includeAll=True, multi=True,
                        allValue=".*", default="$__all", refresh=2, sort=1,
                        query={"query": "label_values(tidewater_changefeed_state, changefeed)", "refId": "cf"})
    return Dashboard(
        title="Tidewater", uid="tidewater", description="Tidewater CDC: changefeeds, spans, sink, sorter, "
        "upstream retention, captures (docs/metrics.md, docs/operations.md)", tags=["tidewater", "cdc"],
        timezone="utc", refresh="30s", panels=panels, templating=Templating(list=[template]),
        inputs=[DataSourceInput(name="DS_PROMETHEUS", label="Prometheus", pluginId="prometheus",
                                pluginName="Prometheus")]).auto_panel_ids()


def render() -> str:
    return json.dumps(build().to_json_data(), cls=DashboardEncoder, indent=2, sort_keys=True) + "\n"


def queries(doc: dict[str, Any]) -> list[tuple[str, str]]:
    """``(panel title, expr)`` of every target of a rendered dashboard, and of its template variables."""
    out: list[tuple[str, str]] = []
    for panel in doc["panels"]:
        for target in panel.get("targets", []):
            if target.get("expr"):
                out.append((panel["title"], target["expr"]))
    return out


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if OUT.read_text() != text:
            print(f"{OUT} is not what {__file__} builds: run python {__file__}", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
