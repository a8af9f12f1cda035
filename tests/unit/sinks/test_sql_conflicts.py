"""The conflict partition of a write's transactions over apply workers (sinks.sql.dialect.conflicts), against a
brute-force reference on random key sets."""

from __future__ import annotations

import random

import pytest

from sinks.sql.dialect.conflicts import components, levels, partition, schedule


def _reference_components(keys: list[set[object]]) -> list[int]:
    """Connected components of the pairwise conflict graph (O(n^2) intersections, BFS), each named by its
    smallest member."""
    n = len(keys)
    adj = [[j for j in range(n) if j != i and keys[i] & keys[j]] for i in range(n)]
    comp = [-1] * n
    for i in range(n):
        if comp[i] >= 0:
            continue
        stack, seen = [i], {i}
        while stack:
            v = stack.pop()
            for u in adj[v]:
                if u not in seen:
                    seen.add(u)
                    stack.append(u)
        low = min(seen)
        for v in seen:
            comp[v] = low
    return comp


def _check(keys: list[set[object]], workers: int, weights: list[int] | None = None) -> list[list[int]]:
    lists = partition(keys, workers, weights)
    n = len(keys)
    assert 0 < len(lists) <= workers or n == 0
    flat = [i for lst in lists for i in lst]
    assert sorted(flat) == list(range(n)), "every transaction in exactly one list"
    for lst in lists:
        assert lst == sorted(lst), "each list in commit order"
        assert lst
    where = {i: k for k, lst in enumerate(lists) for i in lst}
    for i in range(n):
        for j in range(i + 1, n):
            if keys[i] & keys[j]:
                assert where[i] == where[j], f"conflicting transactions {i} and {j} on different workers"
    ref = _reference_components(keys)
    assert components(keys) == ref
    # no component is split, and distinct components spread while workers remain
    assert len(lists) == min(workers, len(set(ref))) or n == 0
    return lists


def test_no_conflicts_spread_over_workers() -> None:
    keys = [{("t", "pk", (i,))} for i in range(8)]
    lists = _check(keys, 4)
    assert sorted(len(lst) for lst in lists) == [2, 2, 2, 2]


def test_chain_is_one_component() -> None:
    # T0-T1 share a, T1-T2 share b, T3 alone: T0, T1, T2 on one worker even though T0 and T2 share nothing
    keys = [{"a"}, {"a", "b"}, {"b"}, {"c"}]
    lists = _check(keys, 4)
    assert [0, 1, 2] in lists and [3] in lists


def test_one_worker_keeps_everything_in_order() -> None:
    keys = [{i} for i in range(5)]
    assert partition(keys, 1) == [[0, 1, 2, 3, 4]]


def test_table_key_serialises_the_table() -> None:
    # a TRUNCATE of t (table key) in the middle: every transaction touching t carries the table key too
    keys = [{("t", 1), ("T", "t")}, {("u", 1)}, {("T", "t")}, {("t", 2), ("T", "t")}, {("u", 2)}]
    lists = _check(keys, 3)
    assert [0, 2, 3] in lists


def test_weights_balance() -> None:
    keys = [{i} for i in range(4)]
    lists = _check(keys, 2, [10, 1, 1, 8])
    loads = sorted(sum([10, 1, 1, 8][i] for i in lst) for lst in lists)
    assert loads == [10, 10]


def test_empty_and_invalid() -> None:
    assert partition([], 4) == []
    with pytest.raises(ValueError):
        partition([{1}], 0)


def test_unhashable_equal_keys_are_the_same_key() -> None:
    keys = [{("t", "pk", (1, "x"))}, {("t", "pk", (1, "x"))}]
    assert partition(keys, 4) == [[0, 1]]


@pytest.mark.parametrize("seed", range(200))
def test_random_against_reference(seed: int) -> None:
    rnd = random.Random(seed)
    n = rnd.randint(0, 60)
    space = rnd.choice([5, 20, 100, 1000])
    keys = [{rnd.randrange(space) for _ in range(rnd.randint(0, 4))} for _ in range(n)]
    weights = [rnd.randint(1, 100) for _ in range(n)]
    _check(keys, rnd.randint(1, 8), weights)


def _reference_levels(keys: list[set[object]]) -> list[int]:
    out: list[int] = []
    for j in range(len(keys)):
        out.append(max((out[i] + 1 for i in range(j) if keys[i] & keys[j]), default=0))
    return out


def _check_schedule(keys: list[set[object]], workers: int, weights: list[int] | None, round_cost: int
                    ) -> list[list[list[int]]]:
    rounds = schedule(keys, workers, weights, round_cost)
    where: dict[int, tuple[int, int]] = {}
    for r, lists in enumerate(rounds):
        assert 0 < len(lists) <= workers
        for k, lst in enumerate(lists):
            assert lst and lst == sorted(lst)
            for i in lst:
                assert i not in where, "every transaction once"
                where[i] = (r, k)
    assert sorted(where) == list(range(len(keys)))
    for i in range(len(keys)):
        for j in range(i + 1, len(keys)):
            if keys[i] & keys[j]:
                (ri, ki), (rj, kj) = where[i], where[j]
                assert ri < rj or (ri == rj and ki == kj), f"{j} may run before {i} committed"
    return rounds


def test_levels_of_a_chain_and_independents() -> None:
    assert levels([{"a"}, {"a", "b"}, {"c"}, {"b"}, {"a"}]) == [0, 1, 0, 2, 2]


def test_a_giant_component_goes_by_levels() -> None:
    # every transaction shares a key with the next one only: one component, two levels
    keys = [{i, i + 1} for i in range(0, 40, 2)] + [{i + 1, i + 2} for i in range(0, 40, 2)]
    rounds = _check_schedule(keys, 4, None, 0)
    assert len(rounds) == 2 and all(len(lists) == 4 for lists in rounds)
    # a key all transactions share: levels would be one round per transaction; components win
    assert schedule([{0, i} for i in range(10)], 4, None, 1) == [[list(range(10))]]


@pytest.mark.parametrize("seed", range(200))
def test_random_levels_and_schedule_against_reference(seed: int) -> None:
    rnd = random.Random(1000 + seed)
    n = rnd.randint(0, 60)
    space = rnd.choice([5, 20, 100, 1000])
    keys = [{rnd.randrange(space) for _ in range(rnd.randint(0, 4))} for _ in range(n)]
    assert levels(keys) == _reference_levels(keys)
    _check_schedule(keys, rnd.randint(1, 8), [rnd.randint(1, 100) for _ in range(n)], rnd.choice([0, 10, 1000]))
