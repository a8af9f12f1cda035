"""`/metrics` of real replicating captures: the documented families exist with their label sets, the span
series sit on the capture that runs the span, stage counters agree once the changefeed caught up, and the
owner alone exports changefeed and slot series."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest
from ops_cluster import CHANGEFEED, OPS_SCHEMA, scrape, start_ops_cluster
from prometheus_client.parser import text_string_to_metric_families

from playground.servers import EtcdServer, PostgresServer

pytestmark = pytest.mark.e2e

DOCS = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


@pytest.fixture
def source_schema() -> str:
    return OPS_SCHEMA


def _families(text: str) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def _labels(fam: Any) -> set[tuple[str, ...]]:
    return {tuple(sorted(k for k in s.labels if k != "le")) for s in fam.samples}


def _span_values(fam: Any, name: str) -> dict[tuple[str, str], float]:
    return {(s.labels["changefeed"], s.labels["span"]): s.value for s in fam.samples if s.name == name}


def test_replicating_captures_export_documented_series(etcd_server: EtcdServer, cluster_id: str, tmp_path: Path,
                                                       pg_server: PostgresServer, pg_database: str,
                                                       source: Any) -> None:
    cluster = start_ops_cluster(etcd_server.url, cluster_id, tmp_path, pg_server, pg_database, source)
    try:
        deadline = time.monotonic() + 20
        while True:  # the owner's first upstream look (1 s interval) and both spans placed
            texts = [scrape(c) for c in cluster.captures]
            fams = [_families(t) for t in texts]
            owners = [f for f in fams if f["tidewater_owner"].samples[0].value == 1]
            running = [_span_values(f["tidewater_span_running"], "tidewater_span_running") for f in fams]
            if (len(owners) == 1 and owners[0]["tidewater_slot_retained_wal_bytes"].samples
                    and sum(len(r) for r in running) == 2) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert len(owners) == 1, [f["tidewater_owner"].samples for f in fams]
        owner = owners[0]
        # every span runs on exactly one capture, and each capture has one (rebalanced over the two)
        assert sorted(k for r in running for k in r) == [(CHANGEFEED, "0"), (CHANGEFEED, "1")]
        assert all(len(r) == 1 for r in running), running

        spans = {"changefeed", "span"}
        for f in fams:
            for name in ("tidewater_span_checkpoint_lag_seconds", "tidewater_puller_received_rows",
                         "tidewater_sorter_input_bytes", "tidewater_sorter_output_rows", "tidewater_sink_rows",
                         "tidewater_sink_bytes", "tidewater_sorter_memory_bytes", "tidewater_sink_write_duration_seconds",
                         "tidewater_sink_batch_rows", "tidewater_span_restarts", "tidewater_span_backoff_seconds"):
                assert _labels(f[name]) == {tuple(sorted(spans))}, name
            assert _labels(f["tidewater_etcd_request_duration_seconds"]) == {("op",)}
            ops = {s.labels["op"] for s in f["tidewater_etcd_request_duration_seconds"].samples}
            assert {"range_prefix", "txn", "lease_grant"} <= ops, ops
            assert f["tidewater_etcd_lease_refreshes"].samples
            assert f["process_resident_memory_bytes"].samples[0].value > 10e6
            assert f["tidewater_capture_session_alive"].samples[0].value == 1
        for c in cluster.captures:  # the scrapes so far are counted in the next one
            routes = {s.labels["route"] for s in _families(scrape(c))["tidewater_api_requests"].samples}
            assert "/metrics" in routes, routes
        # the create request went through capture 0's API, counted under its route template
        created = [s for s in fams[0]["tidewater_api_requests"].samples
                   if s.labels["route"] == "/api/v2/changefeeds" and s.labels["method"] == "POST"]
        assert [(s.labels["code"], s.value) for s in created] == [("201", 1.0)]

        # stage counters: everything received was committed (the workload's savepoint rollbacks aside) and
        # everything sorted was written once the changefeed caught up
        total = {name: sum(sum(_span_values(f[fam], name).values()) for f in fams) for fam, name in (
            ("tidewater_puller_received_rows", "tidewater_puller_received_rows_total"),
            ("tidewater_sorter_input_rows", "tidewater_sorter_input_rows_total"),
            ("tidewater_sorter_output_rows", "tidewater_sorter_output_rows_total"),
            ("tidewater_sink_rows", "tidewater_sink_rows_total"),
            ("tidewater_sink_bytes", "tidewater_sink_bytes_total"))}
        assert total["tidewater_sink_rows_total"] > 100, total
        assert total["tidewater_sorter_input_rows_total"] == total["tidewater_sorter_output_rows_total"] \
            == total["tidewater_sink_rows_total"], total
        assert total["tidewater_puller_received_rows_total"] >= total["tidewater_sorter_input_rows_total"]
        assert total["tidewater_sink_bytes_total"] > 10 * total["tidewater_sink_rows_total"]

        # owner-only families
        assert owner["tidewater_etcd_snapshot_ok"].samples[0].value == 1
        assert {(s.labels["changefeed"], s.labels["state"]): s.value
                for s in owner["tidewater_changefeed_state"].samples} == {(CHANGEFEED, "normal"): 1.0}
        lag = owner["tidewater_changefeed_checkpoint_lag_seconds"].samples
        assert [s.labels for s in lag] == [{"changefeed": CHANGEFEED}] and 0 <= lag[0].value < 30
        assert {s.labels["span"] for s in owner["tidewater_slot_usable"].samples} == {"0", "1"}
        assert all(s.value == 1 for s in owner["tidewater_slot_usable"].samples)
        assert {s.labels["status"] for s in owner["tidewater_slot_wal_status"].samples} <= {"reserved", "extended"}
        assert {s.labels["state"]: s.value for s in owner["tidewater_captures"].samples} == {"live": 2, "draining": 0}
        non_owner = next(f for f in fams if f is not owner)
        assert not non_owner["tidewater_changefeed_checkpoint_lag_seconds"].samples
        assert not non_owner["tidewater_slot_usable"].samples

        # docs/metrics.md documents every tidewater_* family the server exports
        documented = {d.removesuffix("_total") for d in re.findall(r"`(tidewater_[a-z_]+)`", DOCS.read_text())}
        exported = {name for f in fams for name in f if name.startswith("tidewater_")}
        assert exported <= documented, sorted(exported - documented)

        # remove the changefeed: every series labelled with it disappears from every capture
        cluster.captures[0].request("DELETE", f"/api/v2/changefeeds/{CHANGEFEED}")

        def labelled() -> list[str]:
            return [f"{s.name}{s.labels}" for c in cluster.captures for f in _families(scrape(c)).values()
                    for s in f.samples if s.labels.get("changefeed") == CHANGEFEED]

        deadline = time.monotonic() + 30
        while labelled() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert labelled() == []
    finally:
        cluster.stop()
