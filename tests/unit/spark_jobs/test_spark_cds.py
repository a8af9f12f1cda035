"""spark_jobs.cds: the driver's class-data archive is used only when one was made for exactly these options."""

from __future__ import annotations

from pathlib import Path

import pytest

from spark_jobs import cds

pytestmark = pytest.mark.unit

OPTS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


@pytest.fixture
def archive_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(cds, "_dirs", lambda: [tmp_path / "pkg", tmp_path / "cache"])
    if cds.archive_key(OPTS) is None:
        pytest.skip("no Java or no pyspark here")
    return tmp_path


def test_no_archive_leaves_the_options_alone(archive_dir: Path) -> None:
    assert cds.archive_path(OPTS) is None
    assert cds.driver_options(OPTS) == OPTS


def test_an_archive_made_for_these_options_is_added_and_only_for_them(archive_dir: Path) -> None:
    key = cds.archive_key(OPTS)
    made = archive_dir / "cache" / f"spark-driver-{key}.jsa"
    made.parent.mkdir(parents=True)
    made.write_bytes(b"x" * 10)
    assert cds.driver_options(OPTS) == f"{OPTS} -XX:SharedArchiveFile={made}"
    assert cds.driver_options("  " + OPTS.replace(" ", "   ")).endswith(str(made))  # white space does not count
    other = "-XX:+UseSerialGC"  # other options: another key, no archive
    assert cds.archive_key(other) != key and cds.driver_options(other) == other
    given = f"{OPTS} -XX:SharedArchiveFile=/elsewhere.jsa"  # the caller's own archive wins
    assert cds.driver_options(given) == given
    made.write_bytes(b"")  # an empty file (a failed build) is no archive
    assert cds.driver_options(OPTS) == OPTS


def test_the_key_follows_the_java_binary(archive_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key = cds.archive_key(OPTS)
    monkeypatch.setattr(cds, "_java", lambda: "/bin/sh")  # another JVM binary: the old archive does not apply
    assert cds.archive_key(OPTS) not in (None, key)
    monkeypatch.setattr(cds, "_java", lambda: None)
    assert cds.archive_key(OPTS) is None and cds.driver_options(OPTS) == OPTS
