"""Schema changes under ``[consistency] mode = "snapshot"`` (issue 25, docs/consistency.md "Schema changes"): the bank
workload of tests/e2e/test_consistency_poller.py (transfers between account tables of three spans, a poller summing
every balance in the target 25+ times a second) while the upstream runs, one after another, ADD COLUMN with a default,
RENAME COLUMN, a type change and DROP COLUMN on account tables of two spans, and TRUNCATE, RENAME TABLE and DROP TABLE on
side tables, with rows written before and after each. Each DDL is applied downstream between two barriers (the span
waits for the barrier just before its transaction): no read sees a torn total, the target ends equal to the upstream
row by row, with the upstream's columns, and the dropped and renamed tables gone.

The kill test SIGKILLs the capture whose span waits at such a DDL for its barrier, then the owner (the coordinator)
while the next DDL waits for it, then runs a DDL again right after a capture restart: each DDL is applied exactly once
(its record downstream), and the target ends equal row by row."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from e2e_workload import FAST_LEASE, BackgroundWriter, server_config, wait_for
from test_consistency_poller import (  # noqa: F401 - cluster: a fixture
    ACCOUNTS,
    BANK_SCHEMA,
    START,
    TABLES,
    TOTAL,
    Cluster,
    Poller,
    barriers,
    cluster,
    precreate,
    target_of,
    transfer,
)

from cdc.events import TableName
from cdc.spans import span_of
from playground.cluster import CdcServer, current_lsn
from playground.compare import compare_tables, sqlalchemy_url
from playground.servers import EtcdServer, PostgresServer

pytestmark = pytest.mark.e2e

SIDE = ("log_a", "log_b")
DDL_TABLES = ("acct0", "acct1")  # column changes, in two spans
assert span_of(TableName("public", DDL_TABLES[0]), 3) != span_of(TableName("public", DDL_TABLES[1]), 3)


@pytest.fixture
def source_schema() -> str:
    return BANK_SCHEMA + "".join(f"CREATE TABLE {t} (id int PRIMARY KEY, v text);\n" for t in SIDE)


class Side:
    """Rows of the side tables and of the DDL'd account columns, written between the DDLs (one autocommit each)."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.n = 0

    def run(self, *sql: str) -> None:
        with self.conn.cursor() as cur:
            for s in sql:
                cur.execute(s)

    def rows(self, table: str, k: int = 3) -> None:
        for _ in range(k):
            self.n += 1
            self.run(f"INSERT INTO {table} VALUES ({self.n}, 'r{self.n}')")


STEPS = [  # (name, table written before it, the DDL, a write after it, table written after it)
    ("add column", "log_a", "ALTER TABLE acct0 ADD COLUMN note text DEFAULT 'n/a'",
     "UPDATE acct0 SET note = 'set' WHERE id = 1", "log_a"),
    ("add column in another span", "log_b", "ALTER TABLE acct1 ADD COLUMN extra numeric(10,2) DEFAULT 7",
     "UPDATE acct1 SET extra = 8.25 WHERE id = 2", "log_b"),
    ("rename column", "log_a", "ALTER TABLE acct1 RENAME COLUMN extra TO extra2",
     "UPDATE acct1 SET extra2 = 9.5 WHERE id = 3", "log_a"),
    # (a wider scale: the coordinator, which bound acct1 with scale 2 before, must apply 4 digits exactly)
    ("type change", "log_b", "ALTER TABLE acct1 ALTER COLUMN extra2 TYPE numeric(14,4)",
     "UPDATE acct1 SET extra2 = 12.3456 WHERE id = 4", "log_b"),
    ("drop column", "log_a", "ALTER TABLE acct0 DROP COLUMN note", "", "log_a"),
    ("truncate", "log_a", "TRUNCATE log_a", "", "log_a"),
    ("rename table", "log_a", "ALTER TABLE log_a RENAME TO log_c", "", "log_c"),
    ("drop table", "log_b", "DROP TABLE log_b", "", "log_c"),
]


