"""deploy/grafana: the committed dashboard is what deploy/grafana/dashboard.py builds; every panel query parses
in a real Prometheus and names only metrics that a real `cdc server` exports (its /metrics scraped here)."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import ModuleType

import pytest

from playground.cluster import CdcServer
from playground.servers import EtcdServer, PrometheusServer

ROOT = Path(__file__).resolve().parents[2]
GRAFANA = ROOT / "deploy" / "grafana"


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("tidewater_dashboard", GRAFANA / "dashboard.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _queries() -> list[tuple[str, str]]:
    doc = json.loads((GRAFANA / "tidewater.json").read_text())
    out = _generator().queries(doc)
    for var in doc["templating"]["list"]:
        out.append((f"variable {var['name']}", var["query"]["query"]))
    return out


def _concrete(expr: str) -> str:
    """Grafana's variables replaced as Grafana would before sending the query; a variable's
    ``label_values(selector, label)`` (Grafana's, served from /api/v1/series) becomes its selector."""
    m = re.fullmatch(r"label_values\((.+), *[a-z_]+\)", expr)
    if m:
        expr = m.group(1)
    return expr.replace("$__rate_interval", "1m").replace("$changefeed", ".*")


@pytest.mark.deploy
def test_committed_dashboard_is_generated() -> None:
    r = subprocess.run([sys.executable, str(GRAFANA / "dashboard.py"), "--check"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    doc = json.loads((GRAFANA / "tidewater.json").read_text())
    titles = {p["title"] for p in doc["panels"]}
    assert {"Overview", "Changefeeds", "Spans", "Sink", "Sorter", "Upstream retention", "Captures and owner",
            "Checkpoint lag", "Sink write latency", "Retained WAL per slot", "Owner"} <= titles
    assert len(_queries()) > 30


def _exported(text: str) -> set[str]:
    """Sample names a scrape can contain, from its ``# TYPE`` lines (families without samples included)."""
    names: set[str] = set()
    for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M):
        if kind == "counter":
            names |= {f"{name.removesuffix('_total')}_total", f"{name.removesuffix('_total')}_created"}
        elif kind == "histogram":
            names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
        else:
            names.add(name)
    return names


@pytest.mark.e2e
@pytest.mark.skipif(shutil.which("prometheus") is None, reason="prometheus missing: run scripts/bootstrap.sh")
def test_every_query_parses_and_uses_exported_metrics(etcd_server: EtcdServer, cluster_id: str,
                                                      tmp_path: Path) -> None:
    cdc = CdcServer(etcd_server.url, tmp_path / "cdc", cluster_id=cluster_id).start()
    try:
        deadline = time.monotonic() + 15
        while True:  # the only capture becomes the owner: owner-only families appear
            with urllib.request.urlopen(cdc.url + "/metrics", timeout=10) as resp:
                text = resp.read().decode()
            if re.search(r'^tidewater_owner\{capture="[^"]+"\} 1\.0$', text, re.M) or \
                    time.monotonic() > deadline:
                break
            time.sleep(0.3)
    finally:
        cdc.terminate()
    exported = _exported(text)
    assert "tidewater_changefeed_checkpoint_lag_seconds" in exported  # scraped from the owner
    prom = PrometheusServer(tmp_path / "prom", {"global": {"scrape_interval": "15s"}, "scrape_configs": []}).start()
    try:
        bad: list[str] = []
        for title, expr in _queries():
            try:
                prom.query(_concrete(expr))
            except RuntimeError as exc:
                bad.append(f"{title}: {expr}: {exc}")
            used = set(re.findall(r"\b((?:tidewater|process)_[a-z0-9_]+)\b", expr))
            assert used, (title, expr)
            missing = used - exported
            if missing:
                bad.append(f"{title}: {expr}: not exported: {sorted(missing)}")
        assert not bad, "\n".join(bad)
        # the check can fail: a misspelt query is refused by the same Prometheus
        with pytest.raises(RuntimeError, match="bad_data"):
            prom.query("sum by (changefeed (tidewater_sink_rows_total)")
    finally:
        prom.stop()
