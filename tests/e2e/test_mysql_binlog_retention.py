"""End to end: a MariaDB upstream that keeps its binlog for less than the servers' gc-ttl gets a warning in
`changefeed create`'s output and in the changefeed's state (the owner's periodic look), naming both durations and
the fix; one that keeps it long enough (or forever) gets none."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from e2e_workload import FAST_LEASE, server_config, wait_for

from playground.cluster import CdcServer
from playground.servers import MariaDBServer

pytestmark = pytest.mark.e2e

CODE = "CDC:NoticeRetentionShort"


def test_binlog_retention_shorter_than_gc_ttl_is_a_warning_at_create_and_in_the_state(
        etcd_server: Any, cluster_id: str, tmp_path: Path) -> None:
    upstream = MariaDBServer(tmp_path / "up", settings={"binlog-expire-logs-seconds": "3600"}).start()
    cdc: CdcServer | None = None
    try:
        upstream.create_database("shop")
        upstream.execute("CREATE TABLE shop.t (id INT PRIMARY KEY)")
        # gc-ttl of 2 h: the server keeps its binlog for 1 h
        config = server_config(tmp_path, FAST_LEASE + "gc-ttl = 7200\n")
        cdc = CdcServer(etcd_server.url, tmp_path / "cdc", cluster_id=cluster_id, extra_args=config).start()
        created = cdc.create_changefeed("short", upstream.uri("shop"), f"sqlite:///{tmp_path / 'a.db'}",
                                        snapshot="none")
        [notice] = [n for n in created.get("notices", []) if "binlog" in n]
        assert "3600s" in notice and "gc-ttl (7200s)" in notice and "binlog_expire_logs_seconds = 7200" in notice
        q = wait_for(cdc, "short", lambda q: any(w["code"] == CODE for w in q["warnings"]),
                     "the retention warning in the changefeed's state")
        [w] = [w for w in q["warnings"] if w["code"] == CODE]
        assert "3600s" in w["message"] and q["state"] == "normal", q  # a notice: the data is not affected yet

        # kept forever (0): nothing to warn about
        upstream.execute("SET GLOBAL binlog_expire_logs_seconds = 0")
        created = cdc.create_changefeed("forever", upstream.uri("shop"), f"sqlite:///{tmp_path / 'b.db'}",
                                        snapshot="none")
        assert not [n for n in created.get("notices", []) if "binlog" in n], created.get("notices")
        wait_for(cdc, "forever", lambda q: all(s["running"] for s in q["spans"]), "the span running")
        assert not [w for w in cdc.changefeed("forever")["warnings"] if w["code"] == CODE]
    finally:
        if cdc is not None:
            cdc.terminate()
        upstream.kill()
