"""owner.partition_watch.compare: what changed between two looks at a root's leaf partitions (pure)."""

from __future__ import annotations

from cdc.events import TableName
from cdc.model import WarningSeverity
from owner.partition_watch import compare, group
from upstream.base import PartitionLeaf

ROOT = TableName("public", "m")
OTHER = TableName("public", "n")


def leaf(oid: int, storage: int | None = None, root: TableName = ROOT) -> PartitionLeaf:
    return PartitionLeaf(root, oid, TableName("public", f"m_{oid}"), storage or oid * 10,
                         f"FOR VALUES FROM ({oid * 10}) TO ({oid * 10 + 10})")


def run(before: list[PartitionLeaf], after: list[PartitionLeaf], *, existing: set[int] = frozenset(),
        with_rows: set[int] = frozenset()) -> list[tuple[str, str, str]]:
    asked: list[int] = []

    def has_rows(oid: int) -> bool:
        asked.append(oid)
        return oid in with_rows

    out = compare(group(before), group(after), exists=lambda oid: oid in existing, has_rows=has_rows, now=5.0)
    assert all(w.first_time == 5.0 for w in out)
    assert all((w.severity is WarningSeverity.NOTICE) == (w.code == "CDC:NoticePartitionsRenewed") for w in out)
    run.asked = asked  # type: ignore[attr-defined]
    return [(w.code, w.table, w.message) for w in out]


def test_nothing_changed_says_nothing_and_reads_nothing() -> None:
    assert run([leaf(1), leaf(2)], [leaf(1), leaf(2)], with_rows={1, 2}) == []
    assert run.asked == []  # type: ignore[attr-defined]


def test_detached_and_dropped_are_told_apart_by_whether_the_relation_exists() -> None:
    got = run([leaf(1), leaf(2), leaf(3)], [leaf(1)], existing={2})
    assert [c for c, _, _ in got] == ["CDC:WarnPartitionDetached", "CDC:WarnPartitionDropped"]
    assert got[0][2] == (
        "partition public.m_2 (FOR VALUES FROM (20) TO (30)) of public.m was detached from it (DETACH PARTITION) "
        "upstream; the replication stream carries no change for that, so its rows are still in the downstream "
        "table of public.m: delete them there (the rows of public.m in FOR VALUES FROM (20) TO (30)) or recreate "
        "the changefeed")
    assert "public.m_3 (FOR VALUES FROM (30) TO (40)) of public.m was dropped upstream" in got[1][2]


def test_new_partition_is_reported_only_when_it_holds_rows() -> None:
    assert run([leaf(1)], [leaf(1), leaf(2)]) == []
    got = run([leaf(1)], [leaf(1), leaf(2)], with_rows={2})
    assert [(c, t) for c, t, _ in got] == [("CDC:WarnPartitionAttachedRows", "public.m")]
    assert got[0][2].startswith("partition public.m_2 (FOR VALUES FROM (20) TO (30)) appeared under public.m and "
                                "holds rows: if it was attached (ATTACH PARTITION) with rows in it")


def test_new_storage_is_a_truncate_or_a_rewrite() -> None:
    got = run([leaf(1), leaf(2)], [leaf(1, storage=99), leaf(2)])
    assert [(c, t) for c, t, _ in got] == [("CDC:WarnPartitionTruncated", "public.m")]
    assert "(new storage; it is now empty)" in got[0][2]
    again = run([leaf(1)], [leaf(1, storage=99)], with_rows={1})
    assert "(new storage; it now holds rows)" in again[0][2]


def test_roots_published_in_only_one_look_are_not_compared() -> None:
    assert run([leaf(1)], [leaf(1), leaf(7, root=OTHER)], with_rows={7}) == []
    assert run([leaf(1), leaf(7, root=OTHER)], [leaf(1)]) == []


def test_every_partition_renewed_at_once_is_a_root_truncate_notice() -> None:
    got = run([leaf(1), leaf(2)], [leaf(1, storage=91), leaf(2, storage=92)])
    assert [(c, t) for c, t, _ in got] == [("CDC:NoticePartitionsRenewed", "public.m")]
    assert got[0][2].startswith("every partition of public.m (public.m_1, public.m_2) got new storage at once: a "
                                "TRUNCATE of public.m (streamed and applied, nothing to do)")
    # a single-partition root: its one partition renewed is still reported as a possible partition truncate
    assert [c for c, _, _ in run([leaf(1)], [leaf(1, storage=91)])] == ["CDC:WarnPartitionTruncated"]
