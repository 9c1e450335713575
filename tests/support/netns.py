"""A thin WAN made of kernel parts: the edge node in a network namespace, joined to this host by a veth
pair whose two ends are shaped by ``tc`` (a token bucket each way), at the link's real rate.

    with ShapedLink("link-t1", rate=150) as wan:           # bytes per second, each way
        proc = wan.popen(["python3", "-m", "gpu_exporter", ...])   # runs inside the edge namespace
        broker listens on wan.cloud_ip; the agent's web port on wan.edge_mgmt_ip (an unshaped side link)

What a shaped link does, as a real thin link would: the kernel's TCP stack sees its own queue fill, its
congestion window shrink, and its send buffer hold whatever the application wrote and the link has not
carried yet; a PINGREQ written behind that data waits for it. The token bucket (``tbf``) holds one
full-size frame of burst (1600 bytes: the least it takes at an MTU of 1500) and queues up to 32 KiB, as
a modem's buffer does (with a queue of a frame or two, as ``latency 400ms`` gives at these rates, TCP's
first window is mostly dropped on the host itself, and each drop costs a retransmission timeout of
seconds: a link that stalls, which no real link does); every frame counts with its Ethernet, IP and
TCP headers, so the payload gets less than ``rate``.

Two links join the namespace to the host: ``wan`` (shaped, the agent to the broker) and ``mgmt``
(unshaped, only for the test to read the agent's /metrics and /readyz without taking the WAN's bytes).
Addresses are private /30s picked free on this host. Names start with the caller's prefix; ``close``
deletes the namespace, which deletes both veth pairs with it. Needs root (CAP_NET_ADMIN), as CI has.
"""

from __future__ import annotations

import ipaddress
import os
import subprocess
import zlib
from typing import Any

__all__ = ["ShapedLink", "netns_unavailable"]

