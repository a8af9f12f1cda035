"""Both implementations of the PostgreSQL per-row functions (upstream.postgres.rowcodec), for tests that run over
each: the pure-Python reference and the C module.

A test module runs all its tests over both with an autouse fixture that calls :func:`use` (it swaps the module's
own imported names and the default codec for the parameter's). The C one is built here with the system compiler;
where no compiler or no Python headers exist its runs skip, and ``test_rowcodec_equivalence`` fails if a compiler
is there and the build still fails.
"""

from __future__ import annotations

import shutil
import sysconfig
from pathlib import Path
from typing import Any

import pytest

from upstream.postgres import rowcodec

NAMES = ["python", "c"]


def can_build() -> bool:
    """A C compiler and this interpreter's headers are here: the C codec must build."""
    return bool(shutil.which("cc") or shutil.which("gcc")) and (
        Path(sysconfig.get_paths()["include"]) / "Python.h").is_file()


def codec_named(name: str) -> rowcodec.RowCodec:
    if name == "python":
        return rowcodec.PYTHON
    native = rowcodec.native()
    if native is None:
        if can_build():
            pytest.fail("the C row codec does not build although a compiler and Python.h are here (see the log)")
        pytest.skip("no C compiler or Python headers: the C row codec cannot be built here")
    return native


def use(name: str, monkeypatch: pytest.MonkeyPatch, namespace: dict[str, Any] | None = None) -> rowcodec.RowCodec:
    """Make codec ``name`` the one under test: ``rowcodec.best()`` returns it (PgChangeDecoder, PgSpanSource), and
    the names of its functions bound in ``namespace`` (a test module's ``globals()``) are replaced by its own."""
    codec = codec_named(name)
    monkeypatch.setattr(rowcodec, "best", lambda: codec)
    if namespace is not None:
        for fn in ("plain_change_relid", "insert_values", "parse_change", "plain_row", "row_parser"):
            if fn in namespace:
                monkeypatch.setitem(namespace, fn, getattr(codec, fn))
    return codec
