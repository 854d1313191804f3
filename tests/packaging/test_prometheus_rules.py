"""The alert rules in config/prometheus: valid for Prometheus, and every alert unit-tested
with promtool (firing and not firing) and documented in the operations runbook."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from support.promserver import require

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "config" / "prometheus" / "diskguard-rules.yml"
RULE_TESTS = sorted((ROOT / "config" / "prometheus" / "tests").glob("*.yml"))
OPERATIONS = ROOT / "docs" / "operations.md"


def alert_names() -> list[str]:
    return sorted(set(re.findall(r"^\s*- alert: (\w+)\s*$", RULES.read_text(), re.M)))


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [require("promtool"), *args], capture_output=True, text=True, timeout=120, cwd=ROOT
    )


def test_the_rules_are_valid() -> None:
    result = _promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 9 rules found" in result.stdout


def test_promtool_unit_tests_pass() -> None:
    assert RULE_TESTS
    result = _promtool("test", "rules", *map(str, RULE_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_is_tested_firing_and_not_firing() -> None:
    """A rule without a case where it must stay quiet could fire on everything unnoticed."""
    firing: set[str] = set()
    quiet: set[str] = set()
    for path in RULE_TESTS:
        lines = [line.strip() for line in path.read_text().splitlines() if line.strip()]
        for i, line in enumerate(lines[:-1]):
            m = re.fullmatch(r"alertname: (\w+)", line)
            if m is None:
                continue
            expected = lines[i + 1]
            if expected == "exp_alerts: []":
                quiet.add(m.group(1))
            elif expected == "exp_alerts:" and lines[i + 2].startswith("- exp_labels:"):
                firing.add(m.group(1))
    names = set(alert_names())
    assert names == {
        "DiskguardActuatorFailing",
        "DiskguardBrokerReclaimTooSlow",
        "DiskguardFilesystemOverCeiling",
        "DiskguardFilesystemOverfull",
        "DiskguardFilesystemSpaceFillingUp",
        "DiskguardPartitionsSetAside",
        "DiskguardRetentionTargetUnreachable",
        "DiskguardStale",
    }
    assert names - firing == set(), "alerts never tested firing"
    assert names - quiet == set(), "alerts never tested staying quiet"


def test_every_alert_has_a_runbook_entry() -> None:
    text = OPERATIONS.read_text()
    runbook = text[text.index("\n## Runbook\n") :]
    rules = RULES.read_text()
    for name in alert_names():
        assert f"\n### {name}\n" in runbook, name
        assert f"runbook: docs/operations.md#{name.lower()}" in rules, name
