"""No module uses another module's ``_private`` name (issue 21 items 1 and 6).

Parses every Python file of the project (its packages, tests, scripts and deploy helpers) with ``ast`` and fails,
naming file:line, on:

- ``from <module> import _name`` where ``<module>`` is not the importing file itself (relative imports resolved);
- ``<module>._name`` where ``<module>`` is a name bound to a module by an import (``import a.b as m``,
  ``import a``, ``from a import b`` for a submodule ``a.b``), e.g. ``kafka_consumer._upstream``;
- importing a private module (``a._b``).

A name that others need is made public; a test that needs an internal uses the public interface or an injected
parameter instead. Dunder names (``__version__``) are not private. Only the third-party uses listed in
``THIRD_PARTY`` are allowed, each with its reason.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("cdc", "cli", "capture", "owner", "processor", "sorter", "sinks", "upstream", "spark_jobs",
            "playground", "bench")
SCANNED = (*PACKAGES, "tests", "scripts", "deploy")

# Private names of other libraries that we use on purpose, dotted, each with its reason; nothing of the project.
THIRD_PARTY: dict[str, str] = {
    # grafanalib's JSON encoder for a dashboard: its README's way to write the JSON (deploy/grafana/dashboard.py)
    "grafanalib._gen": "the documented DashboardEncoder lives in this private module",
    # the span source process (processor/source_process.py) ends itself from a thread when its parent is gone
    "os._exit": "the documented way to end a process at once from any thread, without running cleanups",
}
# Out of this check's reach (attributes of third-party objects, not module names), kept on purpose: kafka-python's
# KafkaProducer._sender/_transaction_manager, KafkaConsumer._fetcher and its record batches' _buffer
# (sinks/kafka/transport.py, txnread.py, metaread.py: committed-records-only reads and transaction state),
# confluent-kafka's KafkaError._FENCED & co. (librdkafka's local error codes, sinks/kafka/confluent.py), PyMySQL's
# Connection._ssl_required/_create_ssl_ctx (sinks/sql/target/connection.py), Spark's SparkContext._jsc
# (spark_jobs/snapshot.py).


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _files() -> Iterator[Path]:
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*.py")):
            if ".venv" not in path.parts and "__pycache__" not in path.parts:
                yield path


def _resolve(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def _allowed(module: str, name: str = "") -> bool:
    dotted = f"{module}.{name}" if name else module
    return dotted in THIRD_PARTY or any(dotted.startswith(f"{m}.") for m in THIRD_PARTY)


def violations(path: Path, modules: set[str]) -> list[str]:
    """file:line: what, for each use of another module's private name in ``path``."""
    tree = ast.parse(path.read_text(), str(path))
    here = _module_name(path)
    is_package = path.name == "__init__.py"
    where = path.relative_to(ROOT)
    found: list[str] = []
    bound: dict[str, str] = {}  # local name -> the module it is bound to (any scope: the check is conservative)
    attributes: list[ast.Attribute] = []  # private attributes, checked once every binding is known (one walk)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            if _private(node.attr):
                attributes.append(node)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if any(_private(p) for p in parts) and not _allowed(alias.name):
                    found.append(f"{where}:{node.lineno}: import {alias.name} (a private module)")
                bound[alias.asname or parts[0]] = alias.name if alias.asname else parts[0]
        elif isinstance(node, ast.ImportFrom):
            source = _resolve(node, here, is_package)
            if any(_private(p) for p in source.split(".")) and not _allowed(source):
                found.append(f"{where}:{node.lineno}: from {source} import ... (a private module)")
            for alias in node.names:
                if _private(alias.name) and source != here and not _allowed(source, alias.name):
                    found.append(f"{where}:{node.lineno}: from {source} import {alias.name}")
                if f"{source}.{alias.name}" in modules:
                    bound[alias.asname or alias.name] = f"{source}.{alias.name}"
    for node in attributes:
        chain, value = [], node.value
        while isinstance(value, ast.Attribute):
            chain.insert(0, value.attr)
            value = value.value
        if not (isinstance(value, ast.Name) and value.id in bound):
            continue
        module = ".".join([bound[value.id], *chain])
        if chain and module not in modules:
            continue  # an attribute of something the module holds, not the module itself
        if module != here and not _allowed(module, node.attr):
            found.append(f"{where}:{node.lineno}: {ast.unparse(node)} ({module}.{node.attr})")
    return found


def test_no_module_uses_another_modules_private_names() -> None:
    paths = list(_files())
    modules = {_module_name(p) for p in paths}
    found = [v for p in paths for v in violations(p, modules)]
    assert not found, (
        "uses of another module's private name (make the name public, or give the test a public way in):\n  "
        + "\n  ".join(found))


def test_the_check_sees_each_form(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check itself: each form is reported with file and line, and the module's own names are not."""
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("_x = 1\nprint(_x)\n")
    (pkg / "b.py").write_text(
        "from pkg.a import _x\n"
        "from .a import _x as y\n"
        "import pkg.a as m\n"
        "from pkg import a\n"
        "import pkg\n"
        "print(m._x, a._x, pkg.a._x, m.__name__, a.public)\n"
        "import pkg._hidden\n")
    modules = {"pkg", "pkg.a", "pkg.b"}
    assert violations(pkg / "a.py", modules) == []
    assert violations(pkg / "b.py", modules) == [
        "pkg/b.py:1: from pkg.a import _x",
        "pkg/b.py:2: from pkg.a import _x",
        "pkg/b.py:7: import pkg._hidden (a private module)",
        "pkg/b.py:6: m._x (pkg.a._x)",
        "pkg/b.py:6: a._x (pkg.a._x)",
        "pkg/b.py:6: pkg.a._x (pkg.a._x)",
    ]
