"""Partition repair (issue 8 item 5) against a real PostgreSQL: the triggers of
``upstream/postgres/sql/20_partitions.sql`` put what pgoutput does not stream for partitions into the WAL,
and ``partition_messages.parse`` turns it into row changes of the root.

Each test runs partition operations upstream, reads everything the publication streams from a real slot
(pgoutput, messages on), replays it into a model of the downstream root table (the changes exactly as the
sinks would get them: Insert = upsert by key, Delete by key or whole row, root TRUNCATE) and ends with the
model compared row by row with ``SELECT * FROM root`` upstream.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import psycopg2
import pytest

from cdc.errors import DecodeError
from playground.servers import PostgresServer
from upstream.postgres import capture_objects, partition_messages, pgoutput, pgoutput_messages
from upstream.postgres.conn import connect

pytestmark = pytest.mark.integration

PUB = "tidewater_pub_pm_0"
SLOT = "tidewater_slot_pm_0"


def install(conn: Any) -> None:
    result = capture_objects.install(conn)
    assert result.installed, result.reason


@pytest.fixture
def conn(pg_server: PostgresServer, pg_database: str) -> Iterator[Any]:
    c = connect(pg_server.uri(pg_database))
    yield c
    with c.cursor() as cur:
        cur.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                    "WHERE database = current_database()")
    c.close()


def run(conn: Any, *statements: str) -> None:
    with conn.cursor() as cur:
        for s in statements:
            cur.execute(s)


def make_slot(conn: Any, slot: str) -> None:
    """Created from a session of its own: the session that creates a slot reads nothing from it."""
    other = psycopg2.connect(conn.dsn)
    try:
        other.autocommit = True
        with other.cursor() as cur:
            cur.execute(f"SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput')")
    finally:
        other.close()


def rows(conn: Any, query: str) -> list[tuple[Any, ...]]:
    with conn.cursor() as cur:
        cur.execute(query)
        return list(cur.fetchall())


class Downstream:
    """The root's downstream table as the stream builds it: by key, or a multiset of rows (key-less)."""

    def __init__(self, keyed: bool) -> None:
        self.keyed = keyed
        self.by_key: dict[tuple[Any, ...], tuple[Any, ...]] = {}
        self.bag: Counter[tuple[Any, ...]] = Counter()
        self.key_pos: list[int] = []
        self.messages: list[partition_messages.RowsMessage] = []

    def apply(self, kind: str, new: list[Any] | None, old: list[Any] | None) -> None:
        if kind == "T":
            self.by_key.clear()
            self.bag.clear()
            return
        if not self.keyed:
            if old is not None:
                row = tuple(old)
                assert self.bag[row] > 0, f"delete of a row not downstream: {row}"
                self.bag[row] -= 1
            if new is not None:
                self.bag[tuple(new)] += 1
            return
        if old is not None:
            self.by_key.pop(tuple(old[i] for i in self.key_pos), None)
        if new is not None:
            self.by_key[tuple(new[i] for i in self.key_pos)] = tuple(new)

    def replay(self, conn: Any, slot: str) -> None:
        """Everything streamed since the last replay."""
        # the test servers commit asynchronously and a slot is read only up to the flushed WAL: a
        # synchronous commit flushes everything before it
        run(conn, "SET synchronous_commit = on", "SELECT pg_logical_emit_message(true, 'test.flush', '')")
        data = rows(conn, f"SELECT data FROM pg_logical_slot_get_binary_changes('{slot}', NULL, NULL, "
                          f"'proto_version', '1', 'publication_names', '{PUB}', 'messages', 'true')")
        for (raw,) in data:
            m = pgoutput.decode(bytes(raw), False)
            if isinstance(m, pgoutput_messages.Relation):
                self.key_pos = [i for i, c in enumerate(m.columns) if c.is_key]
            elif isinstance(m, pgoutput_messages.Change | pgoutput_messages.Truncate):
                raw_change = m.raw if isinstance(m, pgoutput_messages.Change) else pgoutput.truncate_raw(m.relids[0], m.options)
                p = pgoutput.parse_change(raw_change)
                self.apply(p.kind, p.new if p.kind in "IU" else None, p.old if p.kind in "UD" else None)
            elif isinstance(m, pgoutput_messages.LogicalMessage) and m.prefix == partition_messages.PREFIX:
                assert m.transactional
                msg = partition_messages.parse(m.content)
                self.messages.append(msg)
                if msg.relation is not None:
                    self.key_pos = [i for i, c in enumerate(msg.relation.columns) if c.is_key]
                for change in msg.changes:
                    p = pgoutput.parse_change(change)
                    self.apply(p.kind, p.new if p.kind == "I" else None, p.old if p.kind == "D" else None)

    def state(self) -> Counter[tuple[Any, ...]]:
        return Counter(self.by_key.values()) if self.keyed else +self.bag


