"""Test modules are imported by their basename (rootdir-relative, no packages under tests/): two files of one name in
different directories make pytest refuse the second at collection ("import file mismatch"), so the whole suite fails
on a file that was never run (stop 30: tests/unit/sinks/test_kafka_holes.py beside tests/integration/'s)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

TESTS = Path(__file__).resolve().parents[1]


def test_every_test_module_has_a_name_of_its_own() -> None:
    where: dict[str, list[str]] = defaultdict(list)
    for path in TESTS.rglob("test_*.py"):
        where[path.name].append(str(path.relative_to(TESTS)))
    clashes = {name: paths for name, paths in where.items() if len(paths) > 1}
    assert not clashes, f"test modules sharing a basename (rename one, after what it tests): {clashes}"
