"""pgoutput messages built byte by byte (PostgreSQL's proto.c layout), independent of our decoder.

Shared by the decoder's unit tests and by tests that feed a puller hand-made replication traffic.
"""

from __future__ import annotations

import struct
from typing import Any

from cdc.events import UNCHANGED

TS_US = 817_000_000_123_456  # 2025-11-21-ish in PostgreSQL microseconds
TS_UNIX = 946_684_800 + 817_000_000.123456


def cstr(s: str) -> bytes:
    return s.encode() + b"\0"


def xid_part(xid: int | None) -> bytes:
    return b"" if xid is None else struct.pack(">I", xid)


def enc_begin(final_lsn: int, ts: int, xid: int) -> bytes:
    return b"B" + struct.pack(">QqI", final_lsn, ts, xid)


def enc_commit(flags: int, lsn: int, end: int, ts: int) -> bytes:
    return b"C" + struct.pack(">BQQq", flags, lsn, end, ts)


def enc_origin(lsn: int, name: str) -> bytes:
    return b"O" + struct.pack(">Q", lsn) + cstr(name)


def enc_relation(xid: int | None, relid: int, nsp: str, name: str, ident: str, cols: list[tuple]) -> bytes:
    out = b"R" + xid_part(xid) + struct.pack(">I", relid) + cstr(nsp) + cstr(name) + ident.encode()
    out += struct.pack(">H", len(cols))
    for flags, cname, oid, typmod in cols:
        out += bytes([flags]) + cstr(cname) + struct.pack(">Ii", oid, typmod)
    return out


def enc_type(xid: int | None, oid: int, nsp: str, name: str) -> bytes:
    return b"Y" + xid_part(xid) + struct.pack(">I", oid) + cstr(nsp) + cstr(name)


def enc_message(xid: int | None, flags: int, lsn: int, prefix: str, content: bytes) -> bytes:
    return (
        b"M" + xid_part(xid) + struct.pack(">BQ", flags, lsn) + cstr(prefix)
        + struct.pack(">i", len(content)) + content
    )  # fmt: skip


def enc_tuple(values: list[Any]) -> bytes:
    out = struct.pack(">H", len(values))
    for v in values:
        if v is None:
            out += b"n"
        elif v is UNCHANGED:
            out += b"u"
        elif isinstance(v, str):
            b = v.encode()
            out += b"t" + struct.pack(">i", len(b)) + b
        else:
            out += b"b" + struct.pack(">i", len(v)) + bytes(v)
    return out


def enc_insert(xid: int | None, relid: int, new: list[Any]) -> bytes:
    return b"I" + xid_part(xid) + struct.pack(">I", relid) + b"N" + enc_tuple(new)


def enc_update(
    xid: int | None, relid: int, new: list[Any], old: list[Any] | None = None, old_kind: str = "K"
) -> bytes:
    out = b"U" + xid_part(xid) + struct.pack(">I", relid)
    if old is not None:
        out += old_kind.encode() + enc_tuple(old)
    return out + b"N" + enc_tuple(new)


def enc_delete(xid: int | None, relid: int, old: list[Any], old_kind: str = "K") -> bytes:
    return b"D" + xid_part(xid) + struct.pack(">I", relid) + old_kind.encode() + enc_tuple(old)


def enc_truncate(xid: int | None, options: int, relids: list[int]) -> bytes:
    return (
        b"T"
        + xid_part(xid)
        + struct.pack(">iB", len(relids), options)
        + b"".join(struct.pack(">I", r) for r in relids)
    )


def enc_stream_start(xid: int, first: bool) -> bytes:
    return b"S" + struct.pack(">IB", xid, 1 if first else 0)


def enc_stream_commit(xid: int, flags: int, lsn: int, end: int, ts: int) -> bytes:
    return b"c" + struct.pack(">IBQQq", xid, flags, lsn, end, ts)


def enc_stream_abort(xid: int, subxid: int, lsn: int | None = None, ts: int | None = None) -> bytes:
    out = b"A" + struct.pack(">II", xid, subxid)
    if lsn is not None:
        assert ts is not None
        out += struct.pack(">Qq", lsn, ts)
    return out


def strip_xid(msg: bytes) -> bytes:
    return msg[:1] + msg[5:]


class WireStream:
    """A ``ReplicationStream`` stand-in that yields what ``ReplicationStream.messages`` yields for the given wire
    messages (Begin and Commit raw, everything else decoded; ``Keepalive`` objects as they are), then ends. Given the
    span source's ``prefixes``, it routes the plain changes as the real stream does (``walread.Router``, the Python
    reference of the C reader: runs of stored changes of the relations in ``prefixes``, the others dropped, a
    malformed one raw); ``route=False``: each raw, as a stream that does not route. Picklable (module level): a span
    source built on it can run in a process of its own (``processor.source_process``).

    ``idle_after_commit``: the stream's idle mark (``None``: everything received is read) after each Commit, as a
    reader that keeps up with the walsender sees it (the default); False: none at all, the wire read in one go (a
    catch-up). ``None`` items of ``wire`` are yielded as they are (an idle mark where the test puts one)."""

    publication = "tidewater_pub_cf_0"

    def __init__(self, wire: list[Any], raw_begin_commit: bool = True, idle_after_commit: bool = True,
                 route: bool = True, run_rows: int = 1024) -> None:
        self.wire = wire
        self.raw_begin_commit = raw_begin_commit  # Begin/Commit raw, as ReplicationStream yields them (else decoded)
        self.idle_after_commit = idle_after_commit
        self.route = route
        self.run_rows = run_rows

    def open(self) -> None: ...

    def close(self) -> None: ...

    def ack(self, lsn: int) -> None: ...

    def messages(self, stop: Any, prefixes: Any = None) -> Any:
        from upstream.postgres import pgoutput, pgoutput_messages, walread
        from upstream.postgres.stream import Keepalive

        router = walread.Router() if prefixes is not None and self.route else None
        out: list[Any] = []
        state = {"in_stream": False}

        def given(item: Any) -> Any:
            """What the real stream makes of a drained item."""
            if type(item) is list:
                return item
            first = item[0]
            if not state["in_stream"] and (first in pgoutput.PLAIN_CHANGE_TYPES or (
                    self.raw_begin_commit and first in (pgoutput.BEGIN, pgoutput.COMMIT))):
                return item
            m = pgoutput.decode(item, state["in_stream"])
            if isinstance(m, pgoutput_messages.StreamStart):
                state["in_stream"] = True
            elif isinstance(m, pgoutput_messages.StreamStop):
                state["in_stream"] = False
            return m

        def flush() -> Any:
            if router is not None:
                router.end_run()
            items = out[:]
            out.clear()
            for item in items:
                yield given(item)

        for w in self.wire:
            if w is None or isinstance(w, Keepalive):
                yield from flush()
                yield w
                continue
            idle = self.idle_after_commit and not state["in_stream"] and w[0] == pgoutput.COMMIT
            if router is None:
                out.append(w)
            else:  # (a run is handed over once something follows it: the router appends to the open one)
                router.put(w, out, prefixes, self.run_rows)
            if idle or (out and type(out[-1]) is not list):
                yield from flush()
            if idle:
                yield None
        yield from flush()


def no_catalog() -> None:
    """A span source's catalog connection factory for tests without a server (picklable, unlike a lambda)."""
    return None
