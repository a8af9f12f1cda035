"""psycopg2's libpq, loaded once through ctypes for the code that calls it directly (:mod:`upstream.postgres.copy_out`'s
COPY helper, :mod:`upstream.postgres.walread`'s replication reader), with the signatures of the functions they call.

It is the libpq psycopg2's extension is linked against, as loaded in this process (found in /proc/self/maps), so a
``pgconn_ptr`` of a psycopg2 connection is valid for it. Guarantee: :func:`load` returns the same typed library on
every call (None, once, when it is not found); it never raises.
"""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path
from typing import Any

import psycopg2  # noqa: F401 - its extension loads the libpq found below

# name -> (restype, argtypes) of the functions called through ctypes (the rest are passed to C code as addresses)
_SIGNATURES: dict[str, tuple[Any, list[Any]]] = {
    "PQexec": (ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_char_p]),
    "PQgetResult": (ctypes.c_void_p, [ctypes.c_void_p]),
    "PQresultStatus": (ctypes.c_int, [ctypes.c_void_p]),
    "PQclear": (None, [ctypes.c_void_p]),
    "PQresultErrorField": (ctypes.c_char_p, [ctypes.c_void_p, ctypes.c_int]),
    "PQresultErrorMessage": (ctypes.c_char_p, [ctypes.c_void_p]),
    "PQerrorMessage": (ctypes.c_char_p, [ctypes.c_void_p]),
}

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_why_not: str | None = None


def path() -> str | None:
    """The libpq psycopg2's extension is linked against, as loaded in this process (Linux: /proc/self/maps)."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    for line in maps.splitlines():
        p = line.split()[-1] if line.split() else ""
        if "/libpq" in p and ".so" in p:
            return p
    return None


def load() -> ctypes.CDLL | None:
    """The typed library (module docstring); None when it is not here (:func:`why_not` says why)."""
    global _lib, _why_not
    with _lock:
        if _lib is not None or _why_not is not None:
            return _lib
        found = path()
        if found is None:
            _why_not = "psycopg2's libpq is not found among this process's libraries"
            return None
        try:
            lib = ctypes.CDLL(found)
            for name, (res, args) in _SIGNATURES.items():
                fn = getattr(lib, name)
                fn.restype, fn.argtypes = res, args
        except (OSError, AttributeError) as exc:
            _why_not = f"{found}: {exc}"
            return None
        _lib = lib
        return _lib


def why_not() -> str | None:
    """Why :func:`load` returned None (None before a failed load)."""
    return _why_not


def address(lib: ctypes.CDLL, name: str) -> int:
    """The address of function ``name`` of ``lib`` (for C code that calls it)."""
    return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value or 0
