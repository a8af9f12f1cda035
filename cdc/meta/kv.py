"""The values of etcd's KV API as Tidewater's own small vocabulary: :class:`KV`, :class:`Compare`, :class:`Op`,
:class:`TxnResult`, :class:`WatchEvent`, :class:`WatchResponse` (each ``to_rpc`` builds the ``etcd3`` request
message; nothing of ``etcd3`` appears in their fields). :mod:`cdc.meta.etcd` (the client) takes and returns them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import etcd3.etcdrpc as rpc


@dataclass(frozen=True)
class KV:
    """One key-value pair as stored in etcd (revisions are etcd's cluster-wide revisions)."""

    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    lease: int
    version: int = 0


CompareTarget = Literal["mod", "create", "version", "value", "lease"]
CompareOp = Literal["=", "!=", "<", ">"]

_TARGETS = {
    "mod": rpc.Compare.MOD,
    "create": rpc.Compare.CREATE,
    "version": rpc.Compare.VERSION,
    "value": rpc.Compare.VALUE,
    "lease": rpc.Compare.LEASE,
}
_RESULTS = {
    "=": rpc.Compare.EQUAL,
    "!=": rpc.Compare.NOT_EQUAL,
    "<": rpc.Compare.LESS,
    ">": rpc.Compare.GREATER,
}


@dataclass(frozen=True)
class Compare:
    """A transaction condition: ``<target of key> <op> <value>``; with ``prefix``, it must hold for every key under
    ``key`` (etcd's range compare; it holds when there is none).

    A missing key compares as create = mod = version = lease = 0 and never equals any ``value``.
    """

    key: str
    target: CompareTarget
    op: CompareOp
    value: int | bytes
    prefix: bool = False

    def __post_init__(self) -> None:
        if self.target not in _TARGETS:
            raise ValueError(f"bad compare target {self.target!r}")
        if self.op not in _RESULTS:
            raise ValueError(f"bad compare op {self.op!r}")
        if (self.target == "value") != isinstance(self.value, bytes):
            raise ValueError(f"compare on {self.target} needs {'bytes' if self.target == 'value' else 'int'}")

    @staticmethod
    def absent(key: str) -> Compare:
        return Compare(key, "create", "=", 0)

    @staticmethod
    def exists(key: str) -> Compare:
        return Compare(key, "create", ">", 0)

    @staticmethod
    def unchanged_since(prefix: str, revision: int) -> Compare:
        """No key under ``prefix`` was put after ``revision`` (deletions are not seen)."""
        return Compare(prefix, "mod", "<", revision + 1, prefix=True)

    def to_rpc(self) -> Any:
        c = rpc.Compare(key=self.key.encode(), target=_TARGETS[self.target], result=_RESULTS[self.op])
        if self.prefix:
            c.range_end = prefix_range_end(self.key.encode())
        if self.target == "value":
            c.value = self.value  # type: ignore[assignment]
        else:
            setattr(c, {"mod": "mod_revision", "create": "create_revision", "version": "version",
                        "lease": "lease"}[self.target], int(self.value))
        return c


@dataclass(frozen=True)
class Op:
    """A transaction operation: put a key, delete a key, every key under a prefix, or every key in ``[key, end)``."""

    kind: Literal["put", "delete"]
    key: str
    value: bytes = b""
    lease: int = 0
    prefix: bool = False
    end: str = ""

    @staticmethod
    def put(key: str, value: bytes, lease: int = 0) -> Op:
        return Op("put", key, value, lease)

    @staticmethod
    def delete(key: str) -> Op:
        return Op("delete", key)

    @staticmethod
    def delete_prefix(prefix: str) -> Op:
        if not prefix:
            raise ValueError("empty prefix")
        return Op("delete", prefix, prefix=True)

    @staticmethod
    def delete_range(start: str, end: str) -> Op:
        if not start < end:
            raise ValueError(f"empty key range [{start!r}, {end!r})")
        return Op("delete", start, end=end)

    def to_rpc(self) -> Any:
        key = self.key.encode()
        if self.kind == "put":
            return rpc.RequestOp(request_put=rpc.PutRequest(key=key, value=self.value, lease=self.lease))
        if self.kind == "delete":
            req = rpc.DeleteRangeRequest(key=key)
            if self.prefix:
                req.range_end = prefix_range_end(key)
            elif self.end:
                req.range_end = self.end.encode()
            return rpc.RequestOp(request_delete_range=req)
        raise ValueError(f"bad op kind {self.kind!r}")


@dataclass(frozen=True)
class TxnResult:
    succeeded: bool
    revision: int  # the store revision after the transaction (a barrier for watchers)


@dataclass(frozen=True)
class WatchEvent:
    """A put or delete. For a delete, ``kv.value`` is empty and ``kv.mod_revision`` is the deletion's."""

    type: Literal["put", "delete"]
    kv: KV


@dataclass(frozen=True)
class WatchResponse:
    """Events of one or more whole revisions, in revision order; empty for a progress notification."""

    revision: int
    events: list[WatchEvent]


def prefix_range_end(prefix: bytes) -> bytes:
    """The smallest key greater than every key starting with ``prefix``."""
    b = bytearray(prefix)
    while b:
        if b[-1] < 0xFF:
            b[-1] += 1
            return bytes(b)
        b.pop()
    return b"\0"  # every key
