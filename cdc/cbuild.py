"""Compiling one of the project's C files with the system's C compiler, once per source version.

The built library goes into the source's own package directory when it is writable, else ``$XDG_CACHE_HOME/tidewater``
(``~/.cache``), under ``<stem>-<hash>.so`` where the hash covers the source, the platform and the compiler flags
(for a CPython extension, also the interpreter's ABI), so a changed source or another Python builds anew and a
build is never loaded by the wrong interpreter. Builds are atomic (a temporary file renamed into place), so
concurrent builders of the same source are harmless. Nothing built is committed (``.gitignore``); ``make deps``
(scripts/bootstrap.sh) builds ahead, else the first use does. Used by :mod:`upstream.postgres.copy_out` (a plain
shared library loaded with ctypes), :mod:`upstream.postgres.rowcodec`, :mod:`sinks.sql.dialect.rowtext` and
:mod:`sinks.sql.dialect.copy_literals` (CPython extension modules).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
import threading
from collections.abc import Callable
from pathlib import Path


def build_dirs(package: Path) -> list[Path]:
    """Where builds of a source in directory ``package`` are looked for and written, in order: that directory, then
    the user's cache."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tidewater"
    return [package, cache]


def python_flags() -> list[str]:
    """The compiler flags of a CPython extension module for this interpreter (its headers; no libpython link:
    the interpreter that loads the module provides the symbols)."""
    include = sysconfig.get_paths()["include"]
    if not (Path(include) / "Python.h").is_file():
        raise OSError(f"no Python.h in {include} (install the interpreter's development headers)")
    return [f"-I{include}", "-fno-strict-aliasing"]


def build(source: Path, stem: str, flags: list[str] | None = None, *, tag: str = "") -> Path:
    """The path of ``source`` compiled into a shared library, compiling it when no build of this source exists yet.

    ``flags``: extra compiler flags; ``tag``: anything else the build depends on (the interpreter's ABI for an
    extension module). Raises ``OSError``: no compiler, no writable directory, a compile error (its first lines)."""
    extra = list(flags or [])
    code = source.read_bytes()
    salt = (sys.platform + "\0" + "\0".join(extra) + "\0" + tag).encode() if extra or tag else sys.platform.encode()
    name = f"{stem}-{hashlib.sha256(code + salt).hexdigest()[:16]}.so"
    dirs = build_dirs(source.parent)
    for d in dirs:
        if (d / name).is_file():
            return d / name
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise OSError("no C compiler (cc or gcc; or set CC)")
    errors = []
    for d in dirs:
        try:
            d.mkdir(parents=True, exist_ok=True)
            tmp = d / f"{name}.{os.getpid()}.{threading.get_ident()}.tmp"
            proc = subprocess.run([cc, "-O2", "-shared", "-fPIC", *extra, "-o", str(tmp), str(source)],
                                  capture_output=True, text=True, timeout=120, check=False)
            if proc.returncode != 0:
                tmp.unlink(missing_ok=True)
                raise OSError(f"{cc} failed: {' '.join(proc.stderr.split())[:300]}")
            os.replace(tmp, d / name)  # atomic: a concurrent builder's file is the same
            return d / name
        except OSError as exc:
            errors.append(f"{d}: {exc}")
    raise OSError("; ".join(errors))


def build_main(build_it: Callable[[], Path], missing: str) -> int:
    """A build module's ``python -m`` entry (``make deps``): build now and print where; on failure say ``missing``
    (what falls back to what) with the reason on stderr and return 1."""
    try:
        print(build_it())
    except OSError as exc:
        print(f"{missing}: {exc}", file=sys.stderr)
        return 1
    return 0
