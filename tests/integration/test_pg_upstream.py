"""upstream.postgres.upstream.PostgresUpstream (the interface of upstream.base) against a real PostgreSQL 18:
span resources are created all-or-nothing, aligned in one transaction that follows the caller's block, and
dropped idempotently; the factory dispatches on the scheme."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from cdc.errors import InvalidArgument, TableNotEligible
from cdc.events import TableName
from playground.servers import PostgresServer
from upstream import open_upstream
from upstream.base import SpanPlan, Upstream
from upstream.postgres import admin
from upstream.postgres.conn import connect

pytestmark = pytest.mark.integration

A, B, C = TableName("public", "ua"), TableName("public", "ub"), TableName("public", "uc")


@pytest.fixture
def conn(pg_server: PostgresServer, pg_database: str) -> Iterator[Any]:
    c = connect(pg_server.uri(pg_database))
    with c.cursor() as cur:
        for t in (A, B, C):
            cur.execute(f"CREATE TABLE {t.table} (id int PRIMARY KEY, v text)")
        cur.execute("CREATE TABLE nokey (v text)")
    yield c
    c.close()


@pytest.fixture
def up(pg_server: PostgresServer, pg_database: str, conn: Any) -> Iterator[Upstream]:
    with open_upstream(pg_server.uri(pg_database), statement_timeout=15.0) as u:
        yield u


def _names() -> tuple[str, str]:
    n = uuid.uuid4().hex[:10]
    return f"s_{n}", f"p_{n}"


def test_create_align_drop(up: Upstream, conn: Any) -> None:
    (s0, p0), (s1, p1) = _names(), _names()
    spans = up.create_spans([SpanPlan(0, s0, p0, (A,)), SpanPlan(1, s1, p1, (B,))])
    assert [(s.index, s.slot, s.publication) for s in spans] == [(0, s0, p0), (1, s1, p1)]
    assert all(s.start_ts > 0 for s in spans)
    assert up.span_tables(spans[0]) == [A] and up.span_tables(spans[1]) == [B]
    state = up.slot_state(s0)
    assert state is not None and not state.lost and not state.active and state.confirmed_ts == spans[0].start_ts
    assert up.current_position() >= spans[1].start_ts

    # a slot of that name exists: refused, and the existing one is left alone
    with pytest.raises(InvalidArgument, match="already exists"):
        up.create_spans([SpanPlan(0, s0, p0, (A,))])
    assert up.slot_state(s0) is not None

    # the block fails: nothing changes
    with pytest.raises(RuntimeError), up.align_spans(spans, {0: [A, C], 1: []}, label="cf") as before:
        assert before == [A, B]
        raise RuntimeError("the etcd CAS failed")
    assert up.span_tables(spans[0]) == [A] and up.span_tables(spans[1]) == [B]
    # the block succeeds: committed; the session is usable (autocommit) afterwards
    with up.align_spans(spans, {0: [A, C], 1: []}, label="cf") as before:
        assert before == [A, B]
    assert up.span_tables(spans[0]) == [A, C] and up.span_tables(spans[1]) == []
    assert A in up.list_tables()

    assert [s.slot for s in up.drop_spans(spans)] == [s0, s1]
    assert up.slot_state(s0) is None and up.span_tables(spans[0]) is None
    assert up.drop_spans(spans) == []  # idempotent
    with pytest.raises(InvalidArgument, match="no longer exists"), up.align_spans(spans, {0: [A]}):
        pass


def test_a_failed_create_drops_only_what_it_created(up: Upstream, conn: Any) -> None:
    (s0, p0), (s1, p1) = _names(), _names()
    admin.create_publication(conn, p1, [C])  # exists with other tables: the second plan fails
    with pytest.raises(InvalidArgument, match="different tables"):
        up.create_spans([SpanPlan(0, s0, p0, (A,)), SpanPlan(1, s1, p1, (B,))])
    assert up.slot_state(s0) is None and admin.publication_tables(conn, p0) is None
    assert admin.publication_tables(conn, p1) == [C]  # not ours: kept
    admin.drop_publication(conn, p1)


def test_eligibility_and_add_table(up: Upstream, conn: Any) -> None:
    with pytest.raises(TableNotEligible, match="nokey"):
        up.check_tables([TableName("public", "nokey")])
    assert [s.name for s in up.check_tables([A, B])] == [A, B]
    s0, p0 = _names()
    (span,) = up.create_spans([SpanPlan(0, s0, p0, (A,))])
    with conn.cursor() as cur:
        cur.execute("INSERT INTO uc VALUES (1, 'x'), (2, 'y')")
    assert up.check_tables([C], publication=p0)[0].key == ("id",)
    assert up.add_table(span, C, lock_timeout_ms=1000, count_cap=10) == 2
    assert up.add_table(span, C, lock_timeout_ms=1000, count_cap=10) is None  # already in
    assert up.span_tables(span) == [A, C]
    assert up.has_rows(up.table_schema(C).relation_id) and up.relation_exists(up.table_schema(A).relation_id)
    assert not up.relation_exists(1)
    s1, p1 = _names()
    (other,) = up.create_spans([SpanPlan(1, s1, p1, (B,))])
    oid = up.table_schema(C).relation_id
    assert up.carrying_spans(oid, [span, other]) == [0] and up.carrying_spans(oid, [other]) == []
    # carried by another span of the changefeed: not added to a second one
    assert up.add_table(other, C, lock_timeout_ms=1000, count_cap=10, spans=[span]) is None
    assert up.span_tables(other) == [B]
    with conn.cursor() as cur:  # by relation, not by name
        cur.execute("ALTER TABLE uc RENAME TO uc_renamed")
    try:
        assert up.carrying_spans(oid, [span, other]) == [0]
        renamed = TableName("public", "uc_renamed")
        assert up.add_table(other, renamed, lock_timeout_ms=1000, count_cap=10, spans=[span]) is None
        assert up.span_tables(other) == [B] and up.span_tables(span) == [A, renamed]
    finally:
        with conn.cursor() as cur:
            cur.execute("ALTER TABLE uc_renamed RENAME TO uc")
    up.drop_spans([span, other])
