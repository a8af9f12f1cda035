"""End to end failure behaviour: a sink outage, a frozen capture losing its lease, an idle upstream."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from e2e_workload import assert_converged, mixed_workload, server_config, wait_state

from playground.cluster import CdcServer
from playground.servers import MariaDBServer, PostgresServer
from upstream.postgres import admin

pytestmark = pytest.mark.e2e





def test_sink_outage_warns_retries_and_loses_nothing(cdc_server: CdcServer, pg_server: PostgresServer,
                                                     pg_database: str, source: Any, tmp_path: Path) -> None:
    maria = MariaDBServer(tmp_path / "maria").start()
    try:
        maria.create_database("target")
        sink = maria.uri("target")
        cdc_server.create_changefeed("outage", pg_server.uri(pg_database), sink, snapshot="none")
        mixed_workload(source, 10)
        assert_converged(cdc_server, "outage", source, sink)

        maria.kill()
        mixed_workload(source, 10, start=10)
        q = wait_state(cdc_server, "outage", "warning")
        assert q["error"]["code"] == "CDC:ErrSinkUnavailable", q["error"]
        assert str(maria.port) in q["error"]["message"] or "unavailable" in q["error"]["message"].lower(), q["error"]
        # the slot must not confirm anything the sink has not written
        checkpoint = q["checkpoint_ts"]
        time.sleep(3)
        slot = admin.slot_info(source, q["spans"][0]["slot"])
        assert slot is not None and slot.confirmed_flush_lsn is not None
        assert slot.confirmed_flush_lsn <= cdc_server.changefeed("outage")["checkpoint_ts"]
        assert cdc_server.changefeed("outage")["checkpoint_ts"] == checkpoint, "checkpoint moved while the sink was down"

        maria.start()
        wait_state(cdc_server, "outage", "normal", timeout=120)
        assert_converged(cdc_server, "outage", source, sink)
    finally:
        maria.stop()


def test_frozen_capture_loses_lease_reregisters_and_continues(etcd_server: Any, cluster_id: str, tmp_path: Path,
                                                              pg_server: PostgresServer, pg_database: str,
                                                              source: Any) -> None:
    cdc = CdcServer(etcd_server.url, tmp_path / "cdc", cluster_id=cluster_id,
                    extra_args=server_config(tmp_path, "session-ttl = 3\netcd-timeout = 1.0\nowner-tick = 0.2\n")).start()
    sink = f"sqlite:///{tmp_path / 'target.db'}"
    try:
        cdc.create_changefeed("frozen", pg_server.uri(pg_database), sink, snapshot="none")
        mixed_workload(source, 5)
        assert_converged(cdc, "frozen", source, sink)
        (before,) = cdc.get("/api/v2/captures")
        assert cdc.proc is not None
        os.kill(cdc.proc.pid, signal.SIGSTOP)
        try:
            mixed_workload(source, 5, start=5)
            time.sleep(6)  # twice the lease TTL: the lease expires while the process is frozen
        finally:
            os.kill(cdc.proc.pid, signal.SIGCONT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            caps = cdc.get("/api/v2/captures")
            if len(caps) == 1 and caps[0]["id"] != before["id"] and caps[0]["is_owner"]:
                break
            time.sleep(0.3)
        else:
            pytest.fail(f"capture did not re-register as a new owner: {caps}\n{cdc.log_tail()}")
        mixed_workload(source, 5, start=10)
        info = assert_converged(cdc, "frozen", source, sink)
        assert info["state"] == "normal"
        assert info["spans"][0]["capture"] == caps[0]["id"]
    finally:
        cdc.terminate()


def test_idle_upstream_keeps_checkpoint_lag_small(cdc_server: CdcServer, pg_server: PostgresServer,
                                                  pg_database: str, source: Any, tmp_path: Path) -> None:
    sink = f"sqlite:///{tmp_path / 'target.db'}"
    cdc_server.create_changefeed("idle", pg_server.uri(pg_database), sink, snapshot="none")
    mixed_workload(source, 3)
    assert_converged(cdc_server, "idle", source, sink)
    time.sleep(8)  # nothing is written upstream: keepalives must keep the watermarks moving
    q = cdc_server.changefeed("idle")
    assert q["checkpoint_lag"] is not None and q["checkpoint_lag"] < 4.0, q
    assert q["resolved_lag"] is not None and q["resolved_lag"] < 4.0, q
