"""What a user would run instead of the exporter's forwarder, behind the same link: vmagent or Prometheus
in agent mode (both from Debian: ``victoria-metrics`` ships ``vmagent``; ``prometheus
--enable-feature=agent``), in the edge namespace, scraping the same exporter CLI every second and
remote-writing through the shaped WAN into the cloud's VictoriaMetrics.

The cloud TSDB listens on 127.0.0.1 outside the namespace (shared with the exporter's own bridge); a relay
on this host (tests/support/tcp_proxy.py, unshaped) takes the namespace's remote write on the WAN's cloud
address to it. The relay is on the cloud side: what crosses the shaped link is the peer's own TCP.

Both peers scrape the page at 1 s (full resolution, as the exporter's forwarder ships every reading)
and drop the exporter's self-metrics (``gpu_exporter_*``, ``process_*``, ``python_*``), which its
forwarder does not ship either, so every forwarder carries the same GPU series; the scrape adds the
node's name as a ``node`` label. Their own series (``up``, ``scrape_*``) stay: a user gets them too.

Defaults: the peer's remote write as shipped. ``best``: what suits a thin link, from their docs:

- vmagent 1.79 (Debian's: its ``-help`` has no zstd VictoriaMetrics protocol nor
  ``-remoteWrite.vmProtoCompressLevel``, which later releases have; Prometheus remote write v1, snappy): ``-remoteWrite.queues=1`` (one connection, one block at a time instead of
  2 x CPUs), ``-remoteWrite.flushInterval=10s`` (blocks of 10 s, as the exporter's 10 s batches; snappy
  has no window across blocks, so larger blocks only save the per-request overhead),
  ``-remoteWrite.maxRowsPerBlock=100000`` (so a 10 s block is not cut at 10,000 rows),
  ``-remoteWrite.significantFigures=4`` (as the exporter's ``--mqtt.value-digits=4``: fewer distinct
  bytes for snappy), ``-remoteWrite.sendTimeout=10m`` (a block takes minutes on 150 B/s; the default
  1 m gives up and sends it again, forever).
- Prometheus 2.42 agent (remote write v1, snappy): ``queue_config`` ``min_shards: 1``, ``max_shards: 1``
  (one connection), ``max_samples_per_send: 100000`` and ``capacity: 200000`` (a request per deadline,
  not per 500 samples), ``batch_send_deadline: 10s``; ``remote_timeout: 10m`` (as above);
  ``metadata_config: send: false`` (no metadata request every minute).
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from tests.support.netns import PREFIX, ShapedLink
from tests.support.ports import free_port
from tests.support.procs import stop_process
from tests.support.tcp_proxy import TcpProxy
from tests.support.tsdb import PROMETHEUS, VictoriaMetricsServer
from tests.support.weak_link_rig import Agent, LagProbe, exporter_args

__all__ = ["PEERS", "CloudTSDB", "PeerRig", "peer_command", "scrape_config"]

VMAGENT = "/usr/bin/vmagent"
PEERS = ("vmagent", "vmagent-best", "prometheus", "prometheus-best")
SELF_METRICS = "gpu_exporter_.*|process_.*|python_.*"

VMAGENT_BEST = (
    "-remoteWrite.queues=1",
    "-remoteWrite.flushInterval=10s",
    "-remoteWrite.maxRowsPerBlock=100000",
    "-remoteWrite.significantFigures=4",
    "-remoteWrite.sendTimeout=10m",
)
PROMETHEUS_BEST = """    remote_timeout: 10m
    queue_config:
      min_shards: 1
      max_shards: 1
      max_samples_per_send: 100000
      capacity: 200000
      batch_send_deadline: 10s
    metadata_config:
      send: false
