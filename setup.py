"""Build hook (the rest of the build is pyproject.toml): a wheel records the revision and the date it was
built from, in gpu_exporter/_build.json, for ``--version`` and ``*_build_info`` (src/gpu_exporter/buildinfo.py).

The revision is the checkout's HEAD, or "unknown" outside a git checkout; the date honours
SOURCE_DATE_EPOCH (reproducible builds). A _build.json already in src/ (the Dockerfile writes one, having
no .git to ask) is shipped as it is.
"""

from __future__ import annotations

import json
import os
import subprocess
import time

from setuptools import setup
from setuptools.command.build_py import build_py


def _revision() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    revision = out.stdout.strip()
    return revision if out.returncode == 0 and revision else "unknown"


class BuildPyWithBuildInfo(build_py):
    def run(self) -> None:
        super().run()
        if os.path.exists(os.path.join("src", "gpu_exporter", "_build.json")):
            return
        epoch = float(os.environ.get("SOURCE_DATE_EPOCH", time.time()))
        info = {"revision": _revision(), "build_date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))}
        target = os.path.join(self.build_lib, "gpu_exporter", "_build.json")
        with open(target, "w", encoding="utf-8") as handle:
            json.dump(info, handle)
            handle.write("\n")


setup(cmdclass={"build_py": BuildPyWithBuildInfo})
