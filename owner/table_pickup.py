"""Picking up tables created after a changefeed: which may join its publications, and how they join.

Used by the owner's upstream look (:class:`owner.upstream_watch.UpstreamWatcher`). A table that matches the
filter is added to the publication of the span it hashes to only if the same checks as ``changefeed
create`` accept it: a replica identity PostgreSQL can use once it is published (else the application's
UPDATEs and DELETEs would fail upstream), columns that can all be published, and a target name in the sink
that no replicated table has (else two tables' rows would mix). What was not added is reported with the
reason; the add itself holds back the table's writers for an instant (:meth:`upstream.base.Upstream.add_table`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass

from cdc.config import FilterConfig
from cdc.errors import InvalidArgument, TableNotEligible, TidewaterError
from cdc.events import TableName
from cdc.filter import TableFilter
from cdc.model import (
    WARN_TABLE_INELIGIBLE,
    WARN_TARGET_NAME_CONFLICT,
    ChangefeedInfo,
    DataWarning,
    SpanInfo,
    WarningSeverity,
)
from cdc.spans import span_of
from owner import partition_watch
from sinks.base import SinkOpener
from upstream.base import Upstream

log = logging.getLogger(__name__)

COUNT_CAP = 100_000  # rows of a picked-up table counted under its lock (more: "at least")

# DataWarning codes raised by the pick-up
WARN_UNREPLICATED_ROWS = "CDC:WarnUnreplicatedRows"
LOCK_TIMEOUT_MS = 1000  # how long adding a new table may hold back its writers


def filter_rules(info: ChangefeedInfo) -> tuple[str, ...]:
    """The changefeed's filter rules from its stored config (defaults when absent)."""
    rules = (info.config.get("filter") or {}).get("rules")
    return tuple(rules) if rules else FilterConfig().rules


def unreplicated_rows_warning(table: TableName, rows: int, publication: str, now: float) -> DataWarning:
    """``table`` held ``rows`` rows (``COUNT_CAP``: at least that many) when it was added to ``publication``."""
    many = f"at least {rows}" if rows >= COUNT_CAP else str(rows)
    return DataWarning(
        WARN_UNREPLICATED_ROWS, str(table),
        f"table {table} was created after the changefeed and already held {many} row(s) when it was added to "
        f"publication {publication}: changes from then on are replicated, those rows are not. Copy them to the "
        "downstream by hand (then resume the changefeed to acknowledge), or recreate the changefeed",
        WarningSeverity.DIVERGENCE, rows, (), first_time=now)


def ineligible_table_warning(table: TableName, reason: str, now: float) -> DataWarning:
    """``table`` matches the filter but cannot be replicated (``reason`` names the fix); it was not added."""
    return DataWarning(
        WARN_TABLE_INELIGIBLE, str(table),
        f"table {table} matches the changefeed's filter but is not replicated: {reason}. Fix the table (it is "
        "picked up at the next inspection, its rows from then on) or exclude it with the filter",
        WarningSeverity.DIVERGENCE, 1, (), first_time=now)


@dataclass
class PickUp:
    """What one pick-up pass did: tables added (and those of them that already held rows), messages for
    matched tables that were not added, and a data warning for each table added with rows and each matched
    table not added (ineligible, target-name collision)."""

    added: list[str] = dataclasses.field(default_factory=list)
    with_rows: list[str] = dataclasses.field(default_factory=list)
    copied: list[str] = dataclasses.field(default_factory=list)  # added with rows, which a table copy copies
    ineligible: list[str] = dataclasses.field(default_factory=list)
    warnings: list[DataWarning] = dataclasses.field(default_factory=list)


CODE_TARGET_CONFLICT = WARN_TARGET_NAME_CONFLICT


CopyRequester = Callable[[ChangefeedInfo, TableName, int, int], Callable[[], None]]
"""``request(info, table, span, oid)`` stores a table copy of ``table`` (relation ``oid``: the span finds it by that oid
if it is renamed before its copy begins) for span ``span`` of ``info`` in etcd
(:meth:`cdc.meta.store.MetaStore.request_table_copies`) and returns what withdraws it (if no span took it up yet);
raises ``TidewaterError`` when it cannot."""


