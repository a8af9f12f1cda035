"""upstream.postgres.snapshot_read against a real PostgreSQL 18 and a real exported snapshot (no Spark)."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest

from cdc import serde
from cdc.errors import InvalidArgument, SnapshotExpired, SnapshotTableAltered
from cdc.events import OpType, TableName, TableSchema
from cdc.snapshot import TablePlan
from processor.mounter import Mounter
from tests.snapshot_helpers import execute, exported_snapshot
from upstream import open_upstream
from upstream.base import encode_payload
from upstream.postgres import catalog, snapshot_read
from upstream.postgres.source import PgChangeDecoder

pytestmark = pytest.mark.integration

ODD = 'a\tb\nc\\d"e\r,{x}'  # COPY escapes (tab, newline, backslash, CR) and array/quote characters


def _streamed(conn: Any, slot: str, publication: str, schema: TableSchema, n: int) -> list[Any]:
    """The ``n`` INSERTs the slot holds, mounted as a span would mount them."""
    deadline = time.monotonic() + 10
    while True:
        with conn.cursor() as cur:
            cur.execute("SELECT data FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, 'proto_version', "
                        "'1', 'publication_names', %s)", (slot, publication))
            raws = [bytes(r[0]) for r in cur.fetchall() if bytes(r[0])[:1] == b"I"]
        if len(raws) >= n or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    mounter = Mounter(PgChangeDecoder(lambda v: schema))
    return [mounter.mount(encode_payload(0, raw), 1, 0.0) for raw in raws]


def test_a_copied_row_equals_the_same_row_streamed_value_and_text(pg_server: Any, pg_database: str) -> None:
    uri = pg_server.uri(pg_database)
    slot = f"tw_sr_{uuid.uuid4().hex[:8]}"
    execute(pg_server, pg_database,
            "CREATE TYPE mood AS ENUM ('sad', 'ok')",
            "CREATE TABLE t (id int, k text, n numeric(14,4), ts timestamptz, d date, arr int[], tarr text[], "
            "j jsonb, f float8, r real, b bool, bt bytea, ch char(4), u uuid, iv interval, m mood, nul text, "
            "PRIMARY KEY (id, k))",
            "CREATE PUBLICATION p_sr FOR TABLE t",
            f"SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput')")
    conn = pg_server.connect(pg_database)
    try:
        with conn.cursor() as cur:
            cur.execute("INSERT INTO t VALUES (1, 'plain', 1.5, '2024-01-02 03:04:05.123456+05', '2024-02-29', "
                        "'{1,NULL,3}', %s, '{\"a\": [1, 2.50]}', -0.0, 1.1, true, '\\x00ff10', 'ab', "
                        "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '1 day 02:03:04.5', 'ok', NULL)",
                        (["a b", None, 'x"y', "back\\slash"],))
            cur.execute("INSERT INTO t VALUES (2, %s, 'NaN', 'infinity', '-infinity', '{}', '{}', 'null', "
                        "1e-7, 'NaN', false, '', 'abcd', NULL, '-3 mons', 'sad', %s)", (ODD, ODD))
            cur.execute("INSERT INTO t (id, k) VALUES (3, 'nulls')")
            cur.execute("INSERT INTO t VALUES (4, 'old', -0.0001, '0044-03-15 12:00:00+00 BC', '0044-03-15 BC', "
                        "'{{1,2},{3,4}}', NULL, '[]', 'NaN', '-Infinity', NULL, NULL, NULL, NULL, NULL, NULL, '')")
        schema = catalog.table_schema(conn, TableName("public", "t"))
        streamed = {(c.row[0], c.row[1]): c for c in _streamed(conn, slot, "p_sr", schema, 4)}
        assert len(streamed) == 4
        with open_upstream(uri).snapshot_reader(None) as reader:
            plan = reader.plan(reader.table_schema(TableName("public", "t")), 2)
            copied = [c for chunk in plan.chunks for c in reader.read_chunk(schema, chunk, commit_ts=7)]
        assert [c.row[:2] for c in copied] == [(1, "plain"), (2, ODD), (3, "nulls"), (4, "old")]  # key order
        for c in copied:
            s = streamed[(c.row[0], c.row[1])]
            assert c.op is OpType.INSERT and c.commit_ts == 7 and c.schema is schema
            assert list(c.row_text) == list(s.row_text)  # the very text pgoutput sent
            assert repr(c.row) == repr(s.row)  # parsed alike (repr: NaN == NaN, 1.5000 != 1.5)
    finally:
        with conn.cursor() as cur:
            cur.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
        conn.close()


def test_chunks_of_a_composite_key_cover_the_snapshot_exactly(pg_server: Any, pg_database: str) -> None:
    uri = pg_server.uri(pg_database)
    execute(pg_server, pg_database,
            "CREATE TABLE c (a int, b text, v text, PRIMARY KEY (a, b))",
            "INSERT INTO c SELECT i % 7, 'k' || i, 'v' || i FROM generate_series(1, 1000) i")
    with exported_snapshot(pg_server, pg_database) as exp:
        # after the export: invisible to the snapshot, but inside the planned key ranges
        execute(pg_server, pg_database, "INSERT INTO c VALUES (3, 'k3000', 'late'), (-1, 'a', 'late')",
                "DELETE FROM c WHERE a = 0")
        name = TableName("public", "c")
        with open_upstream(uri).snapshot_reader(exp.snapshot) as reader:
            schema = reader.table_schema(name)
            plan = reader.plan(schema, 300)
            assert plan.rows == 1000 and len(plan.chunks) == 4
            assert [ch.index for ch in plan.chunks] == [0, 1, 2, 3] and {ch.count for ch in plan.chunks} == {4}
            assert plan.chunks[0].lower is None and plan.chunks[-1].upper is None
            for left, right in zip(plan.chunks, plan.chunks[1:], strict=False):
                assert left.upper == right.lower is not None and len(left.upper) == 2
            # a plan survives JSON (etcd, the job file) exactly
            assert serde.from_json(TablePlan, serde.to_json(plan)) == plan
            sizes = []
            rows = []
            for chunk in plan.chunks:
                got = [c.row for c in reader.read_chunk(schema, chunk)]
                sizes.append(len(got))
                rows.extend(got)
        assert sizes == [300, 300, 300, 100]  # exact at the snapshot
        assert len(rows) == len(set(rows)) == 1000 and not any(r[2] == "late" for r in rows)
        assert rows == sorted(rows, key=lambda r: (r[0], r[1].encode()))  # ordered by key (C collation aside)
        # the same chunks read at a later snapshot (the export gone) still cover every row exactly once
        exp.expire()
        with open_upstream(uri).snapshot_reader(None) as later:
            now = [c.row for chunk in plan.chunks for c in later.read_chunk(schema, chunk)]
        assert len(now) == len(set(now)) == 1000 - 1000 // 7 + 2
        assert {(3, "k3000", "late"), (-1, "a", "late")} <= set(now)


def test_a_dense_integer_key_is_planned_in_equal_ranges_and_a_sparse_one_exactly(
        pg_server: Any, pg_database: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(snapshot_read, "DENSE_MIN_ROWS", 300)  # (1,000,000 rows: too slow to load here)
    uri = pg_server.uri(pg_database)
    execute(pg_server, pg_database,
            # dense: 1..1000 with every third key gone (667 rows over 1000 keys: spread 1.5)
            "CREATE TABLE dense (id bigint PRIMARY KEY, v text)",
            "INSERT INTO dense SELECT i, 'v' || i FROM generate_series(1, 1000) i WHERE i % 3 <> 0",
            # sparse: 500 rows spread over 500,000 keys, all but 10 bunched at the low end
            "CREATE TABLE sparse (id int PRIMARY KEY, v text)",
            "INSERT INTO sparse SELECT i, 'v' FROM generate_series(1, 490) i",
            "INSERT INTO sparse SELECT i * 50000, 'w' FROM generate_series(1, 10) i")
    with exported_snapshot(pg_server, pg_database) as exp:
        # after the export: invisible to the snapshot, but inside (or beyond) the planned ranges
        execute(pg_server, pg_database, "INSERT INTO dense VALUES (3, 'late'), (5000, 'late'), (-7, 'late')",
                "DELETE FROM dense WHERE id = 1")
        with open_upstream(uri).snapshot_reader(exp.snapshot) as reader:
            schema = reader.table_schema(TableName("public", "dense"))
            plan = reader.plan(schema, 100)
            assert plan.rows == 667 and len(plan.chunks) == 7  # ceil(667 / 100) ranges of ceil(1000 / 7) keys
            assert [ch.lower for ch in plan.chunks] == [None] + [(str(1 + i * 143),) for i in range(1, 7)]
            assert plan.chunks[-1].upper is None
            sizes = [len(list(reader.read_chunk(schema, ch))) for ch in plan.chunks]
            assert sum(sizes) == 667 and max(sizes) <= 2 * 100  # at most DENSE_SPREAD x chunk-rows each
            assert serde.from_json(TablePlan, serde.to_json(plan)) == plan
            s_schema = reader.table_schema(TableName("public", "sparse"))
            s_plan = reader.plan(s_schema, 100)  # the exact ordered pass: 100 rows per chunk but the last
            assert [len(list(reader.read_chunk(s_schema, ch))) for ch in s_plan.chunks] == [100] * 5
            monkeypatch.setattr(snapshot_read, "DENSE_MIN_ROWS", 1000)  # a smaller table: the exact pass too
            exact = reader.plan(schema, 100)
            assert [len(list(reader.read_chunk(schema, ch))) for ch in exact.chunks] == [100] * 6 + [67]
        # the equal ranges read at a later snapshot still cover every row exactly once, the open ends included
        exp.expire()
        with open_upstream(uri).snapshot_reader(None) as later:
            now = [c.row[0] for ch in plan.chunks for c in later.read_chunk(schema, ch)]
        assert sorted(now) == sorted({i for i in range(2, 1001) if i % 3} | {3, 5000, -7})


def test_a_dense_key_with_an_estimate_of_its_rows_is_planned_without_counting_them(
        pg_server: Any, pg_database: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """PostgreSQL's row estimate (here from ANALYZE run after the export: it is updated in place, so the snapshot
    sees the newer figure) sizes the equal ranges instead of a count(*); the ranges still hold every row of the
    snapshot exactly once, each at most its width."""
    monkeypatch.setattr(snapshot_read, "DENSE_MIN_ROWS", 300)
    execute(pg_server, pg_database, "CREATE TABLE est (id bigint PRIMARY KEY, v text)",
            "INSERT INTO est SELECT i, 'v' FROM generate_series(1, 1000) i")
    with exported_snapshot(pg_server, pg_database) as exp:
        execute(pg_server, pg_database, "INSERT INTO est SELECT i, 'late' FROM generate_series(1001, 1200) i",
                "ANALYZE est")
        with open_upstream(pg_server.uri(pg_database)).snapshot_reader(exp.snapshot) as reader:
            schema = reader.table_schema(TableName("public", "est"))
            plan = reader.plan(schema, 100)
            assert plan.rows == 1200 and len(plan.chunks) == 12  # the estimate, not the snapshot's 1000 rows
            sizes = [len(list(reader.read_chunk(schema, ch))) for ch in plan.chunks]
            assert sum(sizes) == 1000 and max(sizes) <= 84  # ranges of ceil(1000 / 12) keys
            rows = [c.row[0] for ch in plan.chunks for c in reader.read_chunk(schema, ch)]
            assert sorted(rows) == list(range(1, 1001))


def test_a_table_without_a_key_is_one_whole_chunk(pg_server: Any, pg_database: str) -> None:
    uri = pg_server.uri(pg_database)
    execute(pg_server, pg_database, "CREATE TABLE nk (a int, b text)", "ALTER TABLE nk REPLICA IDENTITY FULL",
            "INSERT INTO nk SELECT i % 3, 'x' FROM generate_series(1, 50) i")
    with open_upstream(uri).snapshot_reader() as reader:
        schema = reader.table_schema(TableName("public", "nk"))
        plan = reader.plan(schema, 10)
        assert not plan.has_key and plan.rows == 50
        assert len(plan.chunks) == 1 and plan.chunks[0].whole
        assert len(list(reader.read_chunk(schema, plan.chunks[0]))) == 50


def test_a_one_column_row_holding_the_empty_string_is_read_not_skipped(pg_server: Any, pg_database: str) -> None:
    """COPY writes such a row as an empty line; the parsed read used to skip empty lines, so the row was lost."""
    uri = pg_server.uri(pg_database)
    execute(pg_server, pg_database, "CREATE TABLE one (k text PRIMARY KEY)", "INSERT INTO one VALUES (''), ('a'), (' ')")
    with open_upstream(uri).snapshot_reader() as reader:
        schema = reader.table_schema(TableName("public", "one"))
        (chunk,) = reader.plan(schema, 10).chunks
        assert [ch.row for ch in reader.read_chunk(schema, chunk)] == [("",), (" ",), ("a",)]


def test_an_expired_snapshot_and_a_missing_table_are_clear_errors(pg_server: Any, pg_database: str) -> None:
    uri = pg_server.uri(pg_database)
    execute(pg_server, pg_database, "CREATE TABLE e (id int PRIMARY KEY)")
    with exported_snapshot(pg_server, pg_database) as exp:
        with (open_upstream(uri).snapshot_reader(exp.snapshot) as reader,
              pytest.raises(InvalidArgument, match=r"public\.nope does not exist .*at the snapshot")):
            reader.table_schema(TableName("public", "nope"))
        exp.expire()
        with (open_upstream(uri).snapshot_reader(exp.snapshot) as reader,
              pytest.raises(SnapshotExpired, match="no longer exists.*Fix: copy under a fresh snapshot")):
            reader.table_schema(TableName("public", "e"))


def test_a_big_chunk_streams_and_an_abandoned_or_failed_read_leaves_nothing_behind(pg_server: Any,
                                                                                   pg_database: str) -> None:
    import dataclasses
    import threading

    from cdc.events import ColumnSchema

    uri = pg_server.uri(pg_database)
    execute(pg_server, pg_database, "CREATE TABLE s (a int, b text)", "ALTER TABLE s REPLICA IDENTITY FULL",
            "INSERT INTO s SELECT i, repeat('x', 100) FROM generate_series(1, 100000) i")  # ~10 MB, one chunk
    with open_upstream(uri).snapshot_reader() as reader:
        schema = reader.table_schema(TableName("public", "s"))
        [chunk] = reader.plan(schema, 1000).chunks
        rows = reader.read_chunk(schema, chunk)
        first = [next(rows) for _ in range(10)]
        assert [r.row[0] for r in first] == list(range(1, 11))
        rows.close()  # the consumer goes away mid-COPY: the copy thread stops, the connection is dropped
        assert not [t for t in threading.enumerate() if t.name.startswith("copy-public.s")]
        assert sum(1 for _ in reader.read_chunk(schema, chunk)) == 100000  # reopened
        bad = dataclasses.replace(schema, columns=(*schema.columns, ColumnSchema("gone", 25, "text")))
        with pytest.raises(SnapshotTableAltered, match='reading chunk 0 of public.s failed: .*"gone" does not exist'):
            list(reader.read_chunk(bad, chunk))
        assert sum(1 for _ in reader.read_chunk(schema, chunk)) == 100000


@pytest.mark.parametrize("ddl", ["ALTER TABLE t DROP COLUMN qty", "ALTER TABLE t RENAME COLUMN v TO w",
                                 "DROP TABLE t"])
def test_a_table_altered_after_the_snapshot_is_a_retryable_error_and_the_reader_goes_on(
        pg_server: Any, pg_database: str, ddl: str) -> None:
    """PostgreSQL resolves the copy's query against the current catalog: a column renamed or dropped, or the table
    dropped, after the snapshot makes the read fail, retryably (the next run plans the table anew), never fatally;
    the reader's transaction is not left aborted. (A table renamed is read by its relation oid: the next test.)"""
    execute(pg_server, pg_database, "CREATE TABLE t (id int PRIMARY KEY, qty int, v text)",
            "INSERT INTO t SELECT g, g, 'x' FROM generate_series(1, 1000) g", "CREATE TABLE other (id int PRIMARY KEY)",
            "INSERT INTO other SELECT generate_series(1, 10)")
    with exported_snapshot(pg_server, pg_database) as exp, \
            open_upstream(pg_server.uri(pg_database)).snapshot_reader(exp.snapshot) as reader:
        schema = reader.table_schema(TableName("public", "t"))
        plan = reader.plan(schema, 300)
        reader.release()
        execute(pg_server, pg_database, ddl)
        for read in (lambda: b"".join(reader.read_chunk_text(schema, plan.chunks[1]).blocks),  # type: ignore[union-attr]
                     lambda: list(reader.read_chunk(schema, plan.chunks[1]))):
            with pytest.raises(SnapshotTableAltered) as err:
                read()
            assert err.value.retryable and "public.t" in err.value.message
        other = reader.table_schema(TableName("public", "other"))
        assert len(list(reader.read_chunk(other, reader.plan(other, 100).chunks[0]))) == 10


