"""One edge node behind a thin link, in real time: the exporter CLI (simulated GPUs) in a network
namespace whose WAN is shaped by ``tc`` (tests/support/netns.py), a real Mosquitto, the real bridge and a real
VictoriaMetrics on this host. Shared by tests/integration/test_forward_realtime.py, bench/bench_weak_link.py and
bench/bench_forwarders.py (which runs vmagent and Prometheus's agent behind the same link, bench/forwarder_peers.py).

The cloud's lag is read from the TSDB: for each GPU, the newest timestamp of its temperature, raw or as a
summary's ``_last``; ``lag_all`` is the age of the stalest GPU's newest value (the whole node is at
least that fresh), ``lag_any`` the age of the node's newest value of any GPU.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from . import paths
from .netns import PREFIX, ShapedLink
from .procs import stop_process
from .tsdb import MOSQUITTO, MosquittoServer, VictoriaMetricsServer, free_port, http_get

ROOT = paths.ROOT

__all__ = ["Agent", "CloudBroker", "LagProbe", "Rig", "agent_args", "exporter_args"]


class CloudBroker(MosquittoServer):
    """Mosquitto on 127.0.0.1 (bridge, test subscribers) and on the WAN's cloud address (the agent);
    it logs each connection, so reconnects can be counted."""

    def __init__(self, workdir: Path, wan_ip: str, extra: str = "") -> None:
        super().__init__(workdir)
        self.wan_ip = wan_ip
        text = self.config_path.read_text().replace("log_type warning\n", "log_type warning\nlog_type notice\n")
        text = text.replace("log_dest stdout\n", f"log_dest file {workdir / 'broker.log'}\n")  # flushed per line
        self.config_path.write_text(text + f"listener {self.port} {wan_ip}\n" + extra)

    def command(self) -> list[str]:
        return [MOSQUITTO, "-c", str(self.config_path)]

    def connections(self, client_id: str) -> int:
        """How many times ``client_id`` connected (from the broker's own log)."""
        try:
            text = (self.workdir / "broker.log").read_text(errors="replace")
        except OSError:
            return 0
        return len(re.findall(rf"New client connected from \S+ as {re.escape(client_id)} ", text))


def exporter_args(link: ShapedLink, node: str, web_port: int, *extra: str) -> list[str]:
    """The exporter CLI on the edge node, not forwarding: 8 simulated GPUs read every second, its page on
    the unshaped management link (where a scraper in the namespace, or the test, reads it)."""
    return [
        sys.executable,
        "-m",
        "gpu_exporter",
        "--gpu-vendor=fake",
        "--fake.gpus=8",
        "--gpu-metrics-collection-interval=1s",
        f"--node-name={node}",
        f"--web.listen-address={link.edge_mgmt_ip}:{web_port}",
        *extra,
    ]


def agent_args(link: ShapedLink, broker: CloudBroker, node: str, spool: Path, web_port: int, *extra: str) -> list[str]:
    """The exporter CLI as an edge node runs it: 8 simulated GPUs read every second, 10 s batches, the
    default keepalive, forwarding over the shaped WAN."""
    return exporter_args(
        link,
        node,
        web_port,
        f"--mqtt.url=mqtt://{broker.wan_ip}:{broker.port}",
        "--mqtt.batch-interval=10s",
        f"--spool.dir={spool}",
        *extra,
    )


class Agent:
    """The exporter process inside the edge namespace, read over the unshaped management link."""

    def __init__(self, link: ShapedLink, args: list[str], log_path: Path) -> None:
        self.link = link
        self.args = args
        self.log_path = log_path
        port = next(a for a in args if a.startswith("--web.listen-address=")).rsplit(":", 1)[1]
        self.base = f"http://{link.edge_mgmt_ip}:{port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30.0) -> Agent:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPU_EXPORTER_")}
        env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
        env["PYTHONUNBUFFERED"] = "1"
        with open(self.log_path, "ab") as log:
            self.proc = self.link.popen(self.args, env=env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"agent exited with {self.proc.returncode}: {self.log()[-2000:]}")
            try:
                if self.get("/readyz")[0] == 200:
                    return self
            except OSError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"agent not ready: {self.log()[-2000:]}")

    def get(self, path: str, timeout: float = 5.0) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(self.base + path, timeout=timeout) as resp:
                return int(resp.status), resp.read().decode()
        except urllib.error.HTTPError as exc:
            return int(exc.code), exc.read().decode()

    def metrics(self) -> dict[str, float]:
        """The forwarder's self-metrics, by series as written on the page."""
        out = {}
        for line in self.get("/metrics")[1].splitlines():
            if line.startswith("gpu_exporter_forward_"):
                name, _, value = line.rpartition(" ")
                out[name] = float(value)
        return out

    def peak_rss(self) -> int:
        """The process's peak resident set (VmHWM), in bytes."""
        assert self.proc is not None
        with open(f"/proc/{self.proc.pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
        return 0

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self, timeout: float = 20.0) -> int | None:
        proc, self.proc = self.proc, None
        return None if proc is None else stop_process(proc, timeout=timeout)


