#!/usr/bin/env python3
"""Merge gpu-exporter's prometheus-adapter rules into an adapter configuration that another stack owns.

kube-prometheus (and other stacks) configure prometheus-adapter with a ConfigMap of their own, whose
``config.yaml`` holds the ``resourceRules`` behind ``kubectl top`` and CPU autoscaling. Replacing that
ConfigMap would break them; this adds the rules of deploy/prometheus-adapter/values.yaml
(``rules.custom``) to its ``rules`` list and keeps everything else. Run again, it replaces its own
rules (matched by the custom metric's name) instead of adding them twice.

    kubectl -n monitoring get configmap adapter-config -o jsonpath='{.data.config\\.yaml}' > config.yaml
    python3 tools/adapter_rules.py config.yaml > merged.yaml
    kubectl -n monitoring create configmap adapter-config --from-file=config.yaml=merged.yaml \\
      --dry-run=client -o yaml | kubectl apply -f -
    kubectl -n monitoring rollout restart deployment prometheus-adapter

Exit status 2 with one line when the input is not an adapter configuration.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

VALUES = Path(__file__).resolve().parent.parent / "deploy" / "prometheus-adapter" / "values.yaml"


def our_rules(values: Path = VALUES) -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = yaml.safe_load(values.read_text(encoding="utf-8"))["rules"]["custom"]
    return rules


def _metric(rule: Any) -> str | None:
    if not isinstance(rule, dict):
        return None
    name = rule.get("name")
    return name.get("as") if isinstance(name, dict) else None


def merge(config: dict[str, Any], rules: list[dict[str, Any]]) -> dict[str, Any]:
    """``config`` with ``rules`` in its ``rules`` list (same-named custom metrics replaced); the rest kept."""
    existing = config.get("rules") or []
    if not isinstance(existing, list):
        raise ValueError("its 'rules' is not a list")
    ours = {_metric(rule) for rule in rules}
    merged = dict(config)
    merged["rules"] = [rule for rule in existing if _metric(rule) not in ours] + rules
    return merged


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", help="the adapter's config.yaml ('-' for standard input)")
    parser.add_argument("--values", default=str(VALUES), help="where the rules come from (default: %(default)s)")
    args = parser.parse_args(argv)
    try:
        text = sys.stdin.read() if args.config == "-" else Path(args.config).read_text(encoding="utf-8")
        config = yaml.safe_load(text) or {}
        if not isinstance(config, dict):
            raise ValueError("not a YAML mapping")
        merged = merge(config, our_rules(Path(args.values)))
    except (OSError, yaml.YAMLError, ValueError, KeyError, TypeError) as exc:
        reason = " ".join(str(exc).split())  # a YAML error spans several lines: one is enough
        print(f"adapter_rules: {args.config}: {reason}", file=sys.stderr)
        return 2
    sys.stdout.write(yaml.safe_dump(merged, sort_keys=False, width=1000))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
