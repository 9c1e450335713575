#!/usr/bin/env python3
"""Build the image for amd64 and arm64 from the one Dockerfile, assemble the OCI manifest list, and run
each image the way the DaemonSet runs it, on a machine without a registry: ``python tools/image.py`` (as
root; Debian's docker.io, mmdebstrap, qemu-user-static, binfmt-support, skopeo, buildah, mosquitto and a
C compiler: .ci/image installs them).

1. A Docker engine of its own (tools/image_engine.py): Debian's dockerd, vfs storage, no bridge, no
   iptables, in the work folder, started and stopped by its PID.
2. Per architecture, the base image (tools/image_base.py): Debian bookworm by mmdebstrap standing in for
   ``python:3.11-slim-bookworm``; amd64 with a CPython copied under /usr/local, arm64 (``--arch`` under
   qemu-user-static) with Debian's python3.11.
3. Per architecture, ``docker build --platform=linux/<arch> --network=host`` with the legacy builder, the
   revision and its commit date as build arguments, and the local CA certificates this machine trusts as
   ``EXTRA_CA_CERTS`` (a network that intercepts TLS). A foreign architecture's RUN steps run under qemu.
4. The manifest list (tools/image_oci.py): skopeo copies each image into an OCI layout, buildah makes
   the index that names both platforms, written to ``<workdir>/oci`` (``--oci``) as ``<tag>``.
5. The smoke runs (tools/image_smoke.py), as deploy/base/daemonset.yaml runs the container: read-only
   root, UID 65532, every capability dropped, no new privileges, host network. amd64: the NVIDIA runtime's
   injection stood in for by the simulated libnvidia-ml.so.1; ``doctor`` passes and ``/metrics`` serves the
   simulated GPUs. arm64, under emulation: the Jetson Orin fixture tree bound at /host/sys and /host/proc
   where the DaemonSet mounts the host's; ``doctor`` passes, ``/metrics`` serves the Jetson GPU, ``/readyz``
   is ready, and a batch reaches a Mosquitto outside the container. Neither image holds a compiler.

It prints each image's size and layers and, with ``--json FILE``, writes them and the timings there.
Exit status 0 when every step passed. A work folder given with ``--workdir`` is kept (with the engine's
cache: a second run reuses the bases and the build cache, and a new commit reuses the installed
environment); without one a temporary folder is removed at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

# the sibling modules (tools/image_*.py), also when this file is loaded by its path (the tests)
sys.path.insert(0, str(Path(__file__).resolve().parent))

from image_base import base_tag, make_base
from image_engine import Engine, StepError, log
from image_oci import assemble, describe
from image_smoke import smoke

ROOT = Path(__file__).resolve().parent.parent
IMAGE_TAG = "gpu-exporter:dev"
ARCHES = ("amd64", "arm64")
LOCAL_CAS = "/usr/local/share/ca-certificates"
# The DaemonSet's image limit, per architecture (README): the node pulls one of them.
MAX_IMAGE_BYTES = 200_000_000
TOOLS = {
    "mmdebstrap": "mmdebstrap",
    "skopeo": "skopeo",
    "buildah": "buildah",
    "mosquitto": "mosquitto",
    "mosquitto_sub": "mosquitto-clients",
}


def extra_cas() -> str:
    """The local CA certificates this machine trusts beyond Debian's list, as one PEM text."""
    pems = [Path(p).read_text() for p in sorted(glob.glob(os.path.join(LOCAL_CAS, "*.crt")))]
    return "".join(pem if pem.endswith("\n") else pem + "\n" for pem in pems)


