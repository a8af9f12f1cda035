"""playground.demo without servers: a target whose server cannot start ends the demo with a message naming the
server and the fix (exit 2, no traceback) before anything else is started; what the read-back could not apply
exactly makes the verdict a mismatch."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from playground import demo
from playground.compare import TableDiff
from playground.demo_targets import MariaDBTarget, Verdict

pytestmark = pytest.mark.unit


def test_a_missing_mariadbd_names_the_fix_and_starts_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the demo's working directory
    no_binaries = tmp_path / "bin"
    no_binaries.mkdir()
    rc = demo.main(["--sink", "mariadb"], targets={"mariadb": lambda d: MariaDBTarget(d, bin_dir=no_binaries)})
    out = capsys.readouterr().out
    assert rc == 2, out
    assert "could not start the MariaDB target (mariadbd)" in out, out
    assert "apt-get install mariadb-server" in out, out
    assert "Traceback" not in out and "etcd up" not in out, out
    (work,) = tmp_path.glob("tidewater-demo-*")
    assert not (work / "etcd").exists(), "nothing else starts once the target cannot"


def test_a_row_the_reader_could_not_apply_exactly_is_a_mismatch() -> None:
    equal = TableDiff("public.t", 3, 3)
    assert Verdict([equal]).identical
    assert not Verdict([equal], problems=["public.t: update of a row the state does not have"]).identical
    assert not Verdict([TableDiff("public.t", 3, 2, missing=[(1,)])]).identical
