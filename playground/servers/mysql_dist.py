"""MySQL 8.0 server binaries for the tests: Ubuntu 22.04 (jammy) packages unpacked into a private directory.

Debian 12 packages no MySQL server. Ubuntu jammy's ``mysql-server-core-8.0`` is built against glibc 2.35 and runs on
Debian 12 (glibc 2.36) with four libraries Debian lacks in those versions (ICU 70, protobuf-lite 23, MeCab, libevent
2.1's pthreads part, taken from jammy as well). :func:`install` downloads exactly the packages of :data:`PACKAGES`
from ``archive.ubuntu.com`` (a package registry), checks each file's SHA256 against the archive's ``Packages``
index, and unpacks them with ``dpkg-deb -x`` into :func:`home` (never into the system's dpkg database). The server is
``<home>/usr/sbin/mysqld``, run with ``LD_LIBRARY_PATH`` = :func:`library_path` (:class:`MySQLServer
<playground.servers.mysql.MySQLServer>` does).

Guarantees: :func:`install` is idempotent (a complete install is marked by a stamp file naming every package and
its version, written last; a partial one is removed and redone), and returns without installing (a message, no
exception) when the archive cannot be reached, so ``make deps`` still succeeds offline and the MySQL 8 tests skip
with the reason :func:`missing` gives. A download whose SHA256 differs from the index is an error, never unpacked.

``python -m playground.servers.mysql_dist`` installs (``scripts/bootstrap.sh`` runs it; ``--check`` only says whether
it is installed); the directory is
``$TIDEWATER_MYSQL8_HOME`` when set, else ``~/.cache/tidewater/mysql-8.0`` (shared by every checkout of the user:
the download is ~30 MB, unpacked ~250 MB).
"""

from __future__ import annotations

import hashlib
import logging
import lzma
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

log = logging.getLogger(__name__)

ARCHIVE = "http://archive.ubuntu.com/ubuntu"
INDEXES = ("dists/jammy-updates/main/binary-amd64/Packages.xz", "dists/jammy/main/binary-amd64/Packages.xz")
"""Searched in order: the newest build of a package is in jammy-updates; a package never updated only in jammy."""
PACKAGES = (
    "mysql-server-core-8.0",  # mysqld, mysqlbinlog, share/mysql (errmsg.sys, charsets); initialize needs no more
    "libicu70",
    "libprotobuf-lite23",
    "libmecab2",
    "libevent-core-2.1-7",  # (same version as its pthreads part, which Debian 12 does not install by default)
    "libevent-pthreads-2.1-7",
)
MYSQL_VERSION_PREFIX = "8.0."
STAMP = ".tidewater-installed"
ENV_HOME = "TIDEWATER_MYSQL8_HOME"
_TIMEOUT = 60.0


def home() -> Path:
    """Where the MySQL 8 binaries are (or will be) unpacked."""
    env = os.environ.get(ENV_HOME)
    if env:
        return Path(env)
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "tidewater" / "mysql-8.0"


def mysqld(root: Path | None = None) -> Path:
    return (root or home()) / "usr" / "sbin" / "mysqld"


def library_path(root: Path | None = None) -> str:
    """``LD_LIBRARY_PATH`` for :func:`mysqld` (the jammy libraries first, then whatever the caller had)."""
    own = str((root or home()) / "usr" / "lib" / "x86_64-linux-gnu")
    prev = os.environ.get("LD_LIBRARY_PATH")
    return f"{own}:{prev}" if prev else own


def missing(root: Path | None = None) -> str | None:
    """None when a complete install is at ``root`` (default :func:`home`), else why not (a skip reason)."""
    root = root or home()
    if not (root / STAMP).is_file() or not mysqld(root).is_file():
        return (f"MySQL 8 is not installed in {root}: run `make deps` (or `python -m playground.servers.mysql_dist`; "
                f"it needs archive.ubuntu.com)")
    return None


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=_TIMEOUT) as resp:  # noqa: S310 - a fixed http(s) archive URL
        return bytes(resp.read())


