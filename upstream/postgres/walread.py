"""Reading a logical replication connection in batches: what :meth:`ReplicationStream.messages
<upstream.postgres.stream.ReplicationStream.messages>` drains per call.

A reader's ``drain(out, prefixes, limit, run_rows)`` appends to ``out`` everything received so far (at most ``limit``
messages), in stream order, and returns a status:

- the non-streamed Insert/Update/Delete messages of the relations in ``prefixes`` (relid -> the span source's
  stored-payload prefix, ``upstream.base.encode_payload(version, b"")``) as runs: lists of ``prefix + payload``, at
  most ``run_rows`` each; those of relations not in ``prefixes`` are dropped (the span does not carry them). With
  ``prefixes`` None they are not routed: each is its payload, as every other message;
- every other message as its payload ``bytes`` (Begin, Commit, a malformed change, everything of a streamed
  transaction, Relation, ...). The drain stops after any message that may change ``prefixes`` (all but Begin, Commit
  and the changes of a streamed transaction): the caller handles it before the next plain change is looked up;
- status :data:`IDLE`: everything received is in ``out`` (wait on the socket); :data:`MORE`: call again;
  :data:`REPLY`: a keepalive asked for an answer (send feedback, call again); :data:`END`, :data:`FAILED`,
  :data:`BAD`, :data:`CLOSED`: the stream ended, the connection failed, an unknown message arrived, or the connection
  was closed (by another thread: the C reader takes the connection's libpq handle again at each drain, so it never
  reads a closed one) (``ReplicationStream`` raises).

Two readers with the same items: :func:`native` (``walread.c``, libpq drained in C: no Python object but the items,
keepalives answered from the stream's loop) and :class:`PyReader` (psycopg2's ``read_message`` through
:class:`Router`, the reference). A reader also keeps ``wal_end`` (the server's WAL end last reported), ``in_txn``
(inside a non-streamed transaction) and ``in_stream``. ``TIDEWATER_WALREAD=python`` chooses :class:`PyReader`.
"""

from __future__ import annotations

import ctypes
import logging
import os
from pathlib import Path
from typing import Any, Protocol

from cdc import cbuild
from upstream.postgres import libpq

log = logging.getLogger(__name__)

IDLE, MORE, REPLY, END, FAILED, BAD, CLOSED = 0, 1, 2, -1, -2, -3, -4
_I, _U, _D = ord("I"), ord("U"), ord("D")
_CHANGES = (_I, _U, _D)
_FIRST_MARK = {_I: b"N", _U: b"NKO", _D: b"KO"}
_B, _C, _S, _E, _T = (ord(c) for c in "BCSET")


class Reader(Protocol):
    """What :meth:`ReplicationStream.messages` drains (the module docstring)."""

    wal_end: int
    in_txn: int
    in_stream: int
    received: int  # messages read so far

    def drain(self, out: list[Any], prefixes: dict[int, bytes] | None, limit: int, run_rows: int) -> int: ...


class Router:
    """The routing of one XLogData payload into ``out`` (the module docstring), in Python: the reference of
    ``walread.c``'s, used by :class:`PyReader` and by test streams."""

    __slots__ = ("in_stream", "in_txn", "_run")

    def __init__(self) -> None:
        self.in_stream = 0
        self.in_txn = 0
        self._run: list[bytes] | None = None

    def end_run(self) -> None:
        """The next routed change starts a new run (a drain call ended)."""
        self._run = None

    def put(self, d: bytes, out: list[Any], prefixes: dict[int, bytes] | None, run_rows: int) -> bool:
        """Route payload ``d``; True when the drain must stop after it."""
        first = d[0] if d else -1
        if (prefixes is not None and not self.in_stream and first in _CHANGES and len(d) >= 6
                and d[5] in _FIRST_MARK[first]):
            prefix = prefixes.get(int.from_bytes(d[1:5], "big"))
            if prefix is None:
                return False  # a relation the span does not carry
            if type(prefix) is not bytes:
                raise TypeError("drain: a prefix must be bytes")
            run = self._run
            if run is None or len(run) >= run_rows:
                run = self._run = []
                out.append(run)
            run.append(prefix + d)
            return False
        out.append(d)
        self._run = None
        if not self.in_stream:
            if first == _B:
                self.in_txn = 1
                return False
            if first == _C:
                self.in_txn = 0
                return False
            if first in _CHANGES and prefixes is None:
                return False
            if first == _S:
                self.in_stream = 1
        elif first == _E:
            self.in_stream = 0
        elif first in _CHANGES or first == _T:
            return False
        return True


