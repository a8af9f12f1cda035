"""Both implementations of the SQL sink's row text rendering (sinks.sql.dialect.rowtext), for tests that run over
each: the pure-Python reference and the C module (built here with the system compiler; where no compiler or no
Python headers exist its runs skip, and ``test_rowtext_equivalence`` fails if a compiler is there and the build
still fails)."""

from __future__ import annotations

import pytest

from sinks.sql.dialect import rowtext
from tests.rowcodecs import can_build

NAMES = ["python", "c"]


def rowtext_named(name: str) -> rowtext.RowText:
    if name == "python":
        return rowtext.PYTHON
    native = rowtext.native()
    if native is None:
        if can_build():
            pytest.fail("the C row renderer does not build although a compiler and Python.h are here (see the log)")
        pytest.skip("no C compiler or Python headers: the C row renderer cannot be built here")
    return native
