"""Reading a ``COPY ... TO STDOUT`` in large blocks, without a Python call per row.

psycopg2's ``copy_expert`` hands each row of a COPY OUT to a Python file's ``write`` (a bytes object and a call
per row, the GIL taken back per row): 0.29 us of client CPU per 100-byte row, measured
(docs/benchmarks.md, "Initial snapshot"). :class:`CopyOut` runs the COPY on the connection's own libpq handle and
drains ``PQgetCopyData`` into a 1 MiB buffer per :meth:`CopyOut.read` call in C (``copy_out.c``, with the GIL
released): 0.10 us per row, and the blocks go straight to the target's ``COPY FROM``.

The C file is compiled on first use with the system's C compiler (``$CC``, ``cc`` or ``gcc``; ``make deps`` builds
it ahead) by :mod:`cdc.cbuild` (the package directory or the user's cache, a name carrying the
source's hash); it has no Python API and no libpq headers: libpq's functions are passed in as
pointers from the libpq psycopg2 itself runs on. Without a compiler, a writable directory or that libpq,
:func:`available` is False (said once in the log) and callers keep the ``copy_expert`` path: same bytes, more CPU.

Errors: a COPY that cannot start or fails midway raises :class:`CopyOutError`, a ``psycopg2.OperationalError`` whose
``pgcode`` is the server's SQLSTATE (None for a lost connection), so ``conn.classify_error`` maps it like any driver
error. After an error or an abandoned read the connection is mid-protocol: close it.
"""

from __future__ import annotations

import ctypes
import logging
import subprocess
import threading
from pathlib import Path
from typing import Any

import psycopg2

from cdc import cbuild
from upstream.postgres import libpq

log = logging.getLogger(__name__)

BLOCK = 1 << 20
_SOURCE = Path(__file__).with_name("copy_out.c")
_PGRES_COPY_OUT = 3
_PGRES_COMMAND_OK = 1
_PG_DIAG_SQLSTATE = ord("C")


class CopyOutError(psycopg2.OperationalError):
    """A COPY OUT run through :class:`CopyOut` failed: ``pgcode`` is the server's SQLSTATE (None: no answer, e.g. the
    connection was lost)."""

    def __init__(self, message: str, sqlstate: str | None) -> None:
        super().__init__(message)
        self._sqlstate = sqlstate

    @property
    def pgcode(self) -> str | None:  # type: ignore[override]
        return self._sqlstate


class _State(ctypes.Structure):
    _fields_ = [("pending", ctypes.c_void_p), ("pending_len", ctypes.c_int), ("pending_off", ctypes.c_int),
                ("done", ctypes.c_int)]


class _Lib:
    """The compiled helper and the libpq functions it and :class:`CopyOut` call."""

    def __init__(self, helper: ctypes.CDLL, pq: ctypes.CDLL) -> None:
        self.fill = helper.tw_copy_fill
        self.fill.restype = ctypes.c_int
        self.fill.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.POINTER(_State), ctypes.c_void_p,
                              ctypes.c_void_p]
        self.release = helper.tw_copy_release
        self.release.restype = None
        self.release.argtypes = [ctypes.POINTER(_State), ctypes.c_void_p]
        self.get_copy = libpq.address(pq, "PQgetCopyData")
        self.freemem = libpq.address(pq, "PQfreemem")
        # (typed by upstream.postgres.libpq)
        self.exec = pq.PQexec
        self.get_result = pq.PQgetResult
        self.status = pq.PQresultStatus
        self.clear = pq.PQclear
        self.error_field = pq.PQresultErrorField
        self.result_error = pq.PQresultErrorMessage
        self.conn_error = pq.PQerrorMessage


_lock = threading.Lock()
_lib: _Lib | None = None
_why_not: str | None = None


def build() -> Path:
    """The compiled helper's path, compiling it if no build of this source exists yet; raises ``OSError`` (no
    compiler, no writable directory, a compile error)."""
    return cbuild.build(_SOURCE, "_copy_out")


