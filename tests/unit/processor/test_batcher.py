"""TxnBatcher: whole transactions per batch, at least max_rows rows unless the stream ends, ``last`` is the
watermark of the last transaction handed out."""

from __future__ import annotations

from typing import Any

import pytest

from cdc.ts import Watermark
from processor.batcher import TxnBatcher
from sorter.base import SortedTxn
from upstream.base import SCHEMA_CHANGE, encode_payload

pytestmark = pytest.mark.unit


def entries(sizes: list[int]) -> list[SortedTxn]:
    out = []
    for i, n in enumerate(sizes):
        ts = 100 + 10 * i
        out.append(SortedTxn(ts, ts / 10, n, [f"{ts}:{j}".encode() for j in range(n)]))
    return out


def payload(p: bytes, ts: int, time: float) -> bytes:
    return p


def drain(b: TxnBatcher) -> tuple[list[Any], Watermark | None, bool]:
    rows = list(b.next_batch())
    return rows, b.last, b.batch_complete


def test_batches_are_whole_transactions() -> None:
    es = entries([3, 1, 4, 2, 5])
    b = TxnBatcher(es, payload, max_rows=4)
    got = []
    while b.has_more():
        rows, last, complete = drain(b)
        assert complete and last is not None
        got.append((rows, last))
    # 3+1 reach 4 rows; 4 alone; 2+5 (the 5-row transaction is never split)
    assert [len(r) for r, _ in got] == [4, 4, 7]
    assert [w for _, w in got] == [Watermark(110, 11.0), Watermark(120, 12.0), Watermark(140, 14.0)]
    assert [p for r, _ in got for p in r] == [p for t in es for p in t.payloads]


def test_one_huge_transaction_is_one_batch() -> None:
    b = TxnBatcher(entries([50]), lambda p, ts, tm: ts, max_rows=1)
    rows, last, complete = drain(b)
    assert len(rows) == 50 and last == Watermark(100, 10.0) and complete and not b.has_more()


def test_partially_consumed_batch_is_not_complete() -> None:
    b = TxnBatcher(entries([2, 2]), payload, max_rows=10)
    it = b.next_batch()
    next(it)
    assert not b.batch_complete and b.last is None  # (given once the batch ends, not per transaction)
    assert len(list(it)) == 3 and b.batch_complete and b.last == Watermark(110, 11.0)


def test_empty_stream() -> None:
    b = TxnBatcher([], payload, max_rows=10)
    assert not b.has_more()
    assert drain(b) == ([], None, True)


def test_lazy_payloads_of_a_spilled_transaction_are_consumed_in_order() -> None:
    """A transaction read from disk gives a one-shot iterator and an upper bound of its rows."""
    txns = [SortedTxn(100, 1.0, 5, iter([b"a", b"b", b"c"])), SortedTxn(200, 2.0, 1, [b"d"])]
    b = TxnBatcher(txns, lambda p, ts, tm: (ts, tm, p), max_rows=4)
    assert drain(b) == ([(100, 1.0, b"a"), (100, 1.0, b"b"), (100, 1.0, b"c")], Watermark(100, 1.0), True)
    assert drain(b) == ([(200, 2.0, b"d")], Watermark(200, 2.0), True)


DDL = encode_payload(SCHEMA_CHANGE, b"")


