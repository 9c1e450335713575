"""The shipped dashboard and rules against a bridged node, as shipped: real agents forward over a real
Mosquitto, the real bridge writes to a real Prometheus (remote-write receiver, and a scrape of the
bridge's own page as the cloud's Prometheus does), and the expressions of deploy/grafana/ and
deploy/prometheusrule.yaml, read from the files as written, are evaluated there.

Three agents make the fleet: ``edge-sim`` (simulated GPUs, a healthy node), ``edge-hang`` (the real
nvidia-ml-py over the C fake libnvidia-ml, whose calls block while a file exists: a driver that stopped
answering) and ``edge-thin`` (its uplink capped at 200 B/s by --mqtt.max-rate, less than full
resolution needs: summaries and health go, raw batches pile up in the spool).

GPUExporterStale is checked by evaluating its expression as written in the cloud Prometheus until it
names the hung node (its ``for: 3m`` is promtool's part: tests/alerts/agent.test.yaml). For
GPUExporterSpoolBacklogGrowing the test does not wait the 15 minutes its second condition needs (an
oldest batch over 900 s): it evaluates the rule's first condition as written (``deriv(...[15m]) > 0``)
and checks that the oldest age the cloud sees for the thin node grows with the wall clock; the
threshold and ``for:`` are promtool's (tests/alerts/agent.test.yaml).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from gpu_exporter.forward.health import REPORTED
from tests.fakes import nvml_lib
from tests.support import ROOT, child_env
from tests.support.agent_proc import Proc
from tests.support.bridge_helpers import BridgeProcess
from tests.support.tsdb import MosquittoServer, PrometheusServer, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600), pytest.mark.xdist_group("cloud_dashboard")]

SIM, HANG, THIN = "edge-sim", "edge-hang", "edge-thin"
DASHBOARD = ROOT / "deploy" / "grafana" / "gpu-exporter.json"
RULES = ROOT / "deploy" / "prometheusrule.yaml"

# Dashboard panels that cannot have data for a node without Kubernetes pods or without an event, each
# with why; every other panel must show the bridged node.
PANEL_EXCEPTIONS = {
    "GPU utilization by pod": "per-pod series: the node runs no pods",
    "Device memory by pod": "per-pod series: the node runs no pods",
    "GPU power above idle by pod": "per-pod series: the node runs no pods",
    "XID errors (last hour)": "no XID happened (its series stand at 0)",
}
# Series read by the rules that cannot exist for a healthy bridged node, each with why.
SELECTOR_EXCEPTIONS = {
    "up": "a scrape's own series: a bridged node is not scraped (GPUEdgeNodeSilent stands for GPUExporterDown)",
    "gpu_exporter_bridge_edge_samples_refused_total": "counted per node only once the bridge refused a sample",
    "gpu_exporter_bridge_series_limited_total": "counted per node only once a series limit was reached",
    "gpu_exporter_bridge_twin_batches_total": "counted per node only once two agents shared its name",
    "gpu_exporter_bridge_new_nodes_refused_total": "the bridge's own counter: it has no node label",
    "gpu_exporter_bridge_samples_rejected_total": "the bridge's own counter: it has no node label",
    "gpu_exporter_bridge_held_back_oldest_seconds": "the bridge's own gauge: it has no node label",
}
_KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "offset", "bool", "group_left", "group_right"}
_AGGREGATIONS = {"sum", "min", "max", "avg", "count", "group", "stddev", "stdvar", "topk", "bottomk", "quantile"}
_SELECTOR = re.compile(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(\{[^}]*\})?")


def dashboard_targets() -> list[tuple[str, str]]:
    """(panel title, expression) of every query of the dashboard, as written."""
    out: list[tuple[str, str]] = []

    def walk(panels: list[dict[str, Any]]) -> None:
        for panel in panels:
            for target in panel.get("targets", []):
                out.append((panel["title"], target["expr"]))
            walk(panel.get("panels", []))

    walk(json.loads(DASHBOARD.read_text(encoding="utf-8"))["panels"])
    return out


def fill(expr: str, node: str) -> str:
    """The dashboard's variables filled in as Grafana does for one node, all GPUs and namespaces."""
    return (
        expr.replace("$node", node).replace("$gpu", ".*").replace("$namespace", ".*").replace("$__rate_interval", "1m")
    )


def rule_exprs() -> list[tuple[str, str]]:
    """(alert, expression) of every rule of the shipped PrometheusRule."""
    doc = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    return [(r["alert"], r["expr"]) for g in doc["spec"]["groups"] for r in g["rules"]]