class LagProbe:
    """How old the node's newest data in the TSDB is (see the module doc)."""

    def __init__(self, tsdb: VictoriaMetricsServer, node: str, gpus: int = 8) -> None:
        self.tsdb = tsdb
        self.node = node
        self.gpus = gpus

    def newest(self) -> dict[str, int]:
        """Per GPU, the newest timestamp (ms) of its temperature, raw or summarised."""
        http_get(self.tsdb.url + "/internal/force_flush")
        selector = (
            f'{{__name__=~"gpu_temperature_celsius|gpu_temperature_celsius_last",node="{self.node}",sensor="gpu"}}'
        )
        params = urllib.parse.urlencode({"match[]": selector, "start": "-30m", "end": f"{time.time() + 3600:.0f}"})
        newest: dict[str, int] = {}
        for line in http_get(f"{self.tsdb.url}/api/v1/export?{params}", 30.0).splitlines():
            if line.strip():
                item = json.loads(line)
                gpu = item["metric"].get("gpu", "")
                newest[gpu] = max(newest.get(gpu, 0), max(item["timestamps"]))
        return newest

    def lag(self) -> tuple[float, float]:
        """(lag_all, lag_any) in seconds; inf while some GPU has nothing in the TSDB yet."""
        newest = self.newest()
        now_ms = time.time() * 1000
        if len(newest) < self.gpus:
            return float("inf"), (now_ms - max(newest.values())) / 1000 if newest else float("inf")
        return (now_ms - min(newest.values())) / 1000, (now_ms - max(newest.values())) / 1000


@dataclass
class Rig:
    """The whole path for one node: link, broker, bridge, agent (the TSDB is passed in, shared)."""

    name: str
    rate: float
    workdir: Path
    tsdb: VictoriaMetricsServer
    agent_extra: tuple[str, ...] = ()
    broker_extra: str = ""
    on_link: Callable[[ShapedLink], None] | None = None  # called once the link is up, before anything uses it
    burst: int = 0  # bytes the link's token bucket lends at once (0: netns.BURST, one full frame)
    link: ShapedLink | None = None
    broker: CloudBroker | None = None
    bridge: subprocess.Popen[bytes] | None = None
    agent: Agent | None = None
    node: str = ""
    probe: LagProbe | None = None
    started: float = 0.0
    _bridge_port: int = field(default=0)

    def start(self) -> Rig:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.node = f"edge-{self.name}"
        try:
            self.link = ShapedLink(f"{PREFIX}{self.name}", self.rate, burst=self.burst).open()
            if self.on_link is not None:
                self.on_link(self.link)
            self.broker = CloudBroker(self.workdir / "mqtt", self.link.cloud_ip, self.broker_extra)
            self.broker.start()
            self._bridge_port = free_port()
            env = {k: v for k, v in os.environ.items() if not k.startswith("GPU_EXPORTER_")}
            env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
            with open(self.workdir / "bridge.log", "ab") as log:
                self.bridge = subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "gpu_exporter",
                        "bridge",
                        f"--mqtt.url={self.broker.url}",
                        f"--remote-write.url={self.tsdb.write_url}",
                        f"--bridge.client-id=bridge-{self.name}",
                        f"--bridge.listen-address=127.0.0.1:{self._bridge_port}",
                    ],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            args = agent_args(self.link, self.broker, self.node, self.workdir / "spool", free_port(), *self.agent_extra)
            self.agent = Agent(self.link, args, self.workdir / "agent.log").start()
            self.probe = LagProbe(self.tsdb, self.node)
            self.started = time.monotonic()
        except BaseException:
            self.stop()
            raise
        return self

    def bridge_metric(self, name: str) -> float:
        text = http_get(f"http://127.0.0.1:{self._bridge_port}/metrics").decode()
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith(name) and not line.startswith("#")
        )

    def stop(self) -> None:
        if self.agent is not None:
            self.agent.stop()
        if self.bridge is not None:
            stop_process(self.bridge, timeout=15)
        if self.broker is not None:
            self.broker.stop()
        if self.link is not None:
            self.link.close()


def run_together(threads: list[threading.Thread], stop: threading.Event) -> None:
    """Start the benches' rigs' ``threads`` and wait for them all. When interrupted, ``stop`` tells each
    to stop its rig (processes, namespace), and each gets two minutes for it, before the caller's TSDB goes."""
    for t in threads:
        t.start()
    try:
        for t in threads:
            t.join()
    finally:
        stop.set()
        for t in threads:
            t.join(120)
