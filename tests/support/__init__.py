"""What the tests share: ports, waits, child processes, promtool, paths and golden pages here; brokers,
databases, proxies, shaped links and other rigs in the modules beside (docs/testing.md, "Layout")."""

from .golden import check_golden
from .paths import FAKES, FIXTURES, GOLDEN, ROOT, SRC
from .ports import free_port
from .procs import Exporter, child_env, exporter_cmd, http_get, lone_bridge_args, spawn_logged, stop_process
from .promtool import promtool_check, promtool_path
from .waits import wait_for, wait_progressing, wait_until

__all__ = [
    "FAKES",
    "FIXTURES",
    "GOLDEN",
    "ROOT",
    "SRC",
    "Exporter",
    "check_golden",
    "child_env",
    "exporter_cmd",
    "free_port",
    "http_get",
    "lone_bridge_args",
    "promtool_check",
    "promtool_path",
    "spawn_logged",
    "stop_process",
    "wait_for",
    "wait_progressing",
    "wait_until",
]
