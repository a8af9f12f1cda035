"""Partitioned tables: what the replication stream does not carry, found by comparing looks.

Tidewater publishes partitioned tables via their root (``publish_via_partition_root``): rows arrive under
the root's name, and the downstream has one table for the root. Measured on PostgreSQL 18.6, these leave
the downstream different from the upstream root *without a single message in the stream*:

- ``TRUNCATE`` of one partition: pgoutput skips it (a partition's truncate is not sent when the
  publication publishes via the root); the partition's rows stay downstream.
- ``ALTER TABLE root DETACH PARTITION p`` and ``DROP TABLE p``: DDL; p's rows stay downstream.
- ``ALTER TABLE root ATTACH PARTITION p`` of a table that already holds rows: DDL; those rows never
  reach the downstream (later changes to them do, as updates of rows that are not there).

So the owner's look (:class:`owner.upstream_watch.UpstreamWatcher`) keeps the leaf partitions of every
published partitioned table (:class:`upstream.base.PartitionLeaf`: oid, storage, bound) and
:func:`compare` turns the difference between two looks into :class:`cdc.model.DataWarning` s naming the
root, the partition, its bound and what to do. A TRUNCATE is recognised by the partition's new storage
(``relfilenode``), which VACUUM FULL, CLUSTER and table-rewriting ALTER TABLEs change too: those are
reported as well (worded as "truncated or rewritten"), because the look cannot tell them apart. When
*every* partition of a root got new storage at once, that is nearly always a TRUNCATE of the root, which
the stream does carry: that is only a notice (``CDC:NoticePartitionsRenewed``), since truncating each
partition on its own between two looks would look the same.

Limits: the first look of a changefeed after an owner starts is the baseline (changes made before it, or
while no owner was looking, are not seen); a partition that is created *and* filled between two looks
looks like an attached one (it is reported; its rows were in fact streamed).
"""

from __future__ import annotations

from collections.abc import Callable

from cdc.events import TableName
from cdc.model import DataWarning, WarningSeverity
from upstream.base import PartitionLeaf

CODE_DETACHED = "CDC:WarnPartitionDetached"
CODE_DROPPED = "CDC:WarnPartitionDropped"
CODE_ATTACHED = "CDC:WarnPartitionAttachedRows"
CODE_TRUNCATED = "CDC:WarnPartitionTruncated"
CODE_ALL_RENEWED = "CDC:NoticePartitionsRenewed"
CODE_NO_IDENTITY = "CDC:WarnPartitionNoIdentity"  # raised by the watcher, which can ask the catalog

Leaves = dict[TableName, dict[int, PartitionLeaf]]
"""Per published partitioned root: its leaves by oid."""


def group(leaves: list[PartitionLeaf]) -> Leaves:
    """``leaves`` by root, then by oid."""
    out: Leaves = {}
    for leaf in leaves:
        out.setdefault(leaf.root, {})[leaf.oid] = leaf
    return out


def compare(before: Leaves, after: Leaves, *, exists: Callable[[int], bool], has_rows: Callable[[int], bool],
            now: float) -> list[DataWarning]:
    """Warnings for what changed between two looks, for the roots published in both.

    ``exists(oid)``: the relation still exists (a vanished leaf that exists was detached, else dropped);
    ``has_rows(oid)``: a leaf holds rows (asked only for new leaves and leaves with new storage). A root
    published in only one of the looks (newly added, or removed) is not compared.
    """
    out: list[DataWarning] = []
    for root in sorted(set(before) & set(after)):
        old, new = before[root], after[root]
        for oid in sorted(set(old) - set(new)):
            leaf = old[oid]
            detached = exists(oid)
            how = "detached from it (DETACH PARTITION)" if detached else "dropped"
            out.append(DataWarning(
                CODE_DETACHED if detached else CODE_DROPPED, str(root),
                f"partition {leaf.name} ({leaf.bound}) of {root} was {how} upstream; the replication stream carries "
                f"no change for that, so its rows are still in the downstream table of {root}: delete them there "
                f"(the rows of {root} in {leaf.bound}) or recreate the changefeed",
                WarningSeverity.DIVERGENCE, first_time=now, last_time=now))
        for oid in sorted(set(new) - set(old)):
            leaf = new[oid]
            if not has_rows(oid):
                continue  # an empty new partition: everything written to it is streamed
            out.append(DataWarning(
                CODE_ATTACHED, str(root),
                f"partition {leaf.name} ({leaf.bound}) appeared under {root} and holds rows: if it was attached "
                f"(ATTACH PARTITION) with rows in it, those rows were never streamed and are missing downstream: "
                f"copy them to the downstream table of {root} by hand, or recreate the changefeed (if it was "
                f"created as a partition and written afterwards, its rows were streamed and nothing is missing)",
                WarningSeverity.DIVERGENCE, first_time=now, last_time=now))
        renewed = sorted(oid for oid in set(new) & set(old) if new[oid].storage != old[oid].storage)
        if len(renewed) > 1 and len(renewed) == len(set(new) & set(old)):
            # every partition at once: nearly always a TRUNCATE of the root, which *is* streamed
            names = ", ".join(str(new[oid].name) for oid in renewed)
            out.append(DataWarning(
                CODE_ALL_RENEWED, str(root),
                f"every partition of {root} ({names}) got new storage at once: a TRUNCATE of {root} (streamed and "
                f"applied, nothing to do) or a rewrite of the whole table; only if each partition was truncated on "
                f"its own (TRUNCATE of the partitions, not of {root}) are their old rows still downstream",
                WarningSeverity.NOTICE, first_time=now, last_time=now))
            continue
        for oid in renewed:
            leaf = new[oid]
            state = "now holds rows" if has_rows(oid) else "is now empty"
            out.append(DataWarning(
                CODE_TRUNCATED, str(root),
                f"partition {leaf.name} ({leaf.bound}) of {root} was truncated or rewritten upstream (new storage; "
                f"it {state}). PostgreSQL does not stream a TRUNCATE of a single partition of a table published via "
                f"its root, so if it was truncated its old rows are still downstream: delete the rows of {root} in "
                f"{leaf.bound} downstream (and let later changes refill it) or recreate the changefeed; a VACUUM FULL, "
                f"CLUSTER or table-rewriting ALTER TABLE changes nothing downstream",
                WarningSeverity.DIVERGENCE, first_time=now, last_time=now))
    return out
