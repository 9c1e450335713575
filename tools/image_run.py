"""What every smoke run shares: the DaemonSet's securityContext as ``docker run`` options, the agent in a
detached container stopped as the kubelet stops it, HTTP probes, and the check that no compiler is in
the runtime image."""

from __future__ import annotations

import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable

from image_engine import Engine, StepError, docker_client

__all__ = ["COMPILERS", "Container", "daemonset_security", "free_port", "http_get", "no_compiler"]

# What a build would call; none may be in the runtime image.
COMPILERS = ("cc", "gcc", "c++", "g++", "clang", "ld", "as", "make")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_get(url: str, timeout: float = 5) -> tuple[int, str]:
    """Status and body; (0, reason) when nothing answered."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode(errors="replace")
    except OSError as exc:
        return 0, str(exc)


def daemonset_security(platform: str) -> list[str]:
    """``docker run`` options for the DaemonSet's securityContext and hostNetwork."""
    return [
        f"--platform={platform}",
        "--read-only",
        "--user=65532:65532",
        "--cap-drop=ALL",
        "--security-opt=no-new-privileges",
        "--network=host",
        "--tmpfs=/tmp:size=16m",
        "--env=NODE_NAME=image-smoke",
    ]


class Container:
    """The agent in a detached container: waited on through its HTTP endpoints, stopped as the kubelet
    stops it (SIGTERM, then the grace period)."""

    def __init__(self, engine: Engine, tag: str, args: list[str], agent_args: list[str], port: int) -> None:
        self.engine = engine
        self.name = f"gpu-exporter-smoke-{port}"
        self.url = f"http://127.0.0.1:{port}"
        engine.docker("run", "--detach", f"--name={self.name}", *args, tag, *agent_args)

    def running(self) -> bool:
        return self.engine.docker("inspect", "--format", "{{.State.Running}}", self.name).strip() == "true"

    def wait(self, what: str, ready: Callable[[], bool], seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if ready():
                return
            if not self.running():
                raise StepError(f"the agent's container exited before {what}:\n{self.logs()}")
            time.sleep(1)
        raise StepError(f"no {what} within {seconds:.0f} s:\n{self.logs()}")

    def logs(self) -> str:
        proc = subprocess.run(
            [docker_client(), "logs", self.name], env=self.engine.env(), capture_output=True, text=True
        )
        return (proc.stdout + proc.stderr)[-4000:]

    def stop(self, grace: int = 15) -> float:
        """Seconds from SIGTERM to exit; the container is removed."""
        started = time.monotonic()
        try:
            self.engine.docker("stop", f"--time={grace}", self.name, timeout=grace + 60)
            return time.monotonic() - started
        finally:
            subprocess.run([docker_client(), "rm", "--force", self.name], env=self.engine.env(), capture_output=True)


def no_compiler(engine: Engine, tag: str, platform: str) -> None:
    """StepError when the runtime image holds anything that compiles."""
    script = "for t in " + " ".join(COMPILERS) + '; do command -v "$t" || true; done'
    found = engine.docker("run", "--rm", f"--platform={platform}", "--entrypoint=/bin/sh", tag, "-c", script).split()
    if found:
        raise StepError(f"{tag} holds build tools: {', '.join(found)}")
