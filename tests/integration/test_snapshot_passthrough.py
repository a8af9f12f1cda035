"""The initial copy's COPY passthrough into PostgreSQL (sinks/sql/ops/bulk.py) stores exactly what streaming stores.

The same edge rows reach three PostgreSQL target databases: streamed through the real path (pgoutput -> our
decoder and mounter -> the SQL sink) in one write, which sends a group of 32+ rows through the sink's COPY of
their upstream text; streamed again one row per write, which sends parameters converted from the parsed values;
and copied through the passthrough (the upstream's ``COPY ... TO STDOUT`` text straight into ``COPY ... FROM
STDIN``). Every stored value must be identical in the three (each row's text under the same session settings,
and the column types), and the copy must equal the upstream row by row (playground/compare.py). Then the
refusals (types without a proven text path, a target of other types, another client encoding), a chunk copied
twice (upserted, never duplicated), a key-less table's whole chunk copied twice (replaced), a fence that
refuses (nothing committed), and an error of the upstream's side of the chunk (raised as itself, nothing committed)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from cdc.config import SinkConfig
from cdc.errors import SnapshotSuperseded, SnapshotTableAltered, TidewaterError, UpstreamUnavailable
from cdc.events import TableName, TableSchema
from cdc.snapshot import PG_COPY_TEXT, CopyText, SnapshotChunk
from playground.compare import compare_tables
from sinks.factory import open_sink
from spark_jobs.copy import ChunkTask, copy_one
from spark_jobs.plan import SnapshotJob
from tests.integration.test_values_exact import Upstream
from tests.snapshot_helpers import text_killed_after_first_block
from upstream.base import SnapshotReader
from upstream.postgres.snapshot_read import PgSnapshotReader

pytestmark = pytest.mark.integration

EDGE = """CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE DOMAIN amount AS numeric(10,2);
CREATE TABLE edge (id int PRIMARY KEY, i2 smallint, i8 bigint, b boolean, t text, vc varchar(20), bp char(5),
                   ch "char", nm name, n numeric, n7 numeric(12,7), amt amount, f4 real, f8 double precision, d date,
                   tm time, ttz timetz, ts timestamp, tstz timestamptz, iv interval, u uuid, by bytea, js json,
                   jb jsonb, m mood, ms mood[], ia int[], ta text[], na numeric[], tsa timestamptz[]);
INSERT INTO edge VALUES
 (1, -32768, 9223372036854775807, true, E'tab\\there\\nnew\\rcr \\\\ back \\\\N \\\\. "q" ''s''', 'é😀 x', 'ab', 'x',
  'a name', 'NaN', 0.0000001, 1.50, '-0', '-0', '2026-02-28', '24:00:00', '12:34:56.789+05:30', '2026-02-28 23:59:59',
  '1999-12-31 23:59:59.999999+00', '1 year 2 mons 3 days 04:05:06.789', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11',
  '\\x00ff5c0a0d09', '{"b": 1,  "a": [1, 2.50], "s": "tab\\there"}', '{"b": 1, "a": "é\\\\n"}', 'happy', '{sad,ok}',
  '[0:1]={1,2}', '{"a\\tb","c,d",NULL,"","\\\\"}', '{0.0000001,1.50,NaN}',
  '{"2026-01-01 00:00:00+00","2026-01-01 00:00:00.5+00"}'),
 (2, 0, 0, false, E'\\x01\\b\\f\\v\\x7f', '', '', ' ', '', 'Infinity', -99999.9999999, 0.00, 'NaN', 'Infinity',
  '0001-01-01', '00:00:00', '00:00:00+00', '0001-01-01 00:00:00', '2026-03-29 01:30:00.123456+00',
  '-1 days +00:00:00.000001', '00000000-0000-0000-0000-000000000000', '', '[null]', '[]', 'sad', '{}', '{}', '{}',
  '{}', '{}'),
 (3, 1, -1, NULL, '', 'trailing  ', 'abcde', 'z', 'n', '-Infinity', 12345.6789012, 12345678.90, 3.4028235e38,
  5e-324, '9999-12-31', '23:59:59.999999', '23:59:59.999999-15:59', '2026-01-01 00:00:00.5',
  '2026-06-30 23:00:00.000001+00', '0 seconds', 'ffffffff-ffff-ffff-ffff-ffffffffffff',
  decode(repeat('ab', 3000), 'hex'), '{}', '{"k": [null, true, 1e3, 0.10]}', 'ok', '{happy}', '[-5:-4]={7,NULL}',
  '{{a,b},{c,d}}', '{{1,2},{3,NULL}}', NULL),
 (4, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
  NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL);
