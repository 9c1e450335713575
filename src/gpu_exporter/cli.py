"""Command line: ``gpu-exporter [flags]`` runs the exporter; ``gpu-exporter <subcommand>`` the others.

Exit codes: 0 clean stop, 1 a runtime problem (no GPU library, port in use), 2 a usage problem (bad
flag, bad config). Every error a user can cause ends in one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Any

from gpu_exporter import config as cfg
from gpu_exporter.buildinfo import add_version_flag
from gpu_exporter.config.commands import AGENT
from gpu_exporter.config.flags import FlagParser
from gpu_exporter.daemon import Signals, limit_malloc_arenas
from gpu_exporter.logs import setup_logging
from gpu_exporter.web.activation import ActivationError

__all__ = ["build_parser", "entry", "main", "setup_logging"]

log = logging.getLogger("gpu_exporter")

PROG = "gpu-exporter"

# subcommand -> "module:function" taking argv and returning an exit code
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "tail": ("gpu_exporter.forward.tail:main", "print the decoded samples arriving on an MQTT broker"),
    "bridge": ("gpu_exporter.bridge.cli:main", "cloud side: MQTT to Prometheus remote write"),
    "doctor": ("gpu_exporter.doctor:main", "check this node: GPU libraries, devices, mounts, spool, broker"),
}


def build_parser() -> argparse.ArgumentParser:
    subs = "\n".join(f"  {name:8} {text}" for name, (_, text) in SUBCOMMANDS.items())
    parser = FlagParser(
        prog=PROG,
        words=tuple(SUBCOMMANDS),
        description="Node-level GPU metrics exporter: Prometheus endpoint and store-and-forward over MQTT.",
        epilog=f"subcommands (gpu-exporter SUBCOMMAND --help):\n{subs}\n\n"
        f"Every option can also be set as an environment variable ({cfg.ENV_PREFIX}<OPTION>, e.g. "
        f"{cfg.env_name('web.listen-address')}) or as a key in the --config.file YAML.\n"
        "Precedence: flag > environment > file > default.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_version_flag(parser)
    cfg.add_arguments(parser, AGENT)
    return parser


def _fail(message: str, code: int) -> int:
    print(f"{PROG}: {message}", file=sys.stderr)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list and args_list[0] in SUBCOMMANDS:
        target, _ = SUBCOMMANDS[args_list[0]]
        module_name, _, func = target.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            return _fail(f"the {args_list[0]} subcommand is not available in this build", 2)
        code: int = getattr(module, func)(args_list[1:])
        return code
    args = build_parser().parse_args(args_list)
    try:
        config = cfg.load(vars(args))
    except cfg.ConfigError as exc:
        return _fail(str(exc), 2)
    setup_logging(config.log_level, config.log_format)
    return run(config, args=vars(args))


def run(config: cfg.Config, stop: threading.Event | None = None, args: dict[str, Any] | None = None) -> int:
    """Run the exporter until SIGTERM/SIGINT (or ``stop`` is set); SIGHUP reloads the configuration."""
    from prometheus_client import CollectorRegistry

    from gpu_exporter import selfmetrics
    from gpu_exporter.backends import base
    from gpu_exporter.exposition import AgentCollector, Exposition, MetricsServer
    from gpu_exporter.filewatch import Watched
    from gpu_exporter.reload import Reloader
    from gpu_exporter.ring import RingBuffer
    from gpu_exporter.sampler import Sampler
    from gpu_exporter.web.server import ServerCollector
    from gpu_exporter.web.webconfig import load_web_config

    # the files a change of which reloads, as they stand before this run reads them (main() has just read
    # the config file): a change while the exporter starts is not missed
    watched = Watched((config.config_file, config.web_config_file))
    stop = stop or threading.Event()
    limit_malloc_arenas()
    try:
        sockets = _sockets(config)  # before the GPU library starts: a unit without its socket fails at once
    except ActivationError as exc:
        return _fail(str(exc), 2)
    try:
        backends = base.create(config)
    except base.BackendError as exc:
        return _fail(str(exc), 1)

    ring = RingBuffer(config.buffer_size)
    registry = CollectorRegistry(auto_describe=False)
    attributor = None
    if config.k8s_pod_attribution:
        from gpu_exporter.k8s import PodAttributor

        attributor = PodAttributor(config, ring, registry)
    view = _view(config, attributor)
    sections = [attributor.text] if attributor is not None else []
    listeners = []
    if config.processes_series and attributor is None:  # with attribution on, the attributor renders them
        from gpu_exporter.k8s.processes import ProcessSeries

        processes = ProcessSeries(config.path_procfs, config.processes_series_max, registry)
        sections.append(processes.text)
        listeners.append(processes.update)
    exposition = Exposition(registry, view, sections)
    sampler = Sampler(backends, ring, config.interval, [*listeners, exposition.update])
    exposition.stale = sampler.stale
    registry.register(AgentCollector(sampler, ring, backends))
    if not config.web_disable_exporter_metrics:  # node_exporter's flag: no process_*, no promhttp_* there
        selfmetrics.register(registry)  # process_*; the build info is AgentCollector's

    forwarder: Any = None

    def ready() -> tuple[bool, str]:
        return readiness(ring, exposition, backends, forwarder, sampler)

    try:
        web = load_web_config(config.web_config_file)
    except ValueError as exc:
        return _fail(str(exc), 2)
    try:
        server = MetricsServer(
            config.listen_address, config.telemetry_path, exposition, ready, web, _limits(config), sockets
        )
    except OSError as exc:  # listeners.ListenError: "cannot listen on ADDRESS: reason"
        for backend in backends:
            backend.close()
        return _fail(str(exc), 1)

    if not config.web_disable_exporter_metrics:
        registry.register(ServerCollector(lambda: server))  # gpu_exporter_http_*: the endpoint's own
    if getattr(config, "mqtt_url", ""):
        forward = importlib.import_module("gpu_exporter.forward.service")
        extra = attributor.device_values if attributor is not None else None  # per-pod series go too
        forwarder = forward.Forwarder(config, ring, registry, extra=extra)

    def on_stop(signum: int) -> None:
        log.info("received %s, stopping", signal.Signals(signum).name)

    def apply(old: cfg.Config, new: cfg.Config) -> None:
        if bool(old.mqtt_url) != bool(new.mqtt_url):
            raise ValueError("turning forwarding on or off (--mqtt.url) needs a restart")
        web = load_web_config(new.web_config_file)  # first: a file that fails to load changes nothing
        if (old.log_level, old.log_format) != (new.log_level, new.log_format):
            setup_logging(new.log_level, new.log_format)
        sampler.interval = new.interval
        if (old.metrics_include, old.metrics_exclude) != (new.metrics_include, new.metrics_exclude):
            exposition.view = _view(new, attributor)
        server.set_web(web)  # always: the file's content may have changed
        server.limits = _limits(new)
        if forwarder is not None:
            forwarder.reconfigure(new)

    reloader = Reloader(args if args is not None else {}, config, [apply])

    def on_hup() -> None:
        log.info("received SIGHUP, reloading the configuration")
        reloader.reload("SIGHUP")

    signals = Signals(stop, on_stop)
    signals.install()

    server.start()
    if attributor is not None:
        attributor.start()
    sampler.start()
    if forwarder is not None:
        forwarder.start()
    log.info(
        "serving %s on %s (port %d%s), node %s, %s backend(s), interval %gs",
        config.telemetry_path,
        ", ".join(server.addresses),
        server.port,
        ", passed by systemd" if config.web_systemd_socket else "",
        config.node_name,
        ",".join(b.name for b in backends),
        config.interval,
    )
    reloader.watch(watched)
    signals.run(on_hup)
    reloader.stop()
    sampler.stop()
    if attributor is not None:
        attributor.stop(timeout=5.0)
    if forwarder is not None:
        forwarder.stop(timeout=5.0)
    server.stop()
    for backend in backends:
        backend.close()
    log.info("stopped")
    return 0


def readiness(
    ring: Any, exposition: Any, backends: Sequence[Any], forwarder: Any, sampler: Any = None
) -> tuple[bool, str]:
    """/readyz: the page holds a sample, the sampler is not stale, a GPU answers, and forwarding (when on)
    works.

    The page, not the ring: the sampler fills the ring before its listeners render the page, and a
    scrape in between would get an empty 200."""
    if sampler is not None and sampler.stale():
        return False, f"no GPU read for {sampler.age():.0f}s: the sampler is stuck or failing"
    if ring.latest() is None or exposition.last_sample is None:
        return False, "no sample yet"
    if not any(b.healthy() for b in backends):
        return False, "no GPU is answering"
    if forwarder is not None:
        forwarding, why = forwarder.health(link=False)
        if not forwarding:
            return False, why
    return True, "ready"


def _view(config: cfg.Config, attributor: Any) -> Any:
    from gpu_exporter.exposition import native_view

    if config.metrics_naming == "dcgm":
        from gpu_exporter.naming import dcgm_view

        pods = (lambda uuid: attributor.device_pods().get(uuid)) if attributor is not None else None
        shares = None
        if attributor is not None and config.k8s_virtual_gpus:
            shares = lambda uuid: attributor.device_pods().shares(uuid)  # noqa: E731 - as pods above
        return dcgm_view(
            config.node_name, config.metrics_include, config.metrics_exclude, config.collector_enabled, pods, shares
        )
    return native_view(config.metrics_include, config.metrics_exclude, config.collector_enabled)


def _sockets(config: cfg.Config) -> list[Any]:
    """The sockets systemd passed (``--web.systemd-socket``), or none: the server binds the addresses."""
    if not config.web_systemd_socket:
        return []
    from gpu_exporter.web.activation import inherited_sockets

    return inherited_sockets()


def _limits(config: cfg.Config) -> Any:
    from gpu_exporter.web.server import Limits

    return Limits(config.web_max_connections, config.web_read_timeout, config.web_idle_timeout)


def entry() -> None:
    """Console-script entry point."""
    try:
        code = main()
    except KeyboardInterrupt:
        code = 130
    sys.exit(code)
