"""Tables that would break the application are refused (issue 8 item 4) and stored generated columns are
published (item 6): against a real PostgreSQL 18.

Each refusal first proves, on the server itself, that publishing the table as it is would make the
application's UPDATE/DELETE fail, then asserts the exact message, then applies the fix the message names
and shows the table is accepted and its writes keep working inside a Tidewater publication.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg2
import pytest

from cdc.errors import TableNotEligible
from cdc.events import TableName
from playground.servers import PostgresServer
from upstream.postgres import admin, catalog, eligibility, pgoutput, pgoutput_messages
from upstream.postgres.conn import connect

pytestmark = pytest.mark.integration


@pytest.fixture
def conn(pg_server: PostgresServer, pg_database: str) -> Iterator[Any]:
    c = connect(pg_server.uri(pg_database))
    yield c
    c.close()


def _exec(conn: Any, *statements: str) -> None:
    with conn.cursor() as cur:
        for stmt in statements:
            cur.execute(stmt)


def _refusal(conn: Any, table: str) -> str:
    with pytest.raises(TableNotEligible) as ei:
        eligibility.check_tables(conn, [TableName("public", table)])
    return ei.value.message


def _writes_fail_when_published(conn: Any, table: str, update: str) -> str:
    """Publish ``table`` in a throw-away publication, run ``update``; return PostgreSQL's error text."""
    _exec(conn, f"CREATE PUBLICATION probe_{table} FOR TABLE {table}")
    try:
        with pytest.raises(psycopg2.Error) as ei:
            _exec(conn, update)
        return str(ei.value)
    finally:
        _exec(conn, f"DROP PUBLICATION probe_{table}")


def test_deferrable_primary_key_is_refused_with_the_fix(conn: Any) -> None:
    _exec(conn, "CREATE TABLE dpk (id int PRIMARY KEY DEFERRABLE, v int)", "INSERT INTO dpk VALUES (1, 1)")
    # PostgreSQL cannot use a deferrable key as replica identity: published, the table's UPDATEs fail
    assert "does not have a replica identity" in _writes_fail_when_published(conn, "dpk", "UPDATE dpk SET v = 2")
    schema = catalog.table_schema(conn, TableName("public", "dpk"))
    assert (schema.key, schema.has_key) == ((), False)
    assert _refusal(conn, "dpk") == (
        '1 table(s) cannot be replicated (each needs a primary key, a replica identity index or REPLICA IDENTITY '
        'FULL): table "public"."dpk" has a DEFERRABLE primary key, which PostgreSQL cannot use as replica '
        'identity: once published, every UPDATE and DELETE of "public"."dpk" would fail; fix with ALTER TABLE '
        '"public"."dpk" REPLICA IDENTITY USING INDEX <a non-deferrable unique index on NOT NULL columns> or '
        'ALTER TABLE "public"."dpk" REPLICA IDENTITY FULL')


def test_deferrable_primary_key_names_an_existing_candidate_index(conn: Any) -> None:
    _exec(conn, "CREATE TABLE dpk2 (id int PRIMARY KEY DEFERRABLE INITIALLY DEFERRED, u int NOT NULL, "
                "n int, v int)",
          "CREATE UNIQUE INDEX dpk2_n ON dpk2 (n)",  # nullable column: not a candidate
          "CREATE UNIQUE INDEX dpk2_part ON dpk2 (u) WHERE v > 0",  # partial: not a candidate
          "CREATE UNIQUE INDEX dpk2_u ON dpk2 (u)",
          "INSERT INTO dpk2 VALUES (1, 10, 1, 1)")
    msg = _refusal(conn, "dpk2")
    fix = ('ALTER TABLE "public"."dpk2" REPLICA IDENTITY USING INDEX "dpk2_u" or '
           'ALTER TABLE "public"."dpk2" REPLICA IDENTITY FULL')
    assert msg.endswith("fix with " + fix)
    _exec(conn, fix.split(" or ")[0])  # the hint is valid SQL and makes the table eligible
    schema = eligibility.check_tables(conn, [TableName("public", "dpk2")])[0]
    assert (schema.key, schema.has_key, schema.replica_identity) == (("u",), True, "i")
    assert admin.create_publication(conn, "tw_dpk2", [TableName("public", "dpk2")])
    _exec(conn, "UPDATE dpk2 SET v = 5", "DELETE FROM dpk2")  # writes keep working once published