def upstream_state(conn: Any, root: str) -> Counter[tuple[Any, ...]]:
    with conn.cursor() as cur:
        cur.execute("SET TIME ZONE 'UTC'")
        cur.execute(f"SELECT * FROM {root}")
        return Counter(tuple(None if v is None else str(v) for v in r) for r in cur.fetchall())


def setup_range(conn: Any, slot: str = SLOT) -> Downstream:
    run(conn,
        "CREATE TABLE m (id int, k date, v text, PRIMARY KEY (id, k)) PARTITION BY RANGE (k)",
        "CREATE TABLE m1 PARTITION OF m FOR VALUES FROM ('2024-01-01') TO ('2024-02-01')",
        "CREATE TABLE m2 PARTITION OF m FOR VALUES FROM ('2024-02-01') TO ('2024-03-01')",
        f"CREATE PUBLICATION {PUB} FOR TABLE m WITH (publish_via_partition_root = true)",
        )
    make_slot(conn, slot)
    install(conn)
    run(conn, "INSERT INTO m SELECT g, '2024-01-05', 'a' || g FROM generate_series(1, 7000) g",
        "INSERT INTO m SELECT g, '2024-02-05', 'b' || g FROM generate_series(1, 30) g")
    return Downstream(keyed=True)


def check(conn: Any, down: Downstream, root: str = "m") -> None:
    down.replay(conn, SLOT)
    assert down.state() == upstream_state(conn, root)


def test_truncate_of_one_partition_deletes_its_rows_and_a_root_truncate_sends_no_keys(conn: Any) -> None:
    down = setup_range(conn)
    check(conn, down)
    run(conn, "TRUNCATE m1")
    check(conn, down)
    assert [(x.op, x.reason, x.leaf) for x in down.messages] == [("delete", "truncate", "public.m1")] * 2  # 5,000/msg
    assert sum(len(x.changes) for x in down.messages) == 7000
    down.messages.clear()
    run(conn, "INSERT INTO m VALUES (1, '2024-01-09', 'again')", "TRUNCATE m")  # streamed as a root TRUNCATE
    check(conn, down)
    assert down.messages == []
    # rows written after a root TRUNCATE in the same transaction, then their partition truncated: keys again
    with conn.cursor() as cur:
        cur.execute("BEGIN")
        cur.execute("TRUNCATE m")
        cur.execute("INSERT INTO m VALUES (2, '2024-02-09', 'x'), (3, '2024-01-02', 'y')")
        cur.execute("TRUNCATE m2")
        cur.execute("COMMIT")
    check(conn, down)
    assert [(x.op, x.leaf, len(x.changes)) for x in down.messages] == [("delete", "public.m2", 1)]


def test_repair_sits_at_the_operations_position_between_the_rows_of_its_transaction(conn: Any) -> None:
    """A key deleted by the repair and written again later in the same transaction stays (the repair message
    must be decoded where it was written: a message emitted inside a subtransaction would come last)."""
    down = setup_range(conn)
    with conn.cursor() as cur:
        cur.execute("BEGIN")
        cur.execute("INSERT INTO m VALUES (9001, '2024-01-07', 'before')")
        cur.execute("TRUNCATE m1")
        cur.execute("INSERT INTO m VALUES (1, '2024-01-05', 'after truncate'), (9001, '2024-01-07', 'again')")
        cur.execute("DROP TABLE m2")
        cur.execute("CREATE TABLE m2 PARTITION OF m FOR VALUES FROM ('2024-02-01') TO ('2024-03-01')")
        cur.execute("INSERT INTO m VALUES (1, '2024-02-05', 'after drop')")
        cur.execute("CREATE TABLE m3 (id int, k date, v text, PRIMARY KEY (id, k))")
        cur.execute("INSERT INTO m3 VALUES (5, '2024-03-05', 'attached')")
        cur.execute("ALTER TABLE m ATTACH PARTITION m3 FOR VALUES FROM ('2024-03-01') TO ('2024-04-01')")
        cur.execute("UPDATE m SET v = 'updated after attach' WHERE id = 5")
        cur.execute("COMMIT")
    check(conn, down)
    assert down.state()[("1", "2024-02-05", "after drop")] == 1
    assert down.state()[("5", "2024-03-05", "updated after attach")] == 1