def pick_up_new_tables(up: Upstream, info: ChangefeedInfo, published: dict[int, list[TableName] | None],
                        target_names: Callable[[str], Callable[[TableName], str]], now: float,
                        request_copy: CopyRequester | None = None) -> PickUp:
    """Add matched tables that are in no publication of ``info`` to their span's publication.

    ``published`` (each span's tables, by name) was read before the tables are listed here, one query after
    another, so a table renamed in between (``DROP TABLE b; ALTER TABLE a RENAME TO b``: ``a`` in one span, ``b``
    hashing to another) looks new under its new name. Such a table is never added to a second span, nor copied
    or reported as holding unreplicated rows: before a copy is asked for, the table's relation is looked up in
    every publication of ``info``, and the add itself checks that again under the table's lock
    (:meth:`upstream.base.Upstream.add_table` with ``spans``).

    A table is added only if :meth:`upstream.base.Upstream.check_tables` accepts it for that
    publication (its replica identity works once published; its stored generated columns are published
    too) and its target name in the sink is not already that of a published table or of one added
    earlier in this pass (the same rule ``changefeed create`` applies).

    Rows the table already held: a changefeed with an initial copy (``[snapshot] mode = "initial"``) copies them
    with a table copy (``request_copy``), asked for *before* the add when the table holds rows then (so that an
    owner that dies right after the add leaves the request behind), else right after the add if it counted
    rows; only when that fails, or the changefeed has no copy, are they reported as unreplicated. Spans are indexed
    ``0..len(info.spans)-1`` (``span-count`` is fixed at creation), so ``span_of(table, len(info.spans))``
    is the creation-time rule.
    """
    in_pubs: set[TableName] = set()
    for tables in published.values():
        in_pubs.update(tables or ())
    matched = TableFilter(filter_rules(info)).select(up.list_tables())
    by_index = {s.index: s for s in info.spans}
    out = PickUp()
    at_least_once = (info.config.get("sink") or {}).get("delivery") == "at-least-once"
    targets: dict[str, TableName] | None = None
    target_of: Callable[[TableName], str] = str
    for table in matched:
        if table in in_pubs:
            continue
        span = by_index.get(span_of(table, len(info.spans)))
        if span is None or published.get(span.index) is None:
            continue  # missing publication: reported on the slot report, decided as a lost span
        try:
            up.check_tables([table], publication=span.publication)
        except TableNotEligible as exc:
            out.ineligible.append(exc.message.split(": ", 1)[-1])
            out.warnings.append(ineligible_table_warning(table, out.ineligible[-1], now))
            continue
        except InvalidArgument:
            continue  # dropped since it was listed
        if at_least_once and not info.sink_uri.startswith("blackhole:"):
            try:
                keyless = not up.table_schema(table).has_key
            except InvalidArgument:
                continue  # dropped since it was listed
            if keyless:  # a replay would duplicate its rows (changefeed create refuses the same)
                out.ineligible.append(f"{table} has no key and the changefeed's sink.delivery is \"at-least-once\": "
                                      "a replay after a fault would duplicate its rows; give it a primary key or "
                                      "exclude it with the filter")
                out.warnings.append(ineligible_table_warning(table, out.ineligible[-1], now))
                continue
        if targets is None:
            try:
                target_of = target_names(info.sink_uri)
            except TidewaterError as exc:  # not added while its target name cannot be checked
                out.ineligible.append(f"{table} is not added: its target name in the sink cannot be checked "
                                      f"({exc.message})")
                out.warnings.append(ineligible_table_warning(table, out.ineligible[-1], now))
                continue
            targets = {collision_key(info.sink_uri, target_of(t)): t for t in sorted(in_pubs)}
        target = target_of(table)
        other = targets.get(collision_key(info.sink_uri, target))
        if other is not None and not _still_carried(up, info, other):
            continue  # renamed or dropped since the publications were read: decided again at the next look
        if other is not None:
            msg = (f"{table} would land on {target!r} in the sink, where {other} already lands as "
                   f"{target_of(other)!r} (the rows of two tables would mix); it is not added: exclude one of them "
                   f"with the changefeed's filter")
            out.ineligible.append(msg)
            out.warnings.append(DataWarning(CODE_TARGET_CONFLICT, str(table), msg, WarningSeverity.DIVERGENCE,
                                            first_time=now, last_time=now))
            continue
        copies = request_copy is not None and info.initial_copy
        cancel: Callable[[], None] | None = None  # the table copy asked for before the add (undone if not added)
        oid = 0
        if copies:
            try:
                oid = up.table_schema(table).relation_id
                if up.carrying_spans(oid, info.spans):
                    continue  # renamed onto this name since the publications were read: its span carries it
                if up.has_rows(oid):
                    assert request_copy is not None
                    cancel = request_copy(info, table, span.index, oid)
            except InvalidArgument:
                continue  # dropped since it was listed
            except TidewaterError as exc:
                log.warning("changefeed=%s: %s not added yet: its table copy could not be requested: %s", info.id,
                            table, exc)
                continue
        outcome = _add(up, info, span, table, out, now)
        if outcome is None:
            if cancel is not None:
                _cancel(cancel, info, table)
            continue
        targets[collision_key(info.sink_uri, target)] = table
        out.added.append(str(table))
        if outcome and cancel is None and copies:
            try:
                assert request_copy is not None
                cancel = request_copy(info, table, span.index, oid)
            except TidewaterError as exc:
                log.warning("changefeed=%s: the table copy of %s could not be requested: %s", info.id, table, exc)
        if outcome and cancel is not None:
            out.copied.append(str(table))
        elif outcome:
            out.with_rows.append(str(table))
            out.warnings.append(unreplicated_rows_warning(table, outcome, span.publication, now))
    return out


