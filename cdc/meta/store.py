"""The typed meta-store: everything Tidewater keeps in etcd, as dataclasses (layout: docs/etcd-layout.md).

Public template, private primitive: callers speak ``CaptureInfo``/``ChangefeedInfo``/... and fences;
keys (``cdc.meta.keys``), JSON (``cdc.serde``) and etcd transactions (``cdc.meta.etcd``) stay in here.

Guarantees:
- Every multi-key change is one etcd transaction (atomic).
- Fenced writes (``fence`` = ``Election.fence()``) apply only while the writer is still the owner; when the
  fence no longer holds they raise ``NotOwner`` and change nothing. A fence that fails once never holds
  again, so the check after a failed transaction is exact.
- CAS writes (``expected_mod`` / ``expected``) return False when the precondition failed.
- ``snapshot()`` reads the whole cluster in one range read at one revision.
Thread-safe (stateless apart from the client).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Generic, TypeVar

from cdc import serde
from cdc.crypto import SecretBox, UnopenableSecret, is_sealed
from cdc.errors import ChangefeedExists, ChangefeedNotFound, LeaseLost, MetaStoreError, NotOwner
from cdc.meta import keys
from cdc.meta.etcd import EtcdClient, Watch, is_not_found
from cdc.meta.keys import KeyKind
from cdc.meta.kv import KV, Compare, Op, WatchResponse
from cdc.model import (
    CaptureInfo,
    ChangefeedInfo,
    ChangefeedStatus,
    SchemaHistory,
    SpanAssignment,
    SpanStatus,
    TableCopy,
    VerifyHold,
    VerifyRun,
)

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class Versioned(Generic[T]):
    """A decoded value with the etcd revision that last modified it (for compare-and-swap)."""

    value: T
    mod_revision: int


@dataclass(frozen=True)
class SpanStatusWrite:
    """One span status to store under its processor guard (see :meth:`MetaStore.put_span_statuses`)."""

    cf: str
    span: int
    status: SpanStatus
    guard: Sequence[Compare] = ()


# Span statuses per etcd transaction: each adds one put and at most one distinct compare (the assignment);
# etcd's default --max-txn-ops is 128 for puts and compares alike.
SPAN_STATUSES_PER_TXN = 64
# Schema histories per etcd transaction (a wide table's history is a few KiB: far below etcd's request size limit)
SCHEMA_HISTORIES_PER_TXN = 64


@dataclass(frozen=True)
class OwnerCandidate:
    lease: int
    capture_id: str  # the election value
    create_revision: int


@dataclass
class ClusterSnapshot:
    """The whole cluster state at one etcd ``revision``."""

    revision: int
    captures: dict[str, CaptureInfo] = field(default_factory=dict)
    capture_leases: dict[str, int] = field(default_factory=dict)
    owner_candidates: list[OwnerCandidate] = field(default_factory=list)  # by create revision; [0] leads
    changefeeds: dict[str, Versioned[ChangefeedInfo]] = field(default_factory=dict)
    statuses: dict[str, ChangefeedStatus] = field(default_factory=dict)
    assignments: dict[str, dict[int, SpanAssignment]] = field(default_factory=dict)
    span_statuses: dict[str, dict[int, SpanStatus]] = field(default_factory=dict)
    holds: dict[str, VerifyHold] = field(default_factory=dict)  # changefeed -> its verify hold (expired ones too)
    mod_revisions: dict[str, int] = field(default_factory=dict)  # raw key -> mod revision, every key

    @property
    def owner(self) -> OwnerCandidate | None:
        return self.owner_candidates[0] if self.owner_candidates else None


def _decode(cls: type[T], kv: KV) -> T:
    try:
        return serde.from_json(cls, kv.value)
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        log.error("corrupt value at etcd key %s: %s", kv.key, e)
        raise MetaStoreError(f"corrupt {cls.__name__} at etcd key {kv.key}: {e}", cause=e) from e


class MetaStore:
    """Typed access to one Tidewater cluster's keys (``cluster_id``) through ``client``.

    With ``secrets`` the URIs of every changefeed (they hold credentials) are sealed when written and opened
    when read (:mod:`cdc.crypto`); values stored unsealed are still read. A sealed URI that no key of
    ``secrets`` opens (or read without ``secrets``) is handed out sealed: parsing it then fails with a
    message naming the key file, and writing the info back keeps it as it was."""

    def __init__(self, client: EtcdClient, cluster_id: str, secrets: SecretBox | None = None) -> None:
        keys.cluster_prefix(cluster_id)  # validates
        self.client = client
        self.cluster_id = cluster_id
        self.secrets = secrets
        self._unopened_logged: set[str] = set()

    # ---- changefeed info codec (credentials sealed at rest)
    def _info_json(self, info: ChangefeedInfo) -> bytes:
        if self.secrets is not None:
            info = replace(info, upstream_uri=self.secrets.seal(info.upstream_uri),
                           sink_uri=self.secrets.seal(info.sink_uri))
        return serde.to_json(info)

    def _info(self, kv: KV) -> ChangefeedInfo:
        info = _decode(ChangefeedInfo, kv)
        if not (is_sealed(info.upstream_uri) or is_sealed(info.sink_uri)):
            return info
        if self.secrets is not None:
            try:
                return replace(info, upstream_uri=self.secrets.open(info.upstream_uri),
                               sink_uri=self.secrets.open(info.sink_uri))
            except UnopenableSecret:
                pass
        if info.id not in self._unopened_logged:
            self._unopened_logged.add(info.id)
            log.error("changefeed=%s: its URIs are sealed with a key this capture does not hold; give every "
                      "capture the same --secret-key-file", info.id)
        return info

    def reseal_changefeeds(self) -> int:
        """Seal every changefeed's URIs stored in plain text or under an older key with the first key (a
        compare-and-swap per changefeed; a concurrent change wins and is resealed at its next write).
        Returns how many were rewritten; 0 without ``secrets``."""
        if self.secrets is None:
            return 0
        done = 0
        _, kvs = self.client.get_prefix(keys.changefeed_info_prefix(self.cluster_id))
        for kv in kvs:
            raw = _decode(ChangefeedInfo, kv)
            if not (self.secrets.needs_reseal(raw.upstream_uri) or self.secrets.needs_reseal(raw.sink_uri)):
                continue
            info = self._info(kv)
            if is_sealed(info.upstream_uri) or is_sealed(info.sink_uri):
                continue  # not ours to open
            key = keys.changefeed_info_key(self.cluster_id, info.id)
            if self.client.txn([Compare(key, "mod", "=", kv.mod_revision)], [Op.put(key, self._info_json(info))]):
                done += 1
        if done:
            log.info("sealed the credentials of %d changefeed(s) with the first key of the secret key file", done)
        return done

    @property
    def owner_election_prefix(self) -> str:
        """Prefix for :class:`cdc.meta.election.Election` of the owner (value: the capture id)."""
        return keys.owner_prefix(self.cluster_id)

    # ---- internal helpers
    def _fenced(self, what: str, fence: Sequence[Compare], compares: Sequence[Compare],
                ops: Sequence[Op]) -> bool:
        """Commit ``ops`` if ``fence`` and ``compares`` hold. False if only ``compares`` failed;
        ``NotOwner`` if the fence failed (a fence that failed once never holds again)."""
        return self._fenced_commit(what, fence, compares, ops) > 0

    def _fenced_commit(self, what: str, fence: Sequence[Compare], compares: Sequence[Compare],
                       ops: Sequence[Op]) -> int:
        """Like :meth:`_fenced`; returns the etcd revision of the committed transaction, 0 if only
        ``compares`` failed."""
        res = self.client.commit([*fence, *compares], ops)
        if res.succeeded:
            return res.revision
        if fence and not self.client.txn(fence, []):
            raise NotOwner(f"{what}: this capture is no longer the owner")
        return 0

    # ---- captures
    def register_capture(self, info: CaptureInfo, lease: int) -> None:
        """Put the capture's registration under its session ``lease`` (it vanishes with the lease).
        Raises ``LeaseLost`` if the lease no longer exists."""
        try:
            self.client.put(keys.capture_key(self.cluster_id, info.id), serde.to_json(info), lease=lease)
        except MetaStoreError as e:
            if is_not_found(e):
                raise LeaseLost(f"capture {info.id}: lease {lease:x} no longer exists", cause=e) from e
            raise

    def list_captures(self) -> dict[str, CaptureInfo]:
        _, kvs = self.client.get_prefix(keys.capture_prefix(self.cluster_id))
        return {keys.parse_key(kv.key).capture: _decode(CaptureInfo, kv) for kv in kvs}

    def delete_capture(self, capture_id: str) -> bool:
        return self.client.delete(keys.capture_key(self.cluster_id, capture_id))

    def set_capture_draining(self, capture_id: str) -> bool:
        """Mark a live capture as draining (the owner then moves its spans away).

        Re-puts the capture's ``CaptureInfo`` with ``draining=True`` under the capture's *own* lease (so
        the key still vanishes with that capture), as a compare-and-swap on the key's mod revision;
        retried on a concurrent change. Idempotent. Returns False if the capture is not registered
        (unknown id, or its lease expired meanwhile)."""
        key = keys.capture_key(self.cluster_id, capture_id)
        for _ in range(10):
            kv = self.client.get(key)
            if kv is None:
                return False
            info = _decode(CaptureInfo, kv)
            if info.draining:
                return True
            try:
                done = self.client.txn([Compare(key, "mod", "=", kv.mod_revision)],
                                       [Op.put(key, serde.to_json(replace(info, draining=True)), lease=kv.lease)])
            except MetaStoreError as e:
                if is_not_found(e):  # its lease expired between the read and the write
                    return False
                raise
            if done:
                log.info("capture=%s marked draining", capture_id)
                return True
        raise MetaStoreError(f"capture {capture_id}: registration kept changing while marking it draining")

    # ---- changefeeds
    def create_changefeed(self, info: ChangefeedInfo, status: ChangefeedStatus,
                          histories: Sequence[SchemaHistory] = ()) -> None:
        """Create info and status, with each table's first schema history (``histories``), so that no span can
        start without them: whoever sees the info sees them. Clears leftover keys of an earlier changefeed with
        the same id first. Raises ``ChangefeedExists`` if the id is taken.

        Up to ``SCHEMA_HISTORIES_PER_TXN`` histories go into the transaction that creates the info (atomic). More
        are stored before it, ``SCHEMA_HISTORIES_PER_TXN`` per transaction, each only while the info is still
        absent; a create that fails after them leaves them behind without an info, where nothing reads them and
        the next create of the id clears them."""
        cf = info.id
        info_key = keys.changefeed_info_key(self.cluster_id, cf)
        absent = [Compare.absent(info_key)]
        # (a separate transaction: etcd refuses a put inside a prefix the same transaction deletes)
        if not self.client.txn(absent, [Op.delete_prefix(keys.schema_history_prefix(self.cluster_id, cf))]):
            raise ChangefeedExists(f"changefeed {cf} already exists")
        puts = [Op.put(keys.schema_history_key(self.cluster_id, cf, h.relid), serde.to_json(h))
                for h in histories if not h.gone]
        last = len(puts) - (len(puts) - 1) % SCHEMA_HISTORIES_PER_TXN - 1 if puts else 0
        for i in range(0, last, SCHEMA_HISTORIES_PER_TXN):
            if not self.client.txn(absent, puts[i:i + SCHEMA_HISTORIES_PER_TXN]):
                raise ChangefeedExists(f"changefeed {cf} already exists")
        ok = self.client.txn(
            absent,
            [Op.put(info_key, self._info_json(info)),
             Op.put(keys.changefeed_status_key(self.cluster_id, cf), serde.to_json(status)),
             Op.delete_prefix(keys.assignment_prefix(self.cluster_id, cf)),
             Op.delete_prefix(keys.span_status_prefix(self.cluster_id, cf)),
             *puts[last:]])
        if not ok:
            raise ChangefeedExists(f"changefeed {cf} already exists")

    def get_changefeed(self, cf: str) -> Versioned[ChangefeedInfo] | None:
        kv = self.client.get(keys.changefeed_info_key(self.cluster_id, cf))
        return None if kv is None else Versioned(self._info(kv), kv.mod_revision)

    def list_changefeeds(self) -> dict[str, Versioned[ChangefeedInfo]]:
        _, kvs = self.client.get_prefix(keys.changefeed_info_prefix(self.cluster_id))
        return {keys.parse_key(kv.key).changefeed: Versioned(self._info(kv), kv.mod_revision)
                for kv in kvs}

    def update_changefeed(self, info: ChangefeedInfo, expected_mod: int,
                          fence: Sequence[Compare] = ()) -> bool:
        """Replace the info if its mod revision is still ``expected_mod`` (0: only if absent).
        False on a CAS conflict (re-read and retry); ``NotOwner`` if ``fence`` fails."""
        key = keys.changefeed_info_key(self.cluster_id, info.id)
        return self._fenced(f"update changefeed {info.id}", fence, [Compare(key, "mod", "=", expected_mod)],
                            [Op.put(key, self._info_json(info))])

    def request_table_copies(self, cf: str, tables: Sequence[tuple[str, int]], reason: str, now: float,
                             fence: Sequence[Compare] = (), attempts: int = 20,
                             oids: Mapping[str, int] | None = None) -> tuple[TableCopy, ...]:
        """Add a :class:`cdc.model.TableCopy` for each ``(schema.table, span)`` to changefeed ``cf`` (compare-and-
        swap, retried on conflicts); return them. ``oids``: the tables' relation oids where known.
        ``ChangefeedNotFound`` if it is gone."""
        for _ in range(attempts):
            entry = self.get_changefeed(cf)
            if entry is None:
                raise ChangefeedNotFound(f"changefeed {cf} does not exist")
            info = entry.value
            seq = info.table_copy_seq
            added = []
            for table, span in tables:
                seq += 1
                added.append(TableCopy(table, span, seq, reason, now, (oids or {}).get(table, 0)))
            new = replace(info, table_copies=(*info.table_copies, *added), table_copy_seq=seq)
            if self.update_changefeed(new, entry.mod_revision, fence):
                return tuple(added)
        raise MetaStoreError(f"changefeed {cf}: the table copy request kept conflicting with other updates; retry")

    def cancel_table_copy(self, cf: str, request: int, fence: Sequence[Compare] = (), attempts: int = 20) -> bool:
        """Drop table copy ``request`` of ``cf`` if no span has taken it up yet (it is still listed); True if it
        was dropped now."""
        for _ in range(attempts):
            entry = self.get_changefeed(cf)
            if entry is None:
                return False
            info = entry.value
            left = tuple(c for c in info.table_copies if c.request != request)
            if len(left) == len(info.table_copies):
                return False
            if self.update_changefeed(replace(info, table_copies=left), entry.mod_revision, fence):
                return True
        raise MetaStoreError(f"changefeed {cf}: cancelling table copy {request} kept conflicting; retry")

    def delete_changefeed(self, cf: str, fence: Sequence[Compare] = ()) -> None:
        """Delete every key of the changefeed (info, status, assignments, span statuses, schema histories,
        snapshot copy progress) atomically."""
        self._fenced(f"delete changefeed {cf}", fence, [], [
            Op.delete(keys.changefeed_info_key(self.cluster_id, cf)),
            Op.delete(keys.changefeed_status_key(self.cluster_id, cf)),
            Op.delete(keys.hold_key(self.cluster_id, cf)),
            Op.delete_prefix(keys.verify_prefix(self.cluster_id, cf)),
            Op.delete_prefix(keys.assignment_prefix(self.cluster_id, cf)),
            Op.delete_prefix(keys.span_status_prefix(self.cluster_id, cf)),
            Op.delete_prefix(keys.schema_history_prefix(self.cluster_id, cf)),
            Op.delete_prefix(keys.snapshot_prefix(self.cluster_id, cf))])

    # ---- verify holds (changefeed verify; docs/verify.md)
    def put_hold(self, cf: str, hold: VerifyHold) -> bool:
        """Store ``hold`` as the changefeed's only hold: when there is none, or the one there has the same id (its next
        phase, a new deadline), or has expired by its own deadline. False: the changefeed is gone, or another live
        verification holds it."""
        key = keys.hold_key(self.cluster_id, cf)
        kv = self.client.get(key)
        present = None if kv is None else _decode(VerifyHold, kv)
        if present is not None and present.id != hold.id and present.active(time.time()):
            return False
        guard = [Compare.absent(key)] if kv is None else [Compare(key, "mod", "=", kv.mod_revision)]
        return self.client.txn([Compare.exists(keys.changefeed_info_key(self.cluster_id, cf)), *guard],
                               [Op.put(key, serde.to_json(hold))])

    def get_hold(self, cf: str) -> VerifyHold | None:
        kv = self.client.get(keys.hold_key(self.cluster_id, cf))
        return None if kv is None else _decode(VerifyHold, kv)

    def release_hold(self, cf: str, hold_id: int) -> bool:
        """Delete the changefeed's hold if it is still hold ``hold_id`` (a later verification's stays)."""
        key = keys.hold_key(self.cluster_id, cf)
        kv = self.client.get(key)
        if kv is None or _decode(VerifyHold, kv).id != hold_id:
            return False
        return self.client.txn([Compare(key, "mod", "=", kv.mod_revision)], [Op.delete(key)])

    def put_verify_run(self, cf: str, run: VerifyRun) -> None:
        """Store a verify job's state (the launching capture, then the job itself)."""
        self.client.put(keys.verify_run_key(self.cluster_id, cf, run.id), serde.to_json(run))

    def list_verify_runs(self, cf: str) -> list[VerifyRun]:
        """The changefeed's verify runs, oldest first."""
        _, kvs = self.client.get_prefix(keys.verify_prefix(self.cluster_id, cf))
        return sorted((_decode(VerifyRun, kv) for kv in kvs), key=lambda r: r.started)

    def get_verify_run(self, cf: str, run: str) -> VerifyRun | None:
        kv = self.client.get(keys.verify_run_key(self.cluster_id, cf, run))
        return None if kv is None else _decode(VerifyRun, kv)

    # ---- schema history (processors)
    def get_schema_histories(self, cf: str) -> dict[int, SchemaHistory]:
        """Every table's schema history of changefeed ``cf``, by table oid."""
        _, kvs = self.client.get_prefix(keys.schema_history_prefix(self.cluster_id, cf))
        return {keys.parse_key(kv.key).relid: _decode(SchemaHistory, kv) for kv in kvs}

    def get_schema_history(self, cf: str, relid: int) -> SchemaHistory | None:
        kv = self.client.get(keys.schema_history_key(self.cluster_id, cf, relid))
        return None if kv is None else _decode(SchemaHistory, kv)

    def put_schema_histories(self, cf: str, histories: Sequence[SchemaHistory]) -> None:
        """Store (or, when :attr:`SchemaHistory.gone`, delete) tables' histories, 64 per etcd transaction; only
        while the changefeed exists (a removed changefeed's processor must not leave keys behind)."""
        exists = [Compare.exists(keys.changefeed_info_key(self.cluster_id, cf))]
        for i in range(0, len(histories), SCHEMA_HISTORIES_PER_TXN):
            ops = []
            for h in histories[i:i + SCHEMA_HISTORIES_PER_TXN]:
                key = keys.schema_history_key(self.cluster_id, cf, h.relid)
                ops.append(Op.delete(key) if h.gone else Op.put(key, serde.to_json(h)))
            self.client.commit(exists, ops)

    # ---- changefeed status (owner)
    def get_status(self, cf: str) -> Versioned[ChangefeedStatus] | None:
        kv = self.client.get(keys.changefeed_status_key(self.cluster_id, cf))
        return None if kv is None else Versioned(_decode(ChangefeedStatus, kv), kv.mod_revision)

    def put_status(self, cf: str, status: ChangefeedStatus, fence: Sequence[Compare] = ()) -> int:
        """Write the global status; returns the etcd revision of the write. ``ChangefeedNotFound`` if the
        changefeed is gone (never resurrects keys of a removed changefeed); ``NotOwner`` if ``fence`` fails."""
        info_key = keys.changefeed_info_key(self.cluster_id, cf)
        revision = self._fenced_commit(f"put status of {cf}", fence, [Compare.exists(info_key)],
                                       [Op.put(keys.changefeed_status_key(self.cluster_id, cf), serde.to_json(status))])
        if not revision:
            raise ChangefeedNotFound(f"changefeed {cf} does not exist")
        return revision

    # ---- span assignments (owner)
    def put_assignment(self, cf: str, span: int, assignment: SpanAssignment,
                       fence: Sequence[Compare] = ()) -> None:
        """Assign a span. ``ChangefeedNotFound`` if the changefeed is gone; ``NotOwner`` if ``fence`` fails."""
        info_key = keys.changefeed_info_key(self.cluster_id, cf)
        if not self._fenced(f"assign span {cf}/{span}", fence, [Compare.exists(info_key)],
                            [Op.put(keys.assignment_key(self.cluster_id, cf, span), serde.to_json(assignment))]):
            raise ChangefeedNotFound(f"changefeed {cf} does not exist")

    def delete_assignment(self, cf: str, span: int, fence: Sequence[Compare] = ()) -> None:
        """Unassign a span (its processor stops writing: its guard no longer holds)."""
        self._fenced(f"unassign span {cf}/{span}", fence, [],
                     [Op.delete(keys.assignment_key(self.cluster_id, cf, span))])

    def get_assignments(self, cf: str) -> dict[int, SpanAssignment]:
        _, kvs = self.client.get_prefix(keys.assignment_prefix(self.cluster_id, cf))
        return {keys.parse_key(kv.key).span: _decode(SpanAssignment, kv) for kv in kvs}

    # ---- span status (processor)
    def processor_guard(self, cf: str, span: int, assignment: SpanAssignment,
                        capture_lease: int = 0) -> list[Compare]:
        """Compares for a processor's span-status writes: the span is still assigned exactly as
        ``assignment`` (same capture, same epoch) and, if ``capture_lease`` is given, the capture's
        registration is still alive under that lease."""
        guard = [Compare(keys.assignment_key(self.cluster_id, cf, span), "value", "=", serde.to_json(assignment))]
        if capture_lease:
            guard.append(Compare(keys.capture_key(self.cluster_id, assignment.capture_id), "lease", "=",
                                 capture_lease))
        return guard

    def get_span_status(self, cf: str, span: int) -> Versioned[SpanStatus] | None:
        kv = self.client.get(keys.span_status_key(self.cluster_id, cf, span))
        return None if kv is None else Versioned(_decode(SpanStatus, kv), kv.mod_revision)

    def put_span_status(self, cf: str, span: int, status: SpanStatus, expected: Sequence[Compare] = ()) -> bool:
        """Write a span's status if every ``expected`` compare holds (see :meth:`processor_guard`).
        The key is not leased: a span's checkpoint survives its capture. False if ``expected`` failed."""
        return self.client.txn(list(expected),
                               [Op.put(keys.span_status_key(self.cluster_id, cf, span), serde.to_json(status))])

    def put_span_statuses(self, writes: Sequence[SpanStatusWrite]) -> list[bool]:
        """Write several span statuses, each only if its own guard holds; returns one flag per write.

        Coalesced: up to ``SPAN_STATUSES_PER_TXN`` writes go into one etcd transaction with the union of
        their guards (identical compares, e.g. the capture's lease, appear once). When that transaction's
        compares fail, its writes are retried one transaction each, so a write whose guard holds is
        still stored and the flags say exactly which guards failed. Writes to one span must not repeat
        within a call (etcd refuses a transaction that puts one key twice). Not atomic across writes."""
        out: list[bool] = []
        for i in range(0, len(writes), SPAN_STATUSES_PER_TXN):
            chunk = writes[i:i + SPAN_STATUSES_PER_TXN]
            if len(chunk) > 1:
                compares = list(dict.fromkeys(c for w in chunk for c in w.guard))
                ops = [Op.put(keys.span_status_key(self.cluster_id, w.cf, w.span), serde.to_json(w.status))
                       for w in chunk]
                if self.client.txn(compares, ops):
                    out.extend(True for _ in chunk)
                    continue
            out.extend(self.put_span_status(w.cf, w.span, w.status, w.guard) for w in chunk)
        return out

    # ---- whole cluster
    def snapshot(self) -> ClusterSnapshot:
        """Read and decode every key of the cluster at one revision. Keys under the cluster prefix that
        this version does not know are skipped (logged at debug); corrupt values raise MetaStoreError."""
        prefix = keys.cluster_prefix(self.cluster_id)
        revision, kvs = self.client.get_prefix(prefix, below=f"{prefix}{keys.SCHEMA}/")
        snap = ClusterSnapshot(revision=revision)
        for kv in kvs:
            try:
                k = keys.parse_key(kv.key)
            except ValueError:
                log.debug("snapshot: skipping unknown key %s", kv.key)
                continue
            if k.cluster != self.cluster_id:  # cannot happen for keys under our prefix
                continue
            snap.mod_revisions[kv.key] = kv.mod_revision
            if k.kind is KeyKind.CAPTURE:
                cap = _decode(CaptureInfo, kv)
                snap.captures[k.capture] = cap
                snap.capture_leases[k.capture] = kv.lease
            elif k.kind is KeyKind.OWNER:
                snap.owner_candidates.append(OwnerCandidate(k.owner_lease, kv.value.decode("utf-8", "replace"),
                                                            kv.create_revision))
            elif k.kind is KeyKind.CHANGEFEED_INFO:
                info = self._info(kv)
                if info.id != k.changefeed:
                    raise MetaStoreError(f"corrupt ChangefeedInfo at etcd key {kv.key}: id {info.id!r}")
                snap.changefeeds[k.changefeed] = Versioned(info, kv.mod_revision)
            elif k.kind is KeyKind.CHANGEFEED_STATUS:
                snap.statuses[k.changefeed] = _decode(ChangefeedStatus, kv)
            elif k.kind is KeyKind.SPAN_ASSIGNMENT:
                snap.assignments.setdefault(k.changefeed, {})[k.span] = _decode(SpanAssignment, kv)
            elif k.kind is KeyKind.SPAN_STATUS:
                snap.span_statuses.setdefault(k.changefeed, {})[k.span] = _decode(SpanStatus, kv)
            elif k.kind is KeyKind.CHANGEFEED_HOLD:
                snap.holds[k.changefeed] = _decode(VerifyHold, kv)
        snap.owner_candidates.sort(key=lambda c: c.create_revision)
        return snap

    def watch(self, start_revision: int | None, callback: Callable[[WatchResponse], None],
              on_error: Callable[[MetaStoreError], None] | None = None) -> Watch:
        """Watch every key of the cluster from ``start_revision`` (typically ``snapshot().revision + 1``);
        same guarantees as :meth:`EtcdClient.watch_prefix`. Decode event keys with ``keys.parse_key``."""
        return self.client.watch_prefix(keys.cluster_prefix(self.cluster_id), start_revision, callback, on_error)
