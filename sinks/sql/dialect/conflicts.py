"""Conflicts between the upstream transactions of one write, and their split over apply workers (no I/O).

A transaction's *keys* are hashable values chosen by the caller (``sinks.sql.ops.parallel``): one per primary and
unique key value of every row image it touches, ``(table, key columns, values)``, and a table-wide key for what
cannot be told apart by row (tables without a key, a TRUNCATE, tables linked by a target foreign key). Two
transactions *conflict* when their key sets intersect.

:func:`partition` splits a write's transactions (in commit order) into at most ``workers`` lists such that

- every transaction is in exactly one list, and each list is in commit order;
- two conflicting transactions are always in the same list, and so, transitively, is every transaction of a
  connected component of the conflict graph (the component of ``T`` holds every earlier transaction ``T`` must
  wait for, and everything waiting for ``T``);
- components are spread over the lists largest first, each onto the list with the least weight so far (the weight
  of a transaction is the caller's, e.g. its row count), so lists are balanced as well as whole components allow.

A worker that applies its list in order therefore runs a transaction only after every earlier transaction it
conflicts with (same list, earlier position), which keeps per-key order; transactions of different lists share no
key and may run and commit in any order relative to each other. This is coarser than TiCDC's conflict detector
(``pkg/causality``: a transaction waits only for its own conflicting predecessors, across workers, as they finish):
here a whole component goes to one worker for one write, which needs no cross-worker waiting, at the price of
serialising a component that a finer scheduler could partly overlap. Components are computed by union-find over
the keys: linear in the number of keys.

Components fail where many transactions chain through shared keys (updates of random keys: one giant component).
:func:`schedule` then uses *levels* instead (:func:`levels`: one more than the highest level among a transaction's
earlier conflicting transactions; transactions of one level never conflict): one round per level, each round's
transactions spread over the workers and committed before the next round starts, so a transaction still runs only
after every earlier transaction it conflicts with committed. It picks components or levels by an estimated cost
(heaviest list per round plus a fixed cost per round).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence


def components(keys: Sequence[Iterable[Hashable]]) -> list[int]:
    """The conflict component of each transaction, as the index of its first (earliest) transaction."""
    n = len(keys)
    parent = list(range(n))

    def find(i: int) -> int:
        root = i
        while parent[root] != root:
            root = parent[root]
        while parent[i] != root:  # path compression
            parent[i], i = root, parent[i]
        return root

    owner: dict[Hashable, int] = {}  # key -> a transaction that has it
    for i, ks in enumerate(keys):
        for k in ks:
            j = owner.get(k)
            if j is None:
                owner[k] = i
                continue
            a, b = find(i), find(j)
            if a != b:
                if a < b:
                    parent[b] = a
                else:
                    parent[a] = b
    return [find(i) for i in range(n)]


def partition(keys: Sequence[Iterable[Hashable]], workers: int, weights: Sequence[int] | None = None
              ) -> list[list[int]]:
    """Transaction indexes per worker (at most ``workers`` non-empty lists, each ascending; see the module
    docstring for the guarantees). ``weights`` defaults to 1 per transaction."""
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    n = len(keys)
    if n == 0:
        return []
    comp = components(keys)
    members: dict[int, list[int]] = {}
    for i, c in enumerate(comp):
        members.setdefault(c, []).append(i)
    if workers == 1 or len(members) == 1:
        return [list(range(n))]
    w = weights if weights is not None else [1] * n
    sized = sorted(members.values(), key=lambda m: (-sum(w[i] for i in m), m[0]))
    lists: list[list[int]] = [[] for _ in range(min(workers, len(sized)))]
    loads = [0] * len(lists)
    for m in sized:
        k = min(range(len(lists)), key=loads.__getitem__)
        lists[k].extend(m)
        loads[k] += sum(w[i] for i in m)
    for lst in lists:
        lst.sort()
    return [lst for lst in lists if lst]


def levels(keys: Sequence[Iterable[Hashable]]) -> list[int]:
    """Each transaction's level: 0 without an earlier conflicting transaction, else one more than the highest level
    among the earlier transactions it conflicts with. Two transactions of one level never conflict, and a
    transaction's level is above that of every earlier transaction it conflicts with."""
    last: dict[Hashable, int] = {}  # key -> highest level of a transaction holding it so far
    out = []
    for ks in keys:
        ks = list(ks)
        lvl = 0
        for k in ks:
            prev = last.get(k)
            if prev is not None and prev + 1 > lvl:
                lvl = prev + 1
        for k in ks:
            last[k] = lvl
        out.append(lvl)
    return out


def schedule(keys: Sequence[Iterable[Hashable]], workers: int, weights: Sequence[int] | None = None,
             round_cost: int = 0) -> list[list[list[int]]]:
    """Rounds of per-worker lists of transaction indexes: the rounds run one after the other (each committed
    before the next starts), the lists of a round concurrently. Either one round of whole conflict components
    (:func:`partition`), or one round per :func:`levels` level with the level's transactions spread over the workers
    (transactions of one level never conflict), whichever has the lower estimated cost: the sum over rounds of the
    heaviest list's weight plus ``round_cost`` per round. Guarantees: every transaction in exactly one list; each
    list ascending; a transaction runs in a later round than, or earlier in the same list as, every earlier
    transaction it conflicts with."""
    keys = [list(ks) for ks in keys]
    n = len(keys)
    if n == 0:
        return []
    w = list(weights) if weights is not None else [1] * n
    comp = partition(keys, workers, w)
    comp_cost = max(sum(w[i] for i in lst) for lst in comp) + round_cost
    if workers == 1 or len(comp) == 1 and n == 1:
        return [comp]
    lv = levels(keys)
    by_level: dict[int, list[int]] = {}
    for i, lvl in enumerate(lv):
        by_level.setdefault(lvl, []).append(i)
    rounds = []
    level_cost = 0
    for lvl in sorted(by_level):
        lists = _spread(by_level[lvl], workers, w)
        level_cost += max(sum(w[i] for i in lst) for lst in lists) + round_cost
        if level_cost >= comp_cost:
            return [comp]
        rounds.append(lists)
    return rounds


def _spread(members: list[int], workers: int, w: Sequence[int]) -> list[list[int]]:
    """Independent transactions onto at most ``workers`` lists, heaviest first onto the lightest list."""
    lists: list[list[int]] = [[] for _ in range(min(workers, len(members)))]
    loads = [0] * len(lists)
    for i in sorted(members, key=lambda i: (-w[i], i)):
        k = min(range(len(lists)), key=loads.__getitem__)
        lists[k].append(i)
        loads[k] += w[i]
    for lst in lists:
        lst.sort()
    return lists
