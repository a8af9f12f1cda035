"""cdc.procs: the Spark job ends every child before its last line (run in a child interpreter: end_children kills
every child of the process that calls it, and pytest's own children are the test servers)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit

_SCRIPT = """
import os, subprocess, sys
from cdc.procs import alive, children, descendants, end_children
kids = [subprocess.Popen(["sleep", "60"]), subprocess.Popen(["sh", "-c", "trap '' TERM; exec sleep 60"])]
assert sorted(children(os.getpid())) == sorted(k.pid for k in kids) and all(alive(k.pid) for k in kids)
assert set(children(os.getpid())) <= set(descendants(os.getpid()))
end_children()
print(" ".join(str(k.pid) for k in kids))
print("gone" if all(k.poll() is not None for k in kids) else "alive")
"""


def test_end_children_kills_and_reaps_every_child_before_the_last_line() -> None:
    out = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=60,
                         cwd=os.getcwd(), check=True).stdout.split("\n")
    pids = [int(p) for p in out[0].split()]
    assert out[1] == "gone"
    for pid in pids:  # reaped, not zombies: the pid no longer exists
        assert not os.path.exists(f"/proc/{pid}"), pid
