"""What build is running: version, revision and build date, for ``--version`` and ``*_build_info``.

The revision and date are written at build time into ``_build.json`` next to this file (the Dockerfile
and ``setup.py`` do it). Run from a git checkout without that file, the revision is the checkout's
HEAD; anywhere else it is "unknown". Nothing here raises.
"""

from __future__ import annotations

import argparse
import functools
import json
import platform
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gpu_exporter import __version__

if TYPE_CHECKING:
    from prometheus_client.core import GaugeMetricFamily

__all__ = ["BuildInfo", "add_version_flag", "build_info", "build_info_family", "version_text"]

UNKNOWN = "unknown"
_FILE = Path(__file__).with_name("_build.json")


@dataclass(frozen=True)
class BuildInfo:
    version: str
    revision: str
    build_date: str
    python_version: str


def _from_file(path: Path) -> dict[str, str]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {k: v.strip() for k, v in data.items() if isinstance(v, str) and v.strip()}


def git_revision(folder: Path) -> str:
    """HEAD of the git checkout holding ``folder``, or "unknown" (no checkout, no git, any error)."""
    if not any((parent / ".git").exists() for parent in (folder, *folder.parents)):
        return UNKNOWN  # an installed package: no git process started
    try:
        proc = subprocess.run(
            ["git", "-C", str(folder), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return UNKNOWN
    revision = proc.stdout.strip()
    if proc.returncode != 0 or not revision or any(c not in "0123456789abcdef" for c in revision):
        return UNKNOWN
    return revision


@functools.cache
def build_info() -> BuildInfo:
    data = _from_file(_FILE)
    revision = data.get("revision", UNKNOWN)
    if revision == UNKNOWN:
        revision = git_revision(_FILE.parent)
    return BuildInfo(__version__, revision, data.get("build_date", UNKNOWN), platform.python_version())


def build_info_family(name: str, what: str) -> GaugeMetricFamily:
    """``<name>{version, revision, build_date, python_version} 1``, as the Prometheus exporters' build_info."""
    from prometheus_client.core import GaugeMetricFamily

    info = build_info()
    family = GaugeMetricFamily(
        name, f"Build of the running {what}; always 1.", labels=["version", "revision", "build_date", "python_version"]
    )
    family.add_metric([info.version, info.revision, info.build_date, info.python_version], 1)
    return family


def version_text(prog: str) -> str:
    """The ``--version`` answer, in the layout of the Prometheus exporters'."""
    info = build_info()
    return (
        f"{prog}, version {info.version} (revision: {info.revision})\n"
        f"  build date:     {info.build_date}\n"
        f"  python version: {info.python_version}"
    )


class _VersionAction(argparse.Action):
    """``--version``: the text above, as written (argparse's own action would re-wrap its lines)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[object] | None,
        option_string: str | None = None,
    ) -> None:
        sys.stdout.write(version_text(parser.prog) + "\n")
        parser.exit(0)


def add_version_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--version",
        action=_VersionAction,
        nargs=0,
        default=argparse.SUPPRESS,
        help="show the version, revision and build date, then exit",
    )
