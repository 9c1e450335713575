#!/usr/bin/env python3
"""Check that every runtime dependency installs from a binary wheel on the image's other architecture:
``python tools/check_wheels.py`` (needs PyPI; a few seconds). Exit 0 when pip resolves the whole set.

The set is what the image installs: pyproject.toml's ``dependencies``, the ``kubernetes`` extra, and AMD
SMI's Python package as the Dockerfile's ``AMDSMI`` build argument pins it. pip resolves it for CPython
3.11 (the image's Python) on aarch64 Linux with the image's glibc (Debian bookworm's 2.36: every
``manylinux_2_X_aarch64`` tag up to 2.36, and ``manylinux2014``; pip does not widen one tag to the older
ones itself), with ``--only-binary=:all:`` and ``--dry-run``: it
reads each candidate's metadata, downloads no wheel, installs nothing, and fails on a package with no such
wheel (a Jetson's pod would otherwise find out, building it without a compiler). Each resolved file is
also checked to be a wheel whose tags fit the platform.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = None

ROOT = Path(__file__).resolve().parent.parent
ARCH = "aarch64"
GLIBC = "2.36"  # Debian bookworm's, the image's base
PYTHON = "3.11"
EXTRAS = ("kubernetes",)


class CheckError(Exception):
    """What to print in one line, with exit status 1 (a dependency) or 2 (bad input)."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status


def runtime_requirements(pyproject: Path, dockerfile: Path, extras: Sequence[str] = EXTRAS) -> list[str]:
    """pyproject's dependencies and ``extras``, and the Dockerfile's AMDSMI pin (when not empty)."""
    if tomllib is None:
        raise CheckError("needs Python 3.11+ (tomllib)", 2)
    try:
        project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    except (OSError, ValueError, KeyError) as exc:
        raise CheckError(f"{pyproject}: cannot read [project]: {exc}", 2) from None
    requirements = list(project.get("dependencies", []))
    optional = project.get("optional-dependencies", {})
    for extra in extras:
        if extra not in optional:
            raise CheckError(f"{pyproject}: no optional dependency group {extra!r}", 2)
        requirements += optional[extra]
    try:
        text = dockerfile.read_text(encoding="utf-8")
    except OSError as exc:
        raise CheckError(f"{dockerfile}: {exc.strerror}", 2) from None
    pin = re.search(r"^ARG AMDSMI=\"?([^\"\n]*)\"?\s*$", text, re.MULTILINE)
    if pin is None:
        raise CheckError(f"{dockerfile}: no ARG AMDSMI=... line", 2)
    if pin.group(1).strip():
        requirements.append(pin.group(1).strip())
    return requirements


def platforms(arch: str, glibc: str) -> list[str]:
    """pip's platform tags for a wheel that runs on ``arch`` with this glibc, newest first."""
    major, minor = (int(part) for part in glibc.split("."))
    if major != 2 or not 17 <= minor < 100:
        raise CheckError(f"--glibc {glibc}: expected 2.17 or later", 2)
    return [*(f"manylinux_2_{m}_{arch}" for m in range(minor, 16, -1)), f"manylinux2014_{arch}"]


def pip_flags(tags: Sequence[str], python: str) -> list[str]:
    return [
        "--only-binary=:all:",
        *(f"--platform={tag}" for tag in tags),
        f"--python-version={python}",
        "--implementation=cp",
        f"--abi=cp{python.replace('.', '')}",
    ]


def resolve(requirements: Sequence[str], arch: str, glibc: str, python: str) -> list[dict[str, str]]:
    """What pip would install there: name, version, file; CheckError naming what has no wheel."""
    with tempfile.TemporaryDirectory(prefix="check-wheels-") as tmp:
        report = Path(tmp) / "report.json"
        argv = [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--dry-run",
            "--ignore-installed",
            "--disable-pip-version-check",
            f"--target={Path(tmp) / 'target'}",  # pip's condition for --platform; --dry-run writes nothing
            f"--report={report}",
            *pip_flags(platforms(arch, glibc), python),
            *requirements,
        ]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            raise CheckError(_why(proc.stderr, f"{arch} (glibc {glibc})", python))
        install = json.loads(report.read_text())["install"]
    resolved = []
    for item in install:
        filename = item["download_info"]["url"].rsplit("/", 1)[-1]
        name, version = item["metadata"]["name"], item["metadata"]["version"]
        if not _fits(filename, arch, python):
            raise CheckError(f"{name} {version}: {filename} is not a wheel for {arch}, CPython {python}")
        resolved.append({"name": name, "version": version, "file": filename})
    return resolved


def _why(stderr: str, platform: str, python: str) -> str:
    """pip's reason in one line: the requirement that has no wheel, where pip names one."""
    lines = [line.strip() for line in stderr.splitlines() if line.startswith("ERROR:")]
    missing = [m.group(1) for line in lines if (m := re.search(r"No matching distribution found for (\S+)", line))]
    if missing:
        return f"no {platform} wheel for CPython {python}: {', '.join(missing)} (binary wheels only)"
    return f"pip could not resolve the set for {platform}: {' '.join(lines)[:400] or stderr.strip()[-400:]}"


def _fits(filename: str, arch: str, python: str) -> bool:
    """A wheel file whose tags install on ``arch`` with CPython ``python``."""
    if not filename.endswith(".whl"):
        return False
    pythons, abis, platforms = (part.split(".") for part in filename[:-4].split("-")[-3:])
    cp = f"cp{python.replace('.', '')}"
    tags_ok = platforms == ["any"] or any(p.endswith("_" + arch) for p in platforms)
    abi_ok = any(a in ("none", "abi3", cp) for a in abis)
    python_ok = any(p.startswith(("py3", "cp3")) for p in pythons)
    return tags_ok and abi_ok and python_ok


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pyproject", type=Path, default=ROOT / "pyproject.toml", help="default: %(default)s")
    parser.add_argument("--dockerfile", type=Path, default=ROOT / "Dockerfile", help="default: %(default)s")
    parser.add_argument("--arch", default=ARCH, help="the machine wheels must fit (default: %(default)s)")
    parser.add_argument("--glibc", default=GLIBC, help="the image's glibc (default: %(default)s)")
    parser.add_argument("--python-version", default=PYTHON, help="the image's Python (default: %(default)s)")
    args = parser.parse_args(argv)
    try:
        requirements = runtime_requirements(args.pyproject, args.dockerfile)
        resolved = resolve(requirements, args.arch, args.glibc, args.python_version)
        files = ", ".join(f"{r['name']} {r['version']}" for r in resolved)
        print(
            f"check_wheels: {args.arch} (glibc {args.glibc}), CPython {args.python_version}: "
            f"{len(resolved)} wheels ({files})"
        )
    except CheckError as exc:
        print(f"check_wheels: {exc}", file=sys.stderr)
        return exc.status
    except (OSError, subprocess.TimeoutExpired) as exc:
        print(f"check_wheels: pip did not run: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
