"""Compiling one of the project's C files with the system's C compiler, once per source version.

The built library goes into the source's own package directory when it is writable, else ``$XDG_CACHE_HOME/tidewater``
(``~/.cache``), under ``<stem>-<hash>.so`` where the hash covers the source, the platform and the compiler flags
(for a CPython extension, also the interpreter's ABI), so a changed source or another Python builds anew and a
build is never loaded by the wrong interpreter. Builds are atomic (a temporary file renamed into place), so
concurrent builders of the same source are harmless. Nothing built is committed (``.gitignore``); ``make deps``
(scripts/bootstrap.sh) builds ahead, else the first use does. Used by :mod:`upstream.postgres.copy_out` (a plain
shared library loaded with ctypes), :mod:`upstream.postgres.rowcodec`, :mod:`upstream.postgres.walread`,
:mod:`sinks.sql.dialect.rowtext` and :mod:`sinks.sql.dialect.copy_literals` (CPython extension modules).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import sys
import sysconfig
import threading
from collections.abc import Callable
from importlib.machinery import ExtensionFileLoader
from importlib.util import module_from_spec, spec_from_file_location
from pathlib import Path
from types import ModuleType
from typing import Generic, TypeVar

T = TypeVar("T")


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


class Extension(Generic[T]):
    """One of the project's C files as a CPython extension module (``module``, whose init function is
    ``PyInit_<stem>``), compiled for this interpreter and loaded once per process on first use, then turned by
    ``adapt`` into what its Python module hands out. :meth:`get` is thread-safe and never raises: when the module
    cannot be built or loaded (no compiler, no headers, a compile error, a missing symbol) it returns None from then
    on, and the reason (``why_not``) is logged once at INFO with ``fallback`` (what runs instead)."""

    def __init__(self, source: Path, module: str, adapt: Callable[[ModuleType], T], fallback: str) -> None:
        self.source = source
        self.module = module
        self.stem = module.rsplit(".", 1)[-1]
        self._adapt = adapt
        self._fallback = fallback
        self._lock = threading.Lock()
        self._value: T | None = None
        self.why_not: str | None = None

    def build(self) -> Path:
        """The compiled module's path, compiling it if no build of this source exists yet; raises ``OSError``."""
        tag = sys.implementation.cache_tag + str(sys.version_info[:2]) + getattr(sys, "abiflags", "")
        return build(self.source, self.stem, python_flags(), tag=tag)

    def get(self) -> T | None:
        with self._lock:
            if self._value is not None or self.why_not is not None:
                return self._value
            try:
                path = self.build()
                loader = ExtensionFileLoader(self.module, str(path))
                spec = spec_from_file_location(self.module, path, loader=loader)
                if spec is None:
                    raise ImportError(f"cannot load {path}")
                mod = module_from_spec(spec)
                loader.exec_module(mod)
                self._value = self._adapt(mod)
            except (OSError, ImportError, AttributeError, subprocess.SubprocessError) as exc:
                self.why_not = str(exc)
                logging.getLogger(__name__).info("%s: %s is not available: %s", self._fallback, self.source.name,
                                                 self.why_not)
            return self._value

    def main(self, missing: str) -> int:
        """The module's ``python -m`` entry (``make deps``): :func:`build_main`."""
        return build_main(self.build, missing)