def workload(side: Side, between: Callable[[str], None], steps: list[tuple[str, str, str, str, str]] = STEPS
             ) -> None:
    """The DDLs in order (autocommit), rows before and after each; ``between(name)`` runs after each DDL."""
    for name, before, ddl, after, then in steps:
        side.rows(before)
        side.run(ddl)
        if after:
            side.run(after)
        side.rows(then)
        between(name)


def target_columns(sink_uri: str, table: str) -> list[str] | None:
    """The target table's column names (None: no such table)."""
    engine = sa.create_engine(sqlalchemy_url(sink_uri))
    try:
        insp = sa.inspect(engine)
        schema = "public" if sink_uri.startswith("postgres") else None
        if not insp.has_table(table, schema=schema):
            return None
        return [c["name"] for c in insp.get_columns(table, schema=schema)]
    finally:
        engine.dispose()


def converge(cdc: CdcServer, source: Any, sink_uri: str, tables: tuple[str, ...]) -> None:
    """Wait for the checkpoint and the barrier at the upstream's end, then compare ``tables`` row by row."""
    end = current_lsn(source)
    cdc.wait_checkpoint("bank", end, timeout=120)
    deadline = time.monotonic() + 60
    while not barriers(sink_uri, "bank") or barriers(sink_uri, "bank")[-1] < end:
        assert time.monotonic() < deadline, f"no barrier at or above {end} applied in 60 s"
        time.sleep(0.2)
    for diff in compare_tables(source, [f"public.{t}" for t in tables], sink_uri):
        assert diff.equal and diff.source_rows == diff.target_rows, diff


def opening(source: Any) -> None:
    with source.cursor() as cur:  # the opening balances: one upstream transaction over every table
        cur.execute("BEGIN")
        for t in TABLES:
            cur.execute(f"INSERT INTO {t} SELECT g, {START} FROM generate_series(0, {ACCOUNTS - 1}) g")
        cur.execute("COMMIT")


def start(captures: Cluster, pg_server: PostgresServer, pg_database: str, sink_uri: str) -> None:
    precreate(sink_uri)
    config = 'span-count = 3\n[consistency]\nmode = "snapshot"\ninterval = 0.5\n'
    captures.any().create_changefeed("bank", pg_server.uri(pg_database), sink_uri, config, snapshot="none")


def writers(pg_server: PostgresServer, pg_database: str, n: int = 2) -> list[BackgroundWriter]:
    out = [BackgroundWriter(pg_server.connect(pg_database), transfer, start=i * 10**6, pause=0.01) for i in range(n)]
    for w in out:
        w.start()
    return out


def stop(ws: list[BackgroundWriter]) -> None:
    for w in ws:
        w.finish()
        w.conn.close()


@pytest.mark.parametrize("kind", ["postgresql", "mariadb", "sqlite"])
def test_schema_changes_in_snapshot_mode_show_no_torn_state(
        cluster: Cluster, pg_server: PostgresServer, pg_database: str, source: Any, tmp_path: Path,  # noqa: F811
        request: pytest.FixtureRequest, kind: str) -> None:
    sink_uri = target_of(kind, request, tmp_path, pg_server)
    start(cluster, pg_server, pg_database, sink_uri)
    side = Side(pg_server.connect(pg_database))
    with Poller(sink_uri) as poller:
        opening(source)
        ws = writers(pg_server, pg_database)
        try:
            time.sleep(1.0)
            workload(side, lambda _name: time.sleep(0.3))
            time.sleep(1.0)
        finally:
            stop(ws)
        cdc = cluster.any()
        converge(cdc, source, sink_uri, (*TABLES, "log_c"))
        time.sleep(0.3)
    side.conn.close()
    assert "note" not in (target_columns(sink_uri, "acct0") or [])
    acct1 = target_columns(sink_uri, "acct1") or []
    assert "extra2" in acct1 and "extra" not in acct1, acct1
    assert target_columns(sink_uri, "log_a") is None and target_columns(sink_uri, "log_b") is None
    assert len(ddl_records(sink_uri)) == len(STEPS) - 1  # (the TRUNCATE is a row change of PostgreSQL's stream)
    print(f"\n{kind} snapshot mode with DDLs: {len(poller.totals)} reads ({poller.rate:.1f}/s), {len(poller.torn)} torn, "
          f"{len(poller.errors)} failed")
    assert poller.torn == [], f"{len(poller.torn)} of {len(poller.totals)} reads saw a total that never existed"
    assert TOTAL in poller.totals
    assert poller.rate >= 20, poller.errors[:5]
    assert len(poller.errors) <= len(poller.totals) // 10, poller.errors[:5]
    wait_for(cdc, "bank", lambda q: q["state"] == "normal", "state normal")


