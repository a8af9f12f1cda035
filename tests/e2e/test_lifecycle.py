"""Changefeed lifecycle end to end: target-ts -> finished; an unretryable sink error -> failed, and
resume works once the cause is fixed."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from e2e_workload import assert_converged, mixed_workload, wait_state

from playground.cluster import CdcServer, current_lsn
from playground.servers import MariaDBServer, PostgresServer

pytestmark = pytest.mark.e2e





def test_target_ts_finishes_and_writes_nothing_after_it(cdc_server: CdcServer, pg_server: PostgresServer,
                                                        pg_database: str, source: Any, tmp_path: Path) -> None:
    sink = f"sqlite:///{tmp_path / 'target.db'}"
    mixed_workload(source, 1)
    target = current_lsn(source) + 64 * 1024  # a point some transactions ahead
    cdc_server.request("POST", "/api/v2/changefeeds", {
        "changefeed_id": "bounded", "upstream_uri": pg_server.uri(pg_database), "sink_uri": sink,
        "target_ts": target, "snapshot": "none"})
    t = 1
    while current_lsn(source) <= target + 64 * 1024:
        mixed_workload(source, 5, start=t)
        t += 5
    q = wait_state(cdc_server, "bounded", "finished")
    assert q["checkpoint_ts"] >= target
    deadline = time.monotonic() + 20
    while any(s["capture"] for s in q["spans"]) and time.monotonic() < deadline:
        time.sleep(0.3)
        q = cdc_server.changefeed("bounded")
    assert all(s["capture"] is None for s in q["spans"]), "a finished changefeed keeps no span running"
    with source.cursor() as cur:  # accounts inserted after the target are not downstream
        cur.execute("SELECT count(*) FROM accounts")
        (upstream_rows,) = cur.fetchone()
    import sqlite3

    (downstream_rows,) = sqlite3.connect(tmp_path / "target.db").execute("SELECT count(*) FROM accounts").fetchone()
    assert 0 < downstream_rows < upstream_rows


def test_unretryable_sink_error_fails_then_resume_after_fix(cdc_server: CdcServer, pg_server: PostgresServer,
                                                            pg_database: str, source: Any,
                                                            mariadb_server: MariaDBServer, mariadb_database: str) -> None:
    maria, target = mariadb_server, mariadb_database  # the session's server: this test never stops it
    # an existing target table that lacks a column: no retry can fix that, a human must
    maria.execute("CREATE TABLE accounts (id int PRIMARY KEY, owner text)", db=target)
    sink = maria.uri(target)
    cdc_server.request("POST", "/api/v2/changefeeds", {
        "changefeed_id": "broken", "upstream_uri": pg_server.uri(pg_database), "sink_uri": sink,
        "config": "[filter]\nrules = ['public.accounts']\n"})
    mixed_workload(source, 3)
    q = wait_state(cdc_server, "broken", "failed")
    assert q["error"]["code"] == "CDC:ErrSinkFatal", q["error"]
    assert "accounts" in q["error"]["message"]
    maria.execute("DROP TABLE accounts", db=target)  # the fix: let Tidewater create it
    cdc_server.request("POST", "/api/v2/changefeeds/broken/resume")
    wait_state(cdc_server, "broken", "normal")
    info = assert_converged(cdc_server, "broken", source, sink, ["public.accounts"])
    assert info["state"] == "normal"
