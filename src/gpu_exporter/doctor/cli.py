"""``gpu-exporter doctor [agent options] [--output=json]``: one line per check, exit 1 when one fails.

It takes the agent's own options (the same --config.file, flags and GPU_EXPORTER_* variables), so that
run next to the agent (``kubectl exec ... -- gpu-exporter doctor``) it checks what the agent would use.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from gpu_exporter import config as cfg
from gpu_exporter.buildinfo import add_version_flag
from gpu_exporter.config.commands import DOCTOR
from gpu_exporter.config.flags import FlagParser
from gpu_exporter.doctor import broker
from gpu_exporter.doctor.checks import CHECKS, FAIL, Check, Node, Result

__all__ = ["main", "run_checks"]

PROG = "gpu-exporter doctor"
ALL: tuple[Check, ...] = (*CHECKS, broker.broker, broker.clock)


def build_parser() -> argparse.ArgumentParser:
    parser = FlagParser(
        prog=PROG,
        description="Check this node for what the agent needs: GPU libraries and driver, device nodes, the "
        "NVIDIA runtime's environment, Jetson sysfs, the mounts for pod attribution, the spool, the MQTT "
        "broker and the clock. One line per check (ok, warn, fail, and what to do); exit 1 when one fails.",
    )
    add_version_flag(parser)
    parser.add_argument("--output", choices=("text", "json"), default="text", help="output format (default: text)")
    parser.add_argument("--path.dev", dest="path_dev", default="/dev", metavar="PATH", help="device directory")
    cfg.add_arguments(parser, DOCTOR)
    return parser


def run_checks(node: Node, checks: Sequence[Check] = ALL) -> list[Result]:
    results = []
    for check in checks:
        try:
            results.append(check(node))
        except Exception as exc:
            name = check.__name__.replace("_", "-")
            results.append(Result(name, FAIL, f"the check itself failed: {type(exc).__name__}: {exc}"))
    return results


def render_text(results: Sequence[Result]) -> str:
    lines = []
    for r in results:
        line = f"{r.status:<4} {r.name}: {r.detail}"
        if r.fix and r.status != "ok":
            line += f" -> {r.fix}"
        lines.append(line)
    return "\n".join(lines) + "\n"


def _gpu_found(results: Sequence[Result]) -> bool:
    by_name = {r.name: r for r in results}
    libraries = [by_name.get(n) for n in ("nvidia-library", "amd-library")]
    jetson = by_name.get("jetson-sysfs")
    return any(r is not None and r.status == "ok" for r in libraries) or (
        jetson is not None and jetson.detail.startswith("GPU found")
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = vars(parser.parse_args(list(sys.argv[1:] if argv is None else argv)))
    output, dev = args.pop("output"), args.pop("path_dev")
    try:
        config = cfg.load(args)
    except cfg.ConfigError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    results = run_checks(Node(config, dev=dev))
    if config.gpu_vendor == "auto" and not _gpu_found(results):
        fix = "see the lines above, or set --gpu-vendor to this node's vendor for its own error"
        results.append(Result("gpu", FAIL, "no GPU vendor library works on this node", fix))
    if output == "json":
        body = {"ok": all(r.status != FAIL for r in results), "checks": [vars(r) for r in results]}
        sys.stdout.write(json.dumps(body, indent=2) + "\n")
    else:
        sys.stdout.write(render_text(results))
    return 1 if any(r.status == FAIL for r in results) else 0