def test_full_with_deferrable_primary_key_is_accepted_and_keyed_by_it(conn: Any) -> None:
    _exec(conn, "CREATE TABLE fdpk (id int PRIMARY KEY DEFERRABLE, v int)",
          "ALTER TABLE fdpk REPLICA IDENTITY FULL", "INSERT INTO fdpk VALUES (1, 1), (2, 2)")
    schema = eligibility.check_tables(conn, [TableName("public", "fdpk")])[0]
    # FULL sends whole old rows; the key the sink upserts by is the primary key (unique at every commit)
    assert (schema.key, schema.has_key, schema.replica_identity) == (("id",), True, "f")
    assert [c.is_key for c in schema.columns] == [True, False]
    assert admin.create_publication(conn, "tw_fdpk", [TableName("public", "fdpk")])
    _exec(conn, "BEGIN", "UPDATE fdpk SET id = 3 - id", "COMMIT", "DELETE FROM fdpk WHERE id = 1")


def test_partition_with_deferrable_key_is_named(conn: Any) -> None:
    _exec(conn, "CREATE TABLE pd (id int, k int, PRIMARY KEY (id, k) DEFERRABLE) PARTITION BY RANGE (k)",
          "CREATE TABLE pd_1 PARTITION OF pd FOR VALUES FROM (0) TO (10)")
    msg = _refusal(conn, "pd")
    assert 'table "public"."pd" has a DEFERRABLE primary key' in msg
    # FULL on the root does not reach the partition: its own fix is named
    _exec(conn, "ALTER TABLE pd REPLICA IDENTITY FULL")
    msg = _refusal(conn, "pd")
    assert msg.endswith('partition of "public"."pd", "public"."pd_1" has a DEFERRABLE primary key, which '
                        'PostgreSQL cannot use as replica identity: once published, every UPDATE and DELETE of '
                        '"public"."pd_1" would fail; fix with ALTER TABLE "public"."pd_1" REPLICA IDENTITY USING '
                        'INDEX <a non-deferrable unique index on NOT NULL columns> or ALTER TABLE "public"."pd_1" '
                        'REPLICA IDENTITY FULL')
    _exec(conn, "ALTER TABLE pd_1 REPLICA IDENTITY FULL")
    assert eligibility.check_tables(conn, [TableName("public", "pd")])[0].key == ("id", "k")


def test_identity_index_cannot_be_deferrable(conn: Any) -> None:
    """Measured: PostgreSQL itself refuses a deferrable replica identity index, so no such table exists."""
    _exec(conn, "CREATE TABLE di (id int NOT NULL, CONSTRAINT di_u UNIQUE (id) DEFERRABLE)")
    with pytest.raises(psycopg2.errors.FeatureNotSupported, match="non-immediate index"):
        _exec(conn, "ALTER TABLE di REPLICA IDENTITY USING INDEX di_u")


def test_key_on_a_generated_column_works_with_tidewater_publications(conn: Any) -> None:
    _exec(conn, "CREATE TABLE gk (a int, id int GENERATED ALWAYS AS (a * 2) STORED PRIMARY KEY, v int)",
          "INSERT INTO gk (a, v) VALUES (1, 1), (2, 2)")
    # a publication that does not publish generated columns breaks the table's UPDATE/DELETE ...
    assert "Replica identity must not contain unpublished generated columns" in _writes_fail_when_published(
        conn, "gk", "UPDATE gk SET v = 3")
    # ... so check_tables refuses it for such a publication, naming the columns
    with pytest.raises(TableNotEligible) as ei:
        eligibility.check_tables(conn, [TableName("public", "gk")], publish_generated=False)
    assert str(ei.value).endswith(
        '"public"."gk" has stored generated column(s) "id" and its publication was created without '
        'publish_generated_columns = stored: they would be missing downstream (and a replica identity containing '
        'one makes UPDATE/DELETE fail); upgrade to PostgreSQL 18, or exclude "public"."gk" with the filter')
    # Tidewater's own publications publish them (PostgreSQL 18): accepted, and the writes keep working
    schema = eligibility.check_tables(conn, [TableName("public", "gk")])[0]
    assert schema.column_names == ("a", "id", "v") and schema.key == ("id",)
    assert admin.create_publication(conn, "tw_gk", [TableName("public", "gk")])
    assert admin.publication_publishes_generated(conn, "tw_gk") is True
    _exec(conn, "UPDATE gk SET v = 3", "UPDATE gk SET a = 5 WHERE a = 1", "DELETE FROM gk WHERE a = 2")


