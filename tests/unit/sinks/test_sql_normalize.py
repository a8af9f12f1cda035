"""The normalisation of a window (sinks.sql.dialect.normalize) as a pure function, and the SQLite sink applying the
shared apply-order scenarios (tests/sql_apply_scenarios.py) in one write each."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from cdc.config import SinkConfig
from cdc.events import UNCHANGED, OpType, RowChange
from sinks.sql.dialect.normalize import normalize_keyed, normalize_keyless
from sinks.sql.sink import SQLSink
from tests.sql_apply_scenarios import DEF, FULL, NOKEY, SCENARIOS, Scenario, dele, ins, row, upd

pytestmark = pytest.mark.unit

NAMES = ("id", "v", "big")


def keyed(events: list[RowChange], full: bool = False) -> Any:
    return normalize_keyed(NAMES, ("id",), full, None, (), None, events)


def test_a_deferred_swap_deletes_both_keys_before_inserting_both_images() -> None:
    a, b = row(1, "a"), row(2, "b")
    net = keyed([upd(FULL, row(2, "a"), a), upd(FULL, row(1, "b"), b)], full=True)
    assert net.deletes == [(1,), (2,)] and not net.moves and not net.patches
    assert sorted(tuple(i.values.values()) for i in net.upserts) == [(1, "b", "B"), (2, "a", "B")]


def test_a_plain_key_change_is_a_move_and_nothing_else() -> None:
    net = keyed([upd(DEF, {"id": 5, "v": "x", "big": UNCHANGED}, row(1, "a"))])
    assert net.deletes == [] and net.upserts == [] and len(net.moves) == 1
    old, img = net.moves[0]
    assert old == (1,) and img.src == (1,) and img.partial and img.defined() == (("id", "v"), (5, "x"))


def test_a_chain_through_a_temporary_key_keeps_its_origin_and_unsent_columns() -> None:
    net = keyed([upd(DEF, {"id": 9, "v": "a", "big": UNCHANGED}, row(1, "a")),
                 upd(DEF, {"id": 2, "v": "a2", "big": UNCHANGED}, row(9, "a"))])
    assert [(old, img.values["id"], img.src) for old, img in net.moves] == [((1,), 2, (1,))]


def test_an_insert_then_delete_cancels_and_a_delete_then_insert_replaces() -> None:
    net = keyed([ins(DEF, row(1, "x")), dele(DEF, row(1, "x")), dele(DEF, row(2, "y")), ins(DEF, row(2, "z"))])
    assert net.deletes == [(2,)] and [i.values["v"] for i in net.upserts] == ["z"]


def test_in_place_updates_merge_into_the_new_image_or_stay_a_partial_patch() -> None:
    net = keyed([ins(DEF, row(1, "x", "BIG")), upd(DEF, {"id": 1, "v": "y", "big": UNCHANGED}),
                 upd(DEF, {"id": 2, "v": "p", "big": UNCHANGED}), upd(DEF, {"id": 2, "v": "q", "big": UNCHANGED})])
    assert [i.values for i in net.upserts] == [{"id": 1, "v": "y", "big": "BIG"}]
    assert net.patches == [{"id": 2, "v": "q"}]  # unsent columns stay unsent: never NULL


def test_full_identity_delete_matches_the_image_it_names() -> None:
    # key 2 gets "+A" (from 1), then "-B" (its own pre-existing row): A stays
    a, b = row(1, "a"), row(2, "b")
    net = keyed([upd(FULL, row(2, "a"), a), dele(FULL, b)], full=True)
    assert net.deletes == [(1,), (2,)] and [i.values["v"] for i in net.upserts] == ["a"]


def test_positional_inserts_keep_their_rows_and_texts() -> None:
    rows = [(i, f"v{i}", "B") for i in range(5)]
    texts = [(str(i), f"v{i}", "B") for i in range(5)]
    net = normalize_keyed(NAMES, ("id",), False, NAMES, rows, texts, [dele(DEF, row(3, "v3"))])
    assert [(i.row, i.text) for i in net.upserts] == [(r, t) for r, t in zip(rows, texts, strict=True) if r[0] != 3]


def test_keyless_net_effect_is_a_multiset() -> None:
    x, y = {"id": 1, "v": "x", "big": "B"}, {"id": 2, "v": "y", "big": "B"}
    net = normalize_keyless(NAMES, NAMES, [tuple(x.values())] * 2, None,
                            [dele(NOKEY, x), upd(NOKEY, {"id": 2, "v": "y", "big": UNCHANGED}, x),
                             dele(NOKEY, y), ins(NOKEY, y)])
    # two inserted x, one deleted, one updated to y: one y inserted (twice +, once -)
    assert net.deletes == [] and [i.values for i in net.inserts] == [y]


def sequential_model(before: list[dict[str, Any]], changes: list[RowChange], has_key: bool) -> list[tuple[Any, ...]]:
    """Upstream semantics with the key checked only at the end (DEFERRABLE)."""
    rows = [dict(r) for r in before]
    for ch in changes:
        old = ch.old_values
        if ch.op == OpType.INSERT:
            rows.append(dict(ch.values or {}))
            continue
        match_on = old if old is not None else {"id": (ch.values or {})["id"]}
        idx = next(i for i, r in enumerate(rows) if all(r[k] == v for k, v in match_on.items()))
        if ch.op == OpType.DELETE:
            del rows[idx]
        else:
            rows[idx] = {k: (rows[idx][k] if v is UNCHANGED else v) for k, v in (ch.values or {}).items()}
    return sorted(tuple(r.values()) for r in rows)


@pytest.mark.parametrize("sc", SCENARIOS, ids=lambda s: s.name)
def test_scenarios_are_what_upstream_did(sc: Scenario) -> None:
    assert sequential_model(sc.before, sc.changes, sc.table.has_key) == sc.after


def read(path: Path, name: str) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(path)
    try:
        return sorted(conn.execute(f'SELECT id, v, big FROM "{name}"').fetchall())
    finally:
        conn.close()


@pytest.mark.parametrize("sc", SCENARIOS, ids=lambda s: s.name)
def test_sqlite_applies_each_scenario_in_one_write(tmp_path: Path, sc: Scenario) -> None:
    db = tmp_path / "t.db"
    sink = SQLSink(f"sqlite:///{db}")
    try:
        sink.write([RowChange(OpType.INSERT, sc.table, 1, values=dict(r)) for r in sc.before])
        sink.write(sc.changes)
        assert read(db, sc.table.name.table) == sc.after
        assert sink.take_warnings() == []
    finally:
        sink.close()


@pytest.mark.parametrize("seed", range(6))
def test_random_deferred_key_permutations_end_like_upstream(tmp_path: Path, seed: int) -> None:
    """Random transactions on a FULL-identity table with a deferred key: statement-level permutations of
    keys, in-place updates, deletes and inserts reusing keys; windows of several transactions."""
    rng = random.Random(seed)
    db = tmp_path / "t.db"
    sink = SQLSink(f"sqlite:///{db}", SinkConfig(batch_rows=rng.choice([2, 50]), txn_rows=rng.choice([3, 100])))
    state: dict[int, dict[str, Any]] = {i: row(i, f"v{i}") for i in range(1, 7)}
    try:
        sink.write([RowChange(OpType.INSERT, FULL, 1, values=dict(r)) for r in state.values()])
        changes: list[RowChange] = []
        for ts in range(2, 60):
            for _ in range(rng.randrange(1, 4)):
                r = rng.random()
                keys = sorted(state)
                if r < 0.4 and len(keys) >= 2:  # UPDATE .. SET id = <permutation of a few keys>
                    subset = rng.sample(keys, rng.randrange(2, min(4, len(keys)) + 1))
                    perm = subset[:]
                    rng.shuffle(perm)
                    olds = [state[k] for k in subset]
                    new_state = {k: v for k, v in state.items() if k not in subset}
                    for old, nk in zip(olds, perm, strict=True):
                        new = dict(old, id=nk, v=f"{old['v']}>{nk}")
                        changes.append(RowChange(OpType.UPDATE, FULL, ts, values=new, old_values=dict(old)))
                        new_state[nk] = new
                    state = new_state
                elif r < 0.6 and keys:
                    k = rng.choice(keys)
                    new = dict(state[k], v=f"u{rng.randrange(99)}")
                    changes.append(RowChange(OpType.UPDATE, FULL, ts, values=new, old_values=dict(state[k])))
                    state[k] = new
                elif r < 0.8 and keys:
                    k = rng.choice(keys)
                    changes.append(RowChange(OpType.DELETE, FULL, ts, old_values=state.pop(k)))
                else:
                    free = [k for k in range(1, 10) if k not in state]
                    if not free:
                        continue
                    k = rng.choice(free)
                    state[k] = row(k, f"i{rng.randrange(99)}")
                    changes.append(RowChange(OpType.INSERT, FULL, ts, values=dict(state[k])))
        i = 0
        while i < len(changes):  # calls cut at transaction boundaries
            j = min(len(changes), i + rng.randrange(1, 30))
            while j < len(changes) and changes[j].commit_ts == changes[j - 1].commit_ts:
                j += 1
            sink.write(changes[i:j])
            i = j
        assert read(db, FULL.name.table) == sorted(tuple(r.values()) for r in state.values())
    finally:
        sink.close()


def test_fk_graph_orders_parents_first_and_keeps_cycles_in_the_given_order() -> None:
    from sinks.sql.dialect.fkgraph import FkGraph

    g = FkGraph()
    g.add_all([("child", "parent"), ("grandchild", "child"), ("parent", "parent"), ("x", "y"), ("y", "x")])
    assert g.order(["grandchild", "other", "child", "parent"]) == ["other", "parent", "child", "grandchild"]
    assert g.order(["y", "x", "child"]) == ["child", "y", "x"]  # the cycle last, in the given order
    assert g.is_parent("parent") and not g.has_parents("parent") and g.has_parents("child")


def test_a_whole_row_update_then_delete_of_a_pre_existing_row_deletes_it() -> None:
    # prefix: an INSERT of 1 and an in-place UPDATE of the pre-existing 2 (every column sent, positional)
    rows = [(1, "new", "B"), (2, "upd", "B")]
    net = normalize_keyed(NAMES, ("id",), False, NAMES, rows, None, [dele(DEF, row(2, "upd")), dele(DEF, row(1, "new"))],
                          prefix_updates=[1])
    assert net.deletes == [(2,)] and net.upserts == [] and net.updates == []


def test_positional_updates_without_other_changes_are_one_upsert_of_the_last_rows(tmp_path: Path) -> None:
    db = tmp_path / "t.db"
    sink = SQLSink(f"sqlite:///{db}")
    try:
        sink.write([RowChange(OpType.INSERT, DEF, 1, row=(i, "a", "B")) for i in range(3)])
        sink.write([RowChange(OpType.UPDATE, DEF, 2 + i, row=(i % 3, f"u{i}", "B")) for i in range(7)]
                   + [RowChange(OpType.DELETE, DEF, 9, old_values={"id": 1})])
        assert read(db, DEF.name.table) == [(0, "u6", "B"), (2, "u5", "B")]
    finally:
        sink.close()


def _shift(n: int) -> list[RowChange]:
    """``UPDATE t SET id = id + 1`` over keys 1..n with a deferred key: (1->2), (2->3), ... in one transaction."""
    return [RowChange(OpType.UPDATE, FULL, 5, values=row(i + 1, f"v{i}"), old_values=row(i, f"v{i}"))
            for i in range(1, n + 1)]


@pytest.mark.parametrize("n", [20, 50])
def test_a_deferred_shift_is_applied_whole_or_refused_never_cut_wrongly(tmp_path: Path, n: int) -> None:
    db = tmp_path / "t.db"
    sink = SQLSink(f"sqlite:///{db}", SinkConfig(batch_rows=2, txn_rows=2))  # bound 2: cut at 16 x 2 changes
    try:
        sink.write([RowChange(OpType.INSERT, FULL, 1, values=row(i, f"v{i}")) for i in range(1, n + 1)])
        if n <= 32:
            sink.write(_shift(n))
            assert read(db, FULL.name.table) == [(i + 1, f"v{i}", "B") for i in range(1, n + 1)]
        else:
            from cdc.errors import SinkError

            with pytest.raises(SinkError, match="cannot be applied in parts"):
                sink.write(_shift(n))
            assert read(db, FULL.name.table) == [(i, f"v{i}", "B") for i in range(1, n + 1)]  # rolled back
    finally:
        sink.close()


def test_full_identity_in_place_update_of_the_pre_existing_row_beside_a_moved_in_image() -> None:
    # deferred key: 1 moves onto 2 (pre-existing B still there), B is updated in place, then B moves to 3
    a, b = row(1, "a"), row(2, "b")
    net = keyed([upd(FULL, row(2, "a"), a), upd(FULL, row(2, "b2"), b), upd(FULL, row(3, "b2"), row(2, "b2"))],
                full=True)
    assert net.deletes == [(1,), (2,)]
    assert sorted(tuple(i.values.values()) for i in net.upserts) == [(2, "a", "B"), (3, "b2", "B")]
