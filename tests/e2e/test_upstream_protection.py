"""Protecting the upstream: a slot dropped under a running changefeed fails it loudly; a changefeed
stopped longer than gc-ttl releases its slot; retained WAL is reported."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from e2e_workload import assert_converged, mixed_workload, server_config, wait_for

from playground.cluster import ApiError, CdcServer
from playground.servers import EtcdServer, PostgresServer
from upstream.postgres import admin

pytestmark = pytest.mark.e2e

WATCH = "upstream-check-interval = 0.5\n"




def _server(etcd: EtcdServer, cluster_id: str, tmp_path: Path, *flags: str) -> CdcServer:
    return CdcServer(etcd.url, tmp_path / "cdc", cluster_id=cluster_id,
                     extra_args=[*server_config(tmp_path, WATCH), *flags]).start()



def test_dropped_slot_fails_the_changefeed_loudly(etcd_server: EtcdServer, cluster_id: str, tmp_path: Path,
                                                  pg_server: PostgresServer, pg_database: str, source: Any) -> None:
    cdc = _server(etcd_server, cluster_id, tmp_path)
    sink = f"sqlite:///{tmp_path / 'target.db'}"
    try:
        info = cdc.create_changefeed("lost", pg_server.uri(pg_database), sink, snapshot="none")
        mixed_workload(source, 3)
        assert_converged(cdc, "lost", source, sink)
        admin.drop_slot(source, info["spans"][0]["slot"], timeout=10)  # someone drops it (or a failover loses it)
        mixed_workload(source, 3, start=3)
        q = wait_for(cdc, "lost", lambda q: q["state"] == "failed", "failed state")
        assert q["error"]["code"] in ("CDC:ErrSlotLost",), q["error"]
        assert "slot" in q["error"]["message"] and "create it again" in q["error"]["message"], q["error"]
    finally:
        cdc.terminate()


def test_gc_ttl_releases_slots_of_a_stopped_changefeed(etcd_server: EtcdServer, cluster_id: str, tmp_path: Path,
                                                       pg_server: PostgresServer, pg_database: str,
                                                       source: Any) -> None:
    cdc = _server(etcd_server, cluster_id, tmp_path, "--gc-ttl", "3")
    sink = f"sqlite:///{tmp_path / 'target.db'}"
    try:
        info = cdc.create_changefeed("gc", pg_server.uri(pg_database), sink, snapshot="none")
        slot = info["spans"][0]["slot"]
        mixed_workload(source, 3)
        assert_converged(cdc, "gc", source, sink)
        q = wait_for(cdc, "gc", lambda q: q["spans"][0].get("retained_wal_bytes") is not None, "retained WAL reported")
        assert q["spans"][0]["retained_wal_bytes"] >= 0
        import urllib.request

        with urllib.request.urlopen(cdc.url + "/metrics", timeout=10) as resp:
            text = resp.read().decode()
        assert "tidewater_slot_retained_wal_bytes{" in text and "tidewater_changefeed_checkpoint_lag_seconds{" in text
        cdc.request("POST", "/api/v2/changefeeds/gc/pause")
        q = wait_for(cdc, "gc", lambda q: q["state"] == "failed", "failed after gc-ttl", timeout=60)
        assert q["error"]["code"] == "CDC:ErrGCTTLExceeded", q["error"]
        assert "create it again" in q["error"]["message"]
        deadline = time.monotonic() + 30
        while admin.slot_info(source, slot) is not None and time.monotonic() < deadline:
            time.sleep(0.3)
        assert admin.slot_info(source, slot) is None, "slot not released after gc-ttl"
        with pytest.raises(ApiError) as refused:
            cdc.request("POST", "/api/v2/changefeeds/gc/resume")
        assert refused.value.status >= 400
    finally:
        cdc.terminate()
