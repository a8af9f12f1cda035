"""`cdc cli changefeed create --upstream mysql://...` against real MariaDB servers: every up-front problem is a clear
JSON error and a non-zero exit, and nothing is created; a ready upstream is accepted."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from playground.cluster import CdcServer
from playground.servers import EtcdServer, MariaDBServer

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def env(etcd_server: EtcdServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[CdcServer, MariaDBServer,
                                                                                          Path]]:
    base = tmp_path_factory.mktemp("mysql-refusals")
    upstream = MariaDBServer(base / "up").start()
    upstream.create_database("shop")
    upstream.execute("CREATE TABLE shop.items (id INT PRIMARY KEY, v VARCHAR(20))")
    server = CdcServer(etcd_server.url, base / "cdc", cluster_id="mysql-refusals").start()
    try:
        yield server, upstream, base
    finally:
        server.terminate()
        upstream.kill()


def cli(server: CdcServer, *args: str) -> tuple[int, str, str]:
    proc = subprocess.run([sys.executable, "-m", "cli", "cli", "--server", server.url, *args], capture_output=True,
                          text=True, timeout=120, cwd=REPO)
    return proc.returncode, proc.stdout, proc.stderr


def create(env: Any, cf: str, *extra: str, db: str = "shop") -> tuple[int, str, str]:
    server, upstream, base = env
    return cli(server, "changefeed", "create", "-c", cf, "--upstream", upstream.uri(db), "--sink-uri",
               f"sqlite:///{base / (cf + '.db')}", *extra)


def refused(res: tuple[int, str, str], code: str, *fragments: str) -> None:
    rc, out, err = res
    assert rc == 1 and out.strip() == "", res
    e = json.loads(err)
    assert e["error_code"] == code, res
    for f in fragments:
        assert f in e["error_msg"], (f, e["error_msg"])


def listed(env: Any) -> list[str]:
    rc, out, _ = cli(env[0], "changefeed", "list")
    assert rc == 0
    return [c["id"] for c in json.loads(out)]


def test_wrong_binlog_settings_exit_non_zero_with_the_fix(env: Any) -> None:
    upstream = env[1]
    upstream.execute("SET GLOBAL binlog_row_image = 'MINIMAL'")
    upstream.execute("SET GLOBAL binlog_format = 'MIXED'")
    try:
        refused(create(env, "bad-binlog", "--snapshot", "none"), "CDC:ErrUpstreamNotReady",
                "binlog_format is 'MIXED'", "binlog_row_image is 'MINIMAL'", "SET GLOBAL binlog_row_image = 'FULL'")
    finally:
        upstream.execute("SET GLOBAL binlog_row_image = 'FULL'")
        upstream.execute("SET GLOBAL binlog_format = 'ROW'")
    assert listed(env) == []


def test_a_table_without_key_is_named_with_the_fix(env: Any) -> None:
    upstream = env[1]
    upstream.create_database("nokeys")
    upstream.execute("CREATE TABLE nokeys.log (at DATETIME, msg TEXT)")
    upstream.execute("CREATE TABLE nokeys.fine (id INT PRIMARY KEY)")
    refused(create(env, "no-key", "--snapshot", "none", db="nokeys"), "CDC:ErrTableIneligible",
            "`nokeys`.`log` has no primary key", "ADD PRIMARY KEY")
    assert listed(env) == []


def test_a_ready_upstream_is_accepted(env: Any) -> None:
    # (the initial copy is accepted too since it exists: tests/e2e/test_mysql_initial_copy.py)
    rc, out, err = create(env, "ok", "--snapshot", "none")
    assert rc == 0, (out, err)
    assert json.loads(out)["id"] == "ok"
    rc, _, err = cli(env[0], "changefeed", "remove", "-c", "ok")
    assert rc == 0, err


def test_create_with_the_initial_copy_and_wait_returns_once_the_rows_are_copied(env: Any) -> None:
    """``changefeed create --wait`` from MariaDB: the copy's progress until it streams, exit code 0, and by then the
    target holds every row, equal row by row."""
    from playground.compare import compare_mysql_tables

    server, upstream, base = env
    upstream.execute("CREATE TABLE shop.copied (id INT PRIMARY KEY, v VARCHAR(20), d DECIMAL(10,3))")
    upstream.execute("INSERT INTO shop.copied SELECT seq, CONCAT('v', seq), seq / 8 FROM seq_1_to_2500", db="shop")
    try:
        rc, out, err = create(env, "waited", "--wait")
        assert rc == 0, (out, err)
        assert "chunks" in out + err, (out, err)  # the progress was shown
        conn = upstream.connect("shop")
        try:
            [diff] = compare_mysql_tables(conn, ["shop.copied"], f"sqlite:///{base / 'waited.db'}")
        finally:
            conn.close()
        assert diff.equal and diff.source_rows == 2500, diff
    finally:
        cli(server, "changefeed", "remove", "-c", "waited")
        upstream.execute("DROP TABLE shop.copied")
