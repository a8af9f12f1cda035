"""A table created after the changefeed joins its span's publication in the creating transaction
(``tidewater.ddl_join`` in upstream/postgres/sql/10_ddl.sql), by the rule ``changefeed create`` stores on each span
publication: the filter (PostgreSQL's regex engine applying ``TableFilter.anchored_regexes``), the span it hashes to
(``tidewater.crc32`` = ``zlib.crc32``), and only tables that are surely fine (usable replica identity, no generated
column, no clash of downstream names, a key under at-least-once). Real PostgreSQL 18."""

from __future__ import annotations

import fnmatch
import random
import re
import uuid
import zlib
from collections.abc import Iterator
from typing import Any

import pytest

from cdc.events import TableName
from cdc.filter import TableFilter, glob_regex
from cdc.spans import resource_name, span_of
from playground.servers import PostgresServer
from upstream import open_upstream
from upstream.base import JoinRule, SpanPlan, Upstream
from upstream.postgres import admin
from upstream.postgres.conn import connect

pytestmark = pytest.mark.integration


@pytest.fixture
def conn(pg_server: PostgresServer, pg_database: str) -> Iterator[Any]:
    c = connect(pg_server.uri(pg_database))
    with c.cursor() as cur:
        cur.execute("CREATE TABLE seed (id int PRIMARY KEY); CREATE SCHEMA other")
    yield c
    c.close()


@pytest.fixture
def up(pg_server: PostgresServer, pg_database: str, conn: Any) -> Iterator[Upstream]:
    with open_upstream(pg_server.uri(pg_database), statement_timeout=15.0) as u:
        yield u


def _spans(up: Upstream, rule: JoinRule) -> list[str]:
    cf = "j" + uuid.uuid4().hex[:8]
    seed = TableName("public", "seed")
    plans = [SpanPlan(i, resource_name("slot", cf, i), resource_name("pub", cf, i),
                      (seed,) if span_of(seed, rule.span_count) == i else (), rule) for i in range(rule.span_count)]
    up.create_spans(plans)
    return [p.publication for p in plans]


def _where(conn: Any, table: str) -> list[str]:
    with conn.cursor() as cur:
        cur.execute("SELECT p.pubname FROM pg_publication_rel pr JOIN pg_publication p ON p.oid = pr.prpubid "
                    "WHERE pr.prrelid = %s::regclass ORDER BY 1", (table,))
        return [r[0] for r in cur.fetchall()]


def test_crc32_in_the_upstream_is_zlibs(up: Upstream, conn: Any) -> None:
    _spans(up, JoinRule(TableFilter(["public.*"]), 1))  # installs the functions
    rng = random.Random(3)
    names = ["public.t", "", "sales.orders_2026", "é.ü", *("".join(rng.choice("abcxyz._éß") for _ in range(rng.randint(1, 40)))
                                                          for _ in range(50))]
    with conn.cursor() as cur:
        for n in names:
            cur.execute("SELECT tidewater.crc32(convert_to(%s, 'UTF8'))", (n,))
            assert cur.fetchone()[0] == zlib.crc32(n.encode()), n


def test_the_upstream_regex_engine_gives_fnmatchs_verdicts(conn: Any) -> None:
    rng = random.Random(5)
    alphabet = "ab_.*?[]!-^$(xZé"
    patterns = ["*", "a*", "t?x", "[abc]z", "[!a-c]*", "x[", "a.b", "[]]x", "[!]]", "we$ird(", "a^b", "[^a]", "[[]",
                *("".join(rng.choice(alphabet) for _ in range(rng.randint(0, 5))) for _ in range(150))]
    names = ["", "a", "ab", "t_x", "az", "x[", "a.b", "]x", "]", "we$ird(", "é", "a^b", "^", "!", "[",
             *("".join(rng.choice(alphabet) for _ in range(rng.randint(0, 4))) for _ in range(60))]
    with conn.cursor() as cur:
        for pat in patterns:
            rx = glob_regex(pat)
            try:
                re.compile(rx)
            except re.error:
                continue  # a reversed range: fnmatch fails too; the trigger then leaves the table to the owner
            cur.execute("SELECT n, n ~ %s FROM unnest(%s::text[]) n", (rx, names))
            for name, verdict in cur.fetchall():
                assert verdict == fnmatch.fnmatchcase(name, pat), (pat, name, rx)


