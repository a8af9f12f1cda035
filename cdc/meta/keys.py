"""The one codec for every etcd key Tidewater writes (layout: docs/etcd-layout.md).

All keys of a cluster live under ``/tidewater/{cluster}/``::

    /tidewater/{cluster}/__cdc_meta__/capture/{capture_id}      CaptureInfo, under the capture's lease
    /tidewater/{cluster}/__cdc_meta__/owner/{lease_id:x}        election candidate, under its lease
    /tidewater/{cluster}/changefeed/info/{cf}                   ChangefeedInfo
    /tidewater/{cluster}/changefeed/status/{cf}                 ChangefeedStatus
    /tidewater/{cluster}/changefeed/assign/{cf}/{span}          SpanAssignment
    /tidewater/{cluster}/changefeed/span/{cf}/{span}            SpanStatus
    /tidewater/{cluster}/changefeed/hold/{cf}                   VerifyHold (changefeed verify)
    /tidewater/{cluster}/schema/{cf}/{relid}                    SchemaHistory (after every other key:
                                                                 MetaStore.snapshot() does not read it)
    /tidewater/{cluster}/snapshot/{cf}/{span}/run               cdc.snapshot.SnapshotRun (the job allowed to commit)
    /tidewater/{cluster}/snapshot/{cf}/{span}/{table}/plan      cdc.snapshot.TablePlan (the table's chunks)
    /tidewater/{cluster}/snapshot/{cf}/{span}/{table}/{chunk}   cdc.snapshot.ChunkDone (chunk copied)
    /tidewater/{cluster}/snapshot/{cf}/{span}/{table}/redone    cdc.snapshot.CopyRedone (rows of dropped plans)
    /tidewater/{cluster}/verify/{cf}/{run}                      VerifyRun (changefeed verify; not read by snapshot())

``{table}`` is ``schema.table`` with each part percent-encoded (``/``, ``.``, ``%`` and every other character
outside ``[A-Za-z0-9_-]``), so any PostgreSQL identifier fits in one segment and the dot is unambiguous.

Guarantees: ``parse_key(k.encode()) == k`` for every valid :class:`EtcdKey`, and ``parse_key`` accepts
only strings that ``encode`` could have produced (anything else raises ``ValueError``), so a key is never
misread as another kind. Pure functions, thread-safe, no I/O.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from urllib.parse import quote, unquote

from cdc.events import TableName

ROOT = "/tidewater"
META = "__cdc_meta__"
SCHEMA = "schema"  # sorts after "__cdc_meta__" and "changefeed": MetaStore.snapshot() reads up to it
SNAPSHOT = "snapshot"  # sorts after "schema": not read by MetaStore.snapshot() either
PLAN = "plan"
RUN = "run"
REDONE = "redone"
VERIFY = "verify"  # sorts after "snapshot": not read by MetaStore.snapshot() either

# Cluster and changefeed ids: letters/digits in dash-separated groups (TiCDC's rule).
_ID_RE = re.compile(r"^[a-zA-Z0-9]+(-[a-zA-Z0-9]+)*$")
# Capture ids are UUIDs in practice; allow a slightly wider but '/'-free alphabet.
_CAPTURE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]*$")
_SPAN_RE = re.compile(r"^(0|[1-9][0-9]*)$")
_LEASE_RE = re.compile(r"^[1-9a-f][0-9a-f]*$")
_RUN_RE = re.compile(r"^[a-f0-9]{1,32}$")


class KeyKind(enum.Enum):
    CAPTURE = "capture"
    OWNER = "owner"
    CHANGEFEED_INFO = "changefeed-info"
    CHANGEFEED_STATUS = "changefeed-status"
    SPAN_ASSIGNMENT = "span-assignment"
    SPAN_STATUS = "span-status"
    CHANGEFEED_HOLD = "changefeed-hold"
    SCHEMA_HISTORY = "schema-history"
    SNAPSHOT_PLAN = "snapshot-plan"
    SNAPSHOT_CHUNK = "snapshot-chunk"
    SNAPSHOT_RUN = "snapshot-run"
    SNAPSHOT_REDONE = "snapshot-redone"
    VERIFY_RUN = "verify-run"


_CF_KINDS = {
    KeyKind.CHANGEFEED_INFO: "info",
    KeyKind.CHANGEFEED_STATUS: "status",
    KeyKind.SPAN_ASSIGNMENT: "assign",
    KeyKind.SPAN_STATUS: "span",
    KeyKind.CHANGEFEED_HOLD: "hold",
}
_CF_KIND_BY_SEGMENT = {seg: kind for kind, seg in _CF_KINDS.items()}
_SPAN_KINDS = (KeyKind.SPAN_ASSIGNMENT, KeyKind.SPAN_STATUS)
_SNAPSHOT_KINDS = (KeyKind.SNAPSHOT_PLAN, KeyKind.SNAPSHOT_CHUNK, KeyKind.SNAPSHOT_REDONE)  # per table
_SNAPSHOT_ALL = (*_SNAPSHOT_KINDS, KeyKind.SNAPSHOT_RUN)
_TABLE_SEGMENT_RE = re.compile(r"^[A-Za-z0-9_%-]+\.[A-Za-z0-9_%-]+$")


def _quote_part(part: str) -> str:
    return quote(part, safe="").replace(".", "%2E").replace("~", "%7E")


def table_segment(table: TableName) -> str:
    """``table`` as one key segment: ``schema.table``, each part percent-encoded (see the module docstring)."""
    if not table.schema or not table.table:
        raise ValueError(f"table name {table!r} has an empty part")
    return f"{_quote_part(table.schema)}.{_quote_part(table.table)}"


def parse_table_segment(segment: str) -> TableName:
    """Inverse of :func:`table_segment`; ``ValueError`` for anything it cannot have produced."""
    if not _TABLE_SEGMENT_RE.match(segment):
        raise ValueError(f"bad table segment {segment!r}")
    schema, _, table = segment.partition(".")
    name = TableName(unquote(schema, errors="strict"), unquote(table, errors="strict"))
    if table_segment(name) != segment:
        raise ValueError(f"non-canonical table segment {segment!r}")
    return name


def _check_cluster(cluster: str) -> str:
    if not _ID_RE.match(cluster):
        raise ValueError(f"invalid cluster id {cluster!r}")
    return cluster


def _check_changefeed(cf: str) -> str:
    if not _ID_RE.match(cf):
        raise ValueError(f"invalid changefeed id {cf!r}")
    return cf


def _check_capture(capture: str) -> str:
    if not _CAPTURE_RE.match(capture):
        raise ValueError(f"invalid capture id {capture!r}")
    return capture


@dataclass(frozen=True)
class EtcdKey:
    """A typed etcd key. Only the fields relevant to ``kind`` may be set; the others keep defaults."""

    kind: KeyKind
    cluster: str
    changefeed: str = ""
    capture: str = ""
    span: int = -1
    owner_lease: int = 0
    relid: int = 0
    table: TableName | None = None
    chunk: int = -1
    run: str = ""

    def __post_init__(self) -> None:
        _check_cluster(self.cluster)
        kind = self.kind
        if kind is KeyKind.CAPTURE:
            _check_capture(self.capture)
        elif self.capture:
            raise ValueError(f"{kind.value} key takes no capture id")
        if kind is KeyKind.OWNER:
            if self.owner_lease <= 0:
                raise ValueError(f"owner key needs a positive lease id, got {self.owner_lease}")
        elif self.owner_lease:
            raise ValueError(f"{kind.value} key takes no owner lease")
        if kind is KeyKind.SCHEMA_HISTORY:
            if self.relid <= 0:
                raise ValueError(f"schema-history key needs a positive table oid, got {self.relid}")
        elif self.relid:
            raise ValueError(f"{kind.value} key takes no table oid")
        if kind is KeyKind.VERIFY_RUN:
            if not _RUN_RE.match(self.run):
                raise ValueError(f"verify-run key needs a run id of 1-32 lower-case hex digits, got {self.run!r}")
        elif self.run:
            raise ValueError(f"{kind.value} key takes no run id")
        if kind in _CF_KINDS or kind is KeyKind.SCHEMA_HISTORY or kind in _SNAPSHOT_ALL or kind is KeyKind.VERIFY_RUN:
            _check_changefeed(self.changefeed)
        elif self.changefeed:
            raise ValueError(f"{kind.value} key takes no changefeed id")
        if kind in _SNAPSHOT_KINDS:
            if self.table is None:
                raise ValueError(f"{kind.value} key needs a table")
            table_segment(self.table)
        elif self.table is not None:
            raise ValueError(f"{kind.value} key takes no table")
        if kind is KeyKind.SNAPSHOT_CHUNK:
            if self.chunk < 0:
                raise ValueError(f"snapshot-chunk key needs a chunk index >= 0, got {self.chunk}")
        elif self.chunk != -1:
            raise ValueError(f"{kind.value} key takes no chunk index")
        if kind in _SPAN_KINDS or kind in _SNAPSHOT_ALL:
            if self.span < 0:
                raise ValueError(f"{kind.value} key needs a span index >= 0, got {self.span}")
        elif self.span != -1:
            raise ValueError(f"{kind.value} key takes no span index")

    def encode(self) -> str:
        base = cluster_prefix(self.cluster)
        kind = self.kind
        if kind is KeyKind.CAPTURE:
            return f"{base}{META}/capture/{self.capture}"
        if kind is KeyKind.OWNER:
            return f"{base}{META}/owner/{self.owner_lease:x}"
        if kind is KeyKind.SCHEMA_HISTORY:
            return f"{base}{SCHEMA}/{self.changefeed}/{self.relid}"
        if kind is KeyKind.VERIFY_RUN:
            return f"{base}{VERIFY}/{self.changefeed}/{self.run}"
        if kind is KeyKind.SNAPSHOT_RUN:
            return f"{base}{SNAPSHOT}/{self.changefeed}/{self.span}/{RUN}"
        if kind in _SNAPSHOT_KINDS:
            assert self.table is not None
            last = {KeyKind.SNAPSHOT_PLAN: PLAN, KeyKind.SNAPSHOT_REDONE: REDONE}.get(kind) or str(self.chunk)
            return f"{base}{SNAPSHOT}/{self.changefeed}/{self.span}/{table_segment(self.table)}/{last}"
        seg = _CF_KINDS[kind]
        if kind in _SPAN_KINDS:
            return f"{base}changefeed/{seg}/{self.changefeed}/{self.span}"
        return f"{base}changefeed/{seg}/{self.changefeed}"

    def __str__(self) -> str:
        return self.encode()


def parse_key(key: str) -> EtcdKey:
    """Decode a raw etcd key. Raises ``ValueError`` for anything ``EtcdKey.encode`` cannot produce."""
    if not key.startswith(ROOT + "/"):
        raise ValueError(f"not a Tidewater key: {key!r}")
    parts = key[len(ROOT) + 1:].split("/")
    try:
        cluster = parts[0]
        if len(parts) == 4 and parts[1] == META:
            if parts[2] == "capture":
                return EtcdKey(KeyKind.CAPTURE, cluster, capture=parts[3])
            if parts[2] == "owner":
                if not _LEASE_RE.match(parts[3]):
                    raise ValueError(f"bad owner lease id {parts[3]!r}")
                return EtcdKey(KeyKind.OWNER, cluster, owner_lease=int(parts[3], 16))
        elif len(parts) == 4 and parts[1] == SCHEMA:
            if not _SPAN_RE.match(parts[3]):
                raise ValueError(f"bad table oid {parts[3]!r}")
            return EtcdKey(KeyKind.SCHEMA_HISTORY, cluster, changefeed=parts[2], relid=int(parts[3]))
        elif len(parts) == 4 and parts[1] == VERIFY:
            return EtcdKey(KeyKind.VERIFY_RUN, cluster, changefeed=parts[2], run=parts[3])
        elif len(parts) == 5 and parts[1] == SNAPSHOT and parts[4] == RUN:
            if not _SPAN_RE.match(parts[3]):
                raise ValueError(f"bad span index {parts[3]!r}")
            return EtcdKey(KeyKind.SNAPSHOT_RUN, cluster, changefeed=parts[2], span=int(parts[3]))
        elif len(parts) == 6 and parts[1] == SNAPSHOT:
            if not _SPAN_RE.match(parts[3]):
                raise ValueError(f"bad span index {parts[3]!r}")
            table = parse_table_segment(parts[4])
            if parts[5] in (PLAN, REDONE):
                kind = KeyKind.SNAPSHOT_PLAN if parts[5] == PLAN else KeyKind.SNAPSHOT_REDONE
                return EtcdKey(kind, cluster, changefeed=parts[2], span=int(parts[3]), table=table)
            if not _SPAN_RE.match(parts[5]):
                raise ValueError(f"bad chunk index {parts[5]!r}")
            return EtcdKey(KeyKind.SNAPSHOT_CHUNK, cluster, changefeed=parts[2], span=int(parts[3]), table=table,
                           chunk=int(parts[5]))
        elif len(parts) in (4, 5) and parts[1] == "changefeed":
            kind = _CF_KIND_BY_SEGMENT.get(parts[2])
            if kind is not None:
                if kind in _SPAN_KINDS and len(parts) == 5:
                    if not _SPAN_RE.match(parts[4]):
                        raise ValueError(f"bad span index {parts[4]!r}")
                    return EtcdKey(kind, cluster, changefeed=parts[3], span=int(parts[4]))
                if kind not in _SPAN_KINDS and len(parts) == 4:
                    return EtcdKey(kind, cluster, changefeed=parts[3])
    except ValueError as e:
        raise ValueError(f"malformed Tidewater key {key!r}: {e}") from None
    raise ValueError(f"unknown Tidewater key {key!r}")


# ---- prefixes (all end with '/', so a prefix never matches a longer id) ---------------------------------
def cluster_prefix(cluster: str) -> str:
    return f"{ROOT}/{_check_cluster(cluster)}/"


def meta_prefix(cluster: str) -> str:
    return f"{cluster_prefix(cluster)}{META}/"


def capture_prefix(cluster: str) -> str:
    return f"{meta_prefix(cluster)}capture/"


def owner_prefix(cluster: str) -> str:
    """The election prefix: candidates are ``owner_prefix + f"{lease:x}"``."""
    return f"{meta_prefix(cluster)}owner/"


def changefeed_prefix(cluster: str) -> str:
    return f"{cluster_prefix(cluster)}changefeed/"


def changefeed_info_prefix(cluster: str) -> str:
    return f"{changefeed_prefix(cluster)}info/"


def assignment_prefix(cluster: str, changefeed: str) -> str:
    """All span assignments of one changefeed."""
    return f"{changefeed_prefix(cluster)}assign/{_check_changefeed(changefeed)}/"


def span_status_prefix(cluster: str, changefeed: str) -> str:
    """All span statuses of one changefeed."""
    return f"{changefeed_prefix(cluster)}span/{_check_changefeed(changefeed)}/"


def schema_history_prefix(cluster: str, changefeed: str) -> str:
    """The schema histories of one changefeed's tables."""
    return f"{cluster_prefix(cluster)}{SCHEMA}/{_check_changefeed(changefeed)}/"


