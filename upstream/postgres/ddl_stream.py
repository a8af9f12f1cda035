"""Schema changes in the span's stream: what the source stores for a ``tidewater.ddl`` message, and back.

The DDL event trigger (``sql/10_ddl.sql``) emits, inside the DDL's transaction and at its WAL position, a
transactional logical message with prefix :data:`PREFIX` and a JSON document describing the command and the
table after it (:mod:`upstream.postgres.ddl_decode` reads it). The span source stores it in the sorter, in
its transaction, as an ``upstream.base.SCHEMA_CHANGE`` payload whose raw part is :func:`pack`: the schema
version the table had just before the DDL in this stream (0: none seen yet), the DDL's sequence number in its
transaction (``cdc.events.DdlEvent.seq``: its position among all the transaction's ``tidewater.ddl`` messages, which
every span sees, so the same in every span), whether that number is local to the span (``DdlEvent.seq_local``), and
the message content. The decoder turns it into ``DdlEvent`` s once the transaction's commit
Ts is known (:func:`events`).

Guarantees: :func:`about` and :func:`unpack` are pure and raise ``DecodeError`` on malformed input.
"""

from __future__ import annotations

import dataclasses
import json
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cdc.errors import DdlRejected, DecodeError
from cdc.events import DdlEvent, TableName, TableSchema
from cdc.model import DataWarning, WarningSeverity
from upstream.postgres import ddl_decode

PREFIX = "tidewater.ddl"
CODE_NOT_CAPTURED = "CDC:WarnDdlNotCaptured"

_HEAD = struct.Struct(">IIB")  # before version, seq, seq is local to the span


@dataclass(frozen=True, slots=True)
class About:
    """What the source needs to know of a DDL message before storing it: the table (oid and name; 0 when the
    command concerns no table) or the trigger's error."""

    relid: int
    table: TableName
    error: str | None = None
    query: str = ""
    joined: tuple[str, ...] = ()  # span publications the table joined in this DDL's transaction (CREATE TABLE)

    def warning(self, now: float) -> DataWarning:
        return DataWarning(
            CODE_NOT_CAPTURED, str(self.table) if self.relid else "",
            f"a schema change upstream could not be described by Tidewater's DDL trigger ({self.error}); the "
            f"statement was: {self.query[:300]!r}. The downstream schema may now differ: compare it with the "
            f"upstream and apply the change there by hand, then resume the changefeed",
            WarningSeverity.DIVERGENCE, first_time=now, last_time=now)


def about(content: bytes) -> About:
    try:
        doc: Any = json.loads(content)
        if not isinstance(doc, dict):
            raise ValueError("not an object")
        table = ddl_decode.message_table(doc)
        error = doc.get("error")
        query = str(doc.get("query") or "")
        if table is None:
            return About(0, TableName("", ""), str(error) if error else None, query)
        relid, name = table
        joined = tuple(str(p) for p in doc.get("joined") or ())
        return About(relid, name, str(error) if error else None, query, joined)
    except (ValueError, KeyError, TypeError) as e:
        raise DecodeError(f"malformed {PREFIX} message ({e}): {bytes(content[:200])!r}") from e


def after(content: bytes) -> TableSchema | None:
    """The table as a DDL message describes it after the command (None: a drop, an error, a relation that is
    not a replicated table, or a message that cannot be read: the caller then reads the catalog)."""
    try:
        doc: Any = json.loads(content)
        t = doc.get("table") if isinstance(doc, dict) and not doc.get("error") else None
        if not t or t["relkind"] not in ("r", "p") or t["persistence"] == "t" or t["is_partition"]:
            return None
        return ddl_decode.table_schema(t)
    except (ValueError, KeyError, TypeError, IndexError, DecodeError):
        return None


def pack(before_version: int, seq: int, content: bytes, *, local: bool = False) -> bytes:
    """The stored form (module docstring). ``local``: ``seq`` is unique only within the span (``DdlEvent.seq_local``).
    The sorter is cleared when a span starts, so the form never outlives the process that wrote it."""
    if seq > 0x7FFF_FFFF:  # (the record's seq column downstream is a 32-bit integer)
        raise DecodeError(f"more than {0x7FFF_FFFF} schema changes in one transaction")
    return _HEAD.pack(before_version, seq, 1 if local else 0) + content


def unpack(raw: bytes) -> tuple[int, int, bool, bytes]:
    """(schema version before, seq, seq is local to the span, message content)."""
    if len(raw) < _HEAD.size:
        raise DecodeError(f"stored schema change too short ({len(raw)} bytes)")
    before, seq, local = _HEAD.unpack_from(raw)
    return before, seq, bool(local), raw[_HEAD.size:]


def fallback(relid: int, table: TableName, after_version: int) -> bytes:
    """The stored form of a schema change seen only as a new Relation message (no DDL message came)."""
    return json.dumps({"v": 1, "fallback": {"oid": relid, "schema": table.schema, "table": table.table,
                                            "after_version": after_version}}).encode()


def events(content: bytes, before: TableSchema | None, commit_ts: int, commit_time: float, seq: int, *,
           schemas: Callable[[int], TableSchema] | None = None, local: bool = False) -> list[DdlEvent]:
    """The DDL events of one stored message (``ddl_decode``), for a transaction committed at ``commit_ts``;
    ``local``: their ``seq`` orders nothing across spans (``DdlEvent.seq_local``).

    A change the stream cannot compare (no earlier schema of the table in it) raises ``DdlRejected`` naming the
    statement, table and commit Ts: the operator applies it downstream by hand and skips it
    (``--skip-ddl-ts``), as for any DDL the target rejects."""
    try:
        doc = json.loads(content)
        if isinstance(doc, dict) and doc.get("fallback"):
            if schemas is None or before is None:
                raise DecodeError("a schema change from Relation messages needs both schema versions")
            out = ddl_decode.from_relations(before, schemas(int(doc["fallback"]["after_version"])),
                                            commit_ts=commit_ts, commit_time=commit_time, seq=seq)
        else:
            out = ddl_decode.decode(content, before, commit_ts=commit_ts, commit_time=commit_time, seq=seq)
        return [dataclasses.replace(ev, seq_local=True) for ev in out] if local else out
    except (ddl_decode.UnknownBefore, ddl_decode.ValuesRewritten, ddl_decode.Ambiguous) as e:
        doc = json.loads(content)
        t = ddl_decode.message_table({"table": doc["fallback"]} if doc.get("fallback") else doc)
        raise DdlRejected(str(doc.get("query") or ""), str(t[1]) if t else "?",
                          f"{e.message}; apply it downstream by hand (USING: copy the table again), then skip it", commit_ts=commit_ts) from e
