"""aedes (npm), a second MQTT broker implementation for the bridge tests, run by Node.js on 127.0.0.1.

aedes 1.2 speaks MQTT 3.1 and 3.1.1 only: to an MQTT 5 CONNECT it answers "unacceptable protocol
version". .ci/run installs it with npm into ``GPU_EXPORTER_AEDES_DIR`` (default
``~/.cache/gpu-exporter/aedes``); ``tests/support/aedes_broker.mjs`` starts it on a free port, and
it is stopped by PID.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
from pathlib import Path

import pytest

from .paths import ROOT
from .tsdb import Server

__all__ = ["AedesServer", "aedes_dir"]

RUNNER = ROOT / "tests" / "support" / "aedes_broker.mjs"


def aedes_dir() -> Path:
    """The folder holding node_modules/aedes; the test is skipped (a failure in CI) without it."""
    folder = Path(os.environ.get("GPU_EXPORTER_AEDES_DIR") or Path.home() / ".cache" / "gpu-exporter" / "aedes")
    if shutil.which("node") is None:
        pytest.skip("node (Node.js) is not installed; .ci/run installs it with aedes")
    if not (folder / "node_modules" / "aedes" / "package.json").is_file():
        pytest.skip(f"aedes is not installed in {folder}: npm install --prefix {folder} aedes@1.2.0 (.ci/run does)")
    return folder


class AedesServer(Server):
    name = "aedes"

    def __init__(self, workdir: Path) -> None:
        super().__init__(workdir)
        self.modules = aedes_dir()
        self.version = json.loads((self.modules / "node_modules" / "aedes" / "package.json").read_text())["version"]

    def command(self) -> list[str]:
        return [shutil.which("node") or "node", str(RUNNER), str(self.modules), str(self.port)]

    def ready(self) -> bool:
        with socket.create_connection(("127.0.0.1", self.port), timeout=1.0):
            return "listening on" in self.log()

    @property
    def url(self) -> str:
        return f"mqtt://127.0.0.1:{self.port}"
