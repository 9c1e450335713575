"""The base image each architecture builds on, standing in for ``python:3.11-slim-bookworm``, which cannot
be pulled where no registry is reachable: Debian bookworm made by mmdebstrap (minbase, documentation and
man pages left out as Debian's slim images leave them out), then ``docker import``ed for its platform.

- amd64: a CPython copied under /usr/local (by default the one running tools/image.py), stripped, with pip
  and setuptools as the official image carries them.
- arm64 (and any other architecture foreign to the machine): mmdebstrap ``--arch`` runs the packages'
  scripts under qemu-user-static; there is no foreign CPython to copy, so the Python is Debian's
  ``python3.11`` with ``python3.11-venv`` (``python`` on PATH through ``python-is-python3``), which the
  Dockerfile builds on as it does on the official image.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import sys
import time
from pathlib import Path

from image_engine import Engine, StepError, log, run

__all__ = ["BASE_PACKAGES", "MULTIARCH", "base_tag", "enable_emulation", "host_arch", "make_base"]

BASE_NAME = "gpu-exporter-base"
MIRROR = "http://deb.debian.org/debian"
# What python:3.11-slim-bookworm adds to Debian's minbase: the shared libraries CPython's modules link
# against, CA certificates, netbase and tzdata.
BASE_PACKAGES = (
    "ca-certificates",
    "netbase",
    "tzdata",
    "libssl3",
    "libffi8",
    "libsqlite3-0",
    "libbz2-1.0",
    "liblzma5",
    "libncursesw6",
    "libreadline8",
    "zlib1g",
    "libuuid1",
    "libexpat1",
)
# Debian's CPython, where no CPython of that architecture can be copied.
DEBIAN_PYTHON = ("python3.11", "python3.11-venv", "python-is-python3")
# Left out of the copied CPython, as the official slim image leaves them out or never has them.
PYTHON_EXCLUDES = (
    "./lib/python3*/test",
    "./lib/python3*/idlelib",
    "./lib/python3*/tkinter",
    "./lib/python3*/turtledemo",
    "./lib/python3*/lib-dynload/_tkinter*",
    "./lib/python3*/config-*",
    "*/__pycache__",
    "./include",
    "./share",
    "./lib/pkgconfig",
)
# Debian's multiarch triplets: where the NVIDIA runtime puts libnvidia-ml.so.1 in the container.
MULTIARCH = {"amd64": "x86_64-linux-gnu", "arm64": "aarch64-linux-gnu"}
QEMU = {"arm64": "qemu-aarch64", "amd64": "qemu-x86_64"}
BINFMT = "/proc/sys/fs/binfmt_misc"


def host_arch() -> str:
    machine = platform.machine()
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(machine, machine)


def enable_emulation(arch: str) -> None:
    """Foreign binaries run through qemu-user-static's binfmt_misc entry (flag F: the interpreter is opened
    when registered, so it works inside containers too)."""
    if arch == host_arch():
        return
    name = QEMU.get(arch)
    if name is None:
        raise StepError(f"no qemu-user-static entry known for {arch}")
    if not os.path.exists(os.path.join(BINFMT, "status")):
        run(["mount", "-t", "binfmt_misc", "binfmt_misc", BINFMT])
    if not os.path.exists(os.path.join(BINFMT, name)):
        if not shutil.which("update-binfmts"):
            raise StepError("update-binfmts not found: apt-get install binfmt-support qemu-user-static")
        run(["update-binfmts", "--enable", name])
    entry = Path(BINFMT, name).read_text()
    if not entry.startswith("enabled") or "F" not in entry.split("flags:", 1)[-1].split("\n", 1)[0]:
        raise StepError(f"{BINFMT}/{name} is not enabled with flag F:\n{entry}")
    log(f"{arch} binaries run through {BINFMT}/{name}")


def base_tag(arch: str, python_prefix: Path) -> str:
    """The base image's tag: its recipe's hash, so that a changed recipe makes a new base."""
    python = _recipe_python(arch, python_prefix)
    recipe = json.dumps([BASE_PACKAGES, PYTHON_EXCLUDES, MIRROR, arch, python, 4])
    return f"{BASE_NAME}:bookworm-{arch}-{hashlib.sha256(recipe.encode()).hexdigest()[:12]}"


def _recipe_python(arch: str, python_prefix: Path) -> object:
    if arch == host_arch():
        return [str(python_prefix), sys.version]
    return DEBIAN_PYTHON


def make_base(engine: Engine, arch: str, python_prefix: Path, workdir: Path) -> float:
    """mmdebstrap + a Python, imported as base_tag(); seconds taken (0 when cached)."""
    tag = base_tag(arch, python_prefix)
    if engine.has_image(tag):
        log(f"{tag} exists, reused")
        return 0.0
    if not shutil.which("mmdebstrap"):
        raise StepError("mmdebstrap not found: apt-get install mmdebstrap")
    enable_emulation(arch)
    started = time.monotonic()
    include = list(BASE_PACKAGES)
    hooks = []
    if arch == host_arch():
        hooks.append(_copy_python(python_prefix))
        what = "CPython " + sys.version.split()[0]
    else:
        include += DEBIAN_PYTHON
        hooks.append('chroot "$1" python --version')
        what = "Debian's " + ", ".join(DEBIAN_PYTHON)
    hooks.append('rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/* "$1"/var/log/*')
    context = workdir / f"base-{arch}"
    shutil.rmtree(context, ignore_errors=True)
    context.mkdir(parents=True)
    tarball = context / "rootfs.tar"
    argv = [
        "mmdebstrap",
        "--variant=minbase",
        "--mode=root",
        f"--architectures={arch}",
        # merged /usr made by mmdebstrap itself, not by the usrmerge package (which brings perl: 50 MB)
        "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr",
        f"--include={','.join(include)}",
        "--dpkgopt=path-exclude=/usr/share/man/*",
        "--dpkgopt=path-exclude=/usr/share/doc/*",
        "--dpkgopt=path-include=/usr/share/doc/*/copyright",
        "--dpkgopt=path-exclude=/usr/share/locale/*",
        "--dpkgopt=path-exclude=/usr/share/info/*",
        *(f"--customize-hook={hook}" for hook in hooks),
        "bookworm",
        str(tarball),
        MIRROR,
    ]
    log(f"mmdebstrap --architectures={arch}: Debian bookworm minbase and {what}")
    run(argv, timeout=3600)
    import_rootfs(engine, context, arch, tag)
    return time.monotonic() - started


def import_rootfs(engine: Engine, context: Path, arch: str, tag: str) -> None:
    """The root filesystem ``context/rootfs.tar`` as the image ``tag`` of ``linux/<arch>``. Not ``docker
    import``: Debian's dockerd 20.10 records the machine's architecture whatever ``--platform`` says (and
    a node would pull an arm64 filesystem as amd64); a build ``FROM scratch`` records the platform built for."""
    (context / "Dockerfile").write_text(
        "FROM scratch\n"
        "ADD rootfs.tar /\n"
        "ENV PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin\n"
        "ENV LANG=C.UTF-8\n"
        'CMD ["python3"]\n'
    )
    engine.docker("build", f"--platform=linux/{arch}", "--network=none", "-t", tag, str(context), timeout=1800)
    shutil.rmtree(context, ignore_errors=True)
    imported = engine.docker("image", "inspect", "--format", "{{.Architecture}}", tag).strip()
    if imported != arch:
        raise StepError(f"{tag} was made for {imported}, not {arch}")


def _copy_python(python_prefix: Path) -> str:
    """The customize hook that copies a CPython under /usr/local as the official image has it."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    excludes = " ".join(f"--exclude='{pattern}'" for pattern in PYTHON_EXCLUDES)
    site = f"lib/python{version}/site-packages"
    return (
        f'mkdir -p "$1/usr/local" && tar -C {python_prefix} {excludes} --exclude="./{site}/*" -cf - . '
        f'| tar -C "$1/usr/local" -xf - && '
        # pip and setuptools, as the official image carries them (the Dockerfile removes them again)
        f'mkdir -p "$1/usr/local/{site}" && '
        f"for p in pip setuptools; do cp -a {python_prefix}/{site}/$p {python_prefix}/{site}/$p-*.dist-info "
        f'"$1/usr/local/{site}/"; done && '
        f'find "$1/usr/local/bin" -maxdepth 1 -type f ! -name "python{version}" ! -name "pip*" -delete && '
        f'ln -sf python{version} "$1/usr/local/bin/python3" && ln -sf python3 "$1/usr/local/bin/python" && '
        f'printf "#!/usr/local/bin/python{version}\\nimport sys\\nfrom pip._internal.cli.main import main\\n'
        f'sys.exit(main())\\n" > "$1/usr/local/bin/pip" && chmod 755 "$1/usr/local/bin/pip" && '
        'ln -sf pip "$1/usr/local/bin/pip3" && find "$1/usr/local/bin" -xtype l -delete && '
        # stripped, as the official image links CPython with --strip-all (23 MB of debug data otherwise)
        'find "$1/usr/local/lib" -type f -name "*.so*" -exec strip --strip-unneeded {} + && '
        'chroot "$1" ldconfig'
    )