def _load() -> _Lib | None:
    global _lib, _why_not
    with _lock:
        if _lib is not None or _why_not is not None:
            return _lib
        try:
            pq = libpq.load()
            if pq is None:
                raise OSError(libpq.why_not() or "psycopg2's libpq cannot be loaded")
            _lib = _Lib(ctypes.CDLL(str(build())), pq)
        except (OSError, AttributeError, subprocess.SubprocessError) as exc:
            _why_not = str(exc)
            log.info("snapshot reads use psycopg2's copy_expert (more client CPU per row): the COPY helper is not "
                     "available: %s", _why_not)
        return _lib


def available() -> bool:
    """Whether :class:`CopyOut` can run here (see the module docstring); compiles the helper on first call."""
    return _load() is not None


class CopyOut:
    """One ``COPY ... TO STDOUT`` on ``conn`` (a psycopg2 connection, idle in a transaction), read in blocks.

    :meth:`start` sends the query; :meth:`read` returns the next block of up to ``size`` bytes (rows cut anywhere),
    b'' once the COPY has ended and its result is checked. Not thread-safe; one COPY at a time per connection."""

    def __init__(self, conn: Any, query: bytes) -> None:
        lib = _load()
        if lib is None:
            raise OSError(f"the COPY helper is not available: {_why_not}")
        self._lib = lib
        self._pgconn = ctypes.c_void_p(conn.pgconn_ptr)
        self._query = query
        self._state = _State()
        self._buf = ctypes.create_string_buffer(BLOCK)
        self._ended = False

    def start(self) -> None:
        lib = self._lib
        res = lib.exec(self._pgconn, self._query)
        try:
            if not res or lib.status(res) != _PGRES_COPY_OUT:
                raise self._error(res)
        finally:
            if res:
                lib.clear(res)

    def read(self, size: int = BLOCK) -> bytes:
        if self._ended:
            return b""
        size = BLOCK if size is None or size <= 0 or size > BLOCK else size
        st = self._state
        n = self._lib.fill(self._pgconn, self._buf, size, ctypes.byref(st), self._lib.get_copy, self._lib.freemem)
        if n:
            return self._buf.raw[:n]
        self._finish()
        return b""

    def _finish(self) -> None:
        """After the last row: the COPY's result(s) until none is left; raises the first error."""
        self._ended = True
        lib = self._lib
        failure: CopyOutError | None = None
        if self._state.done < 0:
            failure = CopyOutError(self._conn_message(), None)
        while True:
            res = lib.get_result(self._pgconn)
            if not res:
                break
            if failure is None and lib.status(res) != _PGRES_COMMAND_OK:
                failure = self._error(res)
            lib.clear(res)
        if failure is not None:
            raise failure

    def close(self) -> None:
        """Free a row still pending (an abandoned read; the connection is mid-COPY then: close it too)."""
        self._lib.release(ctypes.byref(self._state), self._lib.freemem)

    def _conn_message(self) -> str:
        raw = self._lib.conn_error(self._pgconn)
        return " ".join((raw or b"").decode("utf-8", "replace").split()) or "the COPY ended without a result"

    def _error(self, res: Any) -> CopyOutError:
        if not res:
            return CopyOutError(self._conn_message(), None)
        code = self._lib.error_field(res, _PG_DIAG_SQLSTATE)
        raw = self._lib.result_error(res) or b""
        msg = " ".join(raw.decode("utf-8", "replace").split()) or self._conn_message()
        return CopyOutError(msg, code.decode() if code else None)


def main() -> int:
    """``python -m upstream.postgres.copy_out``: build the helper now (``make deps``), print where it is."""
    return cbuild.build_main(build, "COPY helper not built (snapshot reads fall back to copy_expert)")


if __name__ == "__main__":
    raise SystemExit(main())