def ddl_records(sink_uri: str) -> list[tuple[int, int, str]]:
    table = "tidewater.tidewater_ddl" if sink_uri.startswith("postgres") else "tidewater_ddl"
    engine = sa.create_engine(sqlalchemy_url(sink_uri))
    try:
        with engine.connect() as conn:
            return [(int(r[0]), int(r[1]), str(r[2])) for r in conn.exec_driver_sql(
                f"SELECT commit_ts, seq, query FROM {table} WHERE changefeed = 'bank' ORDER BY commit_ts, seq")]
    finally:
        engine.dispose()


def holder(captures: Cluster, table: str) -> int:
    """The index of the capture whose span carries ``public.table`` (waits up to 30 s for an assignment)."""
    span = span_of(TableName("public", table), 3)
    deadline = time.monotonic() + 30
    while True:
        try:
            ids = {str(s.get("/api/v2/status")["id"]): i for i, s in enumerate(captures.servers)
                   if s.proc is not None and s.proc.poll() is None}
            holding = captures.any().changefeed("bank")["spans"][span]["capture"]
            if holding in ids:
                return ids[holding]
        except Exception:  # noqa: BLE001 - a capture starting
            pass
        assert time.monotonic() < deadline, f"no capture holds span {span} in 30 s"
        time.sleep(0.2)


def test_kills_around_a_schema_change_apply_it_exactly_once(
        cluster: Cluster, pg_server: PostgresServer, pg_database: str, source: Any, tmp_path: Path,  # noqa: F811
        request: pytest.FixtureRequest) -> None:
    """``interval = 2``: a span waits up to 2 s at each DDL for its barrier. SIGKILLs of the capture holding the span
    while it waits, of the owner (the coordinator) while the barrier a span waits for is due, and of the capture holding
    the span right after its DDL is visible downstream (before the span staged the rows after it and stored its
    checkpoint): each DDL is applied exactly once (one record each, the rows after it neither lost nor doubled), no
    read sees a torn total, the target ends equal row by row."""
    sink_uri = target_of("postgresql", request, tmp_path, pg_server)
    precreate(sink_uri)
    config = 'span-count = 3\n[consistency]\nmode = "snapshot"\ninterval = 2.0\n'
    cluster.any().create_changefeed("bank", pg_server.uri(pg_database), sink_uri, config, snapshot="none")
    side = Side(pg_server.connect(pg_database))
    waited = []
    with Poller(sink_uri) as poller:
        opening(source)
        ws = writers(pg_server, pg_database)
        try:
            deadline = time.monotonic() + 60
            while TOTAL not in poller.totals:
                assert time.monotonic() < deadline, "the opening barrier never showed"
                time.sleep(0.1)
            # 1. the capture holding acct0's span, while that span waits at the DDL for its barrier
            side.rows("log_a")
            victim = holder(cluster, "acct0")
            side.run("ALTER TABLE acct0 ADD COLUMN note text DEFAULT 'n/a'")
            time.sleep(0.3)
            waited.append("note" not in (target_columns(sink_uri, "acct0") or []))
            cluster.kill(victim)
            side.run("UPDATE acct0 SET note = 'set' WHERE id = 1")
            side.rows("log_a")
            # 2. the owner, while the barrier the next DDL's span waits for is due
            side.run("ALTER TABLE acct1 ADD COLUMN extra int DEFAULT 7")
            time.sleep(0.2)
            waited.append("extra" not in (target_columns(sink_uri, "acct1") or []))
            cluster.kill(cluster.owner())
            side.run("UPDATE acct1 SET extra = 8 WHERE id = 2")
            side.rows("log_a")
            # 3. the capture holding log_a's span, as soon as its DDL shows downstream
            victim = holder(cluster, "log_a")
            side.run("ALTER TABLE log_a ADD COLUMN w int DEFAULT 1")
            side.run("UPDATE log_a SET w = 2 WHERE id = 1")
            side.rows("log_a")
            deadline = time.monotonic() + 60
            while "w" not in (target_columns(sink_uri, "log_a") or []):
                assert time.monotonic() < deadline, "the DDL never showed downstream"
                time.sleep(0.01)
            cluster.kill(victim)
            side.rows("log_a")
            time.sleep(1.0)
        finally:
            stop(ws)
        cdc = cluster.any()
        converge(cdc, source, sink_uri, (*TABLES, "log_a"))
        time.sleep(0.3)
    side.conn.close()
    replayed = sum(line.count("not applied again") for s in cluster.servers
                   for line in s.log_file.read_text(errors="replace").splitlines() if "log_a" in line)
    print(f"\nkills around DDLs: {len(poller.totals)} reads ({poller.rate:.1f}/s), {len(poller.torn)} torn, "
          f"{len(poller.errors)} failed; the span was still waiting at the kill: {waited}; the restarted span found "
          f"the DDL of kill 3 applied {replayed} time(s)")
    assert poller.torn == [], f"{len(poller.torn)} of {len(poller.totals)} reads saw a total that never existed"
    assert [q for _, _, q in ddl_records(sink_uri)] == [
        "ALTER TABLE acct0 ADD COLUMN note text DEFAULT 'n/a'", "ALTER TABLE acct1 ADD COLUMN extra int DEFAULT 7",
        "ALTER TABLE log_a ADD COLUMN w int DEFAULT 1"]
    wait_for(cdc, "bank", lambda q: q["state"] == "normal", "state normal")