INSERT INTO edge (id, d, ts, tstz, tsa, js, jb) VALUES
 (5, 'infinity', 'infinity', '-infinity', '{infinity,-infinity}', 'null', 'null'),
 (6, '0044-03-15 BC', '0044-03-15 10:00:00 BC', '0044-03-15 10:00:00+00 BC', '{"0001-01-01 00:00:00+00 BC"}', NULL, NULL),
 (7, '10000-01-01', '10000-01-01 00:00:00', '10000-01-01 00:00:00+00', NULL, NULL, NULL);
INSERT INTO edge (id, i8, t, n, n7, f4, f8, ts, tstz, by, jb, ia, na)
 SELECT g, g * 1000003, 'row ' || g || E'\\t' || repeat('é', g % 5), g * 0.01, g / 7.0, g / 3.0, g / 7.0,
        timestamp '2026-01-01' + g * interval '1.000001 second', timestamptz '2026-01-01 00:00:00+00' + g * interval '1 hour',
        decode(lpad(to_hex(g), 8, '0'), 'hex'), jsonb_build_object('g', g), ARRAY[g, -g], ARRAY[g * 0.5]
 FROM generate_series(10, 49) g"""
ROWS = 47
# compared by their stored text only: infinity, BC and year-10000 dates (psycopg2 cannot read them) and the JSON
# null (compare_tables reads it as SQL NULL from the target)
TEXT_ONLY = (5, 6, 7)


@pytest.fixture
def pg_targets(pg_server: Any) -> Iterator[list[str]]:
    names = [f"tgt_{uuid.uuid4().hex[:12]}" for _ in range(3)]
    for n in names:
        pg_server.create_database(n)
    yield names
    for n in names:
        pg_server.drop_database(n)


def _rows_text(pg_server: Any, db: str, table: str = "edge") -> list[str]:
    return [r[0] for r in pg_server.execute(f"SELECT t::text FROM public.{table} t ORDER BY id", db=db) or []]


def _types(pg_server: Any, db: str, table: str = "edge") -> list[tuple[str, str]]:
    return [tuple(r) for r in pg_server.execute(
        "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = %s::regclass "
        "AND attnum > 0 AND NOT attisdropped ORDER BY attnum", db=db, params=(f"public.{table}",)) or []]


def _chunks(reader: SnapshotReader, schema: TableSchema, chunk_rows: int) -> list[SnapshotChunk]:
    plan = reader.plan(schema, chunk_rows)
    reader.release()
    return list(plan.chunks)


class Counting(SnapshotReader):
    """A reader that counts which form each chunk was read in."""

    def __init__(self, inner: PgSnapshotReader) -> None:
        self.inner = inner
        self.text = 0
        self.parsed = 0

    def table_schema(self, table: TableName) -> TableSchema:
        return self.inner.table_schema(table)

    def plan(self, schema: TableSchema, chunk_rows: int) -> Any:
        return self.inner.plan(schema, chunk_rows)

    def read_chunk(self, schema: TableSchema, chunk: SnapshotChunk, **kw: Any) -> Any:
        self.parsed += 1
        return self.inner.read_chunk(schema, chunk, **kw)

    def read_chunk_text(self, schema: TableSchema, chunk: SnapshotChunk) -> Any:
        self.text += 1
        return self.inner.read_chunk_text(schema, chunk)

    def release(self) -> None:
        self.inner.release()

    def close(self) -> None:
        self.inner.close()


def _task(schema: TableSchema, chunk: SnapshotChunk, upstream_uri: str, sink_uri: str) -> ChunkTask:
    job = SnapshotJob(changefeed="cf-pass", upstream=upstream_uri, sink=sink_uri, tables=(str(schema.name),),
                      etcd=("http://127.0.0.1:1",))  # copy_one never talks to etcd
    return ChunkTask(job, schema, chunk)


def test_copied_rows_are_byte_for_byte_the_streamed_rows(upstream: Upstream, pg_server: Any,
                                                         pg_targets: list[str]) -> None:
    upstream.sql(EDGE)
    changes = upstream.changes()
    assert len(changes) == ROWS
    whole, one_by_one, copied = pg_targets
    sink = open_sink(pg_server.uri(whole), SinkConfig())
    try:
        sink.write(changes)  # 44 rows with their text: the sink's COPY of the upstream text
    finally:
        sink.close()
    sink = open_sink(pg_server.uri(one_by_one), SinkConfig())
    try:
        for ch in changes:  # one row per write: parameters converted from the parsed values
            sink.write([ch])
    finally:
        sink.close()

    reader = PgSnapshotReader(pg_server.uri(upstream.db))
    sink = open_sink(pg_server.uri(copied), SinkConfig())
    try:
        sink.set_bulk_load()
        schema = reader.table_schema(TableName("public", "edge"))
        chunks = _chunks(reader, schema, 15)
        assert len(chunks) == 4
        written = [sink.write_copy_text(schema, lambda c=c: reader.read_chunk_text(schema, c)) for c in chunks]
        reader.release()
    finally:
        sink.close()
        reader.close()
    assert written == [15, 15, 15, 2], "every chunk passed through (none fell back to parsing)"

    streamed = _rows_text(pg_server, whole)
    assert len(streamed) == ROWS
    assert _rows_text(pg_server, one_by_one) == streamed, "the sink's COPY and parameter paths disagree"
    assert _rows_text(pg_server, copied) == streamed
    assert _types(pg_server, copied) == _types(pg_server, whole)
    # a few stored values read back, beyond their text in the record (binary equality of the floats)
    checks = ("SELECT id, float4send(f4), float8send(f8), n::text, by, js::text, ia::text, t FROM public.edge "
              "WHERE id <= 3 ORDER BY id")
    assert pg_server.execute(checks, db=copied) == pg_server.execute(checks, db=whole)
    text_only = f"DELETE FROM public.edge WHERE id IN {TEXT_ONLY}"  # compared above, by their stored text
    upstream.sql(text_only)
    pg_server.execute(text_only, db=copied)
    (diff,) = compare_tables(upstream.conn, ["public.edge"], pg_server.uri(copied))
    n = ROWS - len(TEXT_ONLY)
    assert diff.equal and (diff.source_rows, diff.target_rows) == (n, n), diff.sample


OTHER_TYPES = """CREATE TABLE other (id int PRIMARY KEY, cash money, addr inet, r int4range, p point, bits varbit);
INSERT INTO other SELECT g, g * 1.25, ('10.0.0.' || g)::inet, int4range(g, g + 10), point(g, -g), B'1011'
FROM generate_series(1, 40) g"""


def test_types_without_a_proven_text_path_are_copied_parsed(upstream: Upstream, pg_server: Any,
                                                            pg_targets: list[str]) -> None:
    upstream.sql(OTHER_TYPES)
    target = pg_server.uri(pg_targets[0])
    reader = Counting(PgSnapshotReader(pg_server.uri(upstream.db)))
    sink = open_sink(target, SinkConfig())
    try:
        schema = reader.table_schema(TableName("public", "other"))
        opened: list[int] = []
        assert sink.write_copy_text(schema, lambda: opened.append(1) or None) is None
        assert opened == [], "the text is not even read when it cannot pass through"
        (chunk,) = _chunks(reader, schema, 1000)
        assert copy_one(reader, sink, _task(schema, chunk, pg_server.uri(upstream.db), target)) == 40
        assert (reader.text, reader.parsed) == (0, 1)
    finally:
        sink.close()
        reader.close()
    # (compare_tables reads ranges and bit strings through SQLAlchemy's types: the stored text is compared instead)
    assert _rows_text(pg_server, pg_targets[0], "other") == _rows_text(pg_server, upstream.db, "other")


def test_an_existing_target_of_other_types_is_copied_parsed(upstream: Upstream, pg_server: Any,
                                                            pg_targets: list[str]) -> None:
    upstream.sql("CREATE TABLE w (id int PRIMARY KEY, n numeric(20,9), t varchar(10));"
                 "INSERT INTO w SELECT g, g * 0.5, 'x' || g FROM generate_series(1, 40) g")
    db = pg_targets[0]
    pg_server.execute("CREATE TABLE public.w (id bigint PRIMARY KEY, n numeric(30,9), t text)", db=db)
    reader = Counting(PgSnapshotReader(pg_server.uri(upstream.db)))
    sink = open_sink(pg_server.uri(db), SinkConfig())
    try:
        schema = reader.table_schema(TableName("public", "w"))
        (chunk,) = _chunks(reader, schema, 1000)
        assert copy_one(reader, sink, _task(schema, chunk, pg_server.uri(upstream.db), pg_server.uri(db))) == 40
        assert (reader.text, reader.parsed) == (0, 1), "a target column of another type: the parsed path"
    finally:
        sink.close()
        reader.close()
    (diff,) = compare_tables(upstream.conn, ["public.w"], pg_server.uri(db))
    assert diff.equal and diff.target_rows == 40, diff.sample


def test_a_target_in_another_client_encoding_is_copied_parsed(upstream: Upstream, pg_server: Any) -> None:
    upstream.sql("CREATE TABLE l (id int PRIMARY KEY, t text); INSERT INTO l SELECT g, 'é' || g FROM generate_series(1, 40) g")
    db = f"tgt_{uuid.uuid4().hex[:12]}"
    pg_server.execute(f"CREATE DATABASE {db} ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0")
    reader = Counting(PgSnapshotReader(pg_server.uri(upstream.db)))
    sink = open_sink(pg_server.uri(db), SinkConfig())
    try:
        schema = reader.table_schema(TableName("public", "l"))
        (chunk,) = _chunks(reader, schema, 1000)
        assert copy_one(reader, sink, _task(schema, chunk, pg_server.uri(upstream.db), pg_server.uri(db))) == 40
        assert (reader.text, reader.parsed) == (0, 1)
        (diff,) = compare_tables(upstream.conn, ["public.l"], pg_server.uri(db))
        assert diff.equal and diff.target_rows == 40, diff.sample
    finally:
        sink.close()
        reader.close()
        pg_server.drop_database(db)


def test_a_chunk_copied_again_is_upserted_and_a_keyless_one_replaced(upstream: Upstream, pg_server: Any,
                                                                     pg_targets: list[str]) -> None:
    upstream.sql("CREATE TABLE k (id int PRIMARY KEY, v text); INSERT INTO k SELECT g, 'v' || g FROM generate_series(1, 90) g;"
                 "CREATE TABLE bag (g int, s text); ALTER TABLE bag REPLICA IDENTITY FULL;"
                 "INSERT INTO bag SELECT g % 7, 'same' FROM generate_series(1, 50) g")
    db = pg_targets[0]
    up_uri, uri = pg_server.uri(upstream.db), pg_server.uri(db)
    reader = Counting(PgSnapshotReader(up_uri))
    try:
        k = reader.table_schema(TableName("public", "k"))
        bag = reader.table_schema(TableName("public", "bag"))
        c = _chunks(reader, k, 20)
        (bag_chunk,) = _chunks(reader, bag, 20)
        assert bag_chunk.whole and len(c) == 5

        def copy(chunk: SnapshotChunk) -> tuple[int, str]:
            before = reader.text, reader.parsed
            rows = copy_one(reader, sink, _task(bag if chunk.whole else k, chunk, up_uri, uri))
            return rows, "passed through" if (reader.text - before[0], reader.parsed - before[1]) == (1, 0) else (
                "upserted" if reader.parsed > before[1] else "?")

        sink = open_sink(uri, SinkConfig())
        try:
            assert [copy(x) for x in (c[0], c[1], c[2], bag_chunk)] == [(20, "passed through")] * 3 + [
                (50, "passed through")]
        finally:
            sink.close()
        # a crash between commits and records: the next run (a later snapshot) copies chunks 1 and 2 and the
        # key-less table again
        upstream.sql("UPDATE k SET v = 'changed' WHERE id IN (31, 45); DELETE FROM bag WHERE g = 3")
        reader.close()
        reader = Counting(PgSnapshotReader(up_uri))
        sink = open_sink(uri, SinkConfig())
        try:
            assert [copy(x) for x in (c[1], c[3], c[2], c[4], bag_chunk)] == [
                (20, "upserted"),  # the direct COPY met the rows: rolled back, then upserted by key
                (20, "passed through"),  # a chunk not copied before still passes through
                (20, "upserted"),  # the second chunk that met rows: the table is upserted from now on
                (10, "upserted"),
                (43, "passed through"),  # the key-less table's whole chunk replaces its rows
            ]
        finally:
            sink.close()
    finally:
        reader.close()
    diffs = compare_tables(upstream.conn, ["public.k", "public.bag"], uri)
    assert [(d.equal, d.target_rows) for d in diffs] == [(True, 90), (True, 43)], [d.sample for d in diffs]


def test_a_refusing_fence_commits_nothing(upstream: Upstream, pg_server: Any, pg_targets: list[str]) -> None:
    upstream.sql("CREATE TABLE f (id int PRIMARY KEY, v text); INSERT INTO f SELECT g, 'v' FROM generate_series(1, 40) g")
    db = pg_targets[0]
    reader = PgSnapshotReader(pg_server.uri(upstream.db))
    sink = open_sink(pg_server.uri(db), SinkConfig())

    def fence() -> None:
        raise SnapshotSuperseded("run superseded")

    try:
        schema = reader.table_schema(TableName("public", "f"))
        (chunk,) = _chunks(reader, schema, 1000)
        with pytest.raises(SnapshotSuperseded):
            sink.write_copy_text(schema, lambda: reader.read_chunk_text(schema, chunk), fence)
        reader.release()
        assert pg_server.execute("SELECT count(*) FROM public.f", db=db) == [(0,)]
        assert sink.write_copy_text(schema, lambda: reader.read_chunk_text(schema, chunk)) == 40
    finally:
        sink.close()
        reader.close()


@pytest.mark.parametrize("error", [SnapshotTableAltered, UpstreamUnavailable])
def test_an_error_of_the_upstreams_side_of_a_chunk_is_raised_as_itself(upstream: Upstream, pg_server: Any,
                                                                        pg_targets: list[str],
                                                                        error: type[TidewaterError]) -> None:
    """The chunk's text fails half way on the upstream's side (the retryable CDC:ErrSnapshotTableAltered of a table
    renamed since the snapshot, CDC:ErrUpstreamUnavailable of an upstream session lost mid-chunk): psycopg2 turns an
    exception of ``read()`` into a driver error of the target's COPY ("error in .read() call"), which the sink
    classified as its own fatal error, failing the changefeed for good instead of retrying under a fresh snapshot. It
    is raised as itself now (class, code, retryability and its own cause, not the driver's error), nothing of the
    chunk is committed, and the next attempt copies it."""
    upstream.sql("CREATE TABLE r (id int PRIMARY KEY, v text)")
    db = pg_targets[0]
    reader = PgSnapshotReader(pg_server.uri(upstream.db))
    sink = open_sink(pg_server.uri(db), SinkConfig())
    cause = RuntimeError("the upstream's own failure")

    def blocks(fail: bool) -> Iterator[bytes]:
        yield b"".join(b"%d\tv%d\n" % (i, i) for i in range(1, 1001))
        if fail:
            raise error("relation \"public.r\" does not exist: it was renamed or dropped", cause=cause)

    try:
        schema = reader.table_schema(TableName("public", "r"))
        reader.release()
        with pytest.raises(error, match="renamed or dropped") as err:
            sink.write_copy_text(schema, lambda: CopyText(PG_COPY_TEXT, "UTF8", blocks(True)))
        assert type(err.value) is error and err.value.code == error.code and err.value.retryable, err.value
        assert err.value.__cause__ is cause, err.value.__cause__
        assert pg_server.execute("SELECT count(*) FROM public.r", db=db) == [(0,)]
        assert sink.write_copy_text(schema, lambda: CopyText(PG_COPY_TEXT, "UTF8", blocks(False))) == 1000
    finally:
        sink.close()
        reader.close()


def test_an_upstream_session_killed_mid_chunk_is_retryable_and_commits_nothing(upstream: Upstream, pg_server: Any,
                                                                               pg_targets: list[str]) -> None:
    """The upstream's session is terminated once the first block of a ~10 MB chunk went into the target's COPY: the
    chunk raises the reader's retryable CDC:ErrUpstreamUnavailable, not the target's fatal error, and none of the
    rows already sent is committed."""
    upstream.sql("CREATE TABLE k (id int PRIMARY KEY, v text); "
                 "INSERT INTO k SELECT g, repeat('x', 100) FROM generate_series(1, 100000) g")
    db = pg_targets[0]
    reader = PgSnapshotReader(pg_server.uri(upstream.db))
    sink = open_sink(pg_server.uri(db), SinkConfig())
    sent: list[int] = []
    try:
        schema = reader.table_schema(TableName("public", "k"))
        (chunk,) = _chunks(reader, schema, 1_000_000)
        with pytest.raises(UpstreamUnavailable) as err:
            sink.write_copy_text(schema, text_killed_after_first_block(pg_server, reader, schema, chunk, sent))
        assert err.value.code == "CDC:ErrUpstreamUnavailable" and err.value.retryable, err.value
        assert sent and sent[0] > 0
        assert pg_server.execute("SELECT count(*) FROM public.k", db=db) == [(0,)]
    finally:
        sink.close()
        reader.close()


@pytest.fixture
def upstream(pg_server: Any, pg_database: str) -> Iterator[Upstream]:
    u = Upstream(pg_server, pg_database)
    yield u
    u.close()
