"""End to end: DDL under continuous writes on several tables across spans (issue 9 item 6), PostgreSQL ->
MariaDB / PostgreSQL / SQLite.

A changefeed of two spans carries four tables, two per span. A writer thread runs small transactions of
inserts, updates and deletes on every live table (sometimes two tables, of both spans, in one transaction)
while the main thread runs, between its writes: ADD COLUMN with a NOT NULL default, RENAME COLUMN, a widening
ALTER TYPE, DROP and ADD PRIMARY KEY, CREATE TABLE (written to once the owner has picked it up), RENAME
TABLE, and ``DROP TABLE stock`` followed by renaming a table of the *other* span onto ``stock`` (the
changefeed barrier). The writer learns each change after it commits; a statement of its that meets a name
the DDL just changed fails upstream and is rolled back (counted, never replicated): only downstream equality
matters. At the end: row-by-row and schema compare of every table, the dropped and renamed-away names gone
downstream, the changefeed ``normal`` without warnings.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg2
import pytest
from e2e_workload import assert_converged, run_sql, server_config, targets_in_make_test, wait_for

from cdc.events import TableName
from cdc.spans import span_of
from playground.cluster import CdcServer
from playground.compare_schema import target_tables
from playground.servers import EtcdServer, PostgresServer

pytestmark = pytest.mark.e2e

SPANS = 2
SCHEMA = """
CREATE TABLE orders (id int PRIMARY KEY, label varchar(20), n int);
CREATE TABLE users (id int PRIMARY KEY, label varchar(20), n int);
CREATE TABLE stock (id int PRIMARY KEY, label varchar(20), n int);
CREATE TABLE audit (id int PRIMARY KEY, label varchar(20), n int);
ALTER TABLE audit REPLICA IDENTITY FULL;
"""
# after the changefeed is created (there is no initial copy)
FILL = tuple(f"INSERT INTO {t} SELECT g, '{t}' || g, g FROM generate_series(1, 30) g"
             for t in ("orders", "users", "stock", "audit"))
MAX_TXNS = 3000  # the writer stops by itself after this many transactions or MAX_SECONDS
MAX_SECONDS = 60.0


@pytest.fixture
def source_schema() -> str:
    return SCHEMA


@pytest.fixture
def cdc_server(etcd_server: EtcdServer, cluster_id: str, tmp_path: Path) -> Iterator[CdcServer]:
    """The owner looks for new tables every half second (the CREATE TABLE below waits for its pick-up)."""
    server = CdcServer(etcd_server.url, tmp_path / "cdc", cluster_id=cluster_id,
                       extra_args=server_config(tmp_path, "upstream-check-interval = 0.5\n")).start()
    yield server
    server.terminate()


class Writer:
    """Transactions of 1-3 row changes on one or two live tables, from its own connection, until stopped,
    MAX_TXNS or MAX_SECONDS. ``layout`` (under ``lock``) is what it writes to: logical table -> its current
    name, text column, whether n (``big``) and the text column (``long``) were widened, an added column."""

    def __init__(self, conn: Any, seed: int) -> None:
        self.conn = conn
        self.rnd = random.Random(seed)
        self.lock = threading.Lock()
        self.layout: dict[str, dict[str, Any]] = {
            t: {"table": t, "text": "label", "big": False, "long": False, "extra": None}
            for t in ("orders", "users", "stock", "audit")}
        self.ids: dict[str, list[int]] = {t: list(range(1, 31)) for t in self.layout}
        self.next_id = 1000
        self.committed = 0
        self.failed = 0  # transactions that met a DDL's change upstream (rolled back)
        self.error: BaseException | None = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def change(self, logical: str, **what: Any) -> None:
        with self.lock:
            self.layout[logical].update(what)

    def add(self, logical: str, table: str) -> None:
        with self.lock:
            self.layout[logical] = {"table": table, "text": "label", "big": False, "long": False, "extra": None}
            self.ids[logical] = []

    def forget(self, logical: str) -> None:
        with self.lock:
            del self.layout[logical]

    def _statement(self, logical: str, spec: dict[str, Any]) -> tuple[str, tuple[Any, ...]]:
        rnd, ids = self.rnd, self.ids[logical]
        t, text = f'"{spec["table"]}"', f'"{spec["text"]}"'
        n = rnd.randint(1, 10**6) + (5_000_000_000 if spec["big"] else 0)
        label = ("w" * rnd.randint(30, 90)) if spec["long"] else f"v{rnd.randint(0, 10**6)}"
        op = rnd.random()
        if op < 0.5 or not ids:
            self.next_id += 1
            ids.append(self.next_id)
            if spec["extra"]:
                return (f'INSERT INTO {t} (id, {text}, n, "{spec["extra"]}") VALUES (%s, %s, %s, %s)',
                        (self.next_id, label, n, rnd.randint(0, 99)))
            return f"INSERT INTO {t} (id, {text}, n) VALUES (%s, %s, %s)", (self.next_id, label, n)
        key = rnd.choice(ids)
        if op < 0.8:
            return f"UPDATE {t} SET {text} = %s, n = %s WHERE id = %s", (label, n, key)
        ids.remove(key)
        return f"DELETE FROM {t} WHERE id = %s", (key,)

    def _run(self) -> None:
        deadline = time.monotonic() + MAX_SECONDS
        try:
            while not self.stop.is_set() and self.committed + self.failed < MAX_TXNS and time.monotonic() < deadline:
                with self.lock:
                    live = {k: dict(v) for k, v in self.layout.items()}
                    chosen = self.rnd.sample(sorted(live), k=min(len(live), self.rnd.choice((1, 1, 2))))
                    stmts = [self._statement(c, live[c]) for c in chosen for _ in range(self.rnd.randint(1, 2))]
                try:
                    with self.conn.cursor() as cur:
                        for sql, params in stmts:
                            cur.execute(sql, params)
                    self.conn.commit()
                    self.committed += 1
                except psycopg2.Error:  # a name the main thread's DDL just changed: upstream refused, nothing written
                    self.conn.rollback()
                    self.failed += 1
                time.sleep(0.004)
        except BaseException as exc:  # noqa: BLE001 - re-raised by finish()
            self.error = exc

    def finish(self) -> None:
        self.stop.set()
        self.thread.join(30)
        assert not self.thread.is_alive(), "the writer did not stop"
        if self.error is not None:
            raise self.error


def _wait_published(source: Any, table: str, timeout: float = 30.0) -> None:
    """Until the owner has added ``table`` to its span's publication (rows written before would be reported
    as not replicated: docs/ddl.md, CREATE TABLE of a new table)."""
    deadline = time.monotonic() + timeout
    with source.cursor() as cur:
        while True:
            cur.execute("SELECT count(*) FROM pg_publication_tables WHERE schemaname = 'public' AND tablename = %s",
                        (table,))
            if cur.fetchone()[0]:
                return
            assert time.monotonic() < deadline, f"{table} was not picked up in {timeout}s"
            time.sleep(0.2)


# the barrier across spans is the processor's and the owner's; every DDL kind on every target:
# test_ddl_kinds.py, test_ddl_replication.py, tests/integration/test_sql_ddl_apply.py
@pytest.mark.parametrize("sink_uri", targets_in_make_test("postgresql"), indirect=True)
def test_ddl_under_continuous_writes_on_tables_of_two_spans_ends_equal(
    cdc_server: CdcServer, pg_server: PostgresServer, pg_database: str, source: Any, sink_uri: str
) -> None:
    def span(t: str) -> int:
        return span_of(TableName("public", t), SPANS)

    # two tables per span; the table renamed onto stock comes from the other span
    assert span("orders") == span("stock") != span("users") == span("audit") == span("fresh")
    cdc = cdc_server
    cdc.create_changefeed("conc", pg_server.uri(pg_database), sink_uri, config=f"span-count = {SPANS}\n", snapshot="none")
    run_sql(source, *FILL)
    conn = pg_server.connect(pg_database)
    conn.autocommit = False
    writer = Writer(conn, seed=11)
    writer.thread.start()
    try:
        marks: list[int] = []  # transactions committed by the writer when each DDL ran

        def ddl(*statements: str, then: Callable[[], None] = lambda: None) -> None:
            """Run ``statements``, tell the writer what changed (``then``), let it write for a moment."""
            assert writer.thread.is_alive(), "the writer stopped before the DDL ran"
            marks.append(writer.committed)
            run_sql(source, *statements)
            then()
            time.sleep(0.4)

        time.sleep(1.0)
        ddl("ALTER TABLE orders ADD COLUMN qty int NOT NULL DEFAULT 7", then=lambda: writer.change("orders", extra="qty"))
        ddl("ALTER TABLE users RENAME COLUMN label TO title", then=lambda: writer.change("users", text="title"))
        ddl("ALTER TABLE stock ALTER COLUMN n TYPE bigint, ALTER COLUMN label TYPE varchar(100)",
            then=lambda: writer.change("stock", big=True, long=True))
        ddl("ALTER TABLE audit DROP CONSTRAINT audit_pkey")  # REPLICA IDENTITY FULL: keyless, still updatable
        ddl("CREATE TABLE fresh (id int PRIMARY KEY, label varchar(20), n int)")
        _wait_published(source, "fresh")
        writer.add("fresh", "fresh")
        ddl("ALTER TABLE audit ADD PRIMARY KEY (id)")
        ddl("ALTER TABLE users RENAME TO members", then=lambda: writer.change("users", table="members"))
        writer.forget("stock")
        # across spans: the changefeed barrier (stock's span drops it, fresh's span renames onto its name)
        ddl("DROP TABLE stock", "ALTER TABLE fresh RENAME TO stock", then=lambda: writer.change("fresh", table="stock"))
        ddl("ALTER TABLE members ALTER COLUMN n TYPE bigint", then=lambda: writer.change("users", big=True))
        time.sleep(1.5)
    finally:
        writer.finish()
        conn.close()
    assert writer.committed >= 100, (writer.committed, writer.failed)
    # the writes went on between every two DDLs (not one DDL ran without writes before it)
    assert all(a < b for a, b in zip([0, *marks], [*marks, writer.committed], strict=True)), marks

    tables = ["public.orders", "public.members", "public.stock", "public.audit"]
    assert_converged(cdc, "conc", source, sink_uri, tables=tables, schemas=True)
    assert target_tables(sink_uri) == {"orders", "members", "stock", "audit"}  # users, fresh gone downstream
    q = wait_for(cdc, "conc", lambda q: True, "query")
    assert q["state"] == "normal" and not q["warnings"], q


@pytest.mark.parametrize("sink_uri", targets_in_make_test("postgresql"), indirect=True)  # decoding upstream; keys on every target: test_ddl_kinds.py
def test_rows_decoded_after_a_later_key_change_committed_keep_the_key_of_their_time(
    cdc_server: CdcServer, pg_server: PostgresServer, pg_database: str, source: Any, sink_uri: str
) -> None:
    """The span decodes behind the upstream: here deterministically (the capture is down while the DDL run).
    The rows between DROP PRIMARY KEY and ADD PRIMARY KEY have no key; the table's Relation message before them
    must not take the key the catalog has *now* (after the ADD)."""
    cdc = cdc_server
    cdc.create_changefeed("key", pg_server.uri(pg_database), sink_uri, config=f"span-count = {SPANS}\n", snapshot="none")
    run_sql(source, *FILL)
    tables = ["public.audit", "public.stock"]
    assert_converged(cdc, "key", source, sink_uri, tables=tables, schemas=True)
    cdc.terminate()
    run_sql(source, "ALTER TABLE audit DROP CONSTRAINT audit_pkey", "INSERT INTO audit VALUES (100, 'keyless', 1)",
            "UPDATE audit SET n = 2 WHERE id = 100", "ALTER TABLE stock ALTER COLUMN label TYPE varchar(30)",
            "INSERT INTO stock VALUES (100, 'before the widening', 1)",  # (in the stream after it, fine)
            "ALTER TABLE audit ADD PRIMARY KEY (id)", "UPDATE audit SET n = 3 WHERE id = 100")
    cdc.start()
    assert_converged(cdc, "key", source, sink_uri, tables=tables, schemas=True, timeout=60)
    q = wait_for(cdc, "key", lambda q: True, "query")
    assert q["state"] == "normal" and not q["warnings"], q
