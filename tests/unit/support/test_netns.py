"""tests/support/netns.py's unthrottled link and its byte counter, which bench/bench_forwarders.py reads:
an unthrottled link has no token bucket, a shaped one has, and the counter holds every byte the edge sent
on the WAN with its headers (and nothing the test read over the management link)."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import uuid

from tests.support.netns import PREFIX, ShapedLink

SEND = 200_000  # bytes the edge sends to the cloud


def _qdisc(link: ShapedLink) -> str:
    return subprocess.run(
        ["ip", "netns", "exec", link.name, "tc", "qdisc", "show", "dev", link.edge_wan],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout


def test_an_unthrottled_link_has_no_bucket_and_counts_what_the_edge_sent() -> None:
    with ShapedLink(f"{PREFIX}u{uuid.uuid4().hex[:8]}", 0) as link:
        assert "tbf" not in _qdisc(link)
        before = link.uplink_bytes()
        got = bytearray()
        with socket.create_server((link.cloud_ip, 0)) as server:
            port = server.getsockname()[1]

            def take() -> None:
                conn, _ = server.accept()
                with conn:
                    while chunk := conn.recv(65536):
                        got.extend(chunk)

            reader = threading.Thread(target=take, daemon=True)
            reader.start()
            send = f"import socket; s = socket.create_connection(('{link.cloud_ip}', {port})); s.sendall(b'x' * {SEND}); s.close()"
            subprocess.run(["ip", "netns", "exec", link.name, sys.executable, "-c", send], check=True, timeout=60)
            reader.join(60)
        assert len(got) == SEND
        sent = link.uplink_bytes() - before
        assert SEND < sent < SEND * 1.1  # the payload, and the frames' headers on top

        link.shape(2000)
        assert "tbf" in _qdisc(link)
        link.shape(0)  # back to unthrottled: the bucket is gone
        assert "tbf" not in _qdisc(link)