"""


class CloudTSDB(VictoriaMetricsServer):
    """The cloud's VictoriaMetrics, taking as many uploads at once as arrive. Its default (8 concurrent
    inserts here; 1.79 holds a slot while it reads a request's body) lets eight peers' requests trickling
    in at 150 B/s hold every slot: then the bridge's writes, on this host, wait a minute and time out,
    and every node's lag grows with the TSDB's queue, not with its link (seen in a first run). A cloud
    TSDB's ingest takes many slow edge uploads at once; so does this one."""

    def command(self) -> list[str]:
        return [*super().command(), "-maxConcurrentInserts=512", "-insert.maxQueueDuration=10m"]


def scrape_config(target: str, node: str, remote_write: str = "", best: bool = False) -> str:
    """The scrape (every second, the self-metrics dropped, ``node`` added); with ``remote_write``, the
    Prometheus agent's whole configuration."""
    text = f"""global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
  - job_name: gpu-exporter
    static_configs:
      - targets: ["{target}"]
        labels:
          node: "{node}"
    metric_relabel_configs:
      - source_labels: [__name__]
        regex: "{SELF_METRICS}"
        action: drop
"""
    if remote_write:
        text += f"remote_write:\n  - url: {remote_write}\n" + (PROMETHEUS_BEST if best else "")
    return text


def peer_command(peer: str, workdir: Path, target: str, node: str, remote_write: str) -> list[str]:
    """The peer's command line (its configuration written into ``workdir``); it listens inside the
    namespace only."""
    best = peer.endswith("-best")
    port = free_port()
    if peer.startswith("vmagent"):
        (workdir / "scrape.yml").write_text(scrape_config(target, node))
        return [
            VMAGENT,
            f"-promscrape.config={workdir / 'scrape.yml'}",
            f"-remoteWrite.url={remote_write}",
            f"-remoteWrite.tmpDataPath={workdir / 'queue'}",
            f"-httpListenAddr=127.0.0.1:{port}",
            "-loggerLevel=WARN",
            *(VMAGENT_BEST if best else ()),
        ]
    if peer.startswith("prometheus"):
        (workdir / "prometheus.yml").write_text(scrape_config(target, node, remote_write, best))
        return [
            PROMETHEUS,
            "--enable-feature=agent",
            f"--config.file={workdir / 'prometheus.yml'}",
            f"--storage.agent.path={workdir / 'wal'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ]
    raise ValueError(f"unknown peer {peer!r}; known: {', '.join(PEERS)}")


@dataclass
class PeerRig:
    """One edge node: link, exporter, peer in the namespace; the relay to the shared TSDB on the host."""

    name: str
    peer: str
    rate: float
    workdir: Path
    tsdb: VictoriaMetricsServer
    link: ShapedLink | None = None
    relay: TcpProxy | None = None
    agent: Agent | None = None
    proc: subprocess.Popen[bytes] | None = None
    node: str = ""
    probe: LagProbe | None = None
    started: float = 0.0

    def start(self) -> PeerRig:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.node = f"edge-{self.name}"
        try:
            self.link = ShapedLink(f"{PREFIX}{self.name}", self.rate).open()
            self.relay = TcpProxy(("127.0.0.1", self.tsdb.port), listen=(self.link.cloud_ip, 0)).start()
            web = free_port()
            args = exporter_args(self.link, self.node, web)
            self.agent = Agent(self.link, args, self.workdir / "agent.log").start()
            target = f"{self.link.edge_mgmt_ip}:{web}"
            url = f"http://{self.link.cloud_ip}:{self.relay.port}/api/v1/write"
            cmd = peer_command(self.peer, self.workdir, target, self.node, url)
            with open(self.workdir / f"{self.peer}.log", "ab") as log:
                self.proc = self.link.popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            time.sleep(1.0)
            if self.proc.poll() is not None:
                log_text = (self.workdir / f"{self.peer}.log").read_text(errors="replace")
                raise RuntimeError(f"{self.peer} exited with {self.proc.returncode}: {log_text[-2000:]}")
            self.probe = LagProbe(self.tsdb, self.node)
            self.started = time.monotonic()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc, timeout=15)
            self.proc = None
        if self.agent is not None:
            self.agent.stop()
        if self.relay is not None:
            self.relay.stop()
        if self.link is not None:
            self.link.close()
