#!/usr/bin/env python3
"""Build the image from the Dockerfile and run it the way the DaemonSet runs it, on a machine without a
registry: ``python tools/image.py`` (as root; Debian's docker.io, mmdebstrap and a C compiler).

1. A Docker engine of its own: Debian's dockerd with ``--iptables=false --bridge=none
   --storage-driver=vfs``, its data root, exec root and socket in a work folder, started and stopped by
   its PID (no other engine on the machine is touched).
2. The base image: ``python:3.11-slim-bookworm`` cannot be pulled here, so a stand-in is made of
   Debian bookworm (mmdebstrap, minbase, docs and man pages left out as in Debian's slim images) and a
   CPython copied under /usr/local (``--python``, by default the one running this script), then
   ``docker import``ed.
3. ``docker build --network=host`` with the legacy builder (``DOCKER_BUILDKIT=0``), the revision and
   build date as build arguments, and the extra CA certificates this machine trusts (those under
   /usr/local/share/ca-certificates, where Debian keeps local CAs: a network that intercepts TLS, or a
   proxy) as ``EXTRA_CA_CERTS``.
4. The smoke run, as deploy/base/daemonset.yaml runs the container: read-only root filesystem, UID
   65532, every capability dropped, no new privileges, host network; the NVIDIA runtime's injection
   stood in for by tests/fakes/fake_nvml.c compiled to libnvidia-ml.so.1 and bound into the image's
   library folder, and stand-ins for the /dev/nvidia* nodes it adds. Inside it:
   ``gpu-exporter doctor`` must pass and ``/metrics`` must serve the simulated GPUs and process_*.

It prints the image's size and layers and, with ``--json FILE``, writes them and the timings there.
Exit status 0 when every step passed. A work folder given with ``--workdir`` is kept (with the engine's
cache: a second run reuses the base image and the build cache); without one a temporary folder is
removed at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASE_NAME = "gpu-exporter-base"
IMAGE_TAG = "gpu-exporter:dev"
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
LOCAL_CAS = "/usr/local/share/ca-certificates"


class StepError(Exception):
    """A step failed; the message says which and why."""


def log(message: str) -> None:
    print(f"image: {message}", file=sys.stderr, flush=True)


def run(argv: Sequence[str], env: dict[str, str] | None = None, timeout: float = 1800, **kw: object) -> str:
    """Run a command; its stdout, or StepError with the tail of its output."""
    proc = subprocess.run(
        list(argv), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout, **kw
    )  # type: ignore[call-overload]
    if proc.returncode != 0:
        tail = "\n".join(str(proc.stdout).splitlines()[-30:])
        raise StepError(f"{' '.join(argv[:3])} ... exited {proc.returncode}:\n{tail}")
    return str(proc.stdout)


class Engine:
    """A dockerd of our own, in ``workdir``, stopped by its PID."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.sock = workdir / "docker.sock"
        self.proc: subprocess.Popen[bytes] | None = None

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["DOCKER_HOST"] = f"unix://{self.sock}"
        env["DOCKER_BUILDKIT"] = "0"
        env.pop("DOCKER_CONTEXT", None)
        return env

    def docker(self, *args: str, timeout: float = 1800) -> str:
        return run([docker_client(), *args], env=self.env(), timeout=timeout)

    def start(self) -> None:
        dockerd = shutil.which("dockerd") or "/usr/sbin/dockerd"
        if not os.path.exists(dockerd):
            raise StepError("dockerd not found: apt-get install docker.io")
        for sub in ("data", "exec"):
            (self.workdir / sub).mkdir(parents=True, exist_ok=True)
        argv = [
            dockerd,
            "--iptables=false",
            "--ip-masq=false",
            "--bridge=none",
            "--storage-driver=vfs",
            f"--data-root={self.workdir / 'data'}",
            f"--exec-root={self.workdir / 'exec'}",
            f"--pidfile={self.workdir / 'dockerd.pid'}",
            f"--host=unix://{self.sock}",
        ]
        logfile = open(self.workdir / "dockerd.log", "ab")  # noqa: SIM115 - kept open while it runs
        self.proc = subprocess.Popen(argv, stdout=logfile, stderr=logfile, start_new_session=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise StepError(f"dockerd exited {self.proc.returncode}: see {self.workdir / 'dockerd.log'}")
            probe = subprocess.run(
                [docker_client(), "version", "--format", "{{.Server.Version}}"],
                env=self.env(),
                capture_output=True,
                text=True,
            )
            if probe.returncode == 0:
                log(f"dockerd {probe.stdout.strip()} (PID {self.proc.pid}) on {self.sock}")
                return
            time.sleep(0.5)
        raise StepError("dockerd did not answer within 60 s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.unmount()

    def unmount(self) -> None:
        """What dockerd leaves mounted in its folders (the host network namespace's nsfs), deepest first,
        so that the work folder can be removed."""
        prefix = str(self.workdir) + "/"
        try:
            with open("/proc/self/mounts", encoding="utf-8") as mounts:
                points = [line.split()[1] for line in mounts if line.split()[1].startswith(prefix)]
        except OSError:
            return
        for point in sorted(points, key=len, reverse=True):
            subprocess.run(["umount", "-l", point], capture_output=True, check=False)


def docker_client() -> str:
    """Debian's client (it matches Debian's dockerd); any other on PATH otherwise."""
    return "/usr/bin/docker" if os.path.exists("/usr/bin/docker") else (shutil.which("docker") or "docker")


def make_base(engine: Engine, python_prefix: Path, workdir: Path) -> float:
    """mmdebstrap + a CPython under /usr/local, imported as base_tag(); seconds taken (0 when cached)."""
    tag = base_tag(python_prefix)
    if (
        subprocess.run([docker_client(), "image", "inspect", tag], env=engine.env(), capture_output=True).returncode
        == 0
    ):
        log(f"{tag} exists, reused")
        return 0.0
    if not shutil.which("mmdebstrap"):
        raise StepError("mmdebstrap not found: apt-get install mmdebstrap")
    started = time.monotonic()
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    excludes = " ".join(f"--exclude='{pattern}'" for pattern in PYTHON_EXCLUDES)
    site = f"lib/python{version}/site-packages"
    copy_python = (
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
    cleanup = 'rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/* "$1"/var/log/*'
    tarball = workdir / "base.tar"
    argv = [
        "mmdebstrap",
        "--variant=minbase",
        "--mode=root",
        # merged /usr made by mmdebstrap itself, not by the usrmerge package (which brings perl: 50 MB)
        "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr",
        f"--include={','.join(BASE_PACKAGES)}",
        "--dpkgopt=path-exclude=/usr/share/man/*",
        "--dpkgopt=path-exclude=/usr/share/doc/*",
        "--dpkgopt=path-include=/usr/share/doc/*/copyright",
        "--dpkgopt=path-exclude=/usr/share/locale/*",
        "--dpkgopt=path-exclude=/usr/share/info/*",
        f"--customize-hook={copy_python}",
        f"--customize-hook={cleanup}",
        "bookworm",
        str(tarball),
        MIRROR,
    ]
    log("mmdebstrap: Debian bookworm minbase and CPython " + sys.version.split()[0])
    run(argv, timeout=1800)
    engine.docker(
        "import",
        "--change",
        "ENV PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin",
        "--change",
        "ENV LANG=C.UTF-8",
        "--change",
        'CMD ["python3"]',
        str(tarball),
        tag,
    )
    tarball.unlink()
    return time.monotonic() - started


def base_tag(python_prefix: Path) -> str:
    """The base image's tag: its recipe's hash, so that a changed recipe makes a new base."""
    recipe = json.dumps([BASE_PACKAGES, PYTHON_EXCLUDES, MIRROR, str(python_prefix), sys.version, 3])
    return f"{BASE_NAME}:bookworm-{hashlib.sha256(recipe.encode()).hexdigest()[:12]}"


def extra_cas() -> str:
    """The local CA certificates this machine trusts beyond Debian's list, as one PEM text."""
    pems = [Path(p).read_text() for p in sorted(glob.glob(os.path.join(LOCAL_CAS, "*.crt")))]
    return "".join(pem if pem.endswith("\n") else pem + "\n" for pem in pems)


def git_revision() -> str:
    try:
        out = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out or "unknown"


def build(engine: Engine, tag: str, base: str) -> float:
    started = time.monotonic()
    revision = git_revision()
    date = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    args = [
        "build",
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
    log(f"docker build -t {tag} (revision {revision[:12]})")
    engine.docker(*args, str(ROOT), timeout=3600)
    return time.monotonic() - started


def describe(engine: Engine, tag: str, base_tag: str) -> dict[str, object]:
    size = int(engine.docker("image", "inspect", "--format", "{{.Size}}", tag).strip())
    history = engine.docker("history", "--no-trunc", "--format", "{{.Size}}\t{{.CreatedBy}}", tag)
    layers = []
    for line in history.splitlines():
        human, _, created_by = line.partition("\t")
        layers.append({"size": human, "created_by": " ".join(created_by.split())[:160]})
    base = int(engine.docker("image", "inspect", "--format", "{{.Size}}", base_tag).strip())
    rootfs = json.loads(engine.docker("image", "inspect", "--format", "{{json .RootFS.Layers}}", tag))
    return {"size_bytes": size, "base_size_bytes": base, "filesystem_layers": len(rootfs), "history": layers}


def fake_nvml(workdir: Path) -> Path:
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise StepError("a C compiler is needed for the simulated NVML library (apt-get install gcc libc6-dev)")
    lib = workdir / "nvidia" / "libnvidia-ml.so.1"
    lib.parent.mkdir(parents=True, exist_ok=True)
    run([compiler, "-shared", "-fPIC", "-O1", "-o", str(lib), str(ROOT / "tests" / "fakes" / "fake_nvml.c")])
    return lib


def nvidia_devices(workdir: Path, gpus: int) -> list[tuple[Path, str]]:
    """Stand-ins for the device nodes the NVIDIA runtime adds (/dev/nvidiactl, /dev/nvidia<N>, mode
    0666): the simulated library opens /dev/nvidiactl read-write and counts /dev/nvidia<N>, as the driver's
    does. Plain files: a real character device 195:N without the driver behind it cannot be opened."""
    folder = workdir / "nvidia-dev"
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for name in ["nvidiactl", *(f"nvidia{i}" for i in range(gpus))]:
        path = folder / name
        path.touch()
        os.chmod(path, 0o666)
        out.append((path, f"/dev/{name}"))
    return out


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def container_args(workdir: Path, gpus: int) -> list[str]:
    """``docker run`` options: the DaemonSet's securityContext and the NVIDIA runtime's injection."""
    libdir = f"/usr/lib/{sysconfig.get_config_var('MULTIARCH') or 'x86_64-linux-gnu'}"
    args = [
        "--read-only",
        "--user=65532:65532",
        "--cap-drop=ALL",
        "--security-opt=no-new-privileges",
        "--network=host",
        "--tmpfs=/tmp:size=16m",
        "--env=NODE_NAME=image-smoke",
        f"--volume={fake_nvml(workdir)}:{libdir}/libnvidia-ml.so.1:ro",
    ]
    for host, inside in nvidia_devices(workdir, gpus):
        args.append(f"--volume={host}:{inside}")
    return args


def smoke(engine: Engine, tag: str, workdir: Path) -> dict[str, object]:
    """doctor inside the image, then the agent serving /metrics, as the DaemonSet runs it."""
    gpus = 2
    base = container_args(workdir, gpus)
    user = engine.docker("run", "--rm", *base, "--entrypoint=id", tag).strip()
    log(f"in the container: {user}")
    doctor = engine.docker("run", "--rm", *base, tag, "doctor", "--gpu-vendor=nvidia", timeout=120)
    log("doctor:\n" + doctor.rstrip())
    if any(line.startswith("fail") for line in doctor.splitlines()):
        raise StepError("doctor reported a failure inside the image")
    version = engine.docker("run", "--rm", *base, tag, "--version").strip()
    log(f"--version: {version.splitlines()[0]}")
    port = free_port()
    name = f"gpu-exporter-smoke-{port}"
    engine.docker(
        "run",
        "--detach",
        f"--name={name}",
        *base,
        tag,
        "--gpu-vendor=nvidia",
        f"--web.listen-address=127.0.0.1:{port}",
        "--gpu-metrics-collection-interval=1s",
    )
    try:
        page = _wait_page(f"http://127.0.0.1:{port}/metrics", engine, name)
    finally:
        logs = subprocess.run([docker_client(), "logs", name], env=engine.env(), capture_output=True, text=True).stderr
        subprocess.run([docker_client(), "rm", "--force", name], env=engine.env(), capture_output=True)
    gpu_up = [line for line in page.splitlines() if line.startswith("gpu_up{")]
    process = [line for line in page.splitlines() if line.startswith("process_resident_memory_bytes")]
    if len(gpu_up) != gpus or not all(line.endswith(" 1") for line in gpu_up) or not process:
        raise StepError(f"/metrics lacks the simulated GPUs or process_*:\n{page[:2000]}\nagent log:\n{logs}")
    log(f"/metrics: {len(gpu_up)} GPUs up, {process[0]}")
    return {"container_user": user, "doctor": doctor, "version": version, "gpu_up": gpu_up, "process": process}


def _wait_page(url: str, engine: Engine, name: str) -> str:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                page = response.read().decode()
                if "gpu_up{" in page:
                    return page
        except OSError:
            pass
        running = engine.docker("inspect", "--format", "{{.State.Running}}", name).strip()
        if running != "true":
            raise StepError("the agent's container exited")
        time.sleep(0.5)
    raise StepError(f"{url} did not serve GPU series within 60 s")


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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", help="keep the engine, its cache and the base image here (default: a temp dir)")
    parser.add_argument("--tag", default=IMAGE_TAG, help="image tag (default: %(default)s)")
    parser.add_argument(
        "--python", default=sys.base_prefix, help="CPython copied into the base image (default: %(default)s)"
    )
    parser.add_argument("--json", help="write the figures (size, layers, timings) to this file")
    parser.add_argument("--no-smoke", action="store_true", help="build only")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("image: needs root (dockerd, mmdebstrap)", file=sys.stderr)
        return 2
    report: dict[str, object] = {}
    with workspace(args.workdir) as workdir:
        engine = Engine(workdir)
        try:
            engine.start()
            report["base_seconds"] = round(make_base(engine, Path(args.python), workdir), 1)
            base = base_tag(Path(args.python))
            report["build_seconds"] = round(build(engine, args.tag, base), 1)
            report.update(describe(engine, args.tag, base))
            print_figures(report)
            if not args.no_smoke:
                started = time.monotonic()
                report["smoke"] = smoke(engine, args.tag, workdir)
                report["smoke_seconds"] = round(time.monotonic() - started, 1)
        except (StepError, subprocess.TimeoutExpired, OSError) as exc:
            print(f"image: FAILED: {exc}", file=sys.stderr)
            return 1
        finally:
            engine.stop()
            if args.json:
                Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    log("passed")
    return 0


def print_figures(report: dict[str, object]) -> None:
    size = int(str(report["size_bytes"]))
    base = int(str(report["base_size_bytes"]))
    print(
        f"image size: {size / 1e6:.1f} MB (base {base / 1e6:.1f} MB), {report['filesystem_layers']} filesystem layers"
    )
    for layer in report["history"]:  # type: ignore[attr-defined]
        print(f"  {layer['size']:>10}  {layer['created_by']}")


if __name__ == "__main__":
    raise SystemExit(main())