def schema_history_key(cluster: str, changefeed: str, relid: int) -> str:
    return EtcdKey(KeyKind.SCHEMA_HISTORY, cluster, changefeed=changefeed, relid=relid).encode()


def snapshot_prefix(cluster: str, changefeed: str, span: int | None = None) -> str:
    """The snapshot copy's keys of one changefeed, or of one of its spans."""
    base = f"{cluster_prefix(cluster)}{SNAPSHOT}/{_check_changefeed(changefeed)}/"
    if span is None:
        return base
    if span < 0:
        raise ValueError(f"span index must be >= 0, got {span}")
    return f"{base}{span}/"


def snapshot_table_prefix(cluster: str, changefeed: str, span: int, table: TableName) -> str:
    """The plan and chunk keys of one table of one span."""
    return f"{snapshot_prefix(cluster, changefeed, span)}{table_segment(table)}/"


def snapshot_run_key(cluster: str, changefeed: str, span: int) -> str:
    return EtcdKey(KeyKind.SNAPSHOT_RUN, cluster, changefeed=changefeed, span=span).encode()


def snapshot_plan_key(cluster: str, changefeed: str, span: int, table: TableName) -> str:
    return EtcdKey(KeyKind.SNAPSHOT_PLAN, cluster, changefeed=changefeed, span=span, table=table).encode()


