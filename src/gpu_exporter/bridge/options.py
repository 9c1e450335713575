"""The cloud bridge's options: its MQTT session and bounds, and the remote-write target."""

from __future__ import annotations

from dataclasses import dataclass

from gpu_exporter.config.parsers import (
    Option,
    choice,
    duration_at_least,
    int_between,
    parse_bool,
    parse_group,
    parse_headers,
    parse_http_url,
    parse_label_name,
    parse_listen,
    parse_max_payload,
    parse_packet_size,
    parse_positive_int,
    seconds_between,
    size_between,
)

__all__ = ["BRIDGE_OPTIONS", "REMOTE_WRITE_OPTIONS", "BridgeOptions", "RemoteWriteOptions"]


@dataclass(frozen=True)
class BridgeOptions:
    bridge_group: str = ""  # shared-subscription group; empty: one bridge takes everything
    bridge_client_id: str = ""  # empty: gpu-exporter-bridge-<hostname>-<listen port>
    bridge_session_expiry: float = 86400.0
    bridge_listen_address: str = ":9401"
    bridge_max_inflight: int = 200
    bridge_write_linger: float = 0.5
    bridge_max_payload: int = 4 * 1024 * 1024
    bridge_max_inflight_bytes: int = 64 * 1024 * 1024
    bridge_max_packet_size: int = 0  # 0: --bridge.max-payload plus 64KiB
    # 1,000 8-GPU nodes with their health reports are 888,000 series: room for about 1,690 such nodes
    bridge_max_series: int = 1_500_000
    bridge_new_nodes_per_minute: int = 10
    bridge_new_nodes_burst: int = 0  # 0: --bridge.max-series / 100
    bridge_readiness_timeout: float = 30.0
    bridge_node_label: str = "node"
    bridge_series_cache: int = 750_000
    bridge_max_clock_skew: float = 300.0
    bridge_clock_skew_policy: str = "correct"
    bridge_state_dir: str = ""
    bridge_max_series_per_node: int = 10_000


@dataclass(frozen=True)
class RemoteWriteOptions:
    remote_write_url: str = ""
    remote_write_username: str = ""
    remote_write_password_file: str = ""
    remote_write_bearer_token_file: str = ""
    remote_write_tls_ca_file: str = ""
    remote_write_tls_cert_file: str = ""
    remote_write_tls_key_file: str = ""
    remote_write_tls_insecure_skip_verify: bool = False
    remote_write_timeout: float = 10.0
    remote_write_max_samples: int = 5000
    remote_write_max_backoff: float = 10.0
    remote_write_headers: str = ""  # "Name=value,Name=value", e.g. X-Scope-OrgID=fleet


