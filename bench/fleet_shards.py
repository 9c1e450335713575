"""Past one TSDB: the bridge writes to one vmagent, which splits the series between VictoriaMetrics shards.

``Sharded`` stands where ``fleet_procs.Victoria`` stands in the fleet bench (``--tsdb sharded``) and in
tests/integration/test_bridge_sharded.py: the bridge's remote-write URL is vmagent's, and reading back
(``export``, ``metric``) goes to every shard, so the count check sees a sample stored in two shards as
a duplicate and one stored in none as lost.

vmagent from Debian 12 (1.79.5) has no ``-remoteWrite.shardByURL`` (later releases: one flag, all labels
or ``-remoteWrite.shardByURL.labels``), so each ``-remoteWrite.url`` gets its own
``-remoteWrite.urlRelabelConfig``: a ``hashmod`` of the node label over the shard count, and a ``keep``
of its own remainder. Every series goes to exactly one shard, and all of one node's series to the same
one (a node's queries and recording rules read one shard). vmagent keeps what a shard has not taken
in ``-remoteWrite.tmpDataPath`` and retries it: it answers the bridge as soon as it holds the samples.
"""

from __future__ import annotations

import shutil
import socket
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from fleet_procs import Victoria, _Server, _wait

__all__ = ["SHARD_LABEL", "Sharded", "Vmagent", "shard_rules", "split_note"]

SHARD_LABEL = "node"  # the label whose value picks the shard


def shard_rules(index: int, shards: int, label: str = SHARD_LABEL) -> str:
    """vmagent relabeling (YAML) for the ``index``-th of ``shards`` remote-write URLs: keep the series
    whose ``label`` hashes to ``index``; the helper label does not reach the TSDB."""
    return (
        f"- action: hashmod\n  source_labels: [{label}]\n  modulus: {shards}\n  target_label: __tmp_shard\n"
        f'- action: keep\n  source_labels: [__tmp_shard]\n  regex: "{index}"\n'
        "- action: labeldrop\n  regex: __tmp_shard\n"
    )


class Vmagent(_Server):
    def __init__(self, workdir: Path, urls: list[str], label: str = SHARD_LABEL) -> None:
        super().__init__(workdir, "vmagent")
        self.url = f"http://127.0.0.1:{self.port}"
        self.argv = [
            shutil.which("vmagent") or "/usr/bin/vmagent",
            f"-httpListenAddr=127.0.0.1:{self.port}",
            f"-remoteWrite.tmpDataPath={self.dir / 'buffer'}",
            "-remoteWrite.flushInterval=1s",
            "-loggerLevel=ERROR",
        ]
        for i, url in enumerate(urls):
            rules = self.dir / f"shard-{i}.yml"
            rules.write_text(shard_rules(i, len(urls), label))
            self.argv += [f"-remoteWrite.url={url}", f"-remoteWrite.urlRelabelConfig={rules}"]

    def start(self) -> None:
        self._spawn(self.argv)

        def up() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"vmagent exited with {self.proc.returncode}: see {self.log}")
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                return bool(urllib.request.urlopen(self.url + "/health", timeout=1).read().strip() == b"OK")

        _wait(up, 60, "vmagent")

    @property
    def write_url(self) -> str:
        return self.url + "/api/v1/write"


class Sharded:
    """``shards`` VictoriaMetrics behind one vmagent; read as one TSDB, written through vmagent."""

    def __init__(self, workdir: Path, shards: int = 2) -> None:
        self.shards = [Victoria(workdir / f"shard-{i}") for i in range(shards)]
        self.agent = Vmagent(workdir, [vm.write_url for vm in self.shards])

    def start(self) -> None:
        for vm in self.shards:
            vm.start()
        self.agent.start()

    def stop(self) -> None:
        self.agent.stop()
        for vm in self.shards:
            vm.stop()

    def watched(self) -> list[tuple[str, int]]:
        """(name, PID) of every process, for the bench's CPU accounting: the shards, then vmagent."""
        return [(f"victoria-{i}", vm.pid) for i, vm in enumerate(self.shards)] + [("vmagent", self.agent.pid)]

    @property
    def write_url(self) -> str:
        return self.agent.write_url

    def export(
        self, match: str, start_ms: int, end_ms: int | None = None
    ) -> Iterator[tuple[dict[str, str], list[int]]]:
        for vm in self.shards:
            yield from vm.export(match, start_ms, end_ms)

    def metric(self, name: str) -> float:
        return sum(vm.metric(name) for vm in self.shards)

    def nodes_per_shard(self, match: str, start_ms: int) -> list[Counter[str]]:
        """Per shard, the samples of ``match`` it holds, per node."""
        out = []
        for vm in self.shards:
            held: Counter[str] = Counter()
            for labels, stamps in vm.export(match, start_ms):
                held[labels.get(SHARD_LABEL, "")] += len(stamps)
            out.append(held)
        return out


def split_note(tsdb: Sharded, start_ms: int) -> str:
    """How the fleet's nodes fell on the shards (gpu_up of GPU 0): nodes and samples per shard, and how
    many nodes are in more than one (none, if the split holds)."""
    per = tsdb.nodes_per_shard('gpu_up{gpu="0"}', start_ms)
    seen: Counter[str] = Counter(n for shard in per for n in shard)
    in_several = sum(1 for c in seen.values() if c > 1)
    parts = " / ".join(f"{len(s):,} nodes, {sum(s.values()):,} samples" for s in per)
    return f"{parts}; nodes in more than one shard: {in_several}"
