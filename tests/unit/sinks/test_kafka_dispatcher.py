"""Dispatcher rules (sinks/kafka/dispatcher.py): each partition dispatcher, topic expressions, first-match rules,
per-key partition stability, and the changefeed TOML that configures them (cdc.config.DispatcherRule)."""

from __future__ import annotations

import subprocess
import sys
import zlib

import pytest

from cdc.config import ChangefeedConfig, DispatcherRule
from cdc.errors import InvalidConfig, SinkError
from cdc.events import OpType, RowChange, TableName
from sinks.codec import split_key_change
from sinks.kafka.dispatcher import Dispatcher, canonical, topic_for
from tests.kafka_sink_fakes import dele, ins, table, upd

pytestmark = pytest.mark.unit

N = 6


def rule(**kw: object) -> DispatcherRule:
    return DispatcherRule(matcher=tuple(kw.pop("matcher", ("public.*",))), **kw)  # type: ignore[arg-type]


def test_default_is_by_table_to_the_uri_topic() -> None:
    d = Dispatcher((), "cdc")
    s = table("accounts")
    r = d.route(s)
    assert r.topic == "cdc" and r.rule == "default"
    expected = zlib.crc32(b"public.accounts") % N
    assert {r.partition(ins(s, ts, i), N) for ts in (1, 2) for i in range(50)} == {expected}


def test_index_value_keeps_a_key_on_one_partition_and_spreads_the_table() -> None:
    d = Dispatcher((rule(partition="index-value"),), "cdc")
    s = table()
    r = d.route(s)
    for i in range(40):
        p = r.partition(ins(s, 10, i), N)
        assert r.partition(upd(s, 11, i, "y"), N) == p
        assert r.partition(dele(s, 12, i), N) == p
    assert len({r.partition(ins(s, 1, i), N) for i in range(100)}) == N


def test_a_key_change_is_split_and_each_half_goes_to_its_own_key() -> None:
    d = Dispatcher((rule(partition="index-value"),), "cdc")
    s = table()
    r = d.route(s)
    change = upd(s, 20, 7, "moved", old_id=3)
    halves = split_key_change(change)
    assert halves is not None
    delete, insert = halves
    assert delete.op is OpType.DELETE and insert.op is OpType.INSERT
    assert r.partition(delete, N) == r.partition(ins(s, 1, 3), N)
    assert r.partition(insert, N) == r.partition(ins(s, 1, 7), N)


def test_keyless_table_with_index_value_falls_back_to_table() -> None:
    d = Dispatcher((rule(partition="index-value"),), "cdc")
    s = table(keyed=False)
    r = d.route(s)
    assert {r.partition(ins(s, 1, i), N) for i in range(30)} == {zlib.crc32(b"public.t") % N}


def test_ts_dispatcher() -> None:
    d = Dispatcher((rule(partition="ts"),), "cdc")
    s = table()
    assert [d.route(s).partition(ins(s, ts, 1), N) for ts in range(12)] == [ts % N for ts in range(12)]


def test_columns_dispatcher_hashes_the_named_columns() -> None:
    d = Dispatcher((rule(partition="columns", columns=("v",)),), "cdc")
    s = table()
    r = d.route(s)
    assert r.partition(ins(s, 1, 1, "same"), N) == r.partition(ins(s, 2, 99, "same"), N)
    assert len({r.partition(ins(s, 1, 1, f"v{i}"), N) for i in range(60)}) == N
    # a delete that does not carry the column (REPLICA IDENTITY DEFAULT): refused, naming table and column
    with pytest.raises(SinkError, match=r"public\.t.*'v'.*REPLICA IDENTITY FULL"):
        r.partition(dele(s, 3, 1), N)


def test_columns_dispatcher_names_a_missing_column() -> None:
    d = Dispatcher((rule(partition="columns", columns=("nope",)),), "cdc")
    with pytest.raises(SinkError, match=r"public\.t has no column\(s\) 'nope'.*id, v"):
        d.route(table())


def test_first_matching_rule_wins_and_unmatched_tables_use_the_defaults() -> None:
    d = Dispatcher((rule(matcher=["public.a*"], topic="A_{schema}_{table}", partition="ts"),
                    rule(matcher=["public.*"], topic="rest", partition="index-value")), "cdc")
    assert (d.route(table("abc")).topic, d.route(table("abc")).rule) == ("A_public_abc", "ts")
    assert (d.route(table("b")).topic, d.route(table("b")).rule) == ("rest", "index-value")
    other = table("x")
    other = type(other)(TableName("audit", "x"), other.columns, other.key)
    assert (d.route(other).topic, d.route(other).rule) == ("cdc", "default")
    assert d.has_table_topics


@pytest.mark.parametrize(("expr", "table_name", "expected"), [
    ("", TableName("public", "t"), "cdc"),
    ("fixed", TableName("public", "t"), "fixed"),
    ("cdc_{schema}_{table}", TableName("public", "Ledger Entries"), "cdc_public_Ledger_Entries"),
    ("{schema}", TableName("sales", "t"), "sales"),
    ("x.{schema}.{table}.y", TableName("Ünï", "t$1"), "x._n_.t_1.y"),
])
def test_topic_expressions(expr: str, table_name: TableName, expected: str) -> None:
    assert topic_for(expr, table_name, "cdc") == expected


def test_an_overlong_topic_is_cut_with_a_hash_so_tables_stay_apart() -> None:
    a = topic_for("{schema}_{table}", TableName("s", "a" * 300), "cdc")
    b = topic_for("{schema}_{table}", TableName("s", "a" * 299 + "b"), "cdc")
    assert len(a) <= 249 and len(b) <= 249 and a != b


