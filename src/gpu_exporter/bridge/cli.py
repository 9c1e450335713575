"""``gpu-exporter bridge``: MQTT batches from edge nodes to Prometheus remote write.

Exit codes as for the exporter: 0 clean stop, 1 a runtime problem (port in use), 2 a usage problem.
"""

from __future__ import annotations

import argparse
import errno
import gc
import logging
import os
import secrets
import socket
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import fields
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry

from gpu_exporter import __version__, selfmetrics
from gpu_exporter import config as cfg
from gpu_exporter.buildinfo import add_version_flag
from gpu_exporter.config.commands import BRIDGE
from gpu_exporter.config.flags import FlagParser
from gpu_exporter.config.sources import add_option
from gpu_exporter.daemon import Signals
from gpu_exporter.forward.options import SUBSCRIBER_HELP
from gpu_exporter.mqtt.tls import error_reason

if TYPE_CHECKING:
    from gpu_exporter.bridge.settings import BridgeSettings
    from gpu_exporter.web.server import WebServer
    from gpu_exporter.web.webconfig import WebConfig

__all__ = ["main", "run", "settings_from", "tune_gc", "tune_malloc"]

log = logging.getLogger("gpu_exporter.bridge")

PROG = "gpu-exporter bridge"


def build_parser() -> argparse.ArgumentParser:
    parser = FlagParser(
        prog=PROG,
        description="Cloud side of store-and-forward: subscribes to the edge nodes' MQTT batches and writes "
        "them to Prometheus remote write (Prometheus, VictoriaMetrics, Thanos Receive, Mimir). A message is "
        "acknowledged only after its samples were written.",
        epilog=f"Every option can also be set as an environment variable ({cfg.ENV_PREFIX}<OPTION>, e.g. "
        f"{cfg.env_name('remote-write.url')}) or as a key in the --config.file YAML.",
    )
    add_version_flag(parser)
    parser.add_argument(
        "--config.file",
        dest="config.file",
        metavar="FILE",
        default=argparse.SUPPRESS,
        help="YAML file with any of these options",
    )
    defaults = cfg.Config()
    for opt in BRIDGE:
        add_option(
            parser, opt, getattr(defaults, opt.field), SUBSCRIBER_HELP.get(opt.name, opt.help.removeprefix("bridge: "))
        )
    return parser


def _read_secret(path: str, what: str) -> str:
    if not path:
        return ""
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read().strip()
    except OSError as exc:
        raise cfg.ConfigError(f"cannot read the {what} file {path}: {exc.strerror}") from None


def _read_mqtt_password(path: str) -> bytes | None:
    """The MQTT password as the agent reads it (the file's first line, as bytes), read once at start."""
    from gpu_exporter.mqtt.settings import read_password_bytes

    if not path:
        return None
    try:
        return read_password_bytes(path)
    except OSError as exc:
        raise cfg.ConfigError(f"cannot read the MQTT password file {path}: {error_reason(exc)}") from None


_RANDOM_MARK = "-any-"


def default_client_id(listen_address: str) -> str:
    """The client id of a bridge given none: the host's name and the port it listens on. Stable across
    restarts, so the session (and what the broker keeps in it during a restart) is the restarted bridge's;
    distinct for two bridges on one host, which cannot listen on one port. With port 0 (any free port) no
    such name exists: then a random one, new for every process."""
    port = listen_address.rpartition(":")[2]
    suffix = port if port.isdigit() and int(port) > 0 else _RANDOM_MARK.strip("-") + "-" + secrets.token_hex(4)
    return f"gpu-exporter-bridge-{socket.gethostname()}-{suffix}"


def _stable(client_id: str) -> bool:
    return _RANDOM_MARK not in client_id


