"""upstream.postgres.copy_out (a COPY OUT drained in C) against a real PostgreSQL: the same bytes as psycopg2's
copy_expert, errors classified like driver errors, abandoned reads, and the snapshot reader's fallback."""

from __future__ import annotations

import io
import threading
import time
from typing import Any

import psycopg2
import pytest

from cdc import cbuild
from cdc.errors import UpstreamError, UpstreamUnavailable
from cdc.events import TableName
from tests.snapshot_helpers import execute
from upstream.postgres import copy_out
from upstream.postgres.snapshot_read import PgSnapshotReader

pytestmark = pytest.mark.integration

ODD = 'a\tb\nc\\d"e\r,{x}'


@pytest.fixture(autouse=True)
def _helper_built() -> None:
    if not copy_out.available():
        pytest.fail("the COPY helper must build on this machine (gcc and psycopg2's libpq are here)")


def _expert(conn: Any, query: str) -> bytes:
    buf = io.BytesIO()
    with conn.cursor() as cur:
        cur.copy_expert(query, buf)
    return buf.getvalue()


def _helper(conn: Any, query: str, size: int) -> tuple[bytes, int]:
    out = copy_out.CopyOut(conn, query.encode())
    out.start()
    parts = []
    try:
        while block := out.read(size):
            assert len(block) <= size
            parts.append(block)
    finally:
        out.close()
    return b"".join(parts), len(parts)


def test_the_helper_reads_the_bytes_copy_expert_reads(pg_server: Any, pg_database: str) -> None:
    execute(pg_server, pg_database,
            "CREATE TABLE t (id int PRIMARY KEY, s text, b bytea, a int[])",
            f"INSERT INTO t SELECT i, repeat({ODD!r}, i % 5), decode(md5(i::text), 'hex'), ARRAY[i, NULL] "
            "FROM generate_series(1, 20000) i",
            "INSERT INTO t VALUES (0, NULL, decode(repeat('ab', 1500000), 'hex'), NULL)")  # one 3 MB row
    conn = pg_server.connect(pg_database)
    conn.autocommit = True
    try:
        query = "COPY (SELECT * FROM t ORDER BY id) TO STDOUT"
        want = _expert(conn, query)
        assert len(want) > 3_000_000
        for size in (copy_out.BLOCK, 4096):  # rows cut anywhere, the big row across many blocks
            got, blocks = _helper(conn, query, size)
            assert got == want and blocks >= len(want) // size
        small = "COPY (SELECT * FROM t WHERE id BETWEEN 1 AND 300 ORDER BY id) TO STDOUT"
        assert _helper(conn, small, 7)[0] == _expert(conn, small)  # blocks smaller than a row
        with conn.cursor() as cur:  # the connection is idle and usable again
            cur.execute("SELECT count(*) FROM t")
            assert cur.fetchone()[0] == 20001
    finally:
        conn.close()


def test_a_failing_copy_raises_the_servers_sqlstate_and_the_reader_classifies_it(pg_server: Any,
                                                                                 pg_database: str) -> None:
    conn = pg_server.connect(pg_database)
    conn.autocommit = True
    try:
        with pytest.raises(copy_out.CopyOutError) as err:  # fails after some rows went out
            _helper(conn, "COPY (SELECT 1 / (i - 3000) FROM generate_series(1, 5000) i) TO STDOUT", 1024)
        assert err.value.pgcode == "22012" and "division by zero" in str(err.value)
        with pytest.raises(copy_out.CopyOutError) as err:  # fails to start
            _helper(conn, "COPY (SELECT * FROM no_such_table) TO STDOUT", 1024)
        assert err.value.pgcode == "42P01"
        assert isinstance(err.value, psycopg2.OperationalError)
        with conn.cursor() as cur:
            cur.execute("SELECT 1")
    finally:
        conn.close()


def test_a_killed_upstream_session_is_unavailable_and_an_abandoned_read_closes_the_reader(
        pg_server: Any, pg_database: str) -> None:
    execute(pg_server, pg_database, "CREATE TABLE big (id int PRIMARY KEY, v text)",
            "INSERT INTO big SELECT i, repeat('x', 200) FROM generate_series(1, 200000) i")
    uri = pg_server.uri(pg_database)
    name = TableName("public", "big")
    reader = PgSnapshotReader(uri)
    try:
        schema = reader.table_schema(name)
        (chunk,) = reader.plan(schema, 10_000_000).chunks
        # abandoned after one block: the reader drops its connection (mid-COPY), the next read starts afresh
        text = reader.read_chunk_text(schema, chunk)
        assert text is not None
        blocks = iter(text.blocks)
        assert len(next(blocks)) == copy_out.BLOCK
        blocks.close()  # type: ignore[attr-defined]
        assert reader.backend_pid is None  # the abandoned read dropped its session
        again = reader.read_chunk_text(schema, chunk)
        assert again is not None and sum(len(b) for b in again.blocks) > 200000 * 200
        # the upstream session killed mid-read: a retryable error, never a short chunk
        text = reader.read_chunk_text(schema, chunk)
        assert text is not None
        blocks = iter(text.blocks)
        next(blocks)
        pid = reader.backend_pid
        killer = pg_server.connect(pg_database)
        killer.autocommit = True
        with killer.cursor() as cur:
            cur.execute("SELECT pg_terminate_backend(%s)", (pid,))
        killer.close()
        time.sleep(0.2)
        with pytest.raises((UpstreamUnavailable, UpstreamError)) as err:
            for _ in blocks:
                pass
        assert isinstance(err.value, UpstreamUnavailable), err.value
    finally:
        reader.close()


def test_without_the_helper_the_reader_sends_the_same_bytes(pg_server: Any, pg_database: str,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    execute(pg_server, pg_database, "CREATE TABLE t (id int PRIMARY KEY, s text)",
            f"INSERT INTO t SELECT i, repeat({ODD!r}, i % 4) FROM generate_series(1, 5000) i")
    name = TableName("public", "t")

    def read_all() -> bytes:
        reader = PgSnapshotReader(pg_server.uri(pg_database))
        try:
            schema = reader.table_schema(name)
            (chunk,) = reader.plan(schema, 100_000).chunks
            text = reader.read_chunk_text(schema, chunk)
            assert text is not None
            return b"".join(text.blocks)
        finally:
            reader.close()

    with_helper = read_all()
    monkeypatch.setattr(copy_out, "_lib", None)
    monkeypatch.setattr(copy_out, "_why_not", "switched off by the test")
    threads_before = threading.active_count()
    assert not copy_out.available()
    assert read_all() == with_helper and len(with_helper) > 5000
    assert threading.active_count() == threads_before  # the pipe's producer thread ended


def test_build_says_why_it_cannot(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setattr(cbuild, "build_dirs", lambda package: [tmp_path / "a"])
    with pytest.raises(OSError) as err:
        copy_out.build()
    assert "no-such-cc" in str(err.value)