@pytest.mark.parametrize("ddl", ["ALTER TABLE t RENAME TO t2", "ALTER TABLE t SET SCHEMA other"])
def test_a_table_renamed_after_the_snapshot_is_read_by_its_relation_oid_as_of_the_snapshot(
        pg_server: Any, pg_database: str, ddl: str) -> None:
    """A copy planned under a snapshot keeps reading its table as of that snapshot after the table was renamed
    (``RENAME``, ``SET SCHEMA``): found by the relation oid its schema carries, not by the name PostgreSQL would
    resolve against the current catalog (docs/snapshot.md, "A table renamed while it is copied"). Planning, counting
    and both ways of reading a chunk give the snapshot's rows, not those written after it under the new name; the
    plan keeps the snapshot's name (its target's). Without the look-up by oid every read fails with "relation
    public.t does not exist"."""
    execute(pg_server, pg_database, "CREATE SCHEMA other", "CREATE TABLE t (id int PRIMARY KEY, v text)",
            "INSERT INTO t SELECT g, 'x' || g FROM generate_series(1, 1000) g")
    new = "t2" if "t2" in ddl else "other.t"
    with exported_snapshot(pg_server, pg_database) as exp, \
            open_upstream(pg_server.uri(pg_database)).snapshot_reader(exp.snapshot) as reader:
        schema = reader.table_schema(TableName("public", "t"))
        reader.release()
        execute(pg_server, pg_database, ddl, f"UPDATE {new} SET v = 'after' WHERE id <= 500",
                f"INSERT INTO {new} VALUES (5000, 'after')")
        plan = reader.plan(schema, 300)
        assert plan.table_name == TableName("public", "t") and plan.rows == 1000, plan
        assert reader.count_rows(schema) == 1000
        reader.release()
        rows = [r for c in plan.chunks for r in reader.read_chunk(schema, c)]
        reader.release()
        assert sorted((r.row[0], r.row[1]) for r in rows) == [(g, f"x{g}") for g in range(1, 1001)]
        text = b"".join(b"".join(reader.read_chunk_text(schema, c).blocks)  # type: ignore[union-attr]
                        for c in plan.chunks)
        assert text.count(b"\n") == 1000 and b"after" not in text
        reader.release()
        execute(pg_server, pg_database, f"DROP TABLE {new}")  # gone: no current name, the retryable error
        with pytest.raises(SnapshotTableAltered) as err:
            list(reader.read_chunk(schema, plan.chunks[0]))
        assert err.value.retryable and "public.t" in err.value.message
