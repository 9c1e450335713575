"""The PrometheusRule's alerts, checked and unit-tested by promtool on synthetic series, the rule groups
extracted from the manifest byte for byte (``shipped_groups``): the rules as shipped, annotations and all.

Each alert has a case where it fires and one where it stays quiet (tests/alerts/*.test.yaml).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import paths

ROOT = paths.ROOT
RULE_FILE = ROOT / "deploy" / "prometheusrule.yaml"
ALERT_TESTS = ROOT / "tests" / "alerts"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"

pytestmark = pytest.mark.skipif(not Path(PROMTOOL).exists(), reason="promtool is not installed")


def _groups() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULE_FILE.read_text(encoding="utf-8"))
    assert doc["kind"] == "PrometheusRule"
    groups: list[dict[str, Any]] = doc["spec"]["groups"]
    return groups


def shipped_groups() -> str:
    """The manifest's ``spec.groups`` as a rule file, byte for byte: its lines from ``groups:`` on, less
    the two spaces of indentation ``spec:`` gives them. Nothing is stripped or re-serialised, so promtool
    tests the rules, annotations and all, exactly as the PrometheusRule ships them."""
    lines = RULE_FILE.read_text(encoding="utf-8").splitlines(keepends=True)
    start = lines.index("  groups:\n")
    body = lines[start:]
    assert all(line.startswith("  ") or not line.strip() for line in body), "spec.groups must end the manifest"
    text = "".join(line[2:] if line.strip() else line for line in body)
    assert yaml.safe_load(text)["groups"] == _groups(), "the extracted groups differ from the manifest's"
    return text


def _write_rules(path: Path) -> None:
    path.write_text(shipped_groups(), encoding="utf-8")


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=60, check=False)


def test_rules_pass_promtool_check(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    _write_rules(rules)
    result = _promtool("check", "rules", str(rules))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


@pytest.mark.parametrize("test_file", ["gpu.test.yaml", "agent.test.yaml", "bridge.test.yaml"])
def test_alerts_fire_and_stay_quiet(tmp_path: Path, test_file: str) -> None:
    _write_rules(tmp_path / "rules.yaml")
    shutil.copy(ALERT_TESTS / test_file, tmp_path / test_file)
    result = _promtool("test", "rules", str(tmp_path / test_file))
    assert result.returncode == 0, result.stdout + result.stderr


def test_annotation_templates_render(tmp_path: Path) -> None:
    _write_rules(tmp_path / "rules.yaml")
    shutil.copy(ALERT_TESTS / "annotations.test.yaml", tmp_path / "annotations.test.yaml")
    result = _promtool("test", "rules", str(tmp_path / "annotations.test.yaml"))
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_a_unit_test() -> None:
    """An alert nobody tests could silently never fire."""
    alerts = {rule["alert"] for group in _groups() for rule in group["rules"] if "alert" in rule}
    tested: set[str] = set()
    for path in ALERT_TESTS.glob("*.test.yaml"):
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        for case in doc["tests"]:
            for check in case.get("alert_rule_test", []):
                if check.get("exp_alerts"):
                    tested.add(check["alertname"])
    assert alerts - tested == set()


def test_broken_rule_is_caught(tmp_path: Path) -> None:
    """The harness really runs the rules: a rule with a wrong threshold fails its unit test."""
    text = shipped_groups()
    assert text.count('gpu_temperature_celsius{sensor="gpu"} > 85') == 1
    (tmp_path / "rules.yaml").write_text(text.replace('{sensor="gpu"} > 85', '{sensor="gpu"} > 95'), encoding="utf-8")
    shutil.copy(ALERT_TESTS / "gpu.test.yaml", tmp_path / "gpu.test.yaml")
    result = _promtool("test", "rules", str(tmp_path / "gpu.test.yaml"))
    assert result.returncode != 0
    assert "GPUTemperatureHigh" in result.stdout + result.stderr
