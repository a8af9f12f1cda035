"""A real Prometheus (Debian package) scraping two replicating captures with deploy/prometheus/prometheus.yml
and the shipped alert rules: lag and throughput series arrive through its query API, and the checkpoint-lag
alert fires while the sink is stopped (the target's tables locked) and resolves once it is back.

The lag rule is the shipped expression with its threshold and ``for:`` shortened (5 s, 2 s) in a copy of the
rule file; every other rule is loaded as shipped. With ``TIDEWATER_RENDER_DOCS=1`` the dashboard's main
panels over the test's window are rendered to docs/images/dashboard.png (matplotlib), as docs/operations.md
shows (the outage is then held 15 s longer, for the picture).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from ops_cluster import CHANGEFEED, OPS_SCHEMA, start_ops_cluster

from playground.servers import EtcdServer, PostgresServer, PrometheusServer

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(shutil.which("prometheus") is None, reason="prometheus missing: run "
                                 "scripts/bootstrap.sh (Debian package prometheus)")]

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "deploy" / "prometheus"
LAG_RULE = "TidewaterCheckpointLagHigh"


@pytest.fixture
def source_schema() -> str:
    return OPS_SCHEMA


def prometheus_config(tmp_path: Path, targets: list[str]) -> dict[str, Any]:
    """deploy/prometheus/prometheus.yml with the real targets, 1 s intervals and a rule file that is the shipped
    one except for the lag rule's threshold and ``for:``."""
    rules = yaml.safe_load((SHIPPED / "alerts.yml").read_text())
    lag = next(r for g in rules["groups"] for r in g["rules"] if r["alert"] == LAG_RULE)
    assert lag["expr"].count("> 300") == 1
    lag["expr"] = lag["expr"].replace("> 300", "> 5")
    lag["for"] = "2s"
    rule_file = tmp_path / "alerts-test.yml"
    rule_file.write_text(yaml.safe_dump(rules, sort_keys=False))
    config = yaml.safe_load((SHIPPED / "prometheus.yml").read_text())
    config["global"].update({"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"})
    config["rule_files"] = [str(rule_file)]
    (job,) = config["scrape_configs"]
    job["static_configs"][0]["targets"] = targets
    return config




def _wait(what: str, check: Callable[[], Any], timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.5)


def _alert_state(prom: PrometheusServer, name: str) -> str:
    states = [a["state"] for a in prom.alerts() if a["labels"]["alertname"] == name]
    return states[0] if states else "inactive"


def _writer(pg_server: PostgresServer, db: str, stop: threading.Event) -> None:
    conn = pg_server.connect(db)
    try:
        with conn.cursor() as cur:
            while not stop.is_set():
                cur.execute("INSERT INTO events (kind, payload, small) SELECT 'tick', 'x', g FROM generate_series(1, 20) g")
                cur.execute("UPDATE accounts SET balance = balance + 1 WHERE id < 20")
                time.sleep(0.1)
    finally:
        conn.close()


