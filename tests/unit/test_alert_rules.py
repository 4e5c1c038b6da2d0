"""The alert rules are valid Prometheus rules, and each fires (and stays silent) when it should.

Both checks are Prometheus's own: ``promtool check rules`` and ``promtool test
rules`` (the Debian package ``prometheus``, installed by ``scripts/install.sh``).
The rule unit tests live beside the rules, in ``deploy/prometheus/alerts_test.yaml``.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import yaml

RULES_DIR = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"
RULES, RULE_TESTS = RULES_DIR / "alerts.yaml", RULES_DIR / "alerts_test.yaml"


def _promtool(*args: str) -> str:
    promtool = shutil.which("promtool")
    assert promtool, "promtool not found: install the Debian package 'prometheus' (scripts/install.sh --test)"
    result = subprocess.run([promtool, *args], capture_output=True, text=True, timeout=60, cwd=RULES_DIR)
    assert result.returncode == 0, f"promtool {' '.join(args)} failed:\n{result.stdout}{result.stderr}"
    return result.stdout


def test_rules_are_valid() -> None:
    assert "SUCCESS" in _promtool("check", "rules", str(RULES))


def test_every_alert_fires_in_the_rule_unit_tests() -> None:
    assert "SUCCESS" in _promtool("test", "rules", str(RULE_TESTS))
    alerts = {rule["alert"] for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]}
    tested = {
        case["alertname"]
        for test in yaml.safe_load(RULE_TESTS.read_text())["tests"]
        for case in test.get("alert_rule_test", [])
        if case["exp_alerts"]
    }
    assert alerts == tested, f"alerts with no firing test: {sorted(alerts - tested)}"


def test_every_alert_names_its_severity_and_summary() -> None:
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        for rule in group["rules"]:
            assert rule.get("for"), f"{rule['alert']}: a 'for' duration keeps one bad scrape from paging"
            assert rule["labels"]["severity"] in ("warning", "critical"), rule["alert"]
            assert rule["annotations"]["summary"], rule["alert"]


def test_scrape_configuration_is_valid_and_loads_the_rules() -> None:
    """deploy/prometheus/prometheus.yaml, the compose stack's Prometheus (its rule file checked with it)."""
    out = _promtool("check", "config", str(RULES_DIR / "prometheus.yaml"))
    assert "1 rule files found" in out, out