def test_a_transaction_with_ddl_is_cut_at_each_ddl_in_batches_of_its_own() -> None:
    es = entries([2, 3, 1])
    # the middle transaction: row, DDL, row, DDL (that changes nothing a sink replicates), DDL, row
    es[1] = SortedTxn(110, 11.0, 6, [b"110:0", DDL + b"a", b"110:1", DDL + b"-", DDL + b"b", b"110:2"])
    decoded: list[tuple[bytes, int, float]] = []

    def schema_changes(raw: bytes, ts: int, tm: float) -> list[Any]:
        decoded.append((raw, ts, tm))
        return [] if raw == b"-" else [f"ddl-{raw.decode()}"]

    b = TxnBatcher(es, payload, max_rows=100, ddl_commits={110}, schema_changes=schema_changes)
    got = []
    while b.has_more():
        rows, last, complete = drain(b)
        assert complete
        got.append((rows, list(b.ddl), last))
    assert got == [
        ([b"100:0", b"100:1"], [], Watermark(100, 10.0)),  # the transaction before stops short of the DDL one
        ([b"110:0"], ["ddl-a"], Watermark(100, 10.0)),  # the checkpoint does not move inside a transaction
        ([b"110:1"], ["ddl-b"], Watermark(100, 10.0)),
        ([b"110:2"], [], Watermark(110, 11.0)),
        ([b"120:0"], [], Watermark(120, 12.0)),
    ]
    assert [(r, ts) for r, ts, _ in decoded] == [(b"a", 110), (b"-", 110), (b"b", 110)]


def test_a_ddl_transaction_first_in_the_stream_and_one_ending_with_its_ddl() -> None:
    es = [SortedTxn(100, 10.0, 2, [b"100:0", DDL + b"x"])]
    b = TxnBatcher(es, payload, max_rows=1, ddl_commits={100}, schema_changes=lambda r, ts, tm: ["ddl"])
    assert drain(b) == ([b"100:0"], None, True) and b.ddl == ["ddl"]
    assert drain(b) == ([], Watermark(100, 10.0), True) and b.ddl == [] and not b.has_more()


def test_a_transaction_not_listed_as_holding_ddl_is_never_looked_into() -> None:
    es = entries([2])
    b = TxnBatcher(es, payload, max_rows=10, ddl_commits={999}, schema_changes=None)
    assert drain(b) == ([b"100:0", b"100:1"], Watermark(100, 10.0), True)


# ---- the initial copy's floors: changes a copy already holds are dropped -------------------------------
def _row(table: str) -> Any:
    from types import SimpleNamespace

    return lambda p, ts, tm: SimpleNamespace(
        schema=SimpleNamespace(name=table if p.startswith(b"t") else "public.u", relation_id=0), p=p, ts=ts)


def test_rows_at_or_below_their_tables_floor_are_dropped_and_the_rest_kept_in_order() -> None:
    txns = [SortedTxn(100, 1.0, 2, [b"t100", b"u100"]), SortedTxn(150, 1.5, 2, [b"t150", b"u150"]),
            SortedTxn(200, 2.0, 2, [b"t200", b"u200"])]
    b = TxnBatcher(txns, _row("public.t"), max_rows=100, floors={"public.t": 150, "public.u": 100})
    rows, last, complete = drain(b)
    assert [r.p for r in rows] == [b"u150", b"t200", b"u200"] and last == Watermark(200, 2.0) and complete
    assert b.read_rows == 6  # every row read from the sorter is counted, also the dropped ones


def test_a_schema_change_of_a_table_below_its_floor_is_dropped_one_above_it_stays_a_barrier() -> None:
    txns = [SortedTxn(100, 1.0, 3, [b"t1", DDL + b"t", b"u1"]), SortedTxn(120, 1.2, 3, [b"t2", DDL + b"u", b"u2"])]

    def schema_changes(raw: bytes, ts: int, tm: float) -> list[Any]:
        from types import SimpleNamespace

        return [SimpleNamespace(table="public.t" if raw == b"t" else "public.u", raw=raw, changes=(),
                                before=None, after=None)]

    b = TxnBatcher(txns, _row("public.t"), max_rows=100, ddl_commits={100, 120}, schema_changes=schema_changes,
                   floors={"public.t": 130})
    first, _, _ = drain(b)  # transaction 100: public.t's rows and DDL are in the copy; u1 stays
    assert [r.p for r in first] == [b"u1"] and b.ddl == [] and b.last == Watermark(100, 1.0)
    before, _, _ = drain(b)  # transaction 120: public.u's DDL is above its floor (none): rows before it, then it
    assert [r.p for r in before] == [] and [e.raw for e in b.ddl] == [b"u"]
    after, last, _ = drain(b)
    assert [r.p for r in after] == [b"u2"] and last == Watermark(120, 1.2)