def test_detach_drop_and_attach_end_equal(conn: Any) -> None:
    down = setup_range(conn)
    run(conn, "ALTER TABLE m DETACH PARTITION m2")
    check(conn, down)
    run(conn, "INSERT INTO m2 VALUES (99, '2024-02-07', 'after detach')")  # no longer replicated
    run(conn, "CREATE TABLE m3 (id int, k date, v text, PRIMARY KEY (id, k))",
        "INSERT INTO m3 SELECT g, '2024-03-03', 'c' || g FROM generate_series(1, 12) g",
        "ALTER TABLE m ATTACH PARTITION m3 FOR VALUES FROM ('2024-03-01') TO ('2024-04-01')")
    check(conn, down)
    run(conn, "ALTER TABLE m ATTACH PARTITION m2 FOR VALUES FROM ('2024-02-01') TO ('2024-03-01')")
    check(conn, down)
    run(conn, "DROP TABLE m3")
    check(conn, down)
    run(conn, "CREATE SCHEMA old", "CREATE TABLE old.m0 PARTITION OF m FOR VALUES FROM ('2023-01-01') TO ('2024-01-01')",
        "INSERT INTO m VALUES (5, '2023-05-05', 'old')", "DROP SCHEMA old CASCADE")
    check(conn, down)
    run(conn, "ALTER TABLE m DETACH PARTITION m1 CONCURRENTLY")  # two transactions of its own
    check(conn, down)
    reasons = [x.reason for x in down.messages]
    assert {"detach", "attach", "drop"} <= set(reasons) and "lost" not in [x.op for x in down.messages]


def test_a_drop_that_names_a_partition_without_dropping_it_restores_its_rows(conn: Any) -> None:
    down = setup_range(conn)
    run(conn, "CREATE TABLE other (x int)")
    run(conn, "DROP TABLE other /* not m2 */")
    check(conn, down)
    assert [x.reason for x in down.messages] == ["drop", "restore"]
    # a DROP that fails rolls its messages back with it
    with pytest.raises(psycopg2.Error):
        run(conn, "DROP TABLE m2, no_such_table")
    conn.rollback() if not conn.autocommit else None
    check(conn, down)


def test_rolled_back_savepoint_and_replica_role(conn: Any) -> None:
    down = setup_range(conn)
    with conn.cursor() as cur:
        cur.execute("BEGIN")
        cur.execute("SAVEPOINT a")
        cur.execute("TRUNCATE m1")
        cur.execute("ROLLBACK TO a")
        cur.execute("COMMIT")
        cur.execute("SET session_replication_role = replica")  # the triggers are ENABLE ALWAYS
        cur.execute("TRUNCATE m2")
        cur.execute("RESET session_replication_role")
    check(conn, down)


def test_an_unprivileged_user_truncating_a_partition_is_repaired_too(conn: Any, pg_server: PostgresServer,
                                                                      pg_database: str) -> None:
    down = setup_range(conn)
    run(conn, "DROP ROLE IF EXISTS pm_app", "CREATE ROLE pm_app LOGIN",
        "GRANT USAGE ON SCHEMA public TO pm_app", "GRANT ALL ON m, m1, m2 TO pm_app")
    app = psycopg2.connect(pg_server.dsn(pg_database, user="pm_app"))
    try:
        app.autocommit = True
        with app.cursor() as cur:
            cur.execute("TRUNCATE m1")
            cur.execute("INSERT INTO m VALUES (8, '2024-01-08', 'app')")
    finally:
        app.close()
    check(conn, down)
    run(conn, "REVOKE ALL ON m, m1, m2 FROM pm_app", "REVOKE USAGE ON SCHEMA public FROM pm_app")


def test_key_less_full_identity_root_with_duplicate_rows(conn: Any) -> None:
    run(conn,
        "CREATE TABLE f (k int, v text) PARTITION BY LIST (k)",
        "CREATE TABLE f1 PARTITION OF f FOR VALUES IN (1)", "CREATE TABLE f2 PARTITION OF f FOR VALUES IN (2)",
        "ALTER TABLE f REPLICA IDENTITY FULL", "ALTER TABLE f1 REPLICA IDENTITY FULL",
        "ALTER TABLE f2 REPLICA IDENTITY FULL",
        f"CREATE PUBLICATION {PUB} FOR TABLE f WITH (publish_via_partition_root = true)")
    make_slot(conn, SLOT)
    install(conn)
    run(conn, "INSERT INTO f VALUES (1, 'a'), (1, 'a'), (1, NULL), (2, 'b'), (2, 'b')")
    down = Downstream(keyed=False)
    check(conn, down, "f")
    run(conn, "TRUNCATE f1")
    check(conn, down, "f")
    run(conn, "ALTER TABLE f DETACH PARTITION f2")
    check(conn, down, "f")
    assert down.state() == Counter()


