"""Every page parses everywhere: the agent's page (our names and DCGM's; alone, forwarding, with pods) and
the bridge's, each in the text format and in OpenMetrics, as real processes serve them, through
prometheus_client's text parser, its (strict) OpenMetrics parser and ``promtool check metrics``.

The DCGM naming breaks Prometheus conventions where dcgm-exporter's dashboards need it (docs/dcgm.md
lists them); promtool's findings on that page must be those and nothing else.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text

from tests.support import FIXTURES, Exporter, child_env, exporter_cmd, free_port, http_get, wait_for
from tests.support.mosquitto import Broker, broker_fixture  # noqa: F401  (the broker fixture)
from tests.support.procs import stop_process
from tests.support.promtool import promtool_path

pytestmark = pytest.mark.integration

OPENMETRICS = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"

# promtool's findings on the DCGM page, each a deliberate break (docs/dcgm.md lists them): dcgm-exporter's
# counters have no _total, its device labels (UUID, modelName, Hostname) are on every series, and one of
# its names says COUNTER
DCGM_LINT = (
    re.compile(r'^DCGM_FI_\w+ counter metrics should have "_total" suffix$'),
    re.compile(r"^\w+ label names should be written in 'snake_case' not 'camelCase'$"),
    re.compile(r"^DCGM_FI_DEV_PCIE_REPLAY_COUNTER metric name should not include type 'counter'$"),
)


def pages(port: int) -> tuple[str, str]:
    """The text page and the OpenMetrics page of the endpoint on ``port``."""
    url = f"http://127.0.0.1:{port}/metrics"
    status, text, headers = http_get(url)
    assert status == 200 and headers["Content-Type"].startswith("text/plain; version=0.0.4")
    status, om, headers = http_get(url, {"Accept": OPENMETRICS})
    assert status == 200 and headers["Content-Type"].startswith("application/openmetrics-text; version=1.0.0")
    return text.decode(), om.decode()


def lint(text: str) -> list[str]:
    """promtool's findings on a text page, one per line (promtool missing: a skip, a failure in CI)."""
    tool = promtool_path()
    if tool is None:
        pytest.skip("promtool not installed (Debian package prometheus)")
    result = subprocess.run([tool, "check", "metrics"], input=text.encode(), capture_output=True, timeout=60)
    found = [line.strip() for line in (result.stdout + result.stderr).decode().splitlines() if line.strip()]
    assert result.returncode == 0 or found, "promtool failed without a finding"
    return found


def check_both_parsers(text: str, om: str) -> set[str]:
    """Both pages parse; they hold the same families (OpenMetrics names counters without _total)."""
    text_families = {f.name: f for f in parse_text(text)}
    om_families = {f.name: f for f in parse_openmetrics(om)}  # raises on any fault, "Clashing name" included
    assert om.endswith("# EOF\n")
    assert set(text_families) == set(om_families)
    for name, family in om_families.items():
        text_type = text_families[name].type
        # a counter whose samples lack _total (the DCGM names) is "unknown" in OpenMetrics
        assert family.type == text_type or (family.type == "unknown" and text_type == "counter"), name
    assert not [name for name in text_families if name.endswith("_created")]
    return set(om_families)


def _pods(tmp_path: Path) -> list[str]:
    """Pod attribution through the /proc fallback: the simulated driver's processes (PIDs 4000 and 4010)
    in a fixture /proc, in the cgroup of the fixture pod ml/trainer-0."""
    proc = tmp_path / "proc"
    trainer = (FIXTURES / "k8s" / "proc" / "1001" / "cgroup").read_text()
    for pid in (4000, 4010):
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "cgroup").write_text(trainer)
    return [
        "--k8s.pod-attribution=true",
        f"--path.procfs={proc}",
        f"--k8s.pod-logs-path={FIXTURES / 'k8s' / 'var' / 'log' / 'pods'}",
        f"--k8s.kubelet-socket={tmp_path / 'none.sock'}",
    ]


@pytest.mark.parametrize("naming", ["native", "dcgm"])
@pytest.mark.parametrize("mode", ["alone", "forwarding", "pods"])
def test_the_agents_pages_parse(
    naming: str, mode: str, request: pytest.FixtureRequest, exporter: type[Exporter], tmp_path: Path
) -> None:
    args = ["--gpu-vendor=fake", "--fake.gpus=2", "--fake.mig=2", "--gpu-metrics-collection-interval=200ms"]
    args.append(f"--metrics.naming={naming}")
    if mode == "forwarding":
        broker: Broker = request.getfixturevalue("broker")
        args += [f"--mqtt.url={broker.url}", f"--spool.dir={tmp_path / 'spool'}", "--mqtt.batch-interval=1s"]
    if mode == "pods":
        args += _pods(tmp_path)
    agent = exporter(*args).start()
    if mode == "forwarding":  # a batch acknowledged: the forwarder's counters have moved
        assert wait_for(lambda: "gpu_exporter_forward_published_batches_total 0" not in agent.scrape(), timeout=20)
    if mode == "pods":  # the per-pod section is on the page
        assert wait_for(lambda: 'pod="trainer-0"' in agent.scrape(), timeout=30)
    text, om = pages(agent.port)
    families = check_both_parsers(text, om)
    assert ("gpu_exporter_forward_published_batches" in families) is (mode == "forwarding")
    assert ("gpu_pod_info" in families) is (mode == "pods")
    assert ("DCGM_FI_DEV_GPU_UTIL" in families) is (naming == "dcgm")
    findings = lint(text)
    if naming == "native":
        assert findings == []
    else:
        assert findings and all(any(p.match(f) for p in DCGM_LINT) for f in findings), findings
    assert agent.stop() == 0


def test_the_bridges_pages_parse(broker: Broker) -> None:
    port = free_port()
    args = [
        "bridge",
        f"--mqtt.url={broker.url}",
        "--remote-write.url=http://127.0.0.1:1/api/v1/write",
        f"--bridge.listen-address=127.0.0.1:{port}",
    ]
    proc = subprocess.Popen(exporter_cmd(*args), env=child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:

        def up() -> bool:
            try:
                return http_get(f"http://127.0.0.1:{port}/metrics")[0] == 200
            except OSError:
                return False

        assert wait_for(up, timeout=20)
        text, om = pages(port)
        families = check_both_parsers(text, om)
        assert "gpu_exporter_bridge_build_info" in families
        assert lint(text) == []
    finally:
        assert stop_process(proc, timeout=10) == 0
