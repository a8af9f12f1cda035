"""Which DDL a span source stores when its stream starts after the DDL committed (docs/ddl.md, "A DROP TABLE decoded
after a restart"). Real PostgreSQL 18 with Tidewater's DDL trigger, a real slot and publication.

A DROP TABLE takes the table out of the span's publication in the dropping transaction, so a span started after the
commit (from a checkpoint before it) cannot find the table there: the schema history's word that the span replicated
the table at its start (``seed_schemas(carried=...)``) decides. A table that still exists and has left the
publication (moved to another span by ``changefeed update``) is not the span's any more, whatever the history says.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from cdc.events import DdlKind, TableName
from cdc.filter import TableFilter
from cdc.spans import resource_name
from cdc.ts import Watermark
from playground.cluster import current_lsn
from playground.servers import PostgresServer
from upstream import open_upstream
from upstream.base import SCHEMA_CHANGE, SpanPlan, SpanSource, Upstream, decode_payload
from upstream.postgres.conn import connect

pytestmark = pytest.mark.integration


class Buffer:
    """A ChangeBuffer that keeps each committed transaction's payloads with its commit Ts."""

    def __init__(self) -> None:
        self.open: dict[int, list[bytes]] = {}
        self.committed: list[tuple[int, float, list[bytes]]] = []

    def add(self, xid: int, subxid: int, payload: bytes) -> None:
        self.open.setdefault(xid, []).append(payload)

    def add_many(self, xid: int, subxid: int, payloads: list[bytes]) -> None:
        self.open.setdefault(xid, []).extend(payloads)

    def abort(self, xid: int, subxid: int) -> None:
        if xid == subxid:
            self.open.pop(xid, None)

    def commit(self, xid: int, commit_ts: int, commit_time: float) -> None:
        self.committed.append((commit_ts, commit_time, self.open.pop(xid, [])))


@pytest.fixture
def conn(pg_server: PostgresServer, pg_database: str) -> Iterator[Any]:
    c = connect(pg_server.uri(pg_database))
    with c.cursor() as cur:
        cur.execute("CREATE TABLE dropped (id int PRIMARY KEY, v text); CREATE TABLE moved (id int PRIMARY KEY);"
                    "CREATE TABLE stays (id int PRIMARY KEY)")
    yield c
    c.close()


@pytest.fixture
def up(pg_server: PostgresServer, pg_database: str, conn: Any) -> Iterator[Upstream]:
    with open_upstream(pg_server.uri(pg_database), statement_timeout=15.0) as u:
        yield u


def _ddl_kinds(source: SpanSource, buffer: Buffer) -> list[tuple[DdlKind, str]]:
    out = []
    decoder = source.decoder()
    for ts, at, payloads in buffer.committed:
        for p in payloads:
            version, raw = decode_payload(p)
            if version == SCHEMA_CHANGE:
                out += [(c.kind, str(e.table)) for e in decoder.schema_changes(raw, ts, at) for c in e.changes]
    return out


@pytest.mark.parametrize("history", ["carried", "unknown"])
def test_a_drop_committed_before_the_stream_started_is_the_spans_by_its_history(
        up: Upstream, conn: Any, history: str) -> None:
    cf = "c" + uuid.uuid4().hex[:8]
    tables = tuple(TableName("public", t) for t in ("dropped", "moved", "stays"))
    (span,) = up.create_spans([SpanPlan(0, resource_name("slot", cf, 0), resource_name("pub", cf, 0), tables)])
    schemas = [up.table_schema(t) for t in tables]
    with conn.cursor() as cur:  # all committed before the span's stream starts
        cur.execute(f"ALTER PUBLICATION {span.publication} DROP TABLE moved")  # as changefeed update moves a table
        cur.execute("ALTER TABLE moved ADD COLUMN x int")
        cur.execute("ALTER TABLE stays ADD COLUMN y int")
        cur.execute("DROP TABLE dropped")
    end = current_lsn(conn)
    source = up.span_source(span, Watermark(span.start_ts, 0.0), TableFilter(("*.*",)), label=f"{cf}/0",
                            holder="test")
    # what the schema history says of the three tables at the start (all this span's; unknown: stored earlier)
    source.seed_schemas(schemas, carried=[s.relation_id for s in schemas] if history == "carried" else None)
    buffer = Buffer()
    stop = threading.Event()

    def resolved(w: Watermark) -> None:
        if w.ts >= end:
            stop.set()

    source.open()
    try:
        runner = threading.Thread(target=source.run, args=(buffer, stop, resolved), daemon=True)
        runner.start()
        runner.join(60)
        assert not runner.is_alive(), "the stream did not reach the DDL"
    finally:
        stop.set()
        source.close()
        up.drop_spans([span])
    kinds = _ddl_kinds(source, buffer)
    if history == "carried":  # the drop is the span's; the table moved away is not, even with its history
        assert kinds == [(DdlKind.ADD_COLUMN, "public.stays"), (DdlKind.DROP_TABLE, "public.dropped")], kinds
    else:  # what a span did before the history said which span replicated a table: the drop left out
        assert kinds == [(DdlKind.ADD_COLUMN, "public.stays")], kinds
