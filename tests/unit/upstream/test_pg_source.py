"""PgSpanSource.run (the span source of upstream.postgres): replication traffic (hand-made pgoutput bytes, classified the way ReplicationStream.messages
does: plain changes raw, everything else decoded) into a sorter, and the resolved watermarks it reports."""

from __future__ import annotations

import json
import struct
import threading
from typing import Any

import pytest

from cdc.errors import DecodeError
from cdc.events import ColumnSchema, TableName, TableSchema
from cdc.filter import TableFilter
from cdc.ts import Watermark
from processor.mounter import Mounter
from processor.source_process import ChildSpanSource
from sorter.memory import MemorySorter
from tests import rowcodecs
from tests.pgoutput_wire import (
    WireStream,
    enc_begin,
    enc_commit,
    enc_delete,
    enc_insert,
    enc_message,
    enc_relation,
    enc_stream_abort,
    enc_stream_commit,
    enc_stream_start,
    enc_truncate,
    enc_update,
    no_catalog,
)
from upstream.base import SCHEMA_CHANGE, decode_payload
from upstream.postgres import pgoutput, pgoutput_messages
from upstream.postgres import source as source_mod
from upstream.postgres.rowcodec import RowCodec
from upstream.postgres.source import PgSpanSource
from upstream.postgres.stream import Keepalive

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True, params=rowcodecs.NAMES)
def codec(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> RowCodec:
    """Every test here runs over both implementations of the per-row functions (tests/rowcodecs.py)."""
    return rowcodecs.use(request.param, monkeypatch)

INT4, TEXT = 23, 25
COLS = [(1, "id", INT4, -1), (0, "v", TEXT, -1)]
MAX = (1 << 64) - 1
T0 = pgoutput_messages.pg_time_to_unix(0)  # commit time 0 on the wire


FakeStream = WireStream


@pytest.fixture(autouse=True, params=["thread", "process"])
def mode(request: pytest.FixtureRequest) -> str:
    """Every test that runs a source through :func:`drive` runs it in this thread and in a process of its own
    (``processor.source_process``: the checks then read the parent's mirrored instance)."""
    global MODE
    MODE = request.param
    return MODE


MODE = "thread"


def drive(source: PgSpanSource, sorter: Any, on_resolved: Any) -> None:
    """``source.run`` into ``sorter`` until its wire ends, in the current :data:`MODE`."""
    if MODE == "thread":
        source.run(sorter, threading.Event(), on_resolved)
        return
    child = ChildSpanSource(source, "cf/0")
    try:
        child.open()
        child.run(sorter, threading.Event(), on_resolved)
    finally:
        child.close()
    assert child.proc is not None and child.proc.returncode is not None  # reaped


def run(wire: list[Any], start: int = 0, rules: tuple[str, ...] = ("*.*",)) -> tuple[PgSpanSource, Any, list[Watermark]]:
    sorter = MemorySorter().span("cf/0")
    marks: list[Watermark] = []
    source = PgSpanSource(FakeStream(wire), TableFilter(rules), Watermark(start, 0.0),  # type: ignore[arg-type]
                          no_catalog, "cf/0")
    drive(source, sorter, marks.append)
    return source, sorter, marks


def rows(source: PgSpanSource, sorter: Any) -> list[tuple[int, str, dict[str, Any] | None]]:
    mounter = Mounter(source.decoder())
    out = []
    for t in sorter.read_txns(-1, MAX):
        for p in t.payloads:
            ch = mounter.mount(p, t.commit_ts, t.commit_time)
            out.append((t.commit_ts, ch.op.name, ch.values if ch.values is not None else ch.old_values))
    return out


def reported(marks: list[Any], expected: list[Any]) -> bool:
    """The watermarks reported are ``expected`` (in a process of its own: the last of each batch only, so an
    ordered part of them that ends with the last)."""
    if MODE == "thread":
        return marks == expected
    return bool(marks) and marks[-1] == expected[-1] and all(m in expected for m in marks) and marks == sorted(
        marks, key=expected.index)


def txn(xid: int, end: int, *changes: bytes) -> list[bytes]:
    return [enc_begin(end - 1, 0, xid), *changes, enc_commit(0, end - 1, end, 0)]


def test_plain_transactions_reach_the_sorter_in_commit_order_with_their_schema() -> None:
    wire = [enc_relation(None, 7, "public", "t", "d", COLS),
            *txn(100, 1000, enc_insert(None, 7, ["1", "a"]), enc_update(None, 7, ["1", "b"])),
            *txn(101, 2000, enc_delete(None, 7, ["1", None]))]
    source, sorter, marks = run(wire)
    assert rows(source, sorter) == [(1000, "INSERT", {"id": 1, "v": "a"}), (1000, "UPDATE", {"id": 1, "v": "b"}),
                                    (2000, "DELETE", {"id": 1})]
    assert reported([m.ts for m in marks], [1000, 2000])
    assert source.schema(1).name == TableName("public", "t")


def test_a_relation_message_makes_a_new_schema_version_for_later_rows() -> None:
    cols2 = [*COLS, (0, "w", INT4, -1)]
    wire = [enc_relation(None, 7, "public", "t", "d", COLS), *txn(1, 10, enc_insert(None, 7, ["1", "a"])),
            enc_relation(None, 7, "public", "t", "d", cols2), *txn(2, 20, enc_insert(None, 7, ["2", "b", "5"]))]
    source, sorter, _ = run(wire)
    assert [r[2] for r in rows(source, sorter)] == [{"id": 1, "v": "a"}, {"id": 2, "v": "b", "w": 5}]


def test_filtered_and_unknown_tables_are_skipped() -> None:
    wire = [enc_relation(None, 7, "public", "t", "d", COLS), enc_relation(None, 8, "audit", "log", "d", COLS),
            *txn(1, 10, enc_insert(None, 8, ["9", "x"]), enc_insert(None, 7, ["1", "a"]), enc_insert(None, 99, ["2", "z"]))]
    source, sorter, _ = run(wire, rules=("public.*",))
    assert [r[2] for r in rows(source, sorter)] == [{"id": 1, "v": "a"}]


def test_transactions_at_or_below_the_start_checkpoint_are_dropped() -> None:
    wire = [enc_relation(None, 7, "public", "t", "d", COLS), *txn(1, 10, enc_insert(None, 7, ["1", "a"])),
            *txn(2, 20, enc_insert(None, 7, ["2", "b"])), *txn(3, 30, enc_insert(None, 7, ["3", "c"]))]
    source, sorter, marks = run(wire, start=20)
    assert [r[2]["id"] for r in rows(source, sorter)] == [3]  # type: ignore[index]
    assert reported([m.ts for m in marks], [30])


def test_streamed_transaction_with_a_rolled_back_subtransaction_and_an_interleaved_plain_one() -> None:
    wire = [enc_relation(None, 7, "public", "t", "d", COLS),
            enc_stream_start(500, True), enc_insert(500, 7, ["1", "top"]), enc_insert(501, 7, ["2", "sub"]),
            pgoutput_stream_stop(),
            *txn(600, 1000, enc_insert(None, 7, ["3", "plain"])),
            enc_stream_start(500, False), enc_insert(500, 7, ["4", "top2"]), pgoutput_stream_stop(),
            enc_stream_abort(500, 501),
            enc_stream_commit(500, 0, 1999, 2000, 0)]
    source, sorter, marks = run(wire)
    assert [(r[0], r[2]["v"]) for r in rows(source, sorter)] == [  # type: ignore[index]
        (1000, "plain"), (2000, "top"), (2000, "top2")]
    assert reported([m.ts for m in marks], [1000, 2000])


def test_truncate_and_keepalives() -> None:
    wire = [enc_relation(None, 7, "public", "t", "d", COLS), *txn(1, 10, enc_truncate(None, 0, [7])),
            Keepalive(50, T0 + 5), Keepalive(40, T0 + 4), Keepalive(60, T0 + 6)]
    source, sorter, marks = run(wire)
    assert [(r[0], r[1]) for r in rows(source, sorter)] == [(10, "TRUNCATE")]
    assert reported(marks, [Watermark(10, T0), Watermark(50, T0 + 5), Watermark(60, T0 + 6)])  # never backwards


def test_a_malformed_plain_change_fails_loudly() -> None:
    bad = b"I" + struct.pack(">I", 7) + b"X"  # 'X' is no tuple marker
    with pytest.raises(DecodeError, match="tuple marker"):
        run([enc_relation(None, 7, "public", "t", "d", COLS), *txn(1, 10, bad)])
    with pytest.raises(DecodeError):
        pgoutput.plain_change_relid(b"I\x00\x00")


def test_logical_messages_reach_the_hook_with_their_transaction_and_store_nothing() -> None:
    calls: list[tuple[str, bytes, int, int]] = []

    class Hooked(PgSpanSource):
        def _on_message(self, m: pgoutput_messages.LogicalMessage, xid: int, subxid: int) -> None:
            assert self.buffer is not None  # the hook may add to the buffer run() feeds
            calls.append((m.prefix, m.content, xid, subxid))

    wire = [enc_relation(None, 7, "public", "t", "d", COLS),
            *txn(100, 1000, enc_message(None, 1, 999, "tidewater.x", b"{}"), enc_insert(None, 7, ["1", "a"])),
            enc_stream_start(500, True), enc_message(501, 1, 1500, "tidewater.y", b"[]"), pgoutput_stream_stop(),
            enc_stream_commit(500, 0, 1999, 2000, 0)]
    sorter = MemorySorter().span("cf/0")
    source = Hooked(FakeStream(wire), TableFilter(("*.*",)), Watermark(0, 0.0), lambda: None,  # type: ignore[arg-type]
                    "cf/0")
    source.run(sorter, threading.Event(), lambda w: None)
    assert calls == [("tidewater.x", b"{}", 100, 100), ("tidewater.y", b"[]", 500, 501)]
    # the base class ignores messages: only the row is stored
    plain, plain_sorter, _ = run(wire)
    assert [r[1] for r in rows(plain, plain_sorter)] == ["INSERT"]


def pgoutput_stream_stop() -> bytes:
    return b"E"


# ---- schema history (seed_schemas / take_schema_versions) ----------------------------------------------
def _relation_schema(cols: list[tuple[int, str, int, int]]) -> Any:
    from upstream.postgres.source import merge_schema

    return merge_schema(pgoutput.decode(enc_relation(None, 7, "public", "t", "d", cols), False), None, 99)


def run_seeded(wire: list[Any], seed: list[Any], start: int = 0,
               carried: list[int] | None = None) -> tuple[PgSpanSource, Any]:
    sorter = MemorySorter().span("cf/0")
    source = PgSpanSource(FakeStream(wire), TableFilter(("*.*",)), Watermark(start, 0.0),  # type: ignore[arg-type]
                          no_catalog, "cf/0")
    source.seed_schemas(seed, carried)
    drive(source, sorter, lambda w: None)
    return source, sorter


def test_a_column_dropped_while_the_span_was_down_is_a_schema_change_against_the_seeded_history() -> None:
    old = _relation_schema([*COLS, (0, "gone", INT4, -1)])
    wire = [*txn(1, 10, enc_relation(None, 7, "public", "t", "d", COLS), enc_insert(None, 7, ["1", "a"]))]
    source, sorter = run_seeded(wire, [old])
    (t,) = list(sorter.read_txns(-1, MAX))
    assert t.commit_ts in source.schema_change_commits()
    (events,) = [source.decoder().schema_changes(p[4:], t.commit_ts, t.commit_time) for p in t.payloads
                 if p[:4] == b"\xff\xff\xff\xff"]
    assert [(c.kind, c.column) for c in events[0].changes] == [("drop column", "gone")]
    assert events[0].before is not None and "gone" in events[0].before.column_names
    (version,) = source.take_schema_versions()
    assert version[0] == 10 and version[1].column_names == ("id", "v")
    assert source.take_schema_versions() == []


def test_a_table_as_the_history_knows_it_stores_no_new_version_and_no_schema_change() -> None:
    wire = [*txn(1, 10, enc_relation(None, 7, "public", "t", "d", COLS), enc_insert(None, 7, ["1", "a"]))]
    source, sorter = run_seeded(wire, [_relation_schema(COLS)])
    assert 10 not in source.schema_change_commits()
    assert source.take_schema_versions() == []
    assert rows(source, sorter) == [(10, "INSERT", {"id": 1, "v": "a"})]


def test_a_table_the_history_gives_another_span_is_recorded_again_as_this_spans_at_its_first_relation() -> None:
    """(a table moved here by changefeed update, or a history stored before versions named their span: from then
    on the history says this span replicates it, which decides whether its DROP TABLE concerns this span)"""
    wire = [*txn(1, 10, enc_relation(None, 7, "public", "t", "d", COLS), enc_insert(None, 7, ["1", "a"]))]
    source, _ = run_seeded(wire, [_relation_schema(COLS)], carried=[])
    assert 10 not in source.schema_change_commits()  # the same shape: no schema change
    assert [(ts, s.column_names) for ts, s in source.take_schema_versions()] == [(10, ("id", "v"))]
    source, _ = run_seeded(wire, [_relation_schema(COLS)], carried=[7])
    assert source.take_schema_versions() == []


def test_a_table_first_seen_in_the_stream_gets_its_first_history_version_at_that_commit() -> None:
    wire = [*txn(1, 10, enc_relation(None, 7, "public", "t", "d", COLS), enc_insert(None, 7, ["1", "a"])),
            *txn(2, 20, enc_relation(None, 7, "public", "t", "d", COLS), enc_insert(None, 7, ["2", "b"]))]
    source, _ = run_seeded(wire, [])
    assert [(ts, s.column_names) for ts, s in source.take_schema_versions()] == [(10, ("id", "v"))]


def test_without_a_ddl_message_a_table_renamed_is_a_rename_table_schema_change() -> None:
    """(the fallback without the DDL trigger: its rows would otherwise land on a new name downstream, the old
    table staying behind with the rows of before)"""
    wire = [*txn(1, 10, enc_relation(None, 7, "public", "t", "d", COLS), enc_insert(None, 7, ["1", "a"])),
            *txn(2, 20, enc_relation(None, 7, "public", "t2", "d", COLS), enc_insert(None, 7, ["2", "b"]))]
    source, sorter = run_seeded(wire, [])
    assert source.schema_change_commits() == {20}
    t = [t for t in sorter.read_txns(-1, MAX) if t.commit_ts == 20][0]
    (events,) = [source.decoder().schema_changes(p[4:], 20, t.commit_time) for p in t.payloads
                 if p[:4] == b"\xff\xff\xff\xff"]
    assert [(c.kind, c.new_name) for c in events[0].changes] == [("rename table", "public.t2")]


# ---- the key of a Relation message is the key at its position, not the catalog's of now ---------------
def test_the_key_of_a_default_identity_relation_is_the_flagged_columns_even_when_the_catalog_has_moved_on() -> None:
    from upstream.postgres.source import merge_schema

    cols = [(1, "id", INT4, -1), (0, "code", INT4, -1)]
    now = merge_schema(pgoutput.decode(enc_relation(None, 7, "public", "t", "d",
                                                    [(0, "id", INT4, -1), (1, "code", INT4, -1)]), False), None, 1)
    assert now.key == ("code",)
    # rows written before `DROP CONSTRAINT pkey; ADD PRIMARY KEY (code)` in one transaction carry the old key
    schema = merge_schema(pgoutput.decode(enc_relation(None, 7, "public", "t", "d", cols), False), now, 2)
    assert schema.key == ("id",) and schema.has_key
    assert [c.is_key for c in schema.columns] == [True, False]


def test_the_key_of_a_full_identity_relation_comes_from_the_stream_before_the_catalog() -> None:
    from upstream.postgres.source import merge_schema

    every = [(1, "id", INT4, -1), (1, "code", INT4, -1)]
    rel = pgoutput.decode(enc_relation(None, 7, "public", "t", "f", every), False)
    catalog_now = TableSchema(TableName("public", "t"), catalog_keyed(("code",)), ("code",), "f", 7, 0, True)
    described = TableSchema(TableName("public", "t"), catalog_keyed(("id",)), ("id",), "f", 7, 0, True)
    assert merge_schema(rel, catalog_now, 2, described).key == ("id",)  # the DDL message's table wins
    assert merge_schema(rel, catalog_now, 3).key == ("code",)  # nothing known in the stream: the catalog
    keyless = merge_schema(rel, None, 4)
    assert not keyless.has_key
    # the stream knew it without a key (a FULL table before its ADD PRIMARY KEY): the catalog's later key is not it
    assert not merge_schema(rel, catalog_now, 5, keyless).has_key


def catalog_keyed(key: tuple[str, ...]) -> tuple[ColumnSchema, ...]:
    return tuple(ColumnSchema(n, INT4, "int4", False, "integer", -1, n not in key, n in key) for n in ("id", "code"))


# ---- the catalog is read now, the rows are of their own time --------------------------------------------
VARCHAR = 1043


def _now_in_catalog(monkeypatch: pytest.MonkeyPatch, schema: Any) -> list[int]:
    """The upstream catalog (read by the source) answers ``schema``: a later DDL has committed already. (Patched in
    this process only: the test's sources run here, in either mode.)"""
    import upstream.postgres.source as source_mod

    global MODE
    MODE = "thread"

    asked: list[int] = []

    def table_schema(conn: Any, relid: int) -> Any:
        asked.append(relid)
        return schema

    monkeypatch.setattr(source_mod.catalog, "table_schema", table_schema)
    return asked


def test_a_relation_sent_again_keeps_the_key_of_its_time_not_the_catalogs_later_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """REPLICA IDENTITY FULL flags every column, so the Relation message cannot show the key: rows between
    DROP PRIMARY KEY and ADD PRIMARY KEY, decoded after the ADD committed, got the catalog's new key and the
    sink refused them (the target had no key yet)."""
    import dataclasses

    from upstream.postgres.source import merge_schema

    full = [(1, "id", INT4, -1), (1, "v", TEXT, -1)]
    keyless = merge_schema(pgoutput.decode(enc_relation(None, 7, "public", "t", "f", full), False), None, 99)
    assert not keyless.has_key
    _now_in_catalog(monkeypatch, dataclasses.replace(keyless, key=("id",), has_key=True))
    wire = [*txn(1, 10, enc_relation(None, 7, "public", "t", "f", full), enc_insert(None, 7, ["1", "a"]))]
    source, sorter = run_seeded(wire, [keyless])
    (t,) = list(sorter.read_txns(-1, MAX))
    (change,) = [Mounter(source.decoder()).mount(p, t.commit_ts, t.commit_time) for p in t.payloads]
    assert not change.schema.has_key and source.schema_change_commits() == set()


def test_a_relation_sent_again_keeps_its_type_modifier_and_makes_no_schema_change(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """varchar(20) in the message, varchar(100) in the catalog (an ALTER TYPE committed since): no schema change
    derived from the two, the real DDL's message comes later in the stream."""
    import dataclasses

    cols = [(1, "id", INT4, -1), (0, "label", VARCHAR, 24)]
    old = _relation_schema(cols)
    wider = dataclasses.replace(old, columns=(old.columns[0], dataclasses.replace(
        old.columns[1], type_modifier=104, type_name="character varying(100)")))
    asked = _now_in_catalog(monkeypatch, wider)
    wire = [*txn(1, 10, enc_relation(None, 7, "public", "t", "d", cols), enc_insert(None, 7, ["1", "a"]))]
    source, sorter = run_seeded(wire, [old])
    assert source.schema_change_commits() == set() and asked == []
    assert rows(source, sorter) == [(10, "INSERT", {"id": 1, "label": "a"})]
    # a message that does not match what the stream knows (a change without a DDL message) reads the catalog
    wire = [*txn(1, 10, enc_relation(None, 7, "public", "t", "d", [*cols, (0, "w", INT4, -1)]),
                 enc_insert(None, 7, ["1", "a", "2"]))]
    source, sorter = run_seeded(wire, [old])
    assert asked == [7] and source.schema_change_commits() == {10}


# ---- DDL positions (DdlEvent.seq): the same in every span ------------------------------------------------------------
def drop_msg(xid: int | None, lsn: int, relid: int, table: str) -> bytes:
    doc = {"v": 1, "dropped": {"oid": relid, "schema": "public", "table": table}, "query": f"DROP TABLE {table}"}
    return enc_message(xid, 1, lsn, "tidewater.ddl", json.dumps(doc).encode())


def ddl_events(source: PgSpanSource, sorter: Any) -> list[tuple[int, str, int, bool]]:
    """(commit Ts, table, seq, seq_local) of every schema change stored."""
    out = []
    for t in sorter.read_txns(-1, MAX):
        for p in t.payloads:
            version, raw = decode_payload(p)
            if version == SCHEMA_CHANGE:
                for ev in source.decoder().schema_changes(raw, t.commit_ts, t.commit_time):
                    out.append((t.commit_ts, ev.table.table, ev.seq, ev.seq_local))
    return out


def test_a_ddls_position_counts_every_ddl_message_of_its_transaction_also_of_tables_other_spans_carry() -> None:
    """Span of ``t`` (filter ``public.t``): the DROP of ``u`` (another span's) comes first in the transaction, so the
    DROP of ``t`` is at position 1 here, as in the span of ``u``: ``(commit Ts, seq)`` is one position changefeed-wide
    (before, each span counted only its own DDLs: both were seq 0, and the sink took the second for a replay)."""
    wire = [enc_relation(None, 7, "public", "t", "d", COLS),
            *txn(100, 1000, enc_insert(None, 7, ["1", "a"]), drop_msg(None, 990, 8, "u"), drop_msg(None, 991, 7, "t")),
            *txn(101, 2000, drop_msg(None, 1990, 9, "w"))]
    source, sorter, _ = run(wire, rules=("public.t",))
    assert ddl_events(source, sorter) == [(1000, "t", 1, False)]
    assert source.schema_change_commits() == {1000}  # (2000 holds no DDL of this span: not cut)


def test_a_streamed_subtransaction_rolled_back_gives_its_ddl_positions_back() -> None:
    """Streamed before its commit, a transaction shows the DDL message of a subtransaction that is then rolled back;
    sent at its commit instead (another span, another memory budget) it never shows it. Both count the same."""
    streamed = [enc_relation(None, 7, "public", "t", "d", COLS),
                enc_stream_start(500, True), drop_msg(501, 1500, 8, "u"), enc_insert(502, 7, ["1", "a"]),
                drop_msg(502, 1501, 9, "w"), pgoutput_stream_stop(),
                enc_stream_abort(500, 502), enc_stream_abort(500, 501),  # (a child's abort before its parent's)
                enc_stream_start(500, False), enc_insert(500, 7, ["2", "b"]), drop_msg(503, 1502, 8, "u"),
                drop_msg(503, 1503, 7, "t"), pgoutput_stream_stop(),
                enc_stream_commit(500, 0, 1999, 2000, 0)]
    sent_at_commit = [enc_relation(None, 7, "public", "t", "d", COLS),
                      *txn(500, 2000, enc_insert(None, 7, ["2", "b"]), drop_msg(None, 1502, 8, "u"),
                           drop_msg(None, 1503, 7, "t"))]
    for wire in (streamed, sent_at_commit):
        source, sorter, _ = run(wire, rules=("public.t",))
        assert ddl_events(source, sorter) == [(2000, "t", 1, False)]


def test_after_a_schema_change_derived_from_the_stream_alone_the_positions_are_local_to_the_span() -> None:
    cols2 = [*COLS, (0, "w", INT4, -1)]
    wire = [enc_relation(None, 7, "public", "t", "d", COLS), *txn(1, 10, enc_insert(None, 7, ["1", "a"])),
            enc_begin(19, 0, 2), enc_relation(None, 7, "public", "t", "d", cols2), enc_insert(None, 7, ["2", "b", "5"]),
            drop_msg(None, 18, 7, "t"), enc_commit(0, 19, 20, 0)]
    source, sorter, _ = run(wire)
    assert ddl_events(source, sorter) == [(20, "t", 0, True), (20, "t", 1, True)]


def test_runs_of_plain_changes_keep_stream_order_around_other_messages() -> None:
    """The puller hands plain changes to the buffer in runs (add_many): a run ends before any other message of the
    transaction (a truncate, a Relation message that stores a schema change) and at its size limit, so the buffer
    holds every change in stream order."""
    from upstream.base import SCHEMA_CHANGE, decode_payload

    cols2 = [*COLS, (0, "w", INT4, -1)]
    first = [enc_insert(None, 7, [str(i), "a"]) for i in range(2500)]  # more than one run
    wire = [enc_relation(None, 7, "public", "t", "d", COLS),
            *txn(1, 10, *first, enc_truncate(None, 0, [7]), enc_insert(None, 7, ["9000", "b"]),
                 enc_relation(None, 7, "public", "t", "d", cols2), enc_insert(None, 7, ["9001", "c", "5"]),
                 enc_update(None, 7, ["9001", "d", "6"]))]
    source, sorter, _ = run(wire)
    (t,) = list(sorter.read_txns(-1, MAX))
    got = [decode_payload(p) for p in t.payloads]
    assert [v for v, _ in got] == [1] * 2502 + [SCHEMA_CHANGE, 2, 2]
    assert [raw for _, raw in got[:2500]] == first
    assert [raw for _, raw in got[2500:2502]] == [pgoutput.truncate_raw(7, 0), enc_insert(None, 7, ["9000", "b"])]
    assert [raw for _, raw in got[2503:]] == [enc_insert(None, 7, ["9001", "c", "5"]),
                                             enc_update(None, 7, ["9001", "d", "6"])]


def test_raw_begin_and_commit_give_what_decoded_ones_gave() -> None:
    """ReplicationStream yields Begin and Commit raw (no object per transaction); the source reads them with
    ``pgoutput.begin_xid``/``commit_position``: the same transactions, Ts, times and watermarks as decoded ones (which
    it still takes)."""
    wire = [enc_relation(None, 7, "public", "t", "d", COLS),
            *txn(100, 1000, enc_insert(None, 7, ["1", "a"]), enc_update(None, 7, ["1", "b"])),
            *txn(101, 1500),  # (no change of a carried table)
            *txn(102, 2000, enc_delete(None, 7, ["1", None])),
            [enc_begin(2999, 5_000_000, 103), enc_insert(None, 7, ["2", "c"]), enc_commit(0, 2999, 3000, 7_000_000)]]
    wire = [*wire[:-1], *wire[-1]]
    out = []
    for raw in (True, False):
        sorter = MemorySorter().span("cf/0")
        marks: list[Watermark] = []
        source = PgSpanSource(FakeStream(wire, raw), TableFilter(("*.*",)), Watermark(1000, 0.0),  # type: ignore[arg-type]
                              no_catalog, "cf/0")
        drive(source, sorter, marks.append)
        out.append(([(t.commit_ts, t.commit_time, list(t.payloads)) for t in sorter.read_txns(-1, MAX)], marks))
    assert out[0] == out[1]
    assert [ts for ts, _, _ in out[0][0]] == [2000, 3000] and out[0][0][1][1] == pgoutput_messages.pg_time_to_unix(7_000_000)


def _catch_up(wire: list[Any]) -> tuple[Any, list[tuple[int, int]]]:
    """The source over ``wire`` read in one go (no idle mark but where the wire has one); per reported watermark, its
    Ts and how many transactions the sorter held up to it at that moment."""
    sorter = MemorySorter().span("cf/0")
    seen: list[tuple[int, int]] = []

    def on_resolved(w: Watermark) -> None:
        seen.append((w.ts, len(list(sorter.read_txns(-1, w.ts)))))

    source = PgSpanSource(FakeStream(wire, idle_after_commit=False), TableFilter(("*.*",)),  # type: ignore[arg-type]
                          Watermark(0, 0.0), no_catalog, "cf/0")
    drive(source, sorter, on_resolved)
    return sorter, seen


def test_commits_read_in_one_go_are_reported_together_and_only_once_in_the_sorter() -> None:
    """While the stream has more to read at once, the commits of plain transactions are reported together (at most
    ``REPORT_EVERY`` of them wait), never before they are in the sorter, and the last when the stream ends."""
    n = 100
    wire = [enc_relation(None, 7, "public", "t", "d", COLS)]
    for i in range(n):
        wire += txn(1000 + i, 10 * (i + 1), enc_insert(None, 7, [str(i), "v"]))
    sorter, seen = _catch_up(wire)
    assert len(list(sorter.read_txns(-1, MAX))) == n
    assert seen and seen[-1] == (10 * n, n)
    assert all(held == ts // 10 for ts, held in seen)  # every transaction up to the watermark was in the sorter
    assert [ts for ts, _ in seen] == sorted({ts for ts, _ in seen})
    if MODE == "thread":
        assert len(seen) == -(-n // source_mod.REPORT_EVERY)  # not one report per transaction
        gaps = [b - a for (a, _), (b, _) in zip([(0, 0), *seen], seen, strict=False)]
        assert max(gaps) <= 10 * source_mod.REPORT_EVERY


def test_the_streams_idle_mark_reports_the_commits_read_so_far_at_once() -> None:
    """When the stream has read everything received (its idle mark), the commits read so far are reported then, not
    after the next transactions: a quiet stream's last commit waits for nothing."""
    wire = [enc_relation(None, 7, "public", "t", "d", COLS),
            *txn(1, 10, enc_insert(None, 7, ["1", "a"])), *txn(2, 20, enc_insert(None, 7, ["2", "b"])), None,
            *txn(3, 30, enc_insert(None, 7, ["3", "c"])), None,
            *txn(4, 40, enc_insert(None, 7, ["4", "d"])), Keepalive(50, 9.0)]
    _, seen = _catch_up(wire)
    assert reported(seen, [(20, 2), (30, 3), (40, 4), (50, 4)])


@pytest.mark.parametrize("run_rows", [1, 3, 1024])
def test_routed_runs_store_what_raw_changes_stored(run_rows: int) -> None:
    """The stream routes plain changes itself (``ReplicationStream.messages`` with the source's prefixes: runs of stored
    changes, other relations' dropped, a malformed one raw): the sorter holds exactly what the source stores from raw
    changes, around Relation messages (a new version for the next rows), truncates, streamed transactions and
    relations outside the filter, whatever the run size."""
    cols2 = [*COLS, (0, "w", INT4, -1)]
    wire = [enc_relation(None, 7, "public", "t", "d", COLS), enc_relation(None, 8, "other", "x", "d", COLS),
            *txn(1, 10, *[enc_insert(None, 7, [str(i), "a"]) for i in range(10)], enc_insert(None, 8, ["1", "x"]),
                 enc_update(None, 7, ["1", "b"]), enc_truncate(None, 0, [7]), enc_insert(None, 9, ["5", "?"]),
                 enc_relation(None, 7, "public", "t", "d", cols2), enc_insert(None, 7, ["20", "c", "5"]),
                 enc_delete(None, 7, ["20", None, None])),
            enc_stream_start(500, True), enc_insert(500, 7, ["30", "s", "1"]), pgoutput_stream_stop(),
            *txn(2, 20, enc_insert(None, 7, ["31", "p", "2"]), enc_insert(None, 8, ["2", "y"])), None,
            enc_stream_commit(500, 0, 29, 30, 0)]
    out = []
    for route in (True, False):
        sorter = MemorySorter().span("cf/0")
        marks: list[Watermark] = []
        source = PgSpanSource(FakeStream(wire, route=route, run_rows=run_rows),  # type: ignore[arg-type]
                              TableFilter(("public.*",)), Watermark(0, 0.0), no_catalog, "cf/0")
        drive(source, sorter, marks.append)
        out.append(([(t.commit_ts, list(t.payloads)) for t in sorter.read_txns(-1, MAX)], marks))
    assert out[0] == out[1]
    assert [len(p) for _, p in out[0][0]] == [15, 1, 1]  # (with the schema change the new Relation stores)