def settings_from(config: cfg.Config) -> BridgeSettings:
    """The bridge's settings from the shared configuration; ConfigError when something is missing."""
    from gpu_exporter.bridge.settings import OPTION, BridgeSettings

    if not config.mqtt_url:
        raise cfg.ConfigError("--mqtt.url is required (the broker the edge nodes publish to)")
    if not config.remote_write_url:
        raise cfg.ConfigError("--remote-write.url is required (e.g. http://prometheus:9090/api/v1/write)")
    if config.remote_write_username and config.remote_write_bearer_token_file:
        raise cfg.ConfigError("use either --remote-write.username or --remote-write.bearer-token-file, not both")
    if bool(config.remote_write_tls_cert_file) != bool(config.remote_write_tls_key_file):
        raise cfg.ConfigError("--remote-write.tls.cert-file and --remote-write.tls.key-file go together")
    client_id = config.bridge_client_id or default_client_id(config.bridge_listen_address)
    if config.bridge_state_dir and not config.bridge_client_id and not _stable(client_id):
        raise cfg.ConfigError(
            "--bridge.state-dir needs --bridge.client-id when --bridge.listen-address has port 0: the record of "
            "what was written belongs to the session kept under a stable client id"
        )
    options = {f.name: getattr(config, f.metadata[OPTION]) for f in fields(BridgeSettings) if OPTION in f.metadata}
    return BridgeSettings(
        **options,
        mqtt_password=_read_mqtt_password(config.mqtt_password_file),
        client_id=client_id,
        rw_password=_read_secret(config.remote_write_password_file, "remote-write password"),
        rw_bearer_token=_read_secret(config.remote_write_bearer_token_file, "bearer token"),
        rw_headers=tuple(
            (name.strip(), value.strip())
            for name, _, value in (item.partition("=") for item in config.remote_write_headers.split(","))
            if name.strip()
        ),
    )


def _fail(message: str, code: int) -> int:
    print(f"{PROG}: {message}", file=sys.stderr)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    from gpu_exporter.logs import setup_logging

    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        config = cfg.load(vars(args))
        settings = settings_from(config)
    except cfg.ConfigError as exc:
        return _fail(str(exc), 2)
    setup_logging(config.log_level, config.log_format)
    tune_malloc()
    return run(settings, config.bridge_listen_address, config=config)


_M_MMAP_THRESHOLD = -3  # mallopt parameter, from glibc's <malloc.h>


def tune_malloc() -> None:
    """One malloc arena (as the exporter), and every block of 1 MiB or more in its own mapping.

    Payloads and inflated JSON are blocks of up to --bridge.max-payload. By default glibc raises its
    mapping threshold to the largest block freed (up to 32 MiB), after which such blocks come from the
    heap, where freeing them rarely gives memory back: a burst of large messages would leave the bridge
    that much larger for good. A fixed threshold gives each large block back as it is freed. Called
    before any thread starts; MALLOC_MMAP_THRESHOLD_ in the environment is left to rule.
    """
    from gpu_exporter.daemon import limit_malloc_arenas

    limit_malloc_arenas()
    if "MALLOC_MMAP_THRESHOLD_" in os.environ or not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL(None).mallopt(_M_MMAP_THRESHOLD, 1024 * 1024)
    except (OSError, AttributeError):
        pass


def tune_gc() -> None:
    """Collect the youngest generation every 50,000 allocations instead of 700, the older ones rarer.

    The writer allocates a few lists and tuples per series and frees them a moment later, and hardly
    ever makes a reference cycle; with the default thresholds the collector runs thousands of times a
    second and takes about a third of the bridge's CPU (bench/bench_bridge.py).
    """
    gc.set_threshold(50_000, 50, 100)