@pytest.fixture
def one_span(etcd_server: EtcdServer, tmp_path: Path) -> Iterator[CdcServer]:
    cdc = CdcServer(etcd_server.url, tmp_path / "cdc", cluster_id=f"sddl-{uuid.uuid4().hex[:8]}",
                    extra_args=server_config(tmp_path, FAST_LEASE)).start()
    yield cdc
    cdc.kill()


def test_rows_before_a_schema_change_in_its_transaction_fail_the_changefeed_loudly(
        one_span: CdcServer, pg_server: PostgresServer, pg_database: str, source: Any, tmp_path: Path,
        request: pytest.FixtureRequest) -> None:
    """``BEGIN; INSERT INTO log_a ..; ALTER TABLE log_a ADD COLUMN ..; COMMIT`` in snapshot mode: the INSERT is staged in
    the old shape and would be applied after the ADD COLUMN, so the changefeed fails, its error naming the table, the
    commit Ts and the statement (in the API, not only in a log), and the DDL is not applied downstream."""
    sink_uri = target_of("postgresql", request, tmp_path, pg_server)
    one_span.create_changefeed("one", pg_server.uri(pg_database), sink_uri,
                               '[consistency]\nmode = "snapshot"\ninterval = 0.2\n', snapshot="none")
    with source.cursor() as cur:
        cur.execute("INSERT INTO log_a VALUES (1, 'before')")
        cur.execute("BEGIN")
        cur.execute("INSERT INTO log_a VALUES (2, 'same transaction')")
        cur.execute("ALTER TABLE log_a ADD COLUMN w int DEFAULT 1")
        cur.execute("COMMIT")
    ddl_ts = current_lsn(source)
    info = wait_for(one_span, "one", lambda q: q["state"] == "failed", "state failed", timeout=60)
    message = info["error"]["message"]
    assert "public.log_a" in message and "ALTER TABLE log_a ADD COLUMN w int DEFAULT 1" in message, message
    assert "changed rows of public.log_a before it" in message, message
    commit = int(message.split(" at commit ")[1].split(" ")[0])
    assert commit <= ddl_ts
    assert "w" not in (target_columns(sink_uri, "log_a") or [])
