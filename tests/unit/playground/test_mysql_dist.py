"""The MySQL 8 download (playground.servers.mysql_dist) without the network: the Packages index is parsed, an
unreachable archive installs nothing and is not an error (the tests skip with the reason), a download whose SHA256
differs from the index is refused before anything is unpacked, and an install is complete only with its stamp."""

from __future__ import annotations

import hashlib
import lzma
from pathlib import Path

import pytest

from playground.servers import mysql_dist

pytestmark = pytest.mark.unit

INDEX = """Package: mysql-server-core-8.0
Version: 8.0.46-0ubuntu0.22.04.5
Depends: libaio1 (>= 0.3.93),
 libc6 (>= 2.35)
Filename: pool/main/m/mysql-8.0/core.deb
SHA256: {sha}

Package: libicu70
Version: 70.1-2
Filename: pool/main/i/icu/libicu70.deb
SHA256: {sha}
"""


def test_the_packages_index_is_parsed_with_continuation_lines() -> None:
    idx = mysql_dist.parse_index(INDEX.format(sha="ab"))
    assert idx["mysql-server-core-8.0"]["Filename"] == "pool/main/m/mysql-8.0/core.deb"
    assert idx["mysql-server-core-8.0"]["Depends"] == "libaio1 (>= 0.3.93),\nlibc6 (>= 2.35)"
    assert idx["libicu70"]["SHA256"] == "ab"


def test_an_unreachable_archive_installs_nothing_and_is_no_error(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mysql_dist, "ARCHIVE", "http://127.0.0.1:9")  # (the discard port: refused)
    monkeypatch.setenv("no_proxy", "*")
    assert mysql_dist.install(tmp_path / "m") is None
    assert not (tmp_path / "m").exists()
    why = mysql_dist.missing(tmp_path / "m")
    assert why is not None and "not installed" in why


def test_a_download_that_differs_from_the_index_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    good = b"the real package"
    index = lzma.compress(INDEX.format(sha=hashlib.sha256(good).hexdigest()).encode())

    def fake_get(url: str) -> bytes:
        return index if url.endswith("Packages.xz") else b"tampered"

    monkeypatch.setattr(mysql_dist, "_get", fake_get)
    monkeypatch.setattr(mysql_dist, "PACKAGES", ("mysql-server-core-8.0", "libicu70"))
    monkeypatch.setattr(mysql_dist, "resolve", lambda names=mysql_dist.PACKAGES: [
        s for s in mysql_dist.parse_index(lzma.decompress(index).decode()).values()])
    with pytest.raises(RuntimeError, match="SHA256 .* differs from the archive index"):
        mysql_dist.install(tmp_path / "m")
    assert mysql_dist.missing(tmp_path / "m") is not None  # nothing half-installed counts as installed