def _held_txns() -> list[SortedTxn]:
    return [SortedTxn(100, 1.0, 2, [b"t100", b"u100"]), SortedTxn(150, 1.5, 1, [b"u150"]),
            SortedTxn(200, 2.0, 2, [b"t200", b"u200"]), SortedTxn(250, 2.5, 1, [b"u250"])]


def test_a_table_copy_holds_back_its_tables_changes_until_its_snapshot_is_known_then_above_it_until_released() -> None:
    from processor.table_hold import TableHold

    hold = TableHold(["public.t"])
    b = TxnBatcher(_held_txns(), _row("public.t"), max_rows=100, hold=hold)
    assert b.blocked() and hold.blocked_at == 100  # no snapshot yet: the very first change of t waits
    hold.pass_up_to(150)
    assert not b.blocked()
    rows, last, _ = drain(b)  # t100 is older than the copy's snapshot: written; the batch ends before t200
    assert [r.p for r in rows] == [b"t100", b"u100", b"u150"] and last == Watermark(150, 1.5)
    assert b.blocked() and hold.blocked_at == 200 and b.has_more()
    rows, last, _ = drain(b)  # (asked anyway: nothing, the checkpoint does not move)
    assert rows == [] and last == Watermark(150, 1.5)
    hold.release({"public.t": 200})  # the copy holds t up to 200: t200 is dropped, u200 and later pass
    assert not b.blocked()
    rows, last, _ = drain(b)
    assert [r.p for r in rows] == [b"u200", b"u250"] and last == Watermark(250, 2.5) and not b.has_more()


def test_a_held_key_less_table_whose_copy_committed_drops_its_changes_up_to_that_snapshot() -> None:
    from processor.table_hold import DROP, PASS, WAIT, TableHold

    hold = TableHold(["public.t"])
    hold.pass_up_to(150, {"public.t": 120})
    assert [hold.verdict("public.t", ts) for ts in (100, 120, 121, 150, 151)] == [DROP, DROP, PASS, PASS, WAIT]
    assert hold.verdict("public.u", 10**9) == PASS and not hold.released
    b = TxnBatcher(_held_txns(), _row("public.t"), max_rows=100, hold=hold)
    rows, _, _ = drain(b)
    assert [r.p for r in rows] == [b"u100", b"u150"]


def test_a_schema_change_of_a_held_table_waits_like_its_rows() -> None:
    from types import SimpleNamespace

    from processor.table_hold import TableHold

    txns = [SortedTxn(100, 1.0, 1, [b"u1"]), SortedTxn(120, 1.2, 2, [DDL + b"t", b"u2"])]
    hold = TableHold(["public.t"])
    hold.pass_up_to(110)
    b = TxnBatcher(txns, _row("public.t"), max_rows=100, ddl_commits={120}, hold=hold,
                   schema_changes=lambda raw, ts, tm: [SimpleNamespace(table="public.t", raw=raw, before=None,
                                                                       after=None)])
    rows, last, _ = drain(b)
    assert [r.p for r in rows] == [b"u1"] and last == Watermark(100, 1.0) and b.blocked()
    hold.release({"public.t": 110})
    before, _, _ = drain(b)
    assert before == [] and [e.raw for e in b.ddl] == [b"t"]