BRIDGE_OPTIONS: tuple[Option, ...] = (
    Option(
        "bridge.group",
        "bridge_group",
        parse_group,
        "bridge: MQTT 5 shared-subscription group, so that several bridges split the load",
        "NAME",
    ),
    Option(
        "bridge.client-id",
        "bridge_client_id",
        str,
        "bridge: MQTT client id; keep it stable across restarts, the session is kept under it "
        "(default: gpu-exporter-bridge-<hostname>-<listen port>: two bridges on one host differ, a restart keeps it)",
        "ID",
    ),
    Option(
        "bridge.session-expiry",
        "bridge_session_expiry",
        duration_at_least(1),
        "bridge: how long the broker keeps the session and its messages while the bridge is away",
        "DURATION",
    ),
    Option(
        "bridge.listen-address",
        "bridge_listen_address",
        parse_listen,
        "bridge: address of its own /metrics",
        "[HOST]:PORT",
    ),
    Option(
        "bridge.max-inflight",
        "bridge_max_inflight",
        int_between(1, 65535),
        "bridge: unacknowledged messages the broker may send at once (MQTT 5 Receive Maximum)",
        "N",
    ),
    Option(
        "bridge.write-linger",
        "bridge_write_linger",
        seconds_between(0, 60),
        "bridge: how long the writer waits for more messages before a remote write, so that messages "
        "arriving one at a time are written together; adds at most this much to the lag (0: no wait)",
        "DURATION",
    ),
    Option(
        "bridge.max-inflight-bytes",
        "bridge_max_inflight_bytes",
        size_between(64 * 1024, 1 << 34),
        "bridge: payload bytes it holds unacknowledged; at this bound (or --bridge.max-inflight messages) "
        "it stops reading from the broker, which keeps the rest",
        "SIZE",
    ),
    Option(
        "bridge.max-payload",
        "bridge_max_payload",
        parse_max_payload,
        "bridge: larger payloads (compressed or inflated) are dropped and counted",
        "SIZE",
    ),
    Option(
        "bridge.max-packet-size",
        "bridge_max_packet_size",
        parse_packet_size,
        "bridge: MQTT 5 Maximum Packet Size announced to the broker, which then does not send larger "
        "messages (0: --bridge.max-payload plus 64KiB)",
        "SIZE",
    ),
    Option(
        "bridge.node-label",
        "bridge_node_label",
        parse_label_name,
        "bridge: label that carries the node name on every series",
        "NAME",
    ),
    Option(
        "bridge.series-cache",
        "bridge_series_cache",
        int_between(1, 100_000_000),
        "bridge: bound of the per-device bookkeeping, in units of ~300 bytes (a device is about 6)",
        "N",
    ),
    Option(
        "bridge.max-series-per-node",
        "bridge_max_series_per_node",
        parse_positive_int,
        "bridge: distinct series one node may create; values of further series are dropped and counted",
        "N",
    ),
    Option(
        "bridge.max-series",
        "bridge_max_series",
        int_between(1, 100_000_000),
        "bridge: distinct active series all nodes together may create; values of further series are dropped "
        "and counted",
        "N",
    ),
    Option(
        "bridge.new-nodes-per-minute",
        "bridge_new_nodes_per_minute",
        int_between(1, 1_000_000),
        "bridge: new node names admitted per minute past --bridge.new-nodes-burst (not counted for the fleet "
        "it hears right after a start: its session's backlog and retained status messages); batches of "
        "further new names wait, unacknowledged, until their name is admitted",
        "N",
    ),
    Option(
        "bridge.new-nodes-burst",
        "bridge_new_nodes_burst",
        int_between(0, 100_000_000),
        "bridge: new node names admitted at once, e.g. a DaemonSet rolled out onto the whole fleet "
        "(0: --bridge.max-series / 100, the fleet that budget was sized for)",
        "N",
    ),
    Option(
        "bridge.readiness-timeout",
        "bridge_readiness_timeout",
        duration_at_least(1),
        "bridge: /readyz answers 503 once the MQTT broker has been unreachable, or remote writes have "
        "failed, for this long",
        "DURATION",
    ),
    Option(
        "bridge.max-clock-skew",
        "bridge_max_clock_skew",
        duration_at_least(1),
        "bridge: a node's clock may be this far off the bridge's before its batches are corrected or "
        "refused (--bridge.clock-skew-policy); samples after the bridge's clock are never written",
        "DURATION",
    ),
    Option(
        "bridge.clock-skew-policy",
        "bridge_clock_skew_policy",
        choice("correct", "refuse"),
        "bridge: batches of a node whose clock is off by more than --bridge.max-clock-skew: move their "
        "timestamps by the measured offset, or refuse them (counted per node)",
        "POLICY",
    ),
    Option(
        "bridge.state-dir",
        "bridge_state_dir",
        str,
        "bridge: folder for the record of what it wrote, so that a restarted bridge does not write again "
        "what the broker delivers again (an emptyDir in Kubernetes; empty: no record)",
        "DIR",
    ),
)

REMOTE_WRITE_OPTIONS: tuple[Option, ...] = (
    Option(
        "remote-write.url",
        "remote_write_url",
        parse_http_url,
        "bridge: Prometheus remote-write endpoint, e.g. http://prometheus:9090/api/v1/write",
        "URL",
    ),
    Option("remote-write.username", "remote_write_username", str, "bridge: basic-auth user", "USER"),
    Option(
        "remote-write.password-file",
        "remote_write_password_file",
        str,
        "bridge: file holding the basic-auth password",
        "FILE",
    ),
    Option(
        "remote-write.bearer-token-file",
        "remote_write_bearer_token_file",
        str,
        "bridge: file holding a bearer token",
        "FILE",
    ),
    Option(
        "remote-write.tls.ca-file",
        "remote_write_tls_ca_file",
        str,
        "bridge: CA bundle to verify the remote-write server",
        "FILE",
    ),
    Option(
        "remote-write.tls.cert-file",
        "remote_write_tls_cert_file",
        str,
        "bridge: client certificate for the remote-write server",
        "FILE",
    ),
    Option(
        "remote-write.tls.key-file", "remote_write_tls_key_file", str, "bridge: key of the client certificate", "FILE"
    ),
    Option(
        "remote-write.tls.insecure-skip-verify",
        "remote_write_tls_insecure_skip_verify",
        parse_bool,
        "bridge: do not verify the server certificate (testing only)",
        "BOOL",
    ),
    Option(
        "remote-write.timeout",
        "remote_write_timeout",
        duration_at_least(0.1, 600),
        "bridge: timeout of one remote-write request",
        "DURATION",
    ),
    Option(
        "remote-write.max-samples-per-request",
        "remote_write_max_samples",
        int_between(1, 1_000_000),
        "bridge: larger writes are split into several requests",
        "N",
    ),
    Option(
        "remote-write.headers",
        "remote_write_headers",
        parse_headers,
        "bridge: extra HTTP headers, comma-separated Name=value (X-Scope-OrgID=fleet for Mimir, "
        "THANOS-TENANT=fleet for Thanos Receive)",
        "LIST",
    ),
    Option(
        "remote-write.max-backoff",
        "remote_write_max_backoff",
        duration_at_least(0.01, 3600),
        "bridge: longest wait between retries of a failing write (5xx, 429, network)",
        "DURATION",
    ),
)