def test_generated_columns_in_the_schema_and_publication(conn: Any) -> None:
    _exec(conn, "CREATE TABLE g (id int PRIMARY KEY, a int, s int GENERATED ALWAYS AS (a * 2) STORED, "
                "v int GENERATED ALWAYS AS (a * 3) VIRTUAL, b text)")
    oid = catalog.table_oid(conn, TableName("public", "g"))
    assert oid is not None
    assert catalog.generated_columns(conn, oid) == {"s": "s", "v": "v"}
    # stored: listed like the Relation message lists it; virtual: never published, not listed
    assert catalog.table_schema(conn, oid).column_names == ("id", "a", "s", "b")
    assert admin.publication_publishes_generated(conn, "tw_g") is None
    _exec(conn, "CREATE PUBLICATION tw_g FOR TABLE g")  # e.g. made before; create converges it
    assert admin.publication_publishes_generated(conn, "tw_g") is False
    assert admin.create_publication(conn, "tw_g", [TableName("public", "g")]) is False
    assert admin.publication_publishes_generated(conn, "tw_g") is True


def test_virtual_generated_column_is_refused(conn: Any) -> None:
    # PostgreSQL 18: GENERATED ALWAYS AS without STORED is virtual, and virtual columns are never published
    _exec(conn, "CREATE TABLE gv (id int PRIMARY KEY, a int, \"Tw ice\" int GENERATED ALWAYS AS (a * 2))")
    assert _refusal(conn, "gv").endswith(
        '"public"."gv" has VIRTUAL generated column(s) "Tw ice", which PostgreSQL never publishes: they would be '
        'missing downstream; make them STORED (drop the column and add it again with GENERATED ALWAYS AS (...) '
        'STORED), or exclude "public"."gv" with the filter')
    _exec(conn, 'ALTER TABLE gv DROP COLUMN "Tw ice"', 'ALTER TABLE gv ADD COLUMN "Tw ice" int GENERATED ALWAYS AS '
                '(a * 2) STORED')
    assert eligibility.check_tables(conn, [TableName("public", "gv")])[0].column_names == ("id", "a", "Tw ice")


def test_catalog_schema_matches_the_relation_message(conn: Any) -> None:
    """The schema the puller enriches Relation messages with lists exactly the columns pgoutput sends."""
    _exec(conn, "SET synchronous_commit = on",  # the test server runs with it off; decoding reads flushed WAL
          "CREATE TABLE gr (id int PRIMARY KEY, a int, s1 int GENERATED ALWAYS AS (a * 2) STORED, dropped int, "
          "v int GENERATED ALWAYS AS (a * 3) VIRTUAL, b text, s2 text GENERATED ALWAYS AS ('x' || a) STORED)",
          "ALTER TABLE gr DROP COLUMN dropped")
    table = TableName("public", "gr")
    assert admin.create_publication(conn, "tw_gr", [table])
    slot = "tw_gr_slot"
    admin.create_slot(conn, slot)
    try:
        _exec(conn, "INSERT INTO gr (id, a, b) VALUES (1, 5, 'b')")
        with conn.cursor() as cur:
            cur.execute("SELECT data FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, 'proto_version', '1', "
                        "'publication_names', 'tw_gr')", (slot,))
            messages = [pgoutput.decode(bytes(r[0]), False) for r in cur.fetchall()]
    finally:
        admin.drop_slot(conn, slot)
    (rel,) = [m for m in messages if isinstance(m, pgoutput_messages.Relation)]
    schema = catalog.table_schema(conn, table)
    assert [c.name for c in rel.columns] == list(schema.column_names) == ["id", "a", "s1", "b", "s2"]
    assert [c.type_oid for c in rel.columns] == [c.type_oid for c in schema.columns]
    (change,) = [pgoutput.parse_change(m.raw) for m in messages if isinstance(m, pgoutput_messages.Change)]
    assert change.new == ["1", "5", "10", "b", "x5"]