def test_a_held_table_is_found_by_its_relation_oid_under_any_name_and_only_that_relation() -> None:
    """docs/snapshot.md, "A table renamed while it is copied": the hold knows ``public.t`` as relation 7. Its changes
    and its rename under the new name ``public.t2`` (same oid) wait like those under the old one; a new relation that
    took the old name (oid 9) is not held. The copy recorded its floor under the name the table had at its snapshot
    (``public.t2``) with the oid: the hold matches it by oid, dropping what the copy holds. Held by name (as before),
    ``t2``'s changes escaped the hold and were written before the copy's rows."""
    from types import SimpleNamespace

    from cdc.events import OpType, RowChange
    from processor.table_hold import DROP, PASS, WAIT, TableHold

    names = {b"t": ("public.t", 7), b"n": ("public.t2", 7), b"x": ("public.t", 9), b"u": ("public.u", 8)}

    def mount(p: bytes, ts: int, tm: float) -> RowChange:
        name, oid = names[p[:1]]
        return RowChange(OpType.INSERT, SimpleNamespace(name=name, relation_id=oid), ts,  # type: ignore[arg-type]
                         values={"p": p})

    hold = TableHold(["public.t"], oids={"public.t": 7})
    assert [hold.verdict(*a) for a in (("public.t2", 1, 7), ("public.t", 1, 9), ("public.t", 1, 0))] == [WAIT, PASS,
                                                                                                      WAIT]
    hold.pass_up_to(110)
    txns = [SortedTxn(100, 1.0, 2, [b"t100", b"u100"]), SortedTxn(120, 1.2, 2, [DDL + b"t", b"u120"]),
            SortedTxn(130, 1.3, 2, [b"n130", b"x130"]), SortedTxn(200, 2.0, 1, [b"n200"])]
    rename = SimpleNamespace(table="public.t", raw=b"t", query="ALTER TABLE t RENAME TO t2", changes=(),
                             before=SimpleNamespace(relation_id=7), after=SimpleNamespace(relation_id=7, name="public.t2"))
    b = TxnBatcher(txns, mount, max_rows=100, ddl_commits={120}, hold=hold,
                   schema_changes=lambda raw, ts, tm: [rename])
    rows, last, _ = drain(b)
    assert [r.values["p"] for r in rows] == [b"t100", b"u100"] and last == Watermark(100, 1.0) and b.blocked()
    assert hold.blocked_at == 120  # the rename of t waits
    hold.release({"public.t2": 130}, {"public.t2": 7})  # recorded under its name at the copy's snapshot
    assert hold.verdict("public.t2", 130, 7) == DROP and hold.verdict("public.t2", 131, 7) == PASS
    out: list[bytes] = []
    while b.has_more():
        got, _, _ = drain(b)
        out += [r.values["p"] for r in got]
    assert out == [b"u120", b"x130", b"n200"] and b.ddl == [], out  # t's rename and n130 are in the copy


def test_a_table_renamed_inside_its_copys_window_fails_loudly_naming_the_resync() -> None:
    from types import SimpleNamespace

    from cdc.errors import DdlRejected
    from cdc.events import DdlChange, DdlKind

    txns = [SortedTxn(100, 1.0, 1, [DDL + b"t"])]
    rename = SimpleNamespace(table="public.t", raw=b"t", query="ALTER TABLE t RENAME TO t2", before=None, after=None,
                             changes=(DdlChange(DdlKind.RENAME_TABLE, new_name="public.t2"),))
    b = TxnBatcher(txns, _row("public.t"), max_rows=100, ddl_commits={100}, floors={"public.t2": 150},
                   schema_changes=lambda raw, ts, tm: [rename])
    with pytest.raises(DdlRejected) as err:
        drain(b)
    assert "cdc cli changefeed snapshot --table public.t2" in err.value.message


