"""End to end: PostgreSQL -> `cdc server` (real etcd, real slot, LevelDB sorter) -> SQL sinks.

Every test ends with a row-by-row comparison of source and target.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from e2e_workload import (
    FAST_LEASE,
    aborted_big_transaction,
    assert_converged,
    big_transaction,
    mixed_workload,
    server_config,
    streamed_with_rolled_back_savepoint,
    wait_for,
)

from playground.cluster import CdcServer
from playground.servers import PostgresServer

pytestmark = pytest.mark.e2e






def test_mixed_workload_big_and_aborted_transactions(
    cdc_server: CdcServer, pg_server: PostgresServer, pg_database: str, source: Any, sink_uri: str
) -> None:
    cdc_server.create_changefeed("cf1", pg_server.uri(pg_database), sink_uri, snapshot="none")
    mixed_workload(source, 60)
    big_transaction(source, 30_000)
    aborted_big_transaction(source, 20_000)
    streamed_with_rolled_back_savepoint(source, 5_000)
    mixed_workload(source, 20, start=60)
    info = assert_converged(cdc_server, "cf1", source, sink_uri)
    assert info["state"] == "normal"
    with source.cursor() as cur:
        cur.execute("SELECT count(*) FROM \"Ledger Entries\" WHERE memo LIKE 'dropped%%'")
        assert cur.fetchone()[0] == 0


def test_sigkill_mid_stream_then_restart_converges(
    etcd_server: Any,
    cluster_id: str,
    tmp_path: Path,
    pg_server: PostgresServer,
    pg_database: str,
    source: Any,
) -> None:
    sink = f"sqlite:///{tmp_path / 'target.db'}"
    config = server_config(tmp_path, FAST_LEASE)
    cdc = CdcServer(etcd_server.url, tmp_path / "cdc", cluster_id=cluster_id, extra_args=config).start()
    try:
        cdc.create_changefeed("kill", pg_server.uri(pg_database), sink, snapshot="none")
        # the big transaction starts once the (empty) initial copy is done: it is streamed, not copied
        wait_for(cdc, "kill", lambda q: q["phase"] == "streaming", "the initial copy")
        mixed_workload(source, 20)
        writer = threading.Thread(target=big_transaction, args=(pg_server.connect(pg_database), 150_000))
        writer.start()
        # kill the capture while the big transaction is being streamed / applied
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            spans = cdc.changefeed("kill")["spans"]
            if spans[0]["rows"] > 100:
                break
            time.sleep(0.05)
        else:
            raise AssertionError("the big transaction was not being streamed within 60 s")
        cdc.kill()
        writer.join()
        mixed_workload(source, 10, start=20)
        cdc = CdcServer(etcd_server.url, tmp_path / "cdc", cluster_id=cluster_id, port=cdc.port,
                        extra_args=config).start()
        me = cdc.get("/api/v2/status")["id"]
        wait_for(cdc, "kill", lambda q: all(s["capture"] == me and s["running"] for s in q["spans"]),
                 "the restarted capture running the span")
        writer = threading.Thread(target=mixed_workload, args=(pg_server.connect(pg_database), 30, 3, 30))
        writer.start()
        time.sleep(1.0)
        cdc.kill()  # second kill, mid small transactions
        writer.join()
        cdc = CdcServer(etcd_server.url, tmp_path / "cdc", cluster_id=cluster_id, port=cdc.port,
                        extra_args=config).start()
        info = assert_converged(cdc, "kill", source, sink)
        assert info["state"] == "normal"
    finally:
        cdc.terminate()


def test_pause_resume(
    cdc_server: CdcServer, pg_server: PostgresServer, pg_database: str, source: Any, tmp_path: Path
) -> None:
    sink = f"sqlite:///{tmp_path / 'target.db'}"
    cdc_server.create_changefeed("pr", pg_server.uri(pg_database), sink, snapshot="none")
    mixed_workload(source, 10)
    assert_converged(cdc_server, "pr", source, sink)
    paused = cdc_server.request("POST", "/api/v2/changefeeds/pr/pause")
    assert paused["state"] == "stopped"
    before = cdc_server.changefeed("pr")["checkpoint_ts"]
    mixed_workload(source, 10, start=10)
    time.sleep(3)
    q = cdc_server.changefeed("pr")
    assert q["state"] == "stopped" and q["checkpoint_ts"] == before, "a paused changefeed must not advance"
    assert all(s["capture"] is None for s in q["spans"])
    assert cdc_server.request("POST", "/api/v2/changefeeds/pr/resume")["state"] == "normal"
    assert_converged(cdc_server, "pr", source, sink)


def test_remove_drops_slot_publication_and_keys(
    cdc_server: CdcServer,
    pg_server: PostgresServer,
    pg_database: str,
    source: Any,
    tmp_path: Path,
    etcd_server: Any,
    cluster_id: str,
) -> None:
    sink = f"sqlite:///{tmp_path / 'target.db'}"
    info = cdc_server.create_changefeed("rm", pg_server.uri(pg_database), sink, snapshot="none")
    slot, pub = info["spans"][0]["slot"], info["spans"][0]["publication"]
    mixed_workload(source, 5)
    assert_converged(cdc_server, "rm", source, sink)
    cdc_server.request("DELETE", "/api/v2/changefeeds/rm")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            cdc_server.changefeed("rm")
        except Exception:  # noqa: BLE001 - 404 once removed
            break
        time.sleep(0.3)
    else:
        pytest.fail("changefeed not removed within 30s")
    assert (
        pg_server.execute(
            "SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s", db=pg_database, params=(slot,)
        )[0][0]
        == 0
    )
    assert (
        pg_server.execute(
            "SELECT count(*) FROM pg_publication WHERE pubname = %s", db=pg_database, params=(pub,)
        )[0][0]
        == 0
    )
    import etcd3

    host, port = etcd_server.url.rsplit("//", 1)[1].split(":")
    client = etcd3.client(host=host, port=int(port))
    left = [m.key.decode() for _, m in client.get_prefix(f"/tidewater/{cluster_id}/changefeed/")]
    assert left == [], left
