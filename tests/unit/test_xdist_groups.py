"""``--dist loadgroup`` keeps an ``xdist_group`` on one worker (tests.xdist_groups): a real pytest-xdist run of a
small suite in a subprocess, two workers, three tests of a group among plain ones."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]

CONFTEST = '''
import pytest

from tests.xdist_groups import pin_groups


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "heavy" in item.fixturenames:
            item.add_marker(pytest.mark.xdist_group("heavy"))
    pin_groups(config, items)


@pytest.fixture(scope="session")
def heavy():
    return 1
'''

TESTS = "import time\n" + "".join(
    f"def test_g{i}(heavy):\n    time.sleep(0.3)\n\n\ndef test_p{i}():\n    time.sleep(0.3)\n\n\n" for i in range(3))


def test_a_group_runs_on_one_worker(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_grouped.py").write_text(TESTS)
    # only xdist among the installed plugins: the others (hypothesis, schemathesis) cost each of the three
    # interpreters seconds of start-up on a loaded host and play no part here
    out = subprocess.run([sys.executable, "-m", "pytest", "-p", "xdist", "-p", "no:cacheprovider", "-n", "2",
                          "--dist", "loadgroup", "-v", str(tmp_path)], cwd=tmp_path, capture_output=True, text=True,
                         timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    ran = re.findall(r"\[(gw\d)\] \[ *\d+%\] PASSED \S+::(test_\w+)(@\w+)?", out.stdout)
    assert len(ran) == 6, out.stdout
    grouped = {(worker, suffix) for worker, name, suffix in ran if name.startswith("test_g")}
    assert len(grouped) == 1 and next(iter(grouped))[1] == "@heavy", ran  # one worker, scheduled as the group