def selectors(expr: str) -> Iterator[tuple[str, str]]:
    """The vector selectors an expression reads: (metric name, its matchers without braces)."""
    for match in _SELECTOR.finditer(expr):
        name, braces = match.group(1), match.group(2)
        after = expr[match.end() :].lstrip()
        if name in _KEYWORDS or name in _AGGREGATIONS or after.startswith("("):
            continue  # a keyword, or a function's name
        before = expr[: match.start()].rstrip()
        if before.endswith(("by (", "without (", "by(", "without(")) or re.search(r"(by|without)\s*\([^)]*$", before):
            continue  # a label name in a grouping
        if re.search(r"\{[^}]*$", before):
            continue  # a label name inside another selector's braces
        yield name, (braces or "{}")[1:-1]


def node_rows(prom: PrometheusServer, expr: str, node: str) -> list[dict[str, Any]]:
    return [r for r in prom.query(expr)["result"] if r["metric"].get("node") == node]


@pytest.fixture(scope="module")
def cloud(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("cloud")
    broker = MosquittoServer(tmp / "mqtt")
    prom = PrometheusServer(tmp / "prom", ooo_window="2h")
    broker.start()
    bridge = BridgeProcess(tmp, broker, prom.write_url, "cloud-bridge")
    # the cloud's Prometheus also scrapes the bridge (the ServiceMonitor of deploy/bridge.yaml)
    config = prom.workdir / "prometheus.yml"
    config.write_text(
        config.read_text()
        + "scrape_configs:\n  - job_name: gpu-bridge\n    scrape_interval: 2s\n"
        + f"    static_configs:\n      - targets: ['127.0.0.1:{bridge.port}']\n"
    )
    hang = tmp / "driver-hangs"
    lib = nvml_lib.build(tmp / "lib")
    scenario = nvml_lib.Scenario(gpus=2)
    env = child_env(**scenario.environment(nvml_lib.device_nodes(tmp / "dev", 2)), FAKE_NVML_HANG=str(hang))
    env["LD_LIBRARY_PATH"] = str(lib.parent)
    common = [f"--mqtt.url={broker.url}", "--mqtt.batch-interval=2s", "--mqtt.reconnect-max-delay=1s"]
    agents = [
        Proc(tmp, "--gpu-vendor=fake", "--fake.gpus=2", "--gpu-metrics-collection-interval=1s",
             f"--node-name={SIM}", f"--spool.dir={tmp / 'spool-sim'}", *common, name=SIM),
        Proc(tmp, "--gpu-vendor=nvidia", "--gpu-metrics-collection-interval=1s", f"--node-name={HANG}",
             f"--spool.dir={tmp / 'spool-hang'}", *common, name=HANG, env=env),
        Proc(tmp, "--gpu-vendor=fake", "--fake.gpus=4", "--gpu-metrics-collection-interval=250ms",
             f"--node-name={THIN}", f"--spool.dir={tmp / 'spool-thin'}", "--mqtt.max-rate=200", *common, name=THIN),
    ]  # fmt: skip
    started: list[Proc] = []
    try:
        prom.start()
        bridge.start()
        for agent in agents:
            started.append(agent.start())
        yield {"prom": prom, "bridge": bridge, "hang": hang, "agents": agents, "tmp": tmp}
    finally:
        hang.unlink(missing_ok=True)
        for agent in started:
            agent.stop()
        bridge.stop()
        prom.stop()
        broker.stop()


def _has(prom: PrometheusServer, expr: str, node: str) -> bool:
    return bool(node_rows(prom, expr, node))


def test_every_dashboard_panel_shows_the_bridged_node(cloud: dict[str, Any]) -> None:
    prom: PrometheusServer = cloud["prom"]
    # a rate over 1m and an increase need a minute of samples
    wait_until(lambda: _has(prom, "gpu_exporter_collect_duration_seconds", SIM), 60, "health of the node")
    time.sleep(70)
    empty = []
    for title, expr in dashboard_targets():
        rows = prom.query(fill(expr, SIM))["result"]
        assert all(r["metric"].get("node", SIM) == SIM for r in rows), (title, rows[:2])
        if title in PANEL_EXCEPTIONS:
            assert not rows, f"{title!r} is listed as without data, but shows {rows[:1]}"
            continue
        if not rows:
            empty.append((title, fill(expr, SIM)))
    assert not empty, f"panels without data for the bridged node: {empty}"
    # the panels the issue found empty for a bridged node, by value
    duration = node_rows(prom, "gpu_exporter_collect_duration_seconds", SIM)
    assert 0 < float(duration[0]["value"][1]) < 1
    age = node_rows(prom, "time() - gpu_exporter_last_collect_success_timestamp_seconds", SIM)
    assert 0 <= float(age[0]["value"][1]) < 30
    # the node variable lists it
    assert _has(prom, "gpu_info", SIM)


def test_the_agents_own_series_are_in_the_cloud_as_on_its_page(cloud: dict[str, Any]) -> None:
    """Every reported series of the node's page, by name and labels, has the node label in the cloud."""
    from prometheus_client.parser import text_string_to_metric_families

    prom: PrometheusServer = cloud["prom"]
    page = cloud["agents"][0].scrape()
    on_page = {
        (s.name, frozenset((k, v) for k, v in s.labels.items() if v))
        for family in text_string_to_metric_families(page)
        for s in family.samples
        if s.name in REPORTED
    }
    assert len(on_page) >= 30
    names = "|".join(sorted({name for name, _ in on_page}))
    rows = prom.query(f'{{__name__=~"{names}",node="{SIM}"}}')["result"]
    in_cloud = {
        (r["metric"]["__name__"], frozenset((k, v) for k, v in r["metric"].items() if k not in ("__name__", "node")))
        for r in rows
    }
    assert on_page == in_cloud


def test_every_series_the_rules_read_exists_for_the_bridged_node(cloud: dict[str, Any]) -> None:
    prom: PrometheusServer = cloud["prom"]
    wait_until(lambda: _has(prom, "gpu_exporter_node_up", SIM), 60, "the bridge's scrape")
    missing = []
    for alert, expr in rule_exprs():
        prom.query(expr)  # evaluates as written (raises on an error)
        for name, matchers in selectors(expr):
            if name in SELECTOR_EXCEPTIONS:
                continue
            query = f'{name}{{{matchers + "," if matchers else ""}node="{SIM}"}}'
            if not prom.query(query)["result"]:
                missing.append((alert, query))
    assert not missing, f"series the rules read but the cloud lacks for the bridged node: {missing}"
    for name in SELECTOR_EXCEPTIONS:  # the list stays true: each has no series for the node
        assert not prom.query(f'{name}{{node="{SIM}"}}')["result"], f"{name} is listed as absent but exists"
    read = {name for _, expr in rule_exprs() for name, _ in selectors(expr)}
    assert set(SELECTOR_EXCEPTIONS) <= read, "an exception for a series no rule reads"
    assert {"gpu_exporter_last_collect_success_timestamp_seconds", "gpu_exporter_forward_spool_batches"} <= read


def test_stale_and_backlog_alerts_fire_in_the_cloud(cloud: dict[str, Any]) -> None:
    prom: PrometheusServer = cloud["prom"]
    rules = dict(rule_exprs())
    stale, backlog = rules["GPUExporterStale"], rules["GPUExporterSpoolBacklogGrowing"]
    wait_until(lambda: _has(prom, "gpu_exporter_last_collect_success_timestamp_seconds", HANG), 60, "hang node")
    assert not _has(prom, stale, HANG)
    cloud["hang"].touch()  # the driver stops answering: the sampler blocks in its next NVML call
    hung_at = time.time()
    # its health keeps arriving (the forwarder reports on its own clock): the last success ages in the cloud
    wait_until(lambda: _has(prom, stale, HANG), 240, "GPUExporterStale's expression naming the hung node")
    age = float(node_rows(prom, stale, HANG)[0]["value"][1])
    assert 120 < age < time.time() - hung_at + 5, age  # the last success came before the driver hung
    assert not _has(prom, stale, SIM), "a healthy node is not stale"
    reports = node_rows(prom, "timestamp(gpu_exporter_forward_connected)", HANG)
    assert time.time() - float(reports[0]["value"][1]) < 30, "the hung node's reports are fresh"
    cloud["hang"].unlink()
    wait_until(lambda: not _has(prom, stale, HANG), 60, "the node recovered")

    # the thin node: raw batches pile up on its disk; the cloud sees it through the health reports
    condition = backlog.split("and")[1].strip()
    assert condition == "deriv(gpu_exporter_forward_spool_batches[15m]) > 0"
    assert _has(prom, condition, THIN)
    assert not _has(prom, condition, SIM)
    assert _has(prom, "gpu_exporter_forward_summarizing == 1", THIN)

    def oldest() -> float:
        return float(node_rows(prom, "gpu_exporter_forward_spool_oldest_age_seconds", THIN)[0]["value"][1])

    first = oldest()  # reports come every 60 s at most while summaries go first (forward/health.py)
    wait_until(lambda: oldest() > first + 5, 150, "a newer report of the thin node")
    assert oldest() > 60