def snapshot_chunk_key(cluster: str, changefeed: str, span: int, table: TableName, chunk: int) -> str:
    return EtcdKey(KeyKind.SNAPSHOT_CHUNK, cluster, changefeed=changefeed, span=span, table=table,
                   chunk=chunk).encode()


def snapshot_chunk_range(cluster: str, changefeed: str, span: int, table: TableName) -> tuple[str, str]:
    """``[start, end)`` holding every chunk key of one table and neither its plan nor its redone key (chunk
    indexes are decimal digits; ``:`` sorts right after ``9``, ``plan`` and ``redone`` after it)."""
    prefix = snapshot_table_prefix(cluster, changefeed, span, table)
    return f"{prefix}0", f"{prefix}:"


def snapshot_redone_key(cluster: str, changefeed: str, span: int, table: TableName) -> str:
    return EtcdKey(KeyKind.SNAPSHOT_REDONE, cluster, changefeed=changefeed, span=span, table=table).encode()


# ---- keys -------------------------------------------------------------------------------------------------
def capture_key(cluster: str, capture: str) -> str:
    return EtcdKey(KeyKind.CAPTURE, cluster, capture=capture).encode()


def owner_key(cluster: str, lease: int) -> str:
    return EtcdKey(KeyKind.OWNER, cluster, owner_lease=lease).encode()