def test_lag_alert_fires_while_sink_is_stopped_and_resolves(etcd_server: EtcdServer, cluster_id: str,
                                                             tmp_path: Path, pg_server: PostgresServer,
                                                             pg_database: str, source: Any) -> None:
    began = time.time()
    render = os.environ.get("TIDEWATER_RENDER_DOCS") == "1"
    cluster = start_ops_cluster(etcd_server.url, cluster_id, tmp_path, pg_server, pg_database, source)
    stop = threading.Event()
    writer = threading.Thread(target=_writer, args=(pg_server, pg_database, stop), daemon=True)
    writer.start()
    targets = [c.url.removeprefix("http://") for c in cluster.captures]
    prom = PrometheusServer(tmp_path / "prom", prometheus_config(tmp_path, targets)).start()
    lock = None
    try:
        # both captures scraped; lag and throughput series through the query API
        _wait("both targets up", lambda: len([r for r in prom.query('up{job="tidewater"} == 1')]) == 2, 20)
        lag = _wait("changefeed lag series", lambda: prom.query(
            f'tidewater_changefeed_checkpoint_lag_seconds{{changefeed="{CHANGEFEED}"}}'), 20)
        assert lag[0]["metric"]["job"] == "tidewater" and float(lag[0]["value"][1]) < 5
        rate = _wait("rows written per second", lambda: [r for r in prom.query(
            f'sum by (changefeed) (rate(tidewater_sink_rows_total{{changefeed="{CHANGEFEED}"}}[5s])) > 0')], 20)
        assert float(rate[0]["value"][1]) > 0
        spans = prom.query(f'count by (changefeed) (tidewater_span_running{{changefeed="{CHANGEFEED}"}} == 1)')
        assert spans and spans[0]["value"][1] == "2"
        assert _alert_state(prom, LAG_RULE) == "inactive"
        rules = prom.api("rules")["groups"]
        assert sum(len(g["rules"]) for g in rules) == 18 and all(r["health"] == "ok" for g in rules
                                                                  for r in g["rules"])

        # stop the sink: lock the target's tables, so that every sink write waits
        lock = pg_server.connect(cluster.target_db)
        lock.autocommit = False
        with lock.cursor() as cur:
            cur.execute("SELECT format('%I.%I', schemaname, tablename) FROM pg_tables WHERE schemaname = 'public'")
            tables = [r[0] for r in cur.fetchall()]
            assert tables
            cur.execute(f"LOCK TABLE {', '.join(tables)} IN ACCESS EXCLUSIVE MODE")
        stopped = time.monotonic()
        _wait("lag alert firing", lambda: _alert_state(prom, LAG_RULE) == "firing", 40)
        fired_after = time.monotonic() - stopped
        if render:  # a longer outage for the pictures
            time.sleep(15)
        firing = [a for a in prom.alerts() if a["labels"]["alertname"] == LAG_RULE]
        assert firing[0]["labels"]["changefeed"] == CHANGEFEED and firing[0]["labels"]["severity"] == "warning"
        assert firing[0]["annotations"]["runbook_url"] == "docs/operations.md#checkpoint-lag"

        # the sink comes back: the alert resolves
        lock.rollback()
        lock.close()
        lock = None
        back = time.monotonic()
        _wait("lag alert resolved", lambda: _alert_state(prom, LAG_RULE) == "inactive", 40)
        print(f"lag alert fired {fired_after:.1f}s after the sink stopped, resolved "
              f"{time.monotonic() - back:.1f}s after it came back")
        assert float(prom.query(f'tidewater_changefeed_checkpoint_lag_seconds{{changefeed="{CHANGEFEED}"}}')[0]
                     ["value"][1]) <= 5
        if render:
            time.sleep(10)
            render_charts(prom, began, time.time(), ROOT / "docs" / "images")
    finally:
        if lock is not None:
            lock.close()
        stop.set()
        writer.join(10)
        prom.stop()
        cluster.stop()


PANELS = ["Checkpoint lag", "Resolved lag", "Rows /s by stage", "Sink write latency p50 / p99",
          "Sorter memory", "Retained WAL per slot", "Bytes /s by stage", "Owner"]


def _legend(fmt: str, metric: dict[str, str]) -> str:
    return re.sub(r"\{\{ *(\w+) *\}\}", lambda m: metric.get(m.group(1), ""), fmt) or str(metric)


def render_charts(prom: PrometheusServer, start: float, end: float, out_dir: Path) -> None:
    """The dashboard's main panels (their own queries, from deploy/grafana/tidewater.json) over [start, end],
    from Prometheus' query_range, as one PNG grid (docs/images/dashboard.png; no Grafana runs here)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    doc = json.loads((ROOT / "deploy" / "grafana" / "tidewater.json").read_text())
    panels = {p["title"]: p for p in doc["panels"]}
    out_dir.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(4, 2, figsize=(14, 13), dpi=90)
    for ax, title in zip(axes.flat, PANELS, strict=True):
        for target in panels[title]["targets"]:
            expr = target["expr"].replace("$__rate_interval", "5s").replace("$changefeed", ".*")
            data = prom.api("query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}", step="1")["result"]
            for r in data:
                ax.plot([float(t) - start for t, _ in r["values"]], [float(v) for _, v in r["values"]],
                        label=_legend(target.get("legendFormat", ""), r["metric"]))
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=8)
        if ax.lines:
            ax.legend(loc="upper left", fontsize=7)
    for ax in axes[-1]:
        ax.set_xlabel("seconds since the test started the captures (target locked in the middle)", fontsize=8)
    fig.suptitle("Tidewater dashboard queries from a real Prometheus: two captures, sink stopped, then back")
    fig.tight_layout()
    fig.savefig(out_dir / "dashboard.png")
    plt.close(fig)