# Namespaces are named after the worktree that makes them (the machine is shared): ``link-`` unless the
# environment names another prefix.
PREFIX = os.environ.get("NETNS_PREFIX", "link") + "-"
BURST = 1600  # bytes: one full-size frame, the least tbf accepts at MTU 1500
QUEUE = 32 * 1024  # bytes the bucket queues before it drops


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def netns_unavailable() -> str:
    """Why network namespaces cannot be used here ("" when they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root (CAP_NET_ADMIN)"
    try:
        probe = f"link-probe-{os.getpid()}"
        made = _ip("netns", "add", probe, check=False)
        if made.returncode:
            return f"ip netns add failed: {made.stderr.strip()}"
        _ip("netns", "del", probe, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"cannot run ip: {exc}"
    return ""


def _used_nets() -> set[ipaddress.IPv4Network]:
    out = _ip("-o", "-4", "addr", "show").stdout
    nets = set()
    for line in out.splitlines():
        fields = line.split()
        if "inet" in fields:
            nets.add(ipaddress.ip_interface(fields[fields.index("inet") + 1]).network)
    return nets


def _free_pair(seed: int) -> tuple[ipaddress.IPv4Network, ipaddress.IPv4Network]:
    """Two free /30s in 10.231.0.0/16 (chosen from ``seed``, skipping any network in use here)."""
    used = _used_nets()
    base = ipaddress.ip_network("10.231.0.0/16")
    subnets = list(base.subnets(new_prefix=30))
    start = seed % (len(subnets) // 2)
    for k in range(len(subnets) // 2):
        i = ((start + k) % (len(subnets) // 2)) * 2
        a, b = subnets[i], subnets[i + 1]
        if not any(a.overlaps(u) or b.overlaps(u) for u in used):
            return a, b
    raise RuntimeError("no free /30 in 10.231.0.0/16")


class ShapedLink:
    """An edge namespace behind a shaped veth; see the module doc."""

    def __init__(self, name: str, rate: float, down_rate: float | None = None, burst: int = 0) -> None:
        if not name.startswith(PREFIX) or len(name) > 40:
            raise ValueError(f"namespace names start with {PREFIX} (this worktree's prefix) and stay short")
        self.name = name
        self.rate = rate  # bytes per second, edge to cloud
        self.down_rate = down_rate or rate  # cloud to edge
        self.burst = burst or BURST  # bytes the bucket lends at once, each way
        tag = f"{zlib.crc32(name.encode()) & 0xFFFFFF:06x}"
        self._host_wan, self._edge_wan = f"lw{tag}h", f"lw{tag}e"  # interface names: 15 bytes at most
        self._host_mgmt, self._edge_mgmt = f"lm{tag}h", f"lm{tag}e"
        wan, mgmt = _free_pair(zlib.crc32(name.encode()) + os.getpid())
        self.cloud_ip, self.edge_ip = (str(h) for h in wan.hosts())
        self.host_mgmt_ip, self.edge_mgmt_ip = (str(h) for h in mgmt.hosts())
        self._nets = (wan, mgmt)
        self._made = False

    def __enter__(self) -> ShapedLink:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(self) -> ShapedLink:
        self.close()  # a namespace of that name left by an interrupted run
        self._made = True
        _ip("netns", "add", self.name)
        try:
            _ip("-n", self.name, "link", "set", "lo", "up")
            for host, edge, net in (
                (self._host_wan, self._edge_wan, self._nets[0]),
                (self._host_mgmt, self._edge_mgmt, self._nets[1]),
            ):
                host_ip, edge_ip = (str(h) for h in net.hosts())
                _ip("link", "add", host, "type", "veth", "peer", "name", edge)
                _ip("link", "set", edge, "netns", self.name)
                _ip("addr", "add", f"{host_ip}/30", "dev", host)
                _ip("-n", self.name, "addr", "add", f"{edge_ip}/30", "dev", edge)
                _ip("link", "set", host, "up")
                _ip("-n", self.name, "link", "set", edge, "up")
            self.shape(self.rate, self.down_rate)
        except BaseException:
            self.close()
            raise
        return self

    def shape(self, rate: float, down_rate: float | None = None) -> None:
        """Set the rate each way (bytes per second): the edge's egress is the uplink, the host's the downlink.
        A rate of 0 is an unthrottled link: no token bucket that way (the veth's own, unlimited)."""
        self.rate, self.down_rate = rate, down_rate or rate
        for ns, dev, r in ((self.name, self._edge_wan, self.rate), (None, self._host_wan, self.down_rate)):
            bits = max(8, round(r * 8))
            cmd = ["tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", f"{bits}bit", "burst", str(self.burst)]
            cmd += ["limit", str(QUEUE)]
            if r <= 0:
                cmd = ["tc", "qdisc", "del", "dev", dev, "root"]
            if ns is not None:
                cmd = ["ip", "netns", "exec", ns, *cmd]
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
            nothing = ("No such file", "handle of zero")  # no bucket there to delete: the veth's default
            if done.returncode and not (r <= 0 and any(n in done.stderr for n in nothing)):
                raise subprocess.CalledProcessError(done.returncode, cmd, done.stdout, done.stderr)

    def cut(self) -> None:
        """The WAN goes down (the veth's edge end), as a cable pulled: nothing passes, nothing is reset."""
        _ip("-n", self.name, "link", "set", self._edge_wan, "down")

    def restore(self) -> None:
        _ip("-n", self.name, "link", "set", self._edge_wan, "up")
        self.shape(self.rate, self.down_rate)

    @property
    def edge_wan(self) -> str:
        """The edge end of the shaped WAN (what leaves the node through it is the uplink)."""
        return self._edge_wan

    def popen(self, cmd: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        """``cmd`` inside the edge namespace; ``ip netns exec`` execs it, so the PID is the program's own."""
        return subprocess.Popen(["ip", "netns", "exec", self.name, *cmd], **kwargs)

    def counters(self) -> dict[str, int]:
        """Bytes and drops of the uplink's qdisc so far."""
        out = subprocess.run(
            ["ip", "netns", "exec", self.name, "tc", "-s", "qdisc", "show", "dev", self._edge_wan],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout.split()
        found = {"bytes": 0, "dropped": 0}
        if "Sent" in out:
            found["bytes"] = int(out[out.index("Sent") + 1])
        if "(dropped" in out:
            found["dropped"] = int(out[out.index("(dropped") + 1].rstrip(","))
        return found

    def uplink_bytes(self) -> int:
        """Bytes the edge end of the WAN has sent so far, every frame with its headers (the interface's own
        counter: it counts with or without a token bucket, and whatever the bucket dropped is not in it)."""
        out = subprocess.run(
            ["ip", "netns", "exec", self.name, "cat", f"/sys/class/net/{self._edge_wan}/statistics/tx_bytes"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        return int(out.stdout.strip())

    def tcp_retransmits(self) -> int:
        """TCP segments sent again inside the edge namespace so far (its own counters, /proc/net/snmp):
        what a thin link costs when TCP's timer fires before a queued frame is through."""
        out = subprocess.run(
            ["ip", "netns", "exec", self.name, "cat", "/proc/net/snmp"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        rows = [line.split() for line in out.stdout.splitlines() if line.startswith("Tcp:")]
        return int(dict(zip(rows[0], rows[1], strict=True))["RetransSegs"])

    def close(self) -> None:
        if _ip("netns", "list", check=False).stdout.split().count(self.name):
            _ip("netns", "del", self.name, check=False)
        for dev in (self._host_wan, self._host_mgmt):  # gone with the namespace's peers; wait until it is
            _ip("link", "del", dev, check=False)