def changefeed_info_key(cluster: str, changefeed: str) -> str:
    return EtcdKey(KeyKind.CHANGEFEED_INFO, cluster, changefeed=changefeed).encode()


def changefeed_status_key(cluster: str, changefeed: str) -> str:
    return EtcdKey(KeyKind.CHANGEFEED_STATUS, cluster, changefeed=changefeed).encode()


def verify_run_key(cluster: str, changefeed: str, run: str) -> str:
    return EtcdKey(KeyKind.VERIFY_RUN, cluster, changefeed=changefeed, run=run).encode()


def verify_prefix(cluster: str, changefeed: str) -> str:
    return f"{cluster_prefix(cluster)}{VERIFY}/{_check_changefeed(changefeed)}/"


def hold_key(cluster: str, changefeed: str) -> str:
    return EtcdKey(KeyKind.CHANGEFEED_HOLD, cluster, changefeed=changefeed).encode()


def assignment_key(cluster: str, changefeed: str, span: int) -> str:
    return EtcdKey(KeyKind.SPAN_ASSIGNMENT, cluster, changefeed=changefeed, span=span).encode()


def span_status_key(cluster: str, changefeed: str, span: int) -> str:
    return EtcdKey(KeyKind.SPAN_STATUS, cluster, changefeed=changefeed, span=span).encode()