# ---- tables copied under several snapshots: changes between floor and ceiling ----------------------------
def test_changes_between_floor_and_ceiling_are_marked_and_written_one_transaction_at_a_time() -> None:
    """Between a table's floor (the snapshot its plan was made under) and its ceiling (the last snapshot one of its
    chunks was read under) changes are replayed over rows that may be newer: marked, each transaction a batch of its
    own (a net effect over several would assume the rows were as the first found them); above the ceiling, batches
    as usual; other tables' rows are not marked."""
    from cdc.events import REPLAYED, OpType, RowChange

    def mount(p: bytes, ts: int, tm: float) -> RowChange:
        from types import SimpleNamespace

        name = "public.t" if p.startswith(b"t") else "public.u"
        return RowChange(OpType.INSERT, SimpleNamespace(name=name, relation_id=0), ts, values={"p": p})  # type: ignore[arg-type]

    txns = [SortedTxn(90, 0.9, 1, [b"t90"]), SortedTxn(150, 1.5, 2, [b"t150", b"u150"]),
            SortedTxn(160, 1.6, 1, [b"t160"]), SortedTxn(170, 1.7, 1, [b"u170"]),
            SortedTxn(250, 2.5, 1, [b"t250"]), SortedTxn(260, 2.6, 1, [b"t260"])]
    b = TxnBatcher(txns, mount, max_rows=100, floors={"public.t": 100}, ceilings={"public.t": 200})
    batches = []
    while b.has_more():
        batches.append([(r.values["p"], bool(r.extra.get(REPLAYED))) for r in b.next_batch()])
    assert batches[0] == []  # t90: at or below the floor, in the copy (read, dropped)
    assert batches[1:] == [[(b"t150", True), (b"u150", False)], [(b"t160", True)],
                           [(b"u170", False), (b"t250", False), (b"t260", False)]]  # nothing replayed: together
    b = TxnBatcher(txns, mount, max_rows=100, floors={"public.t": 100}, ceilings={"public.t": 100})
    assert [r.values["p"] for r in b.next_batch()] == [b"t150", b"u150", b"t160", b"u170", b"t250", b"t260"]


# ---- floors by relation oid: a table renamed inside its copy's window ----------------------------------------------
def _schema(name: str, oid: int) -> Any:
    from cdc.events import ColumnSchema, TableName, TableSchema

    return TableSchema(TableName.parse(name), (ColumnSchema("g", 23, "int4"),), ("g",), "f", relation_id=oid,
                       has_key=False)


def _renamed_bag() -> tuple[list[SortedTxn], Any, Any]:
    """A key-less table, relation 7001, renamed public.bag -> public.bag2 at Ts 120, with an insert under each name
    before its floor (150) and one after; public.u (relation 7002) beside it. And a DROP of public.gone (relation
    7003, unknown to the copy) whose name a copied table (relation 7004) took afterwards."""
    from cdc.events import DdlChange, DdlEvent, DdlKind, OpType, RowChange

    names = {b"b": ("public.bag", 7001), b"B": ("public.bag2", 7001), b"u": ("public.u", 7002),
             b"g": ("public.gone", 7003), b"G": ("public.gone", 7004)}

    def mount(p: bytes, ts: int, tm: float) -> RowChange:
        return RowChange(OpType.INSERT, _schema(*names[p[:1]]), ts, values={"g": 1}, extra={"p": p})

    def ddl(raw: bytes, ts: int, tm: float) -> list[DdlEvent]:
        if raw == b"rename":
            return [DdlEvent(ts, tm, _schema("public.bag", 7001).name,
                             (DdlChange(DdlKind.RENAME_TABLE, new_name="public.bag2"),), _schema("public.bag", 7001),
                             _schema("public.bag2", 7001), "ALTER TABLE bag RENAME TO bag2")]
        return [DdlEvent(ts, tm, _schema("public.gone", 7003).name, (DdlChange(DdlKind.DROP_TABLE),),
                         _schema("public.gone", 7003), None, "DROP TABLE gone")]

    txns = [SortedTxn(100, 1.0, 3, [b"b100", b"u100", b"g100"]), SortedTxn(110, 1.1, 1, [DDL + b"drop"]),
            SortedTxn(120, 1.2, 1, [DDL + b"rename"]), SortedTxn(130, 1.3, 3, [b"B130", b"u130", b"G130"]),
            SortedTxn(200, 2.0, 2, [b"B200", b"u200"])]
    return txns, mount, ddl


def _stream(b: TxnBatcher) -> tuple[list[bytes], list[str]]:
    rows: list[bytes] = []
    ddl: list[str] = []
    while b.has_more():
        rows += [r.extra["p"] for r in b.next_batch()]
        ddl += [e.query for e in b.ddl]
    return rows, ddl