def test_partitions_are_stable_across_processes() -> None:
    """CRC-32 of a canonical form, never hash(): another interpreter (another hash seed) agrees."""
    s = table()
    r = Dispatcher((rule(partition="index-value"),), "cdc").route(s)
    here = [r.partition(ins(s, 1, i, f"v{i}"), 7) for i in range(20)]
    code = ("from sinks.kafka.dispatcher import Dispatcher; from cdc.config import DispatcherRule;"
            "from tests.kafka_sink_fakes import table, ins; s = table();"
            "r = Dispatcher((DispatcherRule(matcher=('public.*',), partition='index-value'),), 'cdc').route(s);"
            "print([r.partition(ins(s, 1, i, f'v{i}'), 7) for i in range(20)])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONHASHSEED": "12345", "PATH": "", "PYTHONPATH": ":".join(sys.path)})
    assert out.stdout.strip() == str(here)


def test_canonical_forms_differ_by_type() -> None:
    assert len({canonical(v) for v in (1, "1", 1.0, True, b"1", None)}) == 6


def test_positional_rows_hash_like_dicts() -> None:
    s = table()
    r = Dispatcher((rule(partition="index-value"),), "cdc").route(s)
    positional = RowChange(OpType.INSERT, s, 1, 0.0, row=(5, "x"))
    assert r.partition(positional, N) == r.partition(ins(s, 1, 5), N)


def test_toml_rules_and_their_validation_errors() -> None:
    cfg = ChangefeedConfig.from_toml(
        "[[sink.dispatchers]]\nmatcher = ['public.*']\ntopic = 'cdc_{schema}_{table}'\npartition = 'index-value'\n"
        "[[sink.dispatchers]]\nmatcher = ['s.*']\npartition = 'columns'\ncolumns = ['a', 'b']\n")
    assert cfg.sink.dispatchers == (
        DispatcherRule(("public.*",), "cdc_{schema}_{table}", "index-value"),
        DispatcherRule(("s.*",), "", "columns", ("a", "b")))
    assert ChangefeedConfig.from_dict(cfg.to_dict()) == cfg
    bad = {
        "partition = 'hash'": r"partition 'hash' is not a dispatcher: use one of default, table, index-value",
        "partition = 'columns'": r"partition = 'columns' needs the columns",
        "columns = ['a']": r"columns are only used with partition = 'columns'",
        "topic = 'a b'": r"topic 'a b' is not a topic expression.*\{schema\}",
        "topic = '{table}'": r"is not a topic expression",
        "topc = 'x'": r"unknown key 'topc'",
    }
    for line, message in bad.items():
        with pytest.raises(InvalidConfig, match=message):
            ChangefeedConfig.from_toml(f"[[sink.dispatchers]]\nmatcher = ['public.*']\n{line}\n")
    with pytest.raises(InvalidConfig, match=r"matcher must list table rules"):
        ChangefeedConfig.from_toml("[[sink.dispatchers]]\ntopic = 'x'\n")


def test_dispatchers_on_a_non_kafka_sink_are_refused() -> None:
    from cdc.config import SinkConfig
    from sinks.factory import open_sink

    with pytest.raises(InvalidConfig, match=r"not a Kafka sink: remove the dispatchers"):
        open_sink("blackhole://", SinkConfig(dispatchers=(rule(),)))


def test_known_keys_keep_their_partitions() -> None:
    """Pinned: an upgrade must not move keys silently (a consumer relying on per-key order across the upgrade would
    see one key's changes in two partitions). A change here is a compatibility break to announce, not a test to
    update."""
    import datetime as dt
    import uuid
    from decimal import Decimal

    from cdc.events import TableSchema
    from tests.kafka_sink_fakes import col

    s = table()
    by_key = Dispatcher((rule(partition="index-value"),), "cdc").route(s)
    assert [by_key.partition(ins(s, 1, i), 6) for i in (1, 2, 3, 42, -7, 2**40)] == [2, 0, 4, 4, 3, 5]
    assert [by_key.partition(ins(s, 1, i), 2**31) for i in (1, 2)] == [789980258, 908031448]
    assert by_key.partition(dele(s, 2, 42), 6) == 4  # a delete by its old key: the same partition

    orders = TableSchema(TableName("shop", "orders"),
                         (col("tenant", "text", 25, key=True), col("id", "uuid", 2950, key=True),
                          col("at", "date", 1082), col("amount", "numeric", 1700)), ("tenant", "id"), "d", 1, 0)
    rows = [{"tenant": "acme", "id": uuid.UUID(int=1), "at": dt.date(2026, 1, 1), "amount": Decimal("1.50")},
            {"tenant": "Ünïcode", "id": uuid.UUID("12345678-1234-5678-1234-567812345678"), "at": None,
             "amount": Decimal("0")},
            {"tenant": "acme", "id": uuid.UUID(int=2), "at": None, "amount": Decimal("0")}]
    changes = [RowChange(OpType.INSERT, orders, 1, 0.0, r) for r in rows]
    composite = Dispatcher((rule(matcher=("shop.*",), partition="index-value"),), "cdc").route(orders)
    assert [composite.partition(c, 6) for c in changes] == [1, 3, 3]
    assert [composite.partition(c, 100) for c in changes] == [63, 5, 33]
    assert [composite.partition(c, 2**31) for c in changes] == [1628501263, 1417192005, 2014946485]
    columns = Dispatcher((rule(matcher=("shop.*",), partition="columns", columns=("tenant", "amount")),),
                         "cdc").route(orders)
    assert [columns.partition(c, 6) for c in changes] == [4, 4, 5]
    assert [columns.partition(c, 100) for c in changes] == [56, 58, 13]
    assert [columns.partition(c, 2**31) for c in changes] == [1028586556, 810116810, 1484997465]
