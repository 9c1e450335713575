"""Lint, install and package deploy/helm/gpu-exporter with Helm's own code (the `helm-sdkpy` wheel).

helm-sdkpy bundles Helm v4's Go library and needs Python 3.12 or later (.ci/run makes such a venv):

    python3.12 tools/helm_chart.py lint [-f VALUES.yaml]...      # strict: a warning fails
    python3.12 tools/helm_chart.py package DEST_DIR               # the chart at pyproject's version
    python3.12 tools/helm_chart.py install --kubeconfig K --namespace NS [-f VALUES.yaml]...
    python3.12 tools/helm_chart.py jobs JOBS.json                 # many of these at once, JSON out

Helm's lint reads only the chart's own values.yaml, so linting with a values file lints a copy of the
chart whose values.yaml is the chart's with that file merged over it, as Helm merges them (maps key by
key, anything else replaced, null removes). `install` never waits for readiness: it renders the chart and
sends the objects to the API server of the kubeconfig (tests/support/kube_apiserver.py is a stand-in that
records them). `jobs` runs a JSON list of {"op": "lint" | "install" | "package", ...} in one process (eight at a
time) and prints a JSON list of results, each with "error" when Helm refused: the tests start Helm once for all.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import copy
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "deploy" / "helm" / "gpu-exporter"
SEVERITY = {1: "INFO", 2: "WARNING", 3: "ERROR"}
RELEASE = "gpu-exporter"


def merged(base: Any, over: Any) -> Any:
    """``over`` merged over ``base`` as Helm merges values files."""
    if not (isinstance(base, dict) and isinstance(over, dict)):
        return copy.deepcopy(over)
    out = copy.deepcopy(base)
    for key, value in over.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merged(out.get(key), value)
    return out


def _helm() -> Any:
    try:
        import helm_sdkpy
    except ImportError:
        sys.exit("helm_chart: helm-sdkpy is not installed for this Python (pip install helm-sdkpy; Python >= 3.12)")
    return helm_sdkpy


def _config(namespace: str = "default", kubeconfig: str | None = None) -> Any:
    return _helm().Configuration(namespace=namespace, kubeconfig=kubeconfig)


def lint(values: dict[str, Any] | None = None, chart: Path = CHART) -> dict[str, Any]:
    """Helm's lint of the chart, with ``values`` merged over its values.yaml when given."""
    import yaml

    with tempfile.TemporaryDirectory(prefix="gpu-exporter-chart-") as tmp:
        path = chart
        if values:
            path = Path(tmp) / chart.name
            shutil.copytree(chart, path)
            defaults = yaml.safe_load((chart / "values.yaml").read_text(encoding="utf-8"))
            (path / "values.yaml").write_text(json.dumps(merged(defaults, values)), encoding="utf-8")
        result = asyncio.run(_helm().Lint(_config()).run(str(path)))
    messages = [
        {
            "severity": SEVERITY.get(m.get("Severity"), str(m.get("Severity"))),
            "path": m.get("Path"),
            "text": m.get("Err"),
        }
        for m in result.get("Messages") or []
    ]
    return {"messages": messages, "errors": result.get("Errors")}


def install(kubeconfig: str, namespace: str, values: dict[str, Any] | None, chart: Path = CHART) -> dict[str, Any]:
    """Helm's install of the chart: rendered, and sent to the kubeconfig's API server; never waits."""
    helm = _helm()
    action = helm.Install(_config(namespace, kubeconfig))
    release: dict[str, Any] = asyncio.run(
        action.run(RELEASE, str(chart), values=values or None, wait=False, timeout=60)
    )
    return release


def pyproject_version() -> str:
    import tomllib

    version: str = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]
    return version


def package(dest: str, chart: Path = CHART) -> dict[str, Any]:
    """`helm package` of the chart, whose version and appVersion must be pyproject's."""
    import yaml

    meta = yaml.safe_load((chart / "Chart.yaml").read_text(encoding="utf-8"))
    want = pyproject_version()
    if (str(meta["version"]), str(meta["appVersion"])) != (want, want):
        return {
            "error": f"{chart / 'Chart.yaml'}: version {meta['version']} and appVersion {meta['appVersion']} "
            f"must both be pyproject.toml's {want}"
        }
    Path(dest).mkdir(parents=True, exist_ok=True)
    return {"path": asyncio.run(_helm().Package(_config()).run(str(chart), dest))}


def run_job(job: dict[str, Any]) -> dict[str, Any]:
    try:
        if job["op"] == "lint":
            return lint(job.get("values"))
        if job["op"] == "install":
            return {"release": install(job["kubeconfig"], job["namespace"], job.get("values"))}
        if job["op"] == "package":
            return package(job["dest"])
    except _helm().HelmError as err:
        return {"error": str(err)}
    return {"error": f"unknown op {job['op']!r}"}


def _values(files: list[str]) -> dict[str, Any]:
    import yaml

    out: dict[str, Any] = {}
    for name in files:
        out = merged(out, yaml.safe_load(Path(name).read_text(encoding="utf-8")) or {})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="op", required=True)
    p_lint = sub.add_parser("lint", help="strict lint: any warning or error fails")
    p_lint.add_argument("-f", "--values", action="append", default=[], help="a values file (repeatable)")
    p_pkg = sub.add_parser("package", help="the chart archive, at pyproject's version")
    p_pkg.add_argument("dest")
    p_inst = sub.add_parser("install", help="render and send to the kubeconfig's API server, no wait")
    p_inst.add_argument("--kubeconfig", required=True)
    p_inst.add_argument("--namespace", default="gpu-exporter")
    p_inst.add_argument("-f", "--values", action="append", default=[])
    p_jobs = sub.add_parser("jobs", help="a JSON list of jobs; prints a JSON list of results")
    p_jobs.add_argument("file")
    args = parser.parse_args(argv)
    if sys.version_info < (3, 12):
        print("helm_chart: helm-sdkpy needs Python 3.12 or later", file=sys.stderr)
        return 2
    if args.op == "jobs":
        jobs = json.loads(Path(args.file).read_text(encoding="utf-8"))
        # Side by side: an install mostly waits on client-go's request rate limit (5 a second), not on a
        # core; each native call keeps its error in its own thread's slot.
        with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
            print(json.dumps(list(pool.map(run_job, jobs))))
        return 0
    if args.op == "lint":
        result = run_job({"op": "lint", "values": _values(args.values)})
        if "error" in result:
            print(f"helm_chart: lint failed: {result['error']}", file=sys.stderr)
            return 1
        for m in result["messages"]:
            print(f"[{m['severity']}] {m['path']}: {m['text'] or '(Helm gave no text)'}")
        bad = [m for m in result["messages"] if m["severity"] != "INFO"]
        given = f" with {', '.join(args.values)}" if args.values else ""
        print(
            f"{CHART.relative_to(ROOT)}{given}: {len(result['messages'])} message(s), {len(bad)} warning(s) or error(s)"
        )
        return 1 if bad or result["errors"] else 0
    if args.op == "package":
        result = run_job({"op": "package", "dest": args.dest})
    else:
        job = {"op": "install", "kubeconfig": args.kubeconfig, "namespace": args.namespace}
        result = run_job({**job, "values": _values(args.values)})
    if "error" in result:
        print(f"helm_chart: {args.op} failed: {result['error']}", file=sys.stderr)
        return 1
    print(result["path"] if args.op == "package" else result["release"].get("info", {}).get("notes", ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