def run(
    settings: BridgeSettings, listen: str, stop: threading.Event | None = None, config: cfg.Config | None = None
) -> int:
    """Run the bridge until SIGTERM/SIGINT (or ``stop`` is set); SIGHUP re-reads the web config file."""
    from gpu_exporter.bridge.service import Bridge
    from gpu_exporter.web.webconfig import load_web_config

    stop = stop or threading.Event()
    tune_gc()
    registry = CollectorRegistry(auto_describe=True)
    selfmetrics.register(registry, "gpu_exporter_bridge_build_info", "bridge")  # and process_*
    try:
        bridge = Bridge(settings, registry)
    except (ValueError, OSError) as exc:
        return _fail(str(exc).splitlines()[0] if str(exc) else type(exc).__name__, 2)
    config = config or cfg.Config()
    from gpu_exporter.filewatch import Watched

    web_path = config.web_config_file
    watched = Watched((web_path,), every=2.0)  # before the read: a change while the bridge starts is seen
    try:
        web = load_web_config(web_path)
        server = _server(listen, registry, web, config, bridge.ready)
    except ValueError as exc:
        return _fail(str(exc), 2)
    except OSError as exc:
        reason = "address already in use" if exc.errno == errno.EADDRINUSE else (exc.strerror or str(exc))
        return _fail(f"cannot listen on {listen}: {reason}", 1)

    signals = Signals(stop)
    signals.install()
    log.info(
        "bridge %s: %s -> %s, metrics on %s", settings.client_id, settings.mqtt_url, settings.remote_write_url, listen
    )
    if config.mqtt_url and not config.bridge_client_id:  # settings_from made one up
        if _stable(settings.client_id):
            log.info("no --bridge.client-id: connecting as %r (the host name and the listen port)", settings.client_id)
        else:
            log.warning(
                "no --bridge.client-id: connecting as %r, an id of this process only (the listen port is 0); a "
                "restarted bridge starts a new session, and what the broker kept for this one is not delivered "
                "to it. Give a stable id (the manifest uses the pod name)",
                settings.client_id,
            )
    server.start()
    bridge.start()
    try:
        signals.run(lambda: _reload_web(server, web_path), lambda: watched.changed() is not None)
    finally:
        log.info("stopping")
        bridge.stop(timeout=10.0)
        server.stop()
    return 0


def _server(
    listen: str, registry: CollectorRegistry, web: WebConfig, config: cfg.Config, ready: Callable[[], tuple[bool, str]]
) -> WebServer:
    """The bridge's /metrics on the shared endpoint (limits, TLS, basic auth); OSError when it cannot listen."""
    import gzip

    from prometheus_client import generate_latest
    from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest

    from gpu_exporter.openmetrics import CONTENT_TYPE, accepts_openmetrics
    from gpu_exporter.web.server import Limits, ServerCollector, Site, WebServer

    served = selfmetrics.Served(registry)  # without the _created series, as the agent's page

    def page(accept_gzip: bool) -> bytes:
        text = generate_latest(served)
        return gzip.compress(text, compresslevel=6, mtime=0) if accept_gzip else text

    def openmetrics_page(accept_gzip: bool) -> bytes:
        text: bytes = openmetrics_latest(served)  # type: ignore[no-untyped-call]
        return gzip.compress(text, compresslevel=6, mtime=0) if accept_gzip else text

    def negotiate(accept: str | None) -> tuple[Callable[[bool], bytes], str]:
        return (openmetrics_page, CONTENT_TYPE) if accepts_openmetrics(accept) else (page, site.content_type)

    site = Site("/metrics", page, ready, title=f"gpu-exporter bridge {__version__}", negotiate=negotiate)
    limits = Limits(config.web_max_connections, config.web_read_timeout, config.web_idle_timeout)
    server = WebServer(listen, site, web, limits)
    registry.register(ServerCollector(lambda: server, prefix="gpu_exporter_bridge"))
    return server


def _reload_web(server: WebServer, path: str) -> None:
    """SIGHUP: the web config file again (other bridge options need a restart)."""
    from gpu_exporter.web.webconfig import load_web_config

    log.info("re-reading the web config file (SIGHUP or a change); other options need a restart")
    try:
        server.set_web(load_web_config(path))
    except ValueError as exc:
        log.error("reload failed, keeping the running web config: %s", exc)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
