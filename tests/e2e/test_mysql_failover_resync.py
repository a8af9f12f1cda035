"""End to end: a resync (``changefeed snapshot --table``) of a MariaDB changefeed that was moved to a promoted replica
(`changefeed update --upstream`, Ts epoch 1), requested while writes go on; ends in a row-by-row compare with the new
primary (issue 23: the copy's snapshot positions must be compared with the stream's Ts of the new epoch)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from e2e_workload import FAST_LEASE, run_on_target, server_config, wait_for
from test_mysql_failover import DB, cli, pair  # noqa: F401 - pair: a fixture
from test_mysql_initial_copy import ROWS, churn, preload
from test_mysql_upstream_e2e import TABLES, binlog_end

from cdc.events import TableName
from cdc.meta.etcd import EtcdClient
from cdc.meta.snapshot_progress import SnapshotProgressStore
from cdc.meta.store import MetaStore
from playground.cluster import CdcServer
from playground.compare import compare_mysql_tables
from playground.servers import MariaDBServer
from upstream.mysql.positions import epoch_of

pytestmark = pytest.mark.e2e


def copy_positions(etcd: Any, cluster_id: str, cf: str, table: str) -> tuple[list[int], int, int, list[int]]:
    """The span's copy exports' Ts, ``table``'s floor and ceiling, and the Ts its chunks were read at."""
    client = EtcdClient([etcd.url])
    try:
        status = MetaStore(client, cluster_id).get_span_status(cf, 0)
        assert status is not None and status.value.snapshot is not None, status
        state = status.value.snapshot
        done = SnapshotProgressStore(client, cluster_id).done_chunks(cf, 0, TableName.parse(table))
        return ([ts for _, ts in state.exports], state.floors[table], state.ceilings[table],
                [d.commit_ts for d in done.values()])
    finally:
        client.close()


def assert_equal(cdc: CdcServer, server: MariaDBServer, epoch: int, sink: str) -> dict[str, Any]:
    info = cdc.wait_checkpoint("frs", binlog_end(server, epoch), timeout=240)
    conn = server.connect(DB)
    try:
        diffs = compare_mysql_tables(conn, [f"{DB}.{t}" for t in TABLES], sink)
    finally:
        conn.close()
    bad = [d for d in diffs if not d.equal]
    assert not bad, f"downstream differs from {server!r}: {bad}\n{cdc.log_tail()}"
    assert diffs[0].source_rows > ROWS // 2, diffs
    return info


def test_a_resync_after_a_failover_to_a_promoted_replica_ends_equal(
        etcd_server: Any, cluster_id: str, tmp_path: Path, pair: tuple[MariaDBServer, MariaDBServer]) -> None:  # noqa: F811
    primary, replica = pair
    sink = f"sqlite:///{tmp_path / 'target.db'}"
    cdc = CdcServer(etcd_server.url, tmp_path / "cdc", cluster_id=cluster_id,
                    extra_args=server_config(tmp_path, FAST_LEASE)).start()
    try:
        cdc.create_changefeed("frs", primary.uri(DB), sink, "[snapshot]\nchunk-rows = 2000\n")
        preload(primary, DB)
        churn(primary.connect(DB), 30, 1, 0.0, base=100_000, move_on=True)
        assert_equal(cdc, primary, 0, sink)

        # the failover
        rc, out, err = cli(cdc, "changefeed", "pause", "-c", "frs")
        assert rc == 0 and out["state"] == "stopped", (out, err)
        wait_for(cdc, "frs", lambda q: not any(s["running"] for s in q["spans"]), "the span stopped")
        replica.catch_up(primary)
        primary.kill()
        replica.promote()
        rc, out, err = cli(cdc, "changefeed", "update", "-c", "frs", "--upstream", replica.uri(DB))
        assert rc == 0, (out, err)
        rc, out, err = cli(cdc, "changefeed", "resume", "-c", "frs")
        assert rc == 0, (out, err)
        churn(replica.connect(DB), 30, 2, 0.0, base=200_000, move_on=True)
        info = assert_equal(cdc, replica, 1, sink)
        assert epoch_of(info["checkpoint_ts"]) == 1, info

        # the target diverges behind Tidewater's back; a resync of accounts while writes go on
        run_on_target(sink, "DELETE FROM accounts WHERE id % 7 = 0")
        run_on_target(sink, "UPDATE accounts SET owner = 'wrong' WHERE id % 11 = 0")
        run_on_target(sink, "INSERT INTO accounts (id, owner) VALUES (-1, 'extra')")
        writer = threading.Thread(target=churn, args=(replica.connect(DB), 300, 3, 0.01),
                                  kwargs={"base": 300_000, "move_on": True})
        writer.start()
        try:
            cdc.request("POST", "/api/v2/changefeeds/frs/snapshot", {"tables": [f"{DB}.accounts"]})
            wait_for(cdc, "frs", lambda q: any(s["table_copy"] for s in q["spans"]) or q["state"] != "normal",
                     "the table copy taken up")
            q = wait_for(cdc, "frs", lambda q: all((s["table_copy"] or {}).get("phase") == "done"
                                                   for s in q["spans"] if s["table_copy"]) or q["state"] != "normal",
                         "the table copy", timeout=240)
            assert q["state"] == "normal", q
        finally:
            writer.join()
        info = assert_equal(cdc, replica, 1, sink)
        assert info["state"] == "normal" and not info.get("error"), info
        wait_for(cdc, "frs", lambda q: q["table_copies"] == [], "the table copy finished")
        # the copy's positions are numbered as the stream's on the new server (epoch 1), so floors and ceilings
        # compare with its Ts (else every change since the hold replays over the copy as if it came after it, in
        # windows, not one transaction at a time, and Kafka/storage readers see the copy's rows below their cut)
        exports, floor, ceiling, chunks = copy_positions(etcd_server, cluster_id, "frs", f"{DB}.accounts")
        assert exports and all(epoch_of(ts) == 1 for ts in exports), exports
        assert epoch_of(floor) == 1 and epoch_of(ceiling) == 1 and floor <= ceiling, (floor, ceiling)
        assert chunks and all(epoch_of(ts) == 1 and ts >= floor for ts in chunks), (floor, chunks)
    finally:
        cdc.terminate()
