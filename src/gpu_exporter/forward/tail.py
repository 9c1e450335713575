"""``gpu-exporter tail``: subscribe to the batch topics and print decoded samples as JSON lines.

What to reach for when ``mosquitto_sub`` shows compressed bytes: one line per device and sample, with the
node, boot id, sequence number, timestamp and the values under their Prometheus names.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from datetime import datetime, timezone
from types import FrameType
from typing import Any, TextIO

import paho.mqtt.client as paho
from paho.mqtt.enums import MQTTErrorCode

from gpu_exporter import catalog
from gpu_exporter import config as cfg
from gpu_exporter.config.commands import TAIL
from gpu_exporter.config.flags import FlagParser
from gpu_exporter.forward.options import SUBSCRIBER_HELP
from gpu_exporter.mqtt.client import new_client
from gpu_exporter.mqtt.settings import LinkSettings, read_password
from gpu_exporter.payload import Batch, PayloadError, decode
from gpu_exporter.units import parse_duration

__all__ = ["lines", "main"]

PROG = "gpu-exporter tail"


def _parser() -> argparse.ArgumentParser:
    parser = FlagParser(
        prog=PROG,
        description="Print the samples arriving on an MQTT broker, decoded, one JSON line per device and sample.",
    )
    for opt in TAIL:
        parser.add_argument(
            f"--{opt.name}",
            dest=opt.name,
            metavar=opt.metavar,
            default=argparse.SUPPRESS,
            help=SUBSCRIBER_HELP.get(opt.name, opt.help),
        )
    parser.add_argument("--node", default="+", help="only this node's batches (default: all nodes)")
    parser.add_argument("--count", type=int, default=0, metavar="N", help="exit after N batches (default: never)")
    parser.add_argument(
        "--timeout", default="0", metavar="DURATION", help="exit after this long (e.g. 30s; default: never)"
    )
    return parser


def _label_text(labels: Sequence[tuple[str, str]]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{v}"' for k, v in labels) + "}"


def _series_name(key: str, values: tuple[str, ...]) -> str:
    base, _, stat = key.partition(":")  # "<key>:max" in a summary batch, as the bridge names it
    try:
        metric = catalog.by_key(base)
    except KeyError:
        return key  # a newer agent's metric: show the key rather than drop it
    return (
        metric.name
        + (f"_{stat}" if stat else "")
        + _label_text(list(metric.const_labels) + list(zip(metric.labels, values, strict=False)))
    )


def lines(batch: Batch) -> Iterator[dict[str, Any]]:
    """The JSON objects ``tail`` prints for one batch (none for a health report: it has no devices)."""
    for sample in batch.samples:
        when = datetime.fromtimestamp(sample.timestamp, timezone.utc).isoformat(timespec="milliseconds")
        for dev in sample.devices:
            yield {
                "node": batch.node,
                "boot": batch.boot,
                "seq": sample.seq,
                "timestamp": when.replace("+00:00", "Z"),
                **dict(dev.device.labels()),
                "up": dev.up,
                **({"summary_ms": batch.summary_ms} if batch.summary_ms else {}),
                "values": {_series_name(k, v): value for (k, v), value in sorted(dev.values.items())},
            }


def _fail(message: str, code: int) -> int:
    print(f"{PROG}: {message}", file=sys.stderr)
    return code


def main(argv: Sequence[str], out: TextIO | None = None) -> int:
    out = out or sys.stdout
    parser = _parser()
    args = vars(parser.parse_args(list(argv)))
    node, count = args.pop("node"), args.pop("count")
    try:
        timeout = parse_duration(args.pop("timeout"))
        config = cfg.load(args)
    except (ValueError, cfg.ConfigError) as exc:
        return _fail(str(exc), 2)
    if not config.mqtt_url:
        return _fail("--mqtt.url is required (mqtt://HOST[:PORT] or mqtts://HOST[:PORT])", 2)
    if "+" in node[1:] or "#" in node or "/" in node:
        return _fail(f"invalid --node {node!r}", 2)
    try:
        settings = LinkSettings.from_config(config, client_id=f"gpu-exporter-tail-{uuid.uuid4().hex[:8]}")
    except cfg.ConfigError as exc:
        return _fail(str(exc), 2)
    state: dict[str, Any] = {"batches": 0, "error": "", "connected": False}
    topic = f"{config.mqtt_topic_prefix}/{node}/batch"

    password = None
    if settings.username:
        try:
            password = read_password(settings)
        except OSError as exc:
            return _fail(f"cannot read --mqtt.password-file: {exc.strerror}", 2)
    client = new_client(settings, password)

    def on_connect(c: paho.Client, userdata: Any, flags: Any, reason: Any, props: Any) -> None:
        if reason.is_failure:
            state["error"] = f"broker refused the connection: {reason.getName()}"
            return
        state["connected"] = True
        c.subscribe(topic, qos=1)

    def on_message(c: paho.Client, userdata: Any, msg: paho.MQTTMessage) -> None:
        try:
            batch = decode(msg.payload)
        except PayloadError as exc:
            print(f"{PROG}: {msg.topic}: {exc}", file=sys.stderr, flush=True)
            return
        for line in lines(batch):
            out.write(json.dumps(line) + "\n")
        out.flush()
        state["batches"] += 1

    client.on_connect = on_connect
    client.on_message = on_message
    stop = {"now": False}

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop["now"] = True

    previous = {}
    try:
        for signum in (signal.SIGTERM, signal.SIGINT):
            previous[signum] = signal.signal(signum, on_signal)
    except ValueError:  # not the main thread
        pass
    try:
        return _follow(client, settings, state, count, timeout, stop)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _follow(
    client: paho.Client,
    settings: LinkSettings,
    state: dict[str, Any],
    count: int,
    timeout: float,
    stop: dict[str, bool],
) -> int:
    try:
        client.connect(settings.host, settings.port, keepalive=settings.keepalive)
    except OSError as exc:
        return _fail(f"cannot connect to the broker at {settings.host}:{settings.port}: {exc}", 1)
    deadline = time.monotonic() + timeout if timeout else None
    try:
        while not stop["now"]:
            if state["error"]:
                return _fail(state["error"], 1)
            if count and state["batches"] >= count:
                break
            if deadline is not None and time.monotonic() >= deadline:
                break
            rc = client.loop(timeout=0.2)
            if rc != MQTTErrorCode.MQTT_ERR_SUCCESS:
                if state["error"]:
                    return _fail(state["error"], 1)
                return _fail(f"connection to the broker lost: {paho.error_string(rc)}", 1)
    except BrokenPipeError:  # `... | head`
        return 0
    finally:
        try:
            client.disconnect()
        except Exception:  # best effort on the way out
            pass
    return 0