def parse_index(text: str) -> dict[str, dict[str, str]]:
    """A Debian ``Packages`` index: package -> its fields (the first stanza of each package)."""
    out: dict[str, dict[str, str]] = {}
    for stanza in text.split("\n\n"):
        fields: dict[str, str] = {}
        key = ""
        for line in stanza.splitlines():
            if line[:1] in (" ", "\t") and key:
                fields[key] += "\n" + line.strip()
            elif ":" in line:
                key, _, value = line.partition(":")
                fields[key] = value.strip()
        name = fields.get("Package")
        if name and name not in out:
            out[name] = fields
    return out


class ArchiveUnreachable(RuntimeError):
    """archive.ubuntu.com could not be reached (offline machine): nothing installed."""


def resolve(names: tuple[str, ...] = PACKAGES) -> list[dict[str, str]]:
    """The index stanza (``Filename``, ``SHA256``, ``Version``) of each package, from the first index having it."""
    found: dict[str, dict[str, str]] = {}
    for path in INDEXES:
        try:
            index = parse_index(lzma.decompress(_get(f"{ARCHIVE}/{path}")).decode("utf-8", "replace"))
        except (urllib.error.URLError, OSError) as exc:
            raise ArchiveUnreachable(f"{ARCHIVE}/{path}: {exc}") from exc
        for n in names:
            if n not in found and n in index:
                found[n] = index[n]
        if len(found) == len(names):
            break
    lacking = [n for n in names if n not in found]
    if lacking:
        raise RuntimeError(f"package(s) {', '.join(lacking)} are not in the jammy indexes {INDEXES}")
    if not found[names[0]]["Version"].startswith(MYSQL_VERSION_PREFIX):
        raise RuntimeError(f"{names[0]} is {found[names[0]]['Version']}, not MySQL 8.0")
    return [found[n] for n in names]


def _stamp_text(stanzas: list[dict[str, str]]) -> str:
    return "".join(f"{s['Package']} {s['Version']} {s['SHA256']}\n" for s in stanzas)


def install(root: Path | None = None) -> Path | None:
    """Download, verify and unpack :data:`PACKAGES` into ``root`` (default :func:`home`) unless a complete install
    is there; the directory, or None (with a logged reason) when the archive is unreachable."""
    root = root or home()
    if missing(root) is None:
        return root
    try:
        stanzas = resolve()
    except ArchiveUnreachable as exc:
        log.warning("MySQL 8 not installed (the MySQL 8 tests will skip): the archive is unreachable: %s", exc)
        return None
    if root.exists():
        shutil.rmtree(root)  # (a partial install: no stamp)
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".mysql8-", dir=root.parent))
    try:
        for s in stanzas:
            url = f"{ARCHIVE}/{s['Filename']}"
            try:
                data = _get(url)
            except (urllib.error.URLError, OSError) as exc:
                log.warning("MySQL 8 not installed (the MySQL 8 tests will skip): %s: %s", url, exc)
                return None
            digest = hashlib.sha256(data).hexdigest()
            if digest != s["SHA256"]:
                raise RuntimeError(f"{url}: SHA256 {digest} differs from the archive index's {s['SHA256']}")
            deb = tmp / Path(s["Filename"]).name
            deb.write_bytes(data)
            subprocess.run(["dpkg-deb", "-x", str(deb), str(tmp / "root")], check=True)
            deb.unlink()
        (tmp / "root" / STAMP).write_text(_stamp_text(stanzas))
        (tmp / "root").rename(root)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("MySQL %s unpacked into %s", stanzas[0]["Version"], root)
    return root


def main(argv: list[str] | None = None) -> int:
    """``--check``: exit 0 when installed, else 1 (nothing downloaded); without it install (exit 0 also when the
    archive is unreachable: the MySQL 8 tests then skip)."""
    args = sys.argv[1:] if argv is None else argv
    if args == ["--check"]:
        return 0 if missing() is None else 1
    logging.basicConfig(level=logging.INFO, format="mysql_dist: %(message)s", stream=sys.stderr)
    root = install()
    if root is not None:
        print(root)
    return 0


if __name__ == "__main__":
    sys.exit(main())
