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
