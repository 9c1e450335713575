"""tools/adapter_rules.py: gpu-exporter's prometheus-adapter rules merged into a configuration another stack
owns, keeping its rules (kube-prometheus's resourceRules are what `kubectl top` reads)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from tests.support import ROOT

TOOL = ROOT / "tools" / "adapter_rules.py"

# The shape of kube-prometheus's adapter-config (config.yaml): resource rules only, plus one custom rule
# of the user's own.
KUBE_PROMETHEUS = """\
resourceRules:
  cpu:
    containerQuery: sum by (<<.GroupBy>>) (irate(container_cpu_usage_seconds_total{<<.LabelMatchers>>}[120s]))
    nodeQuery: sum by (<<.GroupBy>>) (1 - irate(node_cpu_seconds_total{mode="idle",<<.LabelMatchers>>}[60s]))
    resources:
      overrides:
        node: {resource: node}
        namespace: {resource: namespace}
        pod: {resource: pod}
    containerLabel: container
  window: 5m
rules:
  - seriesQuery: 'http_requests_total{namespace!="",pod!=""}'
    resources: {overrides: {namespace: {resource: namespace}, pod: {resource: pod}}}
    name: {matches: "^(.*)_total$", as: "${1}_per_second"}
    metricsQuery: 'sum(rate(<<.Series>>{<<.LabelMatchers>>}[2m])) by (<<.GroupBy>>)'
"""


def _merge(tmp_path: Path, text: str) -> subprocess.CompletedProcess[str]:
    config = tmp_path / "config.yaml"
    config.write_text(text)
    return subprocess.run([sys.executable, str(TOOL), str(config)], capture_output=True, text=True, timeout=60)


def test_merge_keeps_the_stacks_rules_and_adds_ours(tmp_path: Path) -> None:
    result = _merge(tmp_path, KUBE_PROMETHEUS)
    assert result.returncode == 0, result.stderr
    merged = yaml.safe_load(result.stdout)
    before = yaml.safe_load(KUBE_PROMETHEUS)
    assert merged["resourceRules"] == before["resourceRules"]
    names = [rule["name"]["as"] for rule in merged["rules"]]
    assert names == ["${1}_per_second", "gpu_utilization", "gpu_memory_used_bytes"]
    values = yaml.safe_load((ROOT / "deploy" / "prometheus-adapter" / "values.yaml").read_text())
    assert merged["rules"][1:] == values["rules"]["custom"]


def test_merge_twice_adds_nothing(tmp_path: Path) -> None:
    once = _merge(tmp_path, KUBE_PROMETHEUS).stdout
    twice = _merge(tmp_path, once)
    assert twice.returncode == 0 and yaml.safe_load(twice.stdout) == yaml.safe_load(once)


def test_an_empty_configuration_gets_our_rules(tmp_path: Path) -> None:
    result = _merge(tmp_path, "")
    assert result.returncode == 0 and len(yaml.safe_load(result.stdout)["rules"]) == 2


def test_not_an_adapter_configuration_is_one_line_exit_2(tmp_path: Path) -> None:
    for text in ("- a\n- list\n", "rules: {not: a list}\n", "key: [unclosed\n"):
        result = _merge(tmp_path, text)
        assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert result.stdout == ""
