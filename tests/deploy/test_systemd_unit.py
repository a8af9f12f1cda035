"""deploy/systemd: `systemd-analyze verify` accepts the unit without a single warning (and reports a broken
one), `systemd-analyze security --offline` rates its hardening, its command line parses with the real `cdc`
parser under the variables of the shipped environment file, the shipped server.toml loads, the stop timeout
exceeds the drain, and install.sh stages user-owned directories and files with the right modes. (The server's
side of Type=notify and SIGHUP runs in tests/e2e/test_server_ops.py against a real process.)"""

from __future__ import annotations

import configparser
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from cdc.config import ServerConfig
from cli.main import build_parser

pytestmark = [pytest.mark.deploy,
              pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                                 reason="systemd-analyze missing: run scripts/bootstrap.sh (Debian package systemd)")]

ROOT = Path(__file__).resolve().parents[2]
SYSTEMD = ROOT / "deploy" / "systemd"
UNIT = SYSTEMD / "tidewater.service"
CDC = Path(sys.executable).parent / "cdc"


def _local_unit(tmp_path: Path, text: str | None = None) -> Path:
    """The unit with ExecStart pointing at this checkout's `cdc` (verify checks that the binary exists)."""
    out = tmp_path / "tidewater.service"
    out.write_text((text or UNIT.read_text()).replace("/opt/tidewater/.venv/bin/cdc", str(CDC)))
    return out


def _verify(unit: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60,
                          cwd=unit.parent)


def test_systemd_analyze_verify_is_clean(tmp_path: Path) -> None:
    r = _verify(_local_unit(tmp_path))
    assert r.returncode == 0 and not (r.stdout + r.stderr).strip(), r.stdout + r.stderr


@pytest.mark.parametrize("old,new,complaint", [
    ("ProtectSystem=strict", "ProtectSystem=strictly", "protect system"),
    ("WatchdogSec=30", "WatchdogSecs=30", "Unknown key"),
])
def test_verify_reports_a_broken_unit(tmp_path: Path, old: str, new: str, complaint: str) -> None:
    assert old in UNIT.read_text()
    r = _verify(_local_unit(tmp_path, UNIT.read_text().replace(old, new)))
    assert complaint in r.stdout + r.stderr


def test_hardening_exposure_is_low(tmp_path: Path) -> None:
    r = subprocess.run(["systemd-analyze", "security", "--offline=yes", "--no-pager", str(_local_unit(tmp_path))],
                       capture_output=True, text=True, timeout=60, cwd=tmp_path)
    m = re.search(r"Overall exposure level for tidewater.service: ([0-9.]+)", r.stdout + r.stderr)
    assert m, r.stdout + r.stderr
    assert float(m.group(1)) <= 2.0, r.stdout


def _unit() -> configparser.ConfigParser:
    cp = configparser.ConfigParser(strict=False, interpolation=None, delimiters=("=",))
    cp.optionxform = str  # type: ignore[assignment,method-assign]
    cp.read_string(UNIT.read_text().replace("\\\n", " "))
    return cp


def _service() -> configparser.SectionProxy:
    return _unit()["Service"]


def _service_unit_section() -> configparser.SectionProxy:
    return _unit()["Unit"]


def test_unit_settings_and_command_line() -> None:
    svc = _service()
    assert svc["Type"] == "notify" and svc["NotifyAccess"] == "main" and int(svc["WatchdogSec"]) > 0
    assert svc["User"] == "tidewater" and svc["NoNewPrivileges"] == "yes" and svc["ProtectSystem"] == "strict"
    assert svc["ExecReload"] == "/bin/kill -HUP $MAINPID"
    assert svc["EnvironmentFile"] == "/etc/tidewater/tidewater.env"
    env = dict(line.split("=", 1) for line in (SYSTEMD / "tidewater.env").read_text().splitlines()
               if line and not line.startswith("#"))
    words = shlex.split(svc["ExecStart"])
    used = {v for w in words for v in re.findall(r"\$\{(\w+)\}", w)}
    assert used <= set(env), used - set(env)
    argv = [re.sub(r"\$\{(\w+)\}", lambda m: env[m.group(1)], w) for w in words]
    assert argv[0] == "/opt/tidewater/.venv/bin/cdc"
    args = build_parser().parse_args(argv[1:])
    assert args.command == "server"
    assert svc["ReadWritePaths"].split() == [args.data_dir]  # the sorter; nothing else is writable
    assert args.data_dir == f"/var/lib/{svc['StateDirectory']}"
    config = ServerConfig.from_toml((SYSTEMD / "server.toml").read_text(), etcd=args.etcd, addr=args.addr,
                                    data_dir=args.data_dir)
    assert args.config == "/etc/tidewater/server.toml"
    assert int(svc["TimeoutStopSec"]) > config.drain_timeout


@pytest.mark.skipif(os.geteuid() != 0, reason="install.sh sets owners (chown): needs root")
def test_install_script_stages_files_and_modes(tmp_path: Path) -> None:
    env = dict(os.environ, DESTDIR=str(tmp_path), TIDEWATER_USER="root")
    r = subprocess.run(["bash", str(SYSTEMD / "install.sh")], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr

    def mode(p: str) -> int:
        return stat.S_IMODE((tmp_path / p).stat().st_mode)

    assert mode("var/lib/tidewater") == 0o750 and mode("etc/tidewater") == 0o750
    assert mode("etc/tidewater/tidewater.env") == 0o640 and mode("etc/tidewater/server.toml") == 0o640
    assert (tmp_path / "etc/systemd/system/tidewater.service").read_text() == UNIT.read_text()
    docs = _service_unit_section()["Documentation"].removeprefix("file://")
    assert (tmp_path / docs.lstrip("/")).read_text() == (ROOT / "docs" / "operations.md").read_text()
    (tmp_path / "etc/tidewater/server.toml").write_text("# edited\n")
    r = subprocess.run(["bash", str(SYSTEMD / "install.sh")], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0 and "keeping existing /etc/tidewater/server.toml" in r.stderr
    assert (tmp_path / "etc/tidewater/server.toml").read_text() == "# edited\n"