def _still_carried(up: Upstream, info: ChangefeedInfo, table: TableName) -> bool:
    """``table`` (read from a publication before the tables were listed) still names a table a span of ``info``
    carries: a target-name conflict with it is real, not one with a table renamed away in between."""
    try:
        return bool(up.carrying_spans(up.table_schema(table).relation_id, info.spans))
    except InvalidArgument:
        return False  # no table of that name any more


def _add(up: Upstream, info: ChangefeedInfo, span: SpanInfo, table: TableName, out: PickUp, now: float) -> int | None:
    """``Upstream.add_table``: the rows the table held, or None when it was not added (deferred: tried again at
    the next inspection; refused: reported in ``out``; carried by a span of ``info`` already: a table renamed onto
    this name since the caller read the publications, nothing to do)."""
    try:
        return up.add_table(span, table, lock_timeout_ms=LOCK_TIMEOUT_MS, count_cap=COUNT_CAP, spans=info.spans)
    except TidewaterError as exc:
        if exc.retryable:
            log.info("changefeed=%s: adding %s to %s deferred: %s", info.id, table, span.publication, exc)
            return None
        out.ineligible.append(f"{table} cannot be added to publication {span.publication}: {exc.message}")
        out.warnings.append(ineligible_table_warning(table, out.ineligible[-1], now))
        return None


def _cancel(cancel: Callable[[], None], info: ChangefeedInfo, table: TableName) -> None:
    try:
        cancel()
    except TidewaterError as exc:  # its span shows it waiting for the table (CDC:ErrTableCopyWaiting)
        log.warning("changefeed=%s: the table copy of %s (not added) could not be withdrawn: %s", info.id, table, exc)


def unusable_new_partitions(up: Upstream, before: partition_watch.Leaves, current: partition_watch.Leaves,
                             now: float) -> list[DataWarning]:
    """A partition added to a published root (created or attached; at the first look: every partition)
    is published with it; without a usable replica identity of its own its UPDATEs and DELETEs now fail
    upstream (measured on 18.6). Tidewater cannot undo the user's DDL, so it names the fix loudly."""
    out: list[DataWarning] = []
    for root, leaves in current.items():
        for oid in sorted(set(leaves) - set(before.get(root, {}))):
            leaf = leaves[oid]
            try:
                up.check_partition(leaf.name)
            except TableNotEligible as exc:
                out.append(DataWarning(
                    partition_watch.CODE_NO_IDENTITY, str(root),
                    f"partition {leaf.name} of {root} has no usable replica identity, and as part of the published "
                    f"{root} its UPDATEs and DELETEs fail upstream: {exc.message.split(': ', 1)[-1]}",
                    WarningSeverity.DIVERGENCE, first_time=now, last_time=now))
            except InvalidArgument:
                continue  # gone since it was listed
    return out


_ASCII_UPPER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def collision_key(sink_uri: str, target: str) -> str:
    """What two target names must differ in to be different tables in the sink of ``sink_uri``.

    SQLite folds ASCII letters in table names (``"T"`` and ``"t"`` are one table; measured), MySQL and
    MariaDB may (``lower_case_table_names``) and the SQL sink matches existing tables case-insensitively
    there: those compare case-folded. PostgreSQL and other sinks compare exactly.
    """
    scheme = sink_uri.split(":", 1)[0].lower()
    if scheme == "sqlite":
        return target.translate(_ASCII_UPPER)
    if scheme in ("mysql", "mariadb"):
        return target.casefold()
    return target


def sink_target_names(sinks: SinkOpener, sink_uri: str) -> Callable[[TableName], str]:
    """``target_name`` of the sink for ``sink_uri`` (an unconnected sink from ``sinks``: no I/O; closed again)."""
    sink = sinks.open(sink_uri)
    try:
        return sink.target_name
    finally:
        sink.close()
