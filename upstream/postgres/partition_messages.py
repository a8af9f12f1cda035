"""Partition repair messages: rows that left or joined a published partitioned root, as row changes.

PostgreSQL streams nothing for a ``TRUNCATE`` of one partition of a root published via the root, for
``DETACH PARTITION``, for ``DROP`` of a partition, or for the rows a table already held when it was
``ATTACH``-ed. The triggers of ``upstream/postgres/sql/20_partitions.sql`` fill that gap: inside the
operation's own transaction, at its position in the WAL, they emit transactional logical messages with
prefix :data:`PREFIX` whose JSON content is::

    {"v": 1, "op": "delete" | "upsert" | "lost", "reason": "truncate" | "detach" | "drop" | "attach" | ...,
     "root_oid": "16397", "root": ["public", "m"], "replident": "d", "leaf": "public.m1",
     "columns": [["id", "23", -1, true], ...],      # name, type oid, typmod, identifies a row
     "rows": [["1", "2024-01-05"], ...]}            # text values (delete: identifying columns only)

(``lost``: no columns/rows, the rows could not be emitted — the changefeed must warn). :func:`parse` turns
one message into a :class:`RowsMessage`: a Relation message as pgoutput would send it for the root and the
row changes as the normalised Insert / Delete messages pgoutput would send, so that everything downstream of
the puller (sorter, mounter, sink, normalisation) handles them like any other change: an ``upsert`` is an
Insert (sinks apply inserts as upserts by key), a ``delete`` a Delete carrying the old key ('K') or, for
``REPLICA IDENTITY FULL``, the whole old row ('O'). Values are the types' text output under the settings
of Tidewater's stream (UTC, ISO), exactly what pgoutput sends.

Guarantees: :func:`parse` is pure; it raises :class:`DecodeError` for content that is not a well-formed
message of this format, never returns a partial one.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any

from cdc.errors import DecodeError
from cdc.events import TableName, TableSchema
from cdc.model import DataWarning, WarningSeverity
from upstream.postgres.pgoutput_messages import Relation, RelationColumn

PREFIX = "tidewater.rows"
CODE_LOST = "CDC:WarnPartitionRowsLost"

_U16 = struct.Struct(">H")
_I32 = struct.Struct(">i")
_REL = struct.Struct(">I")


@dataclass(frozen=True, slots=True)
class RowsMessage:
    """One decoded repair message. ``relation`` describes the root's columns as the ``changes`` encode
    them (None for ``lost``); ``changes`` are normalised pgoutput Insert/Delete messages of the root."""

    op: str
    reason: str
    root: TableName
    root_oid: int
    leaf: str
    relation: Relation | None
    changes: tuple[bytes, ...]

    def warning(self, now: float) -> DataWarning:
        """The divergence warning of a ``lost`` message (rows that left or joined ``root`` unreplicated)."""
        return DataWarning(
            CODE_LOST, str(self.root) if self.root_oid else "",
            f"rows of partition {self.leaf or '?'} of {self.root if self.root_oid else 'a published root'} changed "
            f"membership ({self.reason}) but could not be sent into the stream, so the downstream table of the root "
            f"differs from the upstream (rows of a dropped/detached/truncated partition still there, or an "
            f"attached partition's rows missing): repair it by hand or recreate the changefeed; a DROP that names "
            f"the partition (DROP TABLE p, not DROP OWNED) is repaired automatically",
            WarningSeverity.DIVERGENCE, first_time=now, last_time=now)


def _tuple(values: list[str | None]) -> bytes:
    out = [_U16.pack(len(values))]
    for v in values:
        if v is None:
            out.append(b"n")
        else:
            b = v.encode()
            out.append(b"t" + _I32.pack(len(b)) + b)
    return b"".join(out)


def parse(content: bytes) -> RowsMessage:
    """Decode the content of one :data:`PREFIX` logical message."""
    try:
        doc: Any = json.loads(content)
        op = doc["op"]
        if doc.get("v") != 1 or op not in ("delete", "upsert", "lost"):
            raise ValueError(f"unsupported version/op {doc.get('v')!r}/{op!r}")
        root_oid = int(doc.get("root_oid") or 0)
        root_parts = doc.get("root") or [None, None]
        root = TableName(root_parts[0] or "", root_parts[1] or "")
        reason = str(doc.get("reason", ""))
        leaf = str(doc.get("leaf") or "")
        if op == "lost":
            return RowsMessage(op, reason, root, root_oid, leaf, None, ())
        replident = str(doc["replident"])
        columns = [(str(c[0]), int(c[1]), int(c[2]), bool(c[3])) for c in doc["columns"]]
        rel = Relation(None, root_oid, root.schema, root.table, replident,
                       tuple(RelationColumn(1 if key else 0, name, oid, typmod) for name, oid, typmod, key in columns))
        relid = _REL.pack(root_oid)
        rows = doc["rows"]
        if op == "upsert":
            head = b"I" + relid + b"N"
            changes = tuple(head + _tuple(_checked(r, len(columns))) for r in rows)
        else:
            keys = [i for i, c in enumerate(columns) if c[3]]
            n = len(columns)
            head = b"D" + relid + (b"O" if replident == "f" else b"K")
            changes = tuple(head + _tuple(_spread(_checked(r, len(keys)), keys, n)) for r in rows)
        return RowsMessage(op, reason, root, root_oid, leaf, rel, changes)
    except DecodeError:
        raise
    except (ValueError, KeyError, TypeError, IndexError) as e:
        raise DecodeError(f"malformed {PREFIX} message ({e}): {bytes(content[:200])!r}") from e


def _checked(row: Any, n: int) -> list[str | None]:
    if not isinstance(row, list) or len(row) != n or not all(v is None or isinstance(v, str) for v in row):
        raise ValueError(f"a row must be a list of {n} strings or nulls, got {row!r}"[:200])
    return row


def _spread(values: list[str | None], positions: list[int], n: int) -> list[str | None]:
    out: list[str | None] = [None] * n
    for p, v in zip(positions, values, strict=True):
        out[p] = v
    return out


def same_columns(rel: Relation, schema: TableSchema) -> bool:
    """Whether tuples encoded for ``rel`` decode correctly with ``schema`` (same column names and types,
    same order): then the puller can file the repair changes under the schema version it already has."""
    cols = schema.columns
    return len(cols) == len(rel.columns) and all(
        c.name == r.name and c.type_oid == r.type_oid for c, r in zip(cols, rel.columns, strict=True))
