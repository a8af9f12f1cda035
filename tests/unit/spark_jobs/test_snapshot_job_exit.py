"""spark_jobs.snapshot: nothing the job started outlives its last line (run in a child interpreter: the helper
kills every child of the process that calls it, and pytest's own children are the test servers)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit

_SCRIPT = """
import os, subprocess, sys
from spark_jobs.snapshot import _end_children
kids = [subprocess.Popen(["sleep", "60"]), subprocess.Popen(["sh", "-c", "trap '' TERM; exec sleep 60"])]
_end_children()
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
