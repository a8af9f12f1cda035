"""The MySQL/MariaDB span-set rule (upstream.mysql.span_set) and the control plane that answers by it
(upstream.mysql.upstream): every table is carried by exactly one span of a changefeed, the one cdc.spans.span_of
gives it (the rule create, the owner and the processor use), the span count survives in the stored span, and a
rename statement is recognised so both spans it concerns refuse it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from cdc.errors import InvalidArgument
from cdc.events import TableName
from cdc.model import SpanInfo
from cdc.spans import resource_name, span_of
from upstream.base import SpanPlan
from upstream.mysql import admin, catalog, ddl
from upstream.mysql.span_set import SpanShare, publication_label
from upstream.mysql.upstream import MySqlUpstream, span_server_id

pytestmark = pytest.mark.unit

NAMES = [TableName(s, f"t{i}") for s in ("shop", "other") for i in range(200)]


@pytest.mark.parametrize("count", [1, 2, 3, 5])
def test_every_table_is_carried_by_exactly_one_span_the_one_span_of_gives_it(count: int) -> None:
    shares = [SpanShare(i, count) for i in range(count)]
    for name in NAMES:
        carriers = [s.index for s in shares if s.carries(name)]
        assert carriers == [span_of(name, count)], name  # never two, never none
    if count > 1:  # (each span gets some: the rule spreads the tables)
        assert all(any(s.carries(n) for n in NAMES) for s in shares)


def test_the_span_count_is_stored_in_the_label_and_old_labels_are_one_span() -> None:
    pub = resource_name("pub", "cf-1", 2)
    stored = SpanInfo(2, resource_name("slot", "cf-1", 2), publication_label(pub, 3), 10)
    assert SpanShare.of(stored) == SpanShare(2, 3)
    assert publication_label(pub, 1) == pub  # one span: the label as before
    assert SpanShare.of(SpanInfo(0, "s", pub, 10)) == SpanShare(0, 1)  # a changefeed made before several spans
    with pytest.raises(ValueError, match="span 3 of a changefeed of 3"):
        SpanShare.of(SpanInfo(3, "s", publication_label(pub, 3), 10))


@pytest.mark.parametrize(("query", "renames"), [
    ("RENAME TABLE a TO b", [(("db", "a"), ("db", "b"))]),
    ("rename table `x`.`a` to y.b, c TO `d`", [(("x", "a"), ("y", "b")), (("db", "c"), ("db", "d"))]),
    ("ALTER TABLE a RENAME TO b", [(("db", "a"), ("db", "b"))]),
    ("ALTER TABLE db.a ADD COLUMN c INT, RENAME AS other.b", [(("db", "a"), ("other", "b"))]),
    ("ALTER TABLE a RENAME COLUMN x TO y", []),
    ("ALTER TABLE a RENAME INDEX i TO j", []),
    ("DROP TABLE a", []),
])
def test_rename_statements_name_old_and_new_tables(query: str, renames: list[Any]) -> None:
    assert ddl.renamed_tables(query, "db") == renames


@pytest.fixture
def up(monkeypatch: pytest.MonkeyPatch) -> Iterator[MySqlUpstream]:
    """A MySqlUpstream whose catalog and server facts are given (no server: the rule is under test)."""
    monkeypatch.setattr(catalog, "list_tables", lambda conn, where, db: sorted(n for n in NAMES if n.schema == db))
    monkeypatch.setattr(admin, "variables", lambda conn, where: {"server_id": "1"})
    monkeypatch.setattr(admin, "replica_server_ids", lambda conn, where: set())
    monkeypatch.setattr(admin, "master_position", lambda conn, where: ("mariadb-bin.000001", 400))
    u = MySqlUpstream("mysql://root@127.0.0.1:3306/shop", connect=lambda *a, **k: object())
    yield u
    u.close()


def _plans(count: int, tables: list[TableName]) -> list[SpanPlan]:
    return [SpanPlan(i, resource_name("slot", "cf", i), resource_name("pub", "cf", i),
                     tuple(t for t in tables if span_of(t, count) == i)) for i in range(count)]


def test_the_control_plane_answers_by_the_rule(up: MySqlUpstream) -> None:
    tables = up.list_tables()
    spans = up.create_spans(_plans(3, tables))
    assert [SpanShare.of(s) for s in spans] == [SpanShare(i, 3) for i in range(3)]
    assert len({span_server_id(s.slot) for s in spans}) == 3
    sets = [up.span_tables(s) for s in spans]
    assert sorted(t for ts in sets for t in ts or ()) == tables  # each table in exactly one set
    for s, ts in zip(spans, sets, strict=True):
        assert ts == [t for t in tables if span_of(t, 3) == s.index]
    for t in tables[:20]:
        assert up.carrying_spans(catalog.relation_id(t), spans) == [span_of(t, 3)]
    assert up.carrying_spans(catalog.relation_id(TableName("shop", "gone")), spans) == []
    assert up.add_table(spans[0], tables[0], lock_timeout_ms=1, count_cap=1, spans=spans) is None
    wanted = {s.index: [t for t in tables if span_of(t, 3) == s.index] for s in spans}
    with up.align_spans(spans, wanted) as before:
        assert before == tables


def test_a_table_set_the_rule_cannot_keep_is_refused(up: MySqlUpstream) -> None:
    tables = up.list_tables()
    wrong = _plans(2, tables)
    moved = wrong[1].tables[0]
    wrong[0] = SpanPlan(0, wrong[0].slot, wrong[0].publication, (*wrong[0].tables, moved))
    with pytest.raises(InvalidArgument, match=f"{moved}.*another span"):
        up.create_spans(wrong)
    spans = up.create_spans(_plans(2, tables))
    with pytest.raises(InvalidArgument, match="cannot carry"), up.align_spans(spans, {0: [moved], 1: []}):
        pass
