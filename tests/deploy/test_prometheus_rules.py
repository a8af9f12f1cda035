"""deploy/prometheus: promtool accepts the config and the rules, the rule unit tests (fire and clear every
rule on synthetic series) pass, every rule carries severity/summary/description and a runbook section that
exists in docs/operations.md, and every metric a rule uses is one the server documents."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.deploy

ROOT = Path(__file__).resolve().parents[2]
PROM = ROOT / "deploy" / "prometheus"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool missing: run scripts/bootstrap.sh "
                                    "(Debian package prometheus)")


def _rules() -> list[dict]:
    return [r for g in yaml.safe_load((PROM / "alerts.yml").read_text())["groups"] for r in g["rules"]]


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=60, cwd=PROM)


@needs_promtool
def test_promtool_checks_config_and_rules() -> None:
    r = _promtool("check", "config", "prometheus.yml")  # also checks the rule files it names
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS: 1 rule files found" in r.stdout + r.stderr


@needs_promtool
def test_every_rule_fires_and_clears_in_promtool_unit_tests() -> None:
    r = _promtool("test", "rules", "tests/alerts_test.yml")
    assert r.returncode == 0, r.stdout + r.stderr
    tests = yaml.safe_load((PROM / "tests" / "alerts_test.yml").read_text())["tests"]
    fired = {t["alertname"] for g in tests for t in g["alert_rule_test"] if t["exp_alerts"]}
    quiet = {t["alertname"] for g in tests for t in g["alert_rule_test"] if not t["exp_alerts"]}
    names = {r["alert"] for r in _rules()}
    assert names - fired == set(), "rules never shown firing"
    assert names - quiet == set(), "rules never shown quiet"


@needs_promtool
def test_promtool_unit_tests_can_fail() -> None:
    """The same test file against rules with one threshold changed must fail (the tests are not vacuous)."""
    text = (PROM / "alerts.yml").read_text().replace("tidewater_changefeed_checkpoint_lag_seconds) > 300",
                                                     "tidewater_changefeed_checkpoint_lag_seconds) > 3000")
    tmp = PROM / "tests" / ".alerts-mutated.yml"
    tmp.write_text(text)
    try:
        test = (PROM / "tests" / "alerts_test.yml").read_text().replace("../alerts.yml", ".alerts-mutated.yml")
        (PROM / "tests" / ".alerts-mutated-test.yml").write_text(test)
        r = _promtool("test", "rules", "tests/.alerts-mutated-test.yml")
        assert r.returncode != 0 and "TidewaterCheckpointLagHigh" in r.stdout + r.stderr
    finally:
        tmp.unlink(missing_ok=True)
        (PROM / "tests" / ".alerts-mutated-test.yml").unlink(missing_ok=True)


def test_rules_have_annotations_and_runbook_sections() -> None:
    ops = (ROOT / "docs" / "operations.md").read_text()
    anchors = {re.sub(r"[^a-z0-9 -]", "", h.strip().lower()).replace(" ", "-")
               for h in re.findall(r"^#+ (.+)$", ops, re.M)}
    for rule in _rules():
        assert rule["labels"]["severity"] in ("warning", "critical"), rule["alert"]
        ann = rule["annotations"]
        assert ann["summary"] and ann["description"], rule["alert"]
        path, _, anchor = ann["runbook_url"].partition("#")
        assert path == "docs/operations.md" and anchor in anchors, (rule["alert"], anchor)
        assert rule["alert"] in ops, f"{rule['alert']} is not named in its runbook section"


def test_rules_use_only_documented_metrics() -> None:
    documented = set(re.findall(r"`(tidewater_[a-z_]+)`", (ROOT / "docs" / "metrics.md").read_text()))
    for rule in _rules():
        used = set(re.findall(r"\b(tidewater_[a-z_]+)\b", rule["expr"]))
        assert used <= documented, (rule["alert"], used - documented)
        assert used or rule["expr"].startswith("up{"), rule["alert"]
