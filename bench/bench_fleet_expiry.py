"""Where a backlog waits: the broker's hold time (Message Expiry Interval countdown) against the real wait.

A subscriber shaped like the bridge (MQTT 5, persistent session, manual acknowledgements, Receive Maximum
``--rm``, its network thread held once it holds ``--hold`` messages, like bridge/inflight.py) drains
``--messages`` messages published at once, acknowledging ``--rate`` per second, through a real Mosquitto
on 127.0.0.1. Each message carries its publish time; the subscriber prints, for a sample of them, the
real wait (read - published) and the broker's hold time (expiry set - expiry received). ``--restart``
stops and restarts the broker (persistence on) while the backlog waits.

Mosquitto 2.0.11 (2026-12-01): ``--rm 200 --hold 50`` (the bench's bridge: Receive Maximum 200, Mosquitto's
max_inflight_messages 100), 800 messages at 40/s: every message arrives with a hold time of 0 s though the
last waited 18.9 s; the broker wrote the whole queue at once and the wait was in its output buffer and the
socket. ``--rm 1``: the window is kept and the hold time counts the wait.

    python3 bench/bench_fleet_expiry.py [--messages 800] [--rate 40] [--rm 200] [--hold 50] [--restart]
"""

from __future__ import annotations

import argparse
import os
import queue
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

EXPIRY = 1000


def _broker(workdir: str, port: int) -> subprocess.Popen[bytes]:
    conf = os.path.join(workdir, "mosquitto.conf")
    with open(conf, "w") as f:
        f.write(
            f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence true\npersistence_location {workdir}/\n"
            "autosave_interval 1\nmax_queued_messages 100000\nmax_inflight_messages 100\n"
            + ("user root\n" if os.geteuid() == 0 else "")
        )
    proc = subprocess.Popen(
        [shutil.which("mosquitto") or "/usr/sbin/mosquitto", "-c", conf],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return proc
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("mosquitto did not start")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=800)
    ap.add_argument("--rate", type=float, default=40.0, help="acknowledgements per second")
    ap.add_argument("--rm", type=int, default=200, help="the subscriber's Receive Maximum")
    ap.add_argument("--hold", type=int, default=50, help="messages held before the network thread waits")
    ap.add_argument("--restart", action="store_true", help="restart the broker while the backlog waits")
    args = ap.parse_args()
    workdir = tempfile.mkdtemp(prefix="bench-expiry-")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    broker = _broker(workdir, port)
    rows: list[tuple[float, int]] = []
    cond = threading.Condition()
    held = [0]
    acks: queue.Queue[int | None] = queue.Queue()

    def on_message(c: mqtt.Client, u: Any, m: mqtt.MQTTMessage) -> None:
        remaining = getattr(m.properties, "MessageExpiryInterval", EXPIRY)
        rows.append((time.time() - float(m.payload.decode()), EXPIRY - remaining))
        with cond:  # like Inflight.admit: paho's thread waits at the bound
            while held[0] >= args.hold:
                cond.wait(0.25)
            held[0] += 1
        acks.put(m.mid)

    sub = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="expiry-sub", protocol=mqtt.MQTTv5, manual_ack=True)
    props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
    props.SessionExpiryInterval = 3600
    props.ReceiveMaximum = args.rm
    subscribed = threading.Event()
    sub.on_message = on_message
    sub.on_connect = lambda c, u, f, r, p: c.subscribe("t/#", qos=1)
    sub.on_subscribe = lambda *a: subscribed.set()
    sub.reconnect_delay_set(1, 2)
    sub.connect("127.0.0.1", port, clean_start=False, properties=props)
    sub.loop_start()
    subscribed.wait(10)

    def acknowledge() -> None:
        while (mid := acks.get()) is not None:
            time.sleep(1 / args.rate)
            sub.ack(mid, 1)
            with cond:
                held[0] -= 1
                cond.notify_all()

    threading.Thread(target=acknowledge, daemon=True).start()
    pub = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="expiry-pub", protocol=mqtt.MQTTv5)
    pub.connect("127.0.0.1", port)
    pub.loop_start()
    infos = []
    for _ in range(args.messages):
        pp = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
        pp.MessageExpiryInterval = EXPIRY
        infos.append(pub.publish("t/x", f"{time.time():.3f}".ljust(2000), qos=1, properties=pp))
    for info in infos:
        info.wait_for_publish(30)
    pub.disconnect()
    pub.loop_stop()
    if args.restart:
        time.sleep(3)
        broker.terminate()
        broker.wait()
        time.sleep(3)
        broker = _broker(workdir, port)
    deadline = time.time() + args.messages / args.rate * 1.5 + 30
    while len(rows) < args.messages and time.time() < deadline:
        time.sleep(0.5)
    acks.put(None)
    sub.disconnect()
    sub.loop_stop()
    broker.terminate()
    broker.wait()
    shutil.rmtree(workdir, ignore_errors=True)
    unseen = sorted(w - h for w, h in rows)
    print(f"{len(rows)} of {args.messages} read; wait the hold time does not show: max {unseen[-1]:.1f} s, ", end="")
    print(f"median {unseen[len(unseen) // 2]:.1f} s; max hold time {max(h for _, h in rows)} s")
    for i in range(0, len(rows), max(1, len(rows) // 10)):
        print(f"  message {i}: waited {rows[i][0]:.1f} s, hold time {rows[i][1]} s")


if __name__ == "__main__":
    main()
