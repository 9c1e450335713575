"""Doctor checks that talk to the MQTT broker: reachable with the configured TLS and credentials, and
the node's clock against what the broker's certificate allows (MQTT itself carries no time)."""

from __future__ import annotations

import socket
import ssl
import threading
import time
import uuid
from typing import Any

from gpu_exporter import config as cfg
from gpu_exporter.doctor.checks import FAIL, OK, SKIP, WARN, Node, Result
from gpu_exporter.mqtt.settings import broker_address
from gpu_exporter.mqtt.tls import error_reason, tls_context

__all__ = ["broker", "clock"]

# No node running this release has a correct clock before this date (2025-01-01 UTC).
CLOCK_FLOOR = 1735689600.0


def broker(node: Node) -> Result:
    """CONNECT with the agent's TLS settings and credentials; the CONNACK says whether they work."""
    import paho.mqtt.client as paho

    from gpu_exporter.mqtt.client import new_client
    from gpu_exporter.mqtt.settings import LinkSettings, read_password

    name = "mqtt-broker"
    c = node.config
    if not c.mqtt_url:
        return Result(name, SKIP, "forwarding off (no --mqtt.url)")
    host, port, secure = broker_address(c.mqtt_url)
    answer: dict[str, Any] = {}
    done = threading.Event()

    def on_connect(client: Any, userdata: Any, flags: Any, reason: Any, props: Any) -> None:
        answer["reason"] = reason
        done.set()

    try:
        settings = LinkSettings.from_config(c, client_id=f"gpu-exporter-doctor-{uuid.uuid4().hex[:8]}")
        client = new_client(settings, read_password(settings) if settings.username else None)
        client.on_connect = on_connect
        client.connect(host, port, keepalive=10)
    except cfg.ConfigError as exc:
        return Result(name, FAIL, str(exc), "fix the TLS files named above")
    except ssl.SSLError as exc:
        return Result(name, FAIL, f"TLS with {host}:{port} failed: {error_reason(exc)}", _TLS_FIX)
    except OSError as exc:
        return Result(
            name,
            FAIL,
            f"cannot reach {host}:{port}: {error_reason(exc)}",
            "check the URL, DNS, the firewall and that the broker listens there",
        )
    deadline = time.monotonic() + node.mqtt_timeout
    try:
        while not done.is_set() and time.monotonic() < deadline:
            if client.loop(timeout=0.1) != paho.MQTT_ERR_SUCCESS:
                break
    except ssl.SSLError as exc:
        return Result(name, FAIL, f"TLS with {host}:{port} failed: {error_reason(exc)}", _TLS_FIX)
    finally:
        try:
            client.disconnect()
        except Exception:
            pass
    reason = answer.get("reason")
    if reason is None:
        return Result(
            name, FAIL, f"{host}:{port} did not answer CONNECT in {node.mqtt_timeout:g}s", "is it an MQTT broker?"
        )
    if getattr(reason, "is_failure", False):
        text = str(reason)
        fix = "check --mqtt.username and the password file, and the broker's ACL for this user"
        return Result(name, FAIL, f"broker refused the connection: {text}", fix)
    return Result(name, OK, f"connected to {host}:{port}{' over TLS' if secure else ''}")


_TLS_FIX = "check --mqtt.tls.ca-file (the CA that signed the broker), the host name in the URL and the clock"


def clock(node: Node) -> Result:
    """With forwarding on: the wall clock is plausible, and within the validity of the broker's certificate
    (mqtts://). Forwarded samples carry the node's timestamps; scraped ones get Prometheus's."""
    name = "clock"
    c = node.config
    if not c.mqtt_url:
        return Result(name, SKIP, "forwarding off (no --mqtt.url): the scraping Prometheus stamps the samples")
    now = node.clock()
    if now < CLOCK_FLOOR:
        return Result(
            name,
            FAIL,
            f"the clock says {time.strftime('%Y-%m-%d', time.gmtime(now))}, before this release",
            "enable NTP (chrony, systemd-timesyncd) on the node; without an RTC battery the clock restarts at its epoch",
        )
    if not c.mqtt_url.startswith("mqtts://"):
        return Result(name, OK, "plausible (plain MQTT carries no time to compare with)")
    host, port, _ = broker_address(c.mqtt_url)
    try:
        ctx = tls_context(c.mqtt_tls_ca_file, c.mqtt_tls_cert_file, c.mqtt_tls_key_file)
        ctx.check_hostname = False  # the name is the mqtt-broker check's business; the dates are ours
        with (
            socket.create_connection((host, port), timeout=node.mqtt_timeout) as raw,
            ctx.wrap_socket(raw, server_hostname=host),
        ):
            pass
    except ssl.SSLCertVerificationError as exc:
        if exc.verify_code in (_NOT_YET_VALID, _EXPIRED):
            return Result(
                name,
                FAIL,
                f"the clock ({time.strftime('%Y-%m-%d %H:%M', time.gmtime(now))} UTC) is outside the broker "
                f"certificate's validity ({exc.verify_message})",
                "fix the node's clock (NTP), or renew the broker's certificate; TLS fails until then",
            )
        return Result(name, WARN, f"could not check against the broker's certificate: {exc.verify_message}")
    except (OSError, ssl.SSLError, cfg.ConfigError) as exc:
        return Result(name, WARN, f"could not check against the broker's certificate: {error_reason(exc)}")
    return Result(name, OK, "plausible, and within the broker certificate's validity")


_NOT_YET_VALID, _EXPIRED = 9, 10  # X509_V_ERR_CERT_NOT_YET_VALID, X509_V_ERR_CERT_HAS_EXPIRED