class PyReader:
    """A reader over psycopg2's ``read_message`` (keepalives are answered by psycopg2 itself, so it never returns
    :data:`REPLY`; ``wal_end`` is the cursor's)."""

    def __init__(self, cursor: Any) -> None:
        self._cur = cursor
        self._router = Router()
        self.received = 0

    @property
    def wal_end(self) -> int:
        return int(self._cur.wal_end)

    @property
    def in_txn(self) -> int:
        return self._router.in_txn

    @property
    def in_stream(self) -> int:
        return self._router.in_stream

    def drain(self, out: list[Any], prefixes: dict[int, bytes] | None, limit: int, run_rows: int) -> int:
        router, read = self._router, self._cur.read_message
        router.end_run()
        for _ in range(limit):
            msg = read()
            if msg is None:
                return IDLE
            self.received += 1
            if router.put(msg.payload, out, prefixes, run_rows):
                return MORE
        return MORE


def _load(mod: Any) -> Any:
    return mod


_EXT = cbuild.Extension(Path(__file__).with_name("walread.c"), "upstream.postgres._walread", _load,
                        "the replication stream is read through psycopg2's read_message (more CPU per row)")


def native_module() -> Any | None:
    """The compiled module (``Reader``), built and loaded on first call; None when it cannot be here."""
    return _EXT.get()


def reader(conn: Any, cursor: Any) -> Reader:
    """A reader of the replication connection ``conn`` (psycopg2, replication started on ``cursor``): the C one when
    it is available and not switched off (``TIDEWATER_WALREAD=python``), else :class:`PyReader`."""
    if os.environ.get("TIDEWATER_WALREAD", "").lower() != "python":
        mod = native_module()
        pq = _libpq() if mod is not None else None
        if mod is not None and pq is not None:
            return mod.Reader(conn, *pq)  # type: ignore[no-any-return]
    return PyReader(cursor)


def _libpq() -> tuple[int, int, int] | None:
    """The addresses of PQgetCopyData, PQconsumeInput and PQfreemem in the libpq psycopg2 runs on."""
    lib = libpq.load()
    if lib is None:
        log.info("the replication stream is read through psycopg2's read_message: %s", libpq.why_not())
        return None
    return (libpq.address(lib, "PQgetCopyData"), libpq.address(lib, "PQconsumeInput"),
            libpq.address(lib, "PQfreemem"))


def failure_text(conn: Any, status: int) -> str:
    """Why a drain of ``conn`` returned :data:`END` (the server's error that ended the COPY, its results consumed)
    or :data:`FAILED` (libpq's connection error), as psycopg2 would have raised it."""
    lib = libpq.load()
    if lib is None:  # (a PyReader: psycopg2 raised it itself)
        return "the replication stream ended"
    if status == CLOSED or conn.pgconn_ptr is None:
        return "the replication connection was closed"
    pgconn = ctypes.c_void_p(conn.pgconn_ptr)
    text = b""
    if status == END:
        while True:
            res = lib.PQgetResult(pgconn)
            if not res:
                break
            text = text or (lib.PQresultErrorMessage(res) or b"")
            lib.PQclear(res)
    text = text or (lib.PQerrorMessage(pgconn) or b"")
    return " ".join(text.decode("utf-8", "replace").split()) or "the server ended the replication stream"


def wire_items(wire: list[Any], prefixes: dict[int, bytes] | None, run_rows: int) -> list[Any]:
    """What a reader drains from the payloads ``wire`` read in one go (``None`` and other non-bytes items pass as they
    are and end the current run): for test streams."""
    out: list[Any] = []
    router = Router()
    for w in wire:
        if not isinstance(w, bytes | bytearray):
            router.end_run()
            out.append(w)
            continue
        router.put(bytes(w), out, prefixes, run_rows)
    return out


def main() -> int:
    """``python -m upstream.postgres.walread``: build the module now (``make deps``), print where it is."""
    return _EXT.main("replication reader not built (the stream is read through psycopg2)")


if __name__ == "__main__":
    raise SystemExit(main())
