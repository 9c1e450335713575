"""The container engine tools/image.py drives: a dockerd of its own (Debian's docker.io, vfs storage, no
bridge, no iptables), its data root, exec root and socket in the work folder, started and stopped by its
PID, so that no other engine on the machine is touched; and the small helpers every step shares."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

__all__ = ["Engine", "StepError", "docker_client", "log", "run"]


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


def docker_client() -> str:
    """Debian's client (it matches Debian's dockerd); any other on PATH otherwise."""
    return "/usr/bin/docker" if os.path.exists("/usr/bin/docker") else (shutil.which("docker") or "docker")


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

    def has_image(self, tag: str) -> bool:
        probe = subprocess.run([docker_client(), "image", "inspect", tag], env=self.env(), capture_output=True)
        return probe.returncode == 0

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
