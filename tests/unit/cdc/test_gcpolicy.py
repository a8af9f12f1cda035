"""The capture's garbage collector settings (cdc/gcpolicy.py)."""

from __future__ import annotations

import gc
import subprocess
import sys

import pytest

from cdc.gcpolicy import GEN0_THRESHOLD

pytestmark = pytest.mark.unit

_PROBE = ("import gc; from cdc.gcpolicy import tune_for_streaming; done = tune_for_streaming(); "
          "print(done, gc.get_threshold()[0], gc.get_freeze_count() > 0)")


def _probe(env_gc: str | None) -> str:
    env = {"PATH": "/usr/bin:/bin"} | ({"TIDEWATER_GC": env_gc} if env_gc is not None else {})
    return subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, check=True,
                          timeout=60).stdout.strip()


def test_a_streaming_process_freezes_its_start_up_objects_and_collects_young_objects_less_often() -> None:
    # (in a child: the setting is process-wide and this test process keeps CPython's)
    assert _probe(None) == f"True {GEN0_THRESHOLD} True"
    assert gc.get_threshold()[0] != GEN0_THRESHOLD


def test_tidewater_gc_default_keeps_cpythons_settings() -> None:
    assert _probe("default") == f"False {gc.get_threshold()[0]} False"
