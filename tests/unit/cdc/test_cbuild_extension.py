"""``cdc.cbuild.Extension``: the one way the project's C extension modules are built, loaded and given up on."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import pytest

from cdc import cbuild

pytestmark = pytest.mark.unit

GOOD = r"""
#define PY_SSIZE_T_CLEAN
#include <Python.h>
static PyObject *answer(PyObject *self, PyObject *unused) { return PyLong_FromLong(42); }
static PyMethodDef methods[] = {{"answer", answer, METH_NOARGS, NULL}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "_probe", NULL, -1, methods};
PyMODINIT_FUNC PyInit__probe(void) { return PyModule_Create(&mod); }
"""


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path


def test_a_module_is_built_once_loaded_and_adapted(cache: Path) -> None:
    src = cache / "probe.c"
    src.write_text(GOOD)
    calls: list[Any] = []

    def adapt(mod: Any) -> int:
        calls.append(mod)
        return int(mod.answer())

    ext = cbuild.Extension(src, "pkg._probe", adapt, "probing in Python")
    results: list[int | None] = []
    threads = [threading.Thread(target=lambda: results.append(ext.get())) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [42] * 4 and len(calls) == 1 and ext.why_not is None
    assert len(list(cache.glob("_probe-*.so"))) == 1  # built beside its source, named by a hash of it


def test_a_module_that_does_not_compile_is_given_up_once_with_the_reason(
        cache: Path, caplog: pytest.LogCaptureFixture) -> None:
    src = cache / "broken.c"
    src.write_text("this is not C;")
    ext = cbuild.Extension(src, "pkg._broken", lambda mod: mod, "the broken part runs in Python")
    with caplog.at_level(logging.INFO, logger="cdc.cbuild"):
        assert ext.get() is None
        assert ext.get() is None
    assert ext.why_not and "failed" in ext.why_not
    (record,) = [r for r in caplog.records if r.name == "cdc.cbuild"]
    assert record.getMessage().startswith("the broken part runs in Python: broken.c is not available: ")
    assert ext.main("broken not built") == 1


def test_an_adapter_missing_a_symbol_falls_back(cache: Path) -> None:
    src = cache / "probe.c"
    src.write_text(GOOD)
    ext = cbuild.Extension(src, "pkg._probe", lambda mod: mod.not_there, "probing in Python")
    assert ext.get() is None and "not_there" in (ext.why_not or "")