def test_a_partition_dropped_without_being_named_is_reported_lost(conn: Any) -> None:
    down = setup_range(conn)
    run(conn, "DROP ROLE IF EXISTS pm_owner", "CREATE ROLE pm_owner", "ALTER TABLE m2 OWNER TO pm_owner")
    run(conn, "DROP OWNED BY pm_owner")  # drops m2 without naming it
    down.replay(conn, SLOT)
    lost = [x for x in down.messages if x.op == "lost"]
    assert len(lost) == 1 and lost[0].reason.startswith("dropped") and lost[0].root.table == "m"
    w = lost[0].warning(0.0)
    assert w.code == "CDC:WarnPartitionRowsLost" and w.table == "public.m" and w.severity == "divergence"
    run(conn, "DROP ROLE pm_owner")


def test_parse_refuses_malformed_content() -> None:
    for bad in (b"", b"{}", b'{"v": 1, "op": "delete"}', b'{"v": 2, "op": "lost"}',
                b'{"v": 1, "op": "upsert", "root_oid": "1", "root": ["s", "t"], "replident": "d", '
                b'"columns": [["a", "23", -1, true]], "rows": [["1", "2"]]}'):
        with pytest.raises(DecodeError):
            partition_messages.parse(bad)


def test_objects_are_shared_by_changefeeds_and_removed_with_the_last(conn: Any, pg_server: PostgresServer,
                                                                       pg_database: str) -> None:
    setup_range(conn)  # installed for the changefeed of SLOT
    make_slot(conn, "tidewater_slot_second_0")  # a second changefeed of the same database
    assert capture_objects.install(conn).installed and capture_objects.installed(conn)
    run(conn, "CREATE TABLE tidewater.tidewater_checkpoint (x int)")  # a PostgreSQL target's table in this db
    assert not capture_objects.uninstall(conn, SLOT)  # the second changefeed's slot still relies on them
    assert capture_objects.installed(conn)
    run(conn, "ALTER TABLE m1 DISABLE TRIGGER tidewater_partitions_truncate")  # a TRUNCATE of m1 would be lost
    assert not capture_objects.installed(conn)
    run(conn, "ALTER TABLE m1 ENABLE ALWAYS TRIGGER tidewater_partitions_truncate")
    assert capture_objects.installed(conn)
    assert rows(conn, "SELECT count(*) FROM pg_trigger WHERE tgname LIKE 'tidewater%'") == [(4,)]  # m (2), m1, m2
    # no table of Tidewater's own upstream: a user's FOR ALL TABLES publication must not publish one
    assert rows(conn, "SELECT count(*) FROM pg_class WHERE relnamespace = 'tidewater'::regnamespace "
                      "AND relname <> 'tidewater_checkpoint'") == [(0,)]
    assert capture_objects.uninstall(conn, SLOT, "tidewater_slot_second_0")
    assert not capture_objects.installed(conn)
    assert rows(conn, "SELECT count(*) FROM pg_trigger WHERE tgname LIKE 'tidewater%'") == [(0,)]
    assert rows(conn, "SELECT count(*) FROM pg_proc WHERE pronamespace = 'tidewater'::regnamespace") == [(0,)]
    assert rows(conn, "SELECT to_regclass('tidewater.tidewater_checkpoint') IS NOT NULL") == [(True,)]
    run(conn, "TRUNCATE m1")  # the user's statements work as before
    run(conn, "DROP TABLE tidewater.tidewater_checkpoint")
    assert capture_objects.uninstall(conn, SLOT, "tidewater_slot_second_0")  # nothing left: the schema goes too
    assert rows(conn, "SELECT to_regnamespace('tidewater') IS NULL") == [(True,)]
    assert not capture_objects.uninstall(conn, SLOT)  # idempotent


def test_a_user_who_is_not_superuser_gets_the_reason_and_nothing_installed(conn: Any, pg_server: PostgresServer,
                                                                           pg_database: str) -> None:
    run(conn, "DROP ROLE IF EXISTS pm_repl", "CREATE ROLE pm_repl LOGIN REPLICATION")
    other = connect(pg_server.uri(pg_database, user="pm_repl"))
    try:
        result = capture_objects.install(other)
    finally:
        other.close()
    assert not result.installed and result.reason is not None and "superuser" in result.reason
    assert rows(conn, "SELECT to_regnamespace('tidewater') IS NULL") == [(True,)]
    run(conn, "DROP ROLE pm_repl")
