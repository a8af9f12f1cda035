"""An error of the upstream's side of a chunk (the reader's) reaches the copy job as itself on every SQL target, with
its code and retryability, and nothing of the chunk is committed.

The chunk's rows reach the target while they are read: as COPY text fed to psycopg2's ``copy_expert`` (the
PostgreSQL passthrough, ``sinks/sql/ops/bulk.py``), or as parsed rows iterated by the sink's ``write`` (every target;
its statements get lists, never the reader's generator). psycopg2 turns an exception of the text's ``read()`` into a
driver error of the target's COPY, which the sink wrapped as its own fatal CDC:ErrSinkFatal: a column renamed after the
snapshot (the retryable CDC:ErrSnapshotTableAltered) failed a PostgreSQL-target changefeed for good instead of copying
on under a fresh snapshot (tests/e2e/test_ddl_concurrent.py). Here each path meets the reader's failure after rows of
the chunk were sent: a fake CDC:ErrSnapshotTableAltered raised mid-chunk, and the upstream session terminated
mid-chunk (the real reader's CDC:ErrUpstreamUnavailable). The key-deferred marked chunk (``sinks/sql/ops/deferred_key.py``)
is tested in test_snapshot_deferred_key.py."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest

from cdc.errors import SnapshotTableAltered, TidewaterError, UpstreamUnavailable
from cdc.events import RowChange, TableName, TableSchema
from cdc.snapshot import CopyText, SnapshotChunk, TablePlan
from sinks.factory import open_sink
from spark_jobs.copy import ChunkTask, copy_chunk
from spark_jobs.plan import SnapshotJob
from tests.snapshot_helpers import execute, pg_target
from tests.sql_targets import SqlTarget, make_target
from upstream.base import SnapshotReader
from upstream.postgres.snapshot_read import PgSnapshotReader

pytestmark = pytest.mark.integration

ROWS = 50_000  # ~100 MB of COPY text (stored compressed): more than the sockets and queues between the upstream's
# COPY and the reader hold, so the reader is still reading when its session is terminated
AFTER_ROWS = 5000  # parsed rows read (several of the sink's 1000-row statements sent) before the failure
CAUSE = RuntimeError("the upstream's own failure")


@pytest.fixture(params=[("postgresql", "text"), ("postgresql", "parsed"), ("mariadb", "text"), ("mariadb", "parsed"),
                        ("sqlite", "parsed")],
                ids=lambda p: f"{p[0]}-{p[1]}")
def target(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[tuple[SqlTarget, str]]:
    """(the target, the path its chunk takes): PostgreSQL's is a database of its own (``pg_database`` is the
    upstream); its parsed path is what a chunk takes when the reader gives no text."""
    kind, path = request.param
    request.param = kind  # (make_target and pg_target read the kind from it)
    if kind != "postgresql":
        yield make_target(SqlTarget, request, tmp_path), path
        return
    for t in pg_target(request):
        yield t, path


class Failing(SnapshotReader):
    """The real reader, whose chunk fails once some of it was read: ``how`` is ``altered`` (a SnapshotTableAltered
    raised with :data:`CAUSE`) or ``killed`` (the upstream session terminated: the real reader's own error).
    ``text``: give the chunk as COPY text (else None: the caller reads it parsed). ``read``: rows or blocks read;
    ``raised``: the exception the chunk's reading raised."""

    def __init__(self, inner: PgSnapshotReader, pg_server: Any, how: str, text: bool) -> None:
        self.inner = inner
        self.pg_server = pg_server
        self.how = how
        self.text = text
        self.read = 0
        self.raised: BaseException | None = None
        self.pid: int | None = None  # the upstream session's (taken before the read: its connection is busy then)

    def fail(self) -> None:
        if self.how == "killed":
            self.pg_server.execute("SELECT pg_terminate_backend(%s)", params=(self.pid,))
        else:
            raise SnapshotTableAltered("reading chunk 0 of public.r failed: a column the copy reads was renamed",
                                       cause=CAUSE)

    def _failing(self, items: Iterator[Any], after: int) -> Iterator[Any]:
        try:
            for item in items:
                self.read += 1
                yield item
                if self.read == after:
                    self.fail()
        except Exception as exc:
            self.raised = exc
            raise

    def table_schema(self, table: TableName) -> TableSchema:
        return self.inner.table_schema(table)

    def plan(self, schema: TableSchema, chunk_rows: int) -> TablePlan:
        return self.inner.plan(schema, chunk_rows)

    def read_chunk(self, schema: TableSchema, chunk: SnapshotChunk, **kw: Any) -> Iterator[RowChange]:
        return self._failing(self.inner.read_chunk(schema, chunk, **kw), AFTER_ROWS)

    def read_chunk_text(self, schema: TableSchema, chunk: SnapshotChunk) -> CopyText | None:
        if not self.text:
            return None
        text = self.inner.read_chunk_text(schema, chunk)
        assert text is not None
        return dataclasses.replace(text, blocks=self._failing(iter(text.blocks), 1))

    def release(self) -> None:
        self.inner.release()

    def close(self) -> None:
        self.inner.close()


def _copy_failing_chunk(pg_server: Any, pg_database: str, tgt: SqlTarget, how: str, path: str) -> tuple[Failing, Any]:
    """Copy the one chunk of ``public.r`` into ``tgt`` (the copy job's task code) through a :class:`Failing` reader;
    (the reader, what the copy raised). Checks that nothing of the chunk was committed."""
    execute(pg_server, pg_database, "CREATE TABLE r (id int PRIMARY KEY, v text)",
            f"INSERT INTO r SELECT g, repeat('x', 2000) FROM generate_series(1, {ROWS}) g")
    job = SnapshotJob(changefeed="cf-read-error", upstream=pg_server.uri(pg_database), sink=tgt.uri, tables=("public.r",),
                      etcd=("http://127.0.0.1:1",))  # copy_chunk never talks to etcd
    reader = Failing(PgSnapshotReader(pg_server.uri(pg_database)), pg_server, how, text=path == "text")
    sink = open_sink(tgt.uri, job.sink_settings)
    try:
        schema = reader.table_schema(TableName("public", "r"))
        (chunk,) = reader.plan(schema, 1_000_000).chunks
        reader.release()
        reader.pid = reader.inner.backend_pid  # (the session the chunk is read on: release keeps it)
        assert reader.pid is not None
        with pytest.raises(TidewaterError) as err:
            copy_chunk(reader, sink, ChunkTask(job, schema, chunk))
        assert reader.read >= (1 if path == "text" else AFTER_ROWS)  # rows went to the target before the failure
    finally:
        sink.close()
        reader.close()
    tables = {"mariadb": "SHOW TABLES", "postgresql": "SELECT relname FROM pg_class WHERE relname = 'r'",
              "sqlite": "SELECT name FROM sqlite_master WHERE type = 'table'"}[tgt.kind]
    if ("r",) in tgt.execute(tables):  # (created in the chunk's transaction on SQLite: gone with it)
        assert tgt.execute(f"SELECT count(*) FROM {tgt.qualified('r')}") == [(0,)]
    return reader, err.value


@pytest.mark.parametrize("how", ["altered", "killed"])
def test_an_upstream_error_mid_chunk_is_raised_as_itself_on_every_target_and_commits_nothing(
        pg_server: Any, pg_database: str, target: tuple[SqlTarget, str], how: str) -> None:
    """The exception the reader raised is the one the copy raises (never the target's wrapping of it), with its code
    and retryability: a SnapshotTableAltered mid-chunk (retryable, its own cause); the upstream session terminated
    mid-chunk (the reader's error; CDC:ErrUpstreamUnavailable, retryable, on the text path, whose reader classifies
    it so: for the parsed path's reader see the test below)."""
    tgt, path = target
    reader, err = _copy_failing_chunk(pg_server, pg_database, tgt, how, path)
    assert err is reader.raised, (err, reader.raised)
    assert ".read() call" not in err.message, err
    if how == "altered":
        assert type(err) is SnapshotTableAltered and err.code == "CDC:ErrSnapshotTableAltered" and err.retryable, err
        assert err.__cause__ is CAUSE, err.__cause__
    elif path == "text":
        assert type(err) is UpstreamUnavailable and err.code == "CDC:ErrUpstreamUnavailable" and err.retryable, err
    else:
        assert err.code.startswith("CDC:ErrUpstream"), err


def test_an_upstream_session_killed_mid_parsed_chunk_is_retryable(pg_server: Any, pg_database: str,
                                                                  tmp_path: Any) -> None:
    tgt = SqlTarget("sqlite", None, str(tmp_path / "target.db"))
    _reader, err = _copy_failing_chunk(pg_server, pg_database, tgt, "killed", "parsed")
    assert type(err) is UpstreamUnavailable and err.retryable, err