def _git(*args: str) -> str:
    try:
        out = subprocess.run(
            ["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=10, env={**os.environ, "TZ": "UTC"}
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out or "unknown"


def git_revision() -> str:
    return _git("rev-parse", "HEAD")


def commit_date() -> str:
    """HEAD's commit date: what the image was built from, and the same on a rerun (the build cache holds)."""
    return _git("log", "-1", "--format=%cd", "--date=format-local:%Y-%m-%dT%H:%M:%SZ")


def arch_tag(tag: str, arch: str) -> str:
    return f"{tag}-{arch}"


def build(engine: Engine, tag: str, base: str, arch: str, revision: str, date: str) -> float:
    started = time.monotonic()
    args = [
        "build",
        f"--platform=linux/{arch}",
        "--network=host",
        "--build-arg",
        f"PYTHON_IMAGE={base}",
        "--build-arg",
        f"REVISION={revision}",
        "--build-arg",
        f"BUILD_DATE={date}",
        "-t",
        tag,
    ]
    cas = extra_cas()
    if cas:
        args += ["--build-arg", f"EXTRA_CA_CERTS={cas}"]
        log(f"EXTRA_CA_CERTS: {cas.count('BEGIN CERTIFICATE')} certificate(s) from {LOCAL_CAS}")
    log(f"docker build --platform=linux/{arch} -t {tag} (revision {revision[:12]})")
    engine.docker(*args, str(ROOT), timeout=3 * 3600)
    built = engine.docker("image", "inspect", "--format", "{{.Os}}/{{.Architecture}}", tag).strip()
    if built != f"linux/{arch}":
        raise StepError(f"{tag} was built for {built}, not linux/{arch}")
    return time.monotonic() - started


def check_tools(smoking: bool) -> None:
    """One line, before anything starts, for each tool a step would miss."""
    missing = [
        package
        for tool, package in TOOLS.items()
        if (smoking or not tool.startswith("mosquitto"))
        and shutil.which(tool) is None
        and not os.path.exists(f"/usr/sbin/{tool}")
    ]
    if missing:
        raise StepError(f"missing tools: apt-get install {' '.join(sorted(set(missing)))}")


@contextlib.contextmanager
def workspace(given: str | None) -> Iterator[Path]:
    if given:
        path = Path(given).resolve()
        path.mkdir(parents=True, exist_ok=True)
        yield path
        return
    # short: the engine's sockets live under it (a UNIX socket path has at most 107 bytes)
    path = Path(tempfile.mkdtemp(prefix="gpx-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", help="keep the engine, its cache and the base images here (default: a temp dir)")
    parser.add_argument("--tag", default=IMAGE_TAG, help="the manifest list's tag (default: %(default)s)")
    parser.add_argument(
        "--arch",
        default=",".join(ARCHES),
        help="architectures, comma-separated (default: %(default)s); one alone makes a one-entry list",
    )
    parser.add_argument(
        "--python", default=sys.base_prefix, help="CPython copied into the amd64 base image (default: %(default)s)"
    )
    parser.add_argument("--oci", help="OCI layout the manifest list is written to (default: <workdir>/oci)")
    parser.add_argument("--json", help="write the figures (sizes, layers, timings, smoke results) to this file")
    parser.add_argument("--no-smoke", action="store_true", help="build and assemble only")
    args = parser.parse_args(argv)
    arches = [a.strip() for a in args.arch.split(",") if a.strip()]
    unknown = [a for a in arches if a not in ARCHES]
    if not arches or unknown:
        parser.error(f"--arch: {', '.join(unknown) or 'none given'}; known: {', '.join(ARCHES)}")
    args.arches = arches
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if os.geteuid() != 0:
        print("image: needs root (dockerd, mmdebstrap, binfmt_misc)", file=sys.stderr)
        return 2
    report: dict[str, object] = {"tag": args.tag, "arches": {}}
    arches: dict[str, dict[str, object]] = report["arches"]  # type: ignore[assignment]
    with workspace(args.workdir) as workdir:
        engine = Engine(workdir)
        try:
            check_tools(not args.no_smoke)
            engine.start()
            # once for every architecture: the entries of one list carry one revision
            revision, date = git_revision(), commit_date()
            report.update(revision=revision, build_date=date)
            for arch in args.arches:
                figures: dict[str, object] = {"tag": arch_tag(args.tag, arch)}
                arches[arch] = figures
                figures["base_seconds"] = round(make_base(engine, arch, Path(args.python), workdir), 1)
                base = base_tag(arch, Path(args.python))
                figures["build_seconds"] = round(build(engine, arch_tag(args.tag, arch), base, arch, revision, date), 1)
                figures.update(describe(engine, arch_tag(args.tag, arch), base))
                print_figures(arch, figures)
            oci = Path(args.oci) if args.oci else workdir / "oci"
            started = time.monotonic()
            report["manifest_list"] = assemble(engine, args.tag, {a: arch_tag(args.tag, a) for a in args.arches}, oci)
            report["manifest_seconds"] = round(time.monotonic() - started, 1)
            too_big = [a for a, f in arches.items() if int(str(f["size_bytes"])) > MAX_IMAGE_BYTES]
            if too_big:
                raise StepError(f"over {MAX_IMAGE_BYTES / 1e6:.0f} MB: {', '.join(too_big)}")
            if not args.no_smoke:
                for arch in args.arches:
                    started = time.monotonic()
                    arches[arch]["smoke"] = smoke(engine, arch_tag(args.tag, arch), arch, workdir)
                    arches[arch]["smoke_seconds"] = round(time.monotonic() - started, 1)
        except (StepError, subprocess.TimeoutExpired, OSError) as exc:
            print(f"image: FAILED: {exc}", file=sys.stderr)
            return 1
        finally:
            engine.stop()
            if args.json:
                Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    log("passed")
    return 0


def print_figures(arch: str, figures: dict[str, object]) -> None:
    size = int(str(figures["size_bytes"]))
    base = int(str(figures["base_size_bytes"]))
    print(
        f"linux/{arch} image size: {size / 1e6:.1f} MB (base {base / 1e6:.1f} MB), "
        f"{figures['filesystem_layers']} filesystem layers",
        flush=True,
    )
    for layer in figures["history"]:  # type: ignore[attr-defined]
        print(f"  {layer['size']:>10}  {layer['created_by']}", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