def test_a_new_table_joins_the_span_it_hashes_to_when_the_filter_selects_it(up: Upstream, conn: Any) -> None:
    rule = JoinRule(TableFilter(["public.*", "!public.skip_*", "other.keep_[0-9]"]), 3)
    pubs = _spans(up, rule)
    with conn.cursor() as cur:
        for t in ("n_a", "n_b", "n_c", "n_d", "skip_me", "other.keep_1", "other.keep_x"):
            cur.execute(f"CREATE TABLE {t} (id int PRIMARY KEY)")
    for t in ("n_a", "n_b", "n_c", "n_d", "other.keep_1"):
        name = TableName(*t.split(".")) if "." in t else TableName("public", t)
        assert _where(conn, t) == [pubs[span_of(name, 3)]], t
    assert _where(conn, "skip_me") == [] and _where(conn, "other.keep_x") == []


def test_only_tables_that_are_surely_fine_join(up: Upstream, conn: Any) -> None:
    pubs = _spans(up, JoinRule(TableFilter(["public.*"]), 1, target_names="table", fold_case=True, keyless=False))
    with conn.cursor() as cur:
        cur.execute("CREATE TABLE nokey (v text)")  # no replica identity: its UPDATEs would fail once published
        cur.execute("CREATE TABLE deferred (id int PRIMARY KEY DEFERRABLE INITIALLY DEFERRED)")
        cur.execute("CREATE TABLE gen (id int PRIMARY KEY, v int, w int GENERATED ALWAYS AS (v * 2) STORED)")
        cur.execute("CREATE UNLOGGED TABLE unl (id int PRIMARY KEY)")
        cur.execute("CREATE TABLE other.seed (id int PRIMARY KEY)")  # lands on 'seed' downstream: a clash
        cur.execute("CREATE TABLE \"SEED\" (id int PRIMARY KEY)")  # the same, case-folded
        cur.execute("CREATE TABLE ctas AS SELECT 1 AS id")  # holds rows already: the owner counts them
        cur.execute("BEGIN; CREATE TABLE fullkeyless (v text); ALTER TABLE fullkeyless REPLICA IDENTITY FULL; "
                    "COMMIT")
        cur.execute("CREATE TABLE fine (id int PRIMARY KEY, v text)")
    for t in ("nokey", "deferred", "gen", "unl", "other.seed", '"SEED"', "ctas", "fullkeyless"):
        assert _where(conn, t) == [], t
    assert _where(conn, "fine") == pubs


def test_the_rule_follows_changefeed_update_and_leaves_with_the_publication(up: Upstream, conn: Any) -> None:
    rule = JoinRule(TableFilter(["public.a_*"]), 1)
    pubs = _spans(up, rule)
    with conn.cursor() as cur:
        cur.execute("CREATE TABLE b_1 (id int PRIMARY KEY)")
    assert _where(conn, "b_1") == []
    spans = [s for s in _list_spans(up, pubs)]
    with up.align_spans(spans, {0: [TableName("public", "seed")]}, join=JoinRule(TableFilter(["public.*"]), 1)):
        pass
    with conn.cursor() as cur:
        cur.execute("CREATE TABLE b_2 (id int PRIMARY KEY)")
        cur.execute(f"COMMENT ON PUBLICATION {pubs[0]} IS 'not ours'")  # a rule that is not ours: ignored
        cur.execute("CREATE TABLE b_3 (id int PRIMARY KEY)")
    assert _where(conn, "b_2") == pubs and _where(conn, "b_3") == []


def _list_spans(up: Upstream, pubs: list[str]) -> list[Any]:
    from cdc.model import SpanInfo

    return [SpanInfo(i, p.replace("_pub_", "_slot_"), p, 0) for i, p in enumerate(pubs)]


def test_the_doc_is_what_the_trigger_reads() -> None:
    doc = admin.join_rule_doc(JoinRule(TableFilter(["x.*"]), 4, "table", True, False), 2, ["p0", "p1"])
    assert doc == {"v": 1, "span": 2, "spans": 4, "rules": [(True, "^x$", "^.*$")], "names": "table",
                   "fold": True, "keyless": False, "pubs": ["p0", "p1"]}