def test_a_table_renamed_inside_its_copys_window_keeps_its_floor_found_by_relation_oid() -> None:
    """The copy recorded public.bag2 (relation 7001) at Ts 150: its changes under the old name and the rename are in the
    copy and are dropped like those under the new name; only the one after the floor streams. By name (main before
    this), b100 escaped the floor: a row the copy held was applied a second time."""
    from processor.floors import TableFloors

    txns, mount, ddl = _renamed_bag()
    floors = TableFloors({"public.bag2": 150, "public.u": 100, "public.gone": 150},
                         {"public.bag2": 7001, "public.u": 7002, "public.gone": 7004})
    b = TxnBatcher(txns, mount, max_rows=100, ddl_commits={110, 120}, schema_changes=ddl, floors=floors)
    rows, queries = _stream(b)
    # the dropped relation 7003 is not one the copy recorded: its name's floor applies (the copy shows it gone)
    assert rows == [b"u130", b"B200", b"u200"] and queries == []


def test_a_floor_recorded_without_an_oid_is_found_by_name_and_a_rename_into_it_fails_loudly() -> None:
    """Records stored before oids were (SpanSnapshot.oids empty): found by name, and a rename inside the window cannot
    be matched: CDC:ErrDdlRejected naming the resync, as before."""
    from cdc.errors import DdlRejected

    txns, mount, ddl = _renamed_bag()
    b = TxnBatcher(txns, mount, max_rows=100, ddl_commits={110, 120}, schema_changes=ddl,
                   floors={"public.bag2": 150, "public.u": 100})
    with pytest.raises(DdlRejected, match="cdc cli changefeed snapshot --table public.bag2"):
        _stream(b)


def test_ceilings_are_found_by_relation_oid_too() -> None:
    """A keyed table read under two snapshots and renamed between: its changes in (floor, ceiling] under either name are
    marked replayed and handed out one transaction at a time."""
    from cdc.events import REPLAYED
    from processor.floors import TableFloors

    txns, mount, ddl = _renamed_bag()
    oids = {"public.bag2": 7001}
    b = TxnBatcher(txns[2:], mount, max_rows=100, ddl_commits={120}, schema_changes=ddl,
                   floors=TableFloors({"public.bag2": 110}, oids), ceilings=TableFloors({"public.bag2": 140}, oids))
    marked: list[tuple[bytes, bool]] = []
    while b.has_more():
        marked += [(r.extra["p"], bool(r.extra.get(REPLAYED))) for r in b.next_batch()]
    assert marked == [(b"B130", True), (b"u130", False), (b"G130", False), (b"B200", False), (b"u200", False)]


def test_single_row_transactions_are_mounted_with_their_own_commit_and_last_is_set_once_per_batch() -> None:
    """The single-row path (no iterator per transaction) and ``last`` set at the batch's end: every row is mounted with
    its own transaction's Ts and time, in order, and each batch's ``last`` is its newest transaction, also when the
    floors' path (a copy's window: Ts <= 110 here) and the plain path follow each other within a batch."""
    from types import SimpleNamespace

    def mount(p: bytes, ts: int, tm: float) -> Any:
        table = "public.t" if p.startswith(b"t") else "public.u"
        return SimpleNamespace(schema=SimpleNamespace(name=table, relation_id=0), v=(p, ts, tm))

    txns = [SortedTxn(ts, ts / 100, 1, [f"t{ts}".encode()]) for ts in (100, 110, 120, 130, 140)]
    txns.insert(1, SortedTxn(105, 1.05, 1, [b"u105"]))  # at its table's floor: dropped
    txns.insert(3, SortedTxn(115, 1.15, 2, [b"t115a", b"u115b"]))
    b = TxnBatcher(txns, mount, max_rows=4, floors={"public.u": 110})
    seen, lasts = [], []
    while b.has_more():
        rows, last, complete = drain(b)
        assert complete
        seen.extend(r.v for r in rows)
        lasts.append(last)
    assert seen == [(b"t100", 100, 1.0), (b"t110", 110, 1.1), (b"t115a", 115, 1.15), (b"u115b", 115, 1.15),
                    (b"t120", 120, 1.2), (b"t130", 130, 1.3), (b"t140", 140, 1.4)]
    assert lasts == [Watermark(115, 1.15), Watermark(140, 1.4)]
