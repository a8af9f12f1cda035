"""End to end: a ``CREATE TABLE`` upstream (MariaDB) is a DDL event through the barrier, so an empty new table appears
in SQLite, PostgreSQL and MariaDB targets with its columns (types translated); ``CREATE TABLE ... LIKE`` and ``...
SELECT`` too; a new table without a key shows the changefeed's ``CDC:WarnTableIneligible`` warning. Ends in a
row-by-row compare after rows are written into the new tables."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa
from e2e_workload import make_sink_uri, wait_for
from test_mysql_upstream_e2e import binlog_end

from playground.cluster import CdcServer
from playground.compare import compare_mysql_tables, sqlalchemy_url
from playground.servers import MariaDBServer, PostgresServer

pytestmark = pytest.mark.e2e


@pytest.fixture(params=["sqlite", "postgresql", "mariadb"])
def create_target(request: pytest.FixtureRequest, tmp_path: Path, pg_server: PostgresServer) -> str:
    """A fresh target database on the session's PostgreSQL and MariaDB servers, or a SQLite file."""
    return make_sink_uri(request.param, request, tmp_path, pg_server)


def target_columns(target: str, db: str) -> dict[str, list[tuple[str, str]]]:
    """Per table of the target: its columns (name, type as SQLAlchemy names it, lower case)."""
    engine = sa.create_engine(sqlalchemy_url(target))
    try:
        schema = db if target.startswith("postgresql") else None
        insp = sa.inspect(engine)
        return {t: [(c["name"], str(c["type"]).lower()) for c in insp.get_columns(t, schema=schema)]
                for t in insp.get_table_names(schema=schema)}
    finally:
        engine.dispose()


def test_created_tables_reach_the_target_empty_and_then_with_their_rows(
        cdc_server: CdcServer, mariadb_server: MariaDBServer, mariadb_database: str, create_target: str) -> None:
    db = mariadb_database
    mariadb_server.execute("CREATE TABLE base (id INT PRIMARY KEY, v VARCHAR(20))", db=db)
    mariadb_server.execute("INSERT INTO base VALUES (1, 'one'), (2, 'two')", db=db)
    cdc_server.create_changefeed("ct", mariadb_server.uri(db), create_target, snapshot="none")
    wait_for(cdc_server, "ct", lambda q: all(s["running"] for s in q["spans"]), "the span running")
    conn = mariadb_server.connect(db)
    try:
        with conn.cursor() as cur:
            cur.execute("CREATE TABLE empty1 (id BIGINT UNSIGNED PRIMARY KEY, name VARCHAR(30) NOT NULL, "
                        "amount DECIMAL(12,3), at DATETIME(6), data BLOB, code CHAR(3) NOT NULL, UNIQUE KEY (code)) "
                        "DEFAULT CHARSET utf8mb4")
            cur.execute("CREATE TABLE like1 LIKE empty1")
            cur.execute("CREATE TABLE sel1 (PRIMARY KEY (id)) SELECT id, v FROM base")
            cur.execute("CREATE TABLE nokey (a INT, b TEXT)")
            cur.execute("CREATE TABLE nokey_sel SELECT id, v FROM base")
            cur.execute("CREATE TEMPORARY TABLE tmp1 (id INT PRIMARY KEY)")
        info = cdc_server.wait_checkpoint("ct", binlog_end(mariadb_server), timeout=120)
        assert not info.get("error") or info["error"]["data_warning"], info  # (the keyless tables, below)
        cols = target_columns(create_target, db)
        assert {"empty1", "like1", "sel1"} <= set(cols), cols
        assert not {"nokey", "nokey_sel", "tmp1"} & set(cols), cols
        assert [c for c, _ in cols["empty1"]] == ["id", "name", "amount", "at", "data", "code"], cols["empty1"]
        assert cols["like1"] == cols["empty1"], cols
        types = dict(cols["empty1"])
        if not create_target.startswith("sqlite"):  # (SQLite keeps DECIMAL as exact text, docs/type-mapping.md)
            assert types["amount"] in ("numeric(12, 3)", "decimal(12, 3)"), types
        assert [c for c, _ in cols["sel1"]] == ["id", "v"], cols["sel1"]
        keyless = {f"{db}.nokey", f"{db}.nokey_sel"}
        q = wait_for(cdc_server, "ct", lambda q: q["state"] == "warning" and {w["table"] for w in q["warnings"]}
                     >= keyless, "the keyless tables' warnings")
        assert all(w["code"] == "CDC:WarnTableIneligible" for w in q["warnings"]), q["warnings"]
        # the rows after the create
        with conn.cursor() as cur:
            for i in range(30):
                cur.execute("INSERT INTO empty1 VALUES (%s, %s, %s, %s, %s, %s)",
                            (2**63 + i, f"n{i}", f"{i}.125", f"2024-01-02 03:04:05.{i:06d}", bytes([i, 0]), f"c{i}"))
                cur.execute("INSERT INTO like1 (id, name, code) VALUES (%s, %s, %s)", (i, f"like {i}", f"l{i}"))
            cur.execute("UPDATE empty1 SET amount = amount * 2 WHERE id % 3 = 0")
            cur.execute("DELETE FROM like1 WHERE id % 4 = 1")
            cur.execute("INSERT INTO sel1 VALUES (3, 'three')")
            cur.execute("INSERT INTO nokey VALUES (1, 'x')")
        info = cdc_server.wait_checkpoint("ct", binlog_end(mariadb_server), timeout=120)
        assert not info.get("error") or info["error"]["data_warning"], info  # (the keyless tables, below)
        diffs = compare_mysql_tables(conn, [f"{db}.{t}" for t in ("empty1", "like1", "sel1")], create_target)
    finally:
        conn.close()
    assert all(d.equal for d in diffs), f"{diffs}\n{cdc_server.log_tail(60)}"
    assert [d.source_rows for d in diffs] == [30, 22, 3], diffs  # (base: before the changefeed, snapshot none)
