"""Run a DaemonSet's containers the way a container runtime would, in a bubblewrap sandbox.

The pod spec is read from the manifest; nothing about it is restated here. What a runtime and the
kubelet do, and how the sandbox does it:

- image: this machine's /usr and /etc, the Python that runs the tests and the package's source, all
  read-only (the image's content; the root filesystem is read-only as readOnlyRootFilesystem asks);
  the image's extra Python packages (``image_packages``) are on its PYTHONPATH;
- user: the container's, else the pod's, else the image's USER (Dockerfile) runAsUser/runAsGroup and
  supplementalGroups, set with setpriv after the mounts; capabilities: the runtime's default set less
  ``drop`` plus ``add`` (all when privileged) as the bounding set, so only a root process keeps any;
  ``allowPrivilegeEscalation: false`` is no_new_privs; runAsNonRoot with UID 0 refuses to start;
- /proc is the container's own (a new PID namespace); /dev the minimal one; /sys the node kernel's
  sysfs read-only with /sys/firmware masked by an empty read-only tmpfs, as runc masks it;
- volumes: only those the container mounts: hostPath from the node's tree (a missing path of type
  Directory, File or CharDevice stops the pod as the kubelet would; DirectoryOrCreate creates it),
  configMap from the manifest's ConfigMap, an optional Secret that does not exist as an empty folder,
  emptyDir as a tmpfs of its sizeLimit with mode 0777;
- device cgroup: a hostPath device node (type CharDevice, or under /dev) can be opened only by a
  privileged container; otherwise it is bound as an unopenable stand-in;
- ``runtimeClassName: nvidia`` with NVIDIA_VISIBLE_DEVICES: the NVIDIA runtime's injection: the driver
  library into the image's library folder (an overlay of that folder, like the toolkit's mount into it)
  and the /dev/nvidia* nodes;
- hostNetwork: the sandbox shares this machine's network; env: the manifest's values, fieldRef
  spec.nodeName, optional secretKeyRef absent; args: the manifest's, after the image's ENTRYPOINT.

Not modelled: seccomp, cgroup limits, the image's own filesystem layout (paths come from this machine).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import paths

ROOT = paths.ROOT
SRC_IN_IMAGE = "/opt/gpu-exporter/src"
PACKAGES_IN_IMAGE = "/opt/gpu-exporter/packages"
# containerd's and CRI-O's default capabilities for a container
DEFAULT_CAPS = [
    "CHOWN",
    "DAC_OVERRIDE",
    "FSETID",
    "FOWNER",
    "MKNOD",
    "NET_RAW",
    "SETGID",
    "SETUID",
    "SETFCAP",
    "SETPCAP",
    "NET_BIND_SERVICE",
    "SYS_CHROOT",
    "KILL",
    "AUDIT_WRITE",
]
ALL_CAPS = "all"


class PodError(Exception):
    """The kubelet or the runtime would not start this container (the message says why)."""


@dataclass
class Node:
    """A simulated node: its filesystem tree and what its runtime injects."""

    root: Path  # hostPath volumes resolve under it
    sysfs: Path | None = None  # the kernel's sysfs as the container's own /sys shows it; None: this machine's
    nvidia_library: Path | None = None  # libnvidia-ml.so.1 the NVIDIA runtime would inject
    nvidia_devices: tuple[str, ...] = ("nvidiactl", "nvidia0", "nvidia-uvm")
    image_packages: Path | None = None  # extra Python packages the image carries (e.g. amdsmi)


@dataclass
class Container:
    name: str
    spec: dict[str, Any]
    pod: dict[str, Any]
    configmaps: dict[str, dict[str, str]] = field(default_factory=dict)


def image_user() -> tuple[int, int]:
    """The final stage's USER in the Dockerfile."""
    users = re.findall(r"^USER\s+(\d+)(?::(\d+))?\s*$", (ROOT / "Dockerfile").read_text(), re.M)
    uid, gid = users[-1]
    return int(uid), int(gid or uid)


def image_entrypoint() -> list[str]:
    """The image's ENTRYPOINT (the console script) as the sandbox runs it: this Python, -m the package."""
    match = re.findall(r'^ENTRYPOINT\s+\["([^"]+)"\]', (ROOT / "Dockerfile").read_text(), re.M)
    assert match == ["gpu-exporter"], match
    return [sys.executable, "-m", "gpu_exporter"]


def containers(docs: list[dict[str, Any]]) -> tuple[list[Container], Container]:
    """The init containers and the one agent container of the manifest's DaemonSet."""
    [daemonset] = [d for d in docs if d.get("kind") == "DaemonSet"]
    pod = daemonset["spec"]["template"]["spec"]
    configmaps = {d["metadata"]["name"]: d.get("data", {}) for d in docs if d.get("kind") == "ConfigMap"}
    inits = [Container(c["name"], c, pod, configmaps) for c in pod.get("initContainers", [])]
    [agent] = pod["containers"]
    return inits, Container(agent["name"], agent, pod, configmaps)


def _security(container: Container) -> tuple[int, int, list[int], list[str], bool, bool]:
    pod_ctx = container.pod.get("securityContext", {})
    ctx = container.spec.get("securityContext", {})
    default_uid, default_gid = image_user()
    uid = int(ctx.get("runAsUser", pod_ctx.get("runAsUser", default_uid)))
    gid = int(ctx.get("runAsGroup", pod_ctx.get("runAsGroup", default_gid)))
    non_root = ctx.get("runAsNonRoot", pod_ctx.get("runAsNonRoot", False))
    if non_root and uid == 0:
        raise PodError(f"{container.name}: runAsNonRoot and the container would run as root")
    if ctx.get("readOnlyRootFilesystem") is not True:
        raise PodError(f"{container.name}: only a read-only root filesystem is modelled")
    groups = [int(g) for g in pod_ctx.get("supplementalGroups", [])]
    privileged = bool(ctx.get("privileged", False))
    caps_spec = ctx.get("capabilities", {})
    if privileged:
        caps = [ALL_CAPS]
    else:
        drop = {c.upper() for c in caps_spec.get("drop", [])}
        caps = [] if "ALL" in drop else [c for c in DEFAULT_CAPS if c not in drop]
        caps += [c.upper() for c in caps_spec.get("add", []) if c.upper() not in caps]
    no_new_privs = ctx.get("allowPrivilegeEscalation") is False
    return uid, gid, groups, caps, privileged, no_new_privs


def _ensure_parents(argv: list[str], made: set[str], path: str) -> None:
    """Create the parent folders of a mount point world-readable (bwrap would make them 0700)."""
    parts = Path(path).parent.parts[1:]
    for i in range(len(parts)):
        folder = "/" + "/".join(parts[: i + 1])
        if folder not in made and folder not in ("/usr", "/etc", "/proc", "/dev", "/sys", "/tmp"):
            made.add(folder)
            argv += ["--perms", "0755", "--dir", folder]


def _size(limit: str) -> int:
    units = {"Ki": 1024, "Mi": 1024**2, "Gi": 1024**3, "k": 1000, "M": 1000**2, "G": 1000**3}
    for suffix, factor in units.items():
        if limit.endswith(suffix):
            return int(float(limit[: -len(suffix)]) * factor)
    return int(limit)


class Sandbox:
    """One container of the pod on one node."""

    def __init__(self, container: Container, node: Node, node_name: str, workdir: Path) -> None:
        self.container = container
        self.node = node
        self.node_name = node_name
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)

    def _env(self, overrides: dict[str, str]) -> dict[str, str]:
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/nonexistent", "PYTHONUNBUFFERED": "1"}
        for item in self.container.spec.get("env", []):
            if "value" in item:
                env[item["name"]] = str(item["value"])
                continue
            source = item.get("valueFrom", {})
            if source.get("fieldRef", {}).get("fieldPath") == "spec.nodeName":
                env[item["name"]] = self.node_name
            elif source.get("secretKeyRef", {}).get("optional") is True:
                continue  # the Secret does not exist on this test node
            else:
                raise PodError(f"unsupported env source for {item['name']}: {source}")
        paths = [SRC_IN_IMAGE] + ([PACKAGES_IN_IMAGE] if self.node.image_packages else [])
        env["PYTHONPATH"] = ":".join(paths)  # the image's virtual environment
        env.update(overrides)
        return env

    def _volumes(self, argv: list[str], made: set[str], privileged: bool) -> None:
        volumes = {v["name"]: v for v in self.container.pod.get("volumes", [])}
        for mount in self.container.spec.get("volumeMounts", []):
            volume = volumes[mount["name"]]
            target = mount["mountPath"]
            read_only = bool(mount.get("readOnly", False))
            bind = "--ro-bind" if read_only else "--bind"
            _ensure_parents(argv, made, target)
            if "hostPath" in volume:
                host = volume["hostPath"]
                source = self.node.root / host["path"].lstrip("/")
                kind = host.get("type", "")
                if not source.exists():
                    if kind == "DirectoryOrCreate":
                        source.mkdir(parents=True)
                    elif kind:
                        raise PodError(f"hostPath {host['path']} ({kind}) does not exist on the node")
                device = kind == "CharDevice" or host["path"].startswith("/dev/")
                if device and not privileged:
                    source = self._unopenable(source)  # the device cgroup refuses the node
                argv += [bind, str(source), target]
            elif "configMap" in volume:
                data = self.container.configmaps[volume["configMap"]["name"]]
                folder = self.workdir / f"configmap-{mount['name']}"
                folder.mkdir(exist_ok=True)
                for key, text in data.items():
                    (folder / key).write_text(text)
                argv += ["--ro-bind", str(folder), target]
            elif "secret" in volume:
                if not volume["secret"].get("optional"):
                    raise PodError(f"Secret {volume['secret']['secretName']} does not exist")
                folder = self.workdir / f"secret-{mount['name']}"
                folder.mkdir(exist_ok=True)
                argv += ["--ro-bind", str(folder), target]
            elif "emptyDir" in volume:
                limit = volume["emptyDir"].get("sizeLimit")
                argv += ["--perms", "0777"] + (["--size", str(_size(limit))] if limit else []) + ["--tmpfs", target]
            else:
                raise PodError(f"unsupported volume {volume}")

    def _unopenable(self, source: Path) -> Path:
        stand_in = self.workdir / f"denied-{source.name}"
        if source.is_dir():
            stand_in.mkdir(mode=0o000, exist_ok=True)
        else:
            stand_in.touch(mode=0o000)
        os.chmod(stand_in, 0)
        return stand_in

    def _nvidia(self, argv: list[str], made: set[str], env: dict[str, str]) -> list[str]:
        """The NVIDIA runtime's injection; returns the commands that prepare it (outside bwrap)."""
        spec = self.container.pod
        if spec.get("runtimeClassName") != "nvidia" or self.node.nvidia_library is None:
            return []
        if env.get("NVIDIA_VISIBLE_DEVICES", "") in ("", "void", "none"):
            return []
        libdir = f"/usr/lib/{sysconfig.get_config_var('MULTIARCH')}"
        injected = self.workdir / "nvidia-lib"
        injected.mkdir(exist_ok=True)
        shutil.copy2(self.node.nvidia_library, injected / "libnvidia-ml.so.1")
        merged = self.workdir / "nvidia-libdir"
        merged.mkdir(exist_ok=True)
        for name in self.node.nvidia_devices:
            node = self.workdir / f"dev-{name}"
            node.touch()
            os.chmod(node, 0o666)  # the runtime creates them crw-rw-rw-
            argv += ["--bind", str(node), f"/dev/{name}"]
        argv += ["--ro-bind", str(merged), libdir]
        return ["mount", "-t", "overlay", "overlay", "-o", f"lowerdir={injected}:{libdir}", str(merged)]

    def command(self, overrides: dict[str, str] | None = None) -> tuple[list[str], dict[str, str]]:
        uid, gid, groups, caps, privileged, no_new_privs = _security(self.container)
        env = self._env(overrides or {})
        python_prefix = sys.prefix
        argv = ["bwrap", "--die-with-parent", "--unshare-pid", "--unshare-ipc", "--unshare-uts"]
        argv += ["--unshare-cgroup-try", "--new-session"]
        made: set[str] = set()
        argv += ["--ro-bind", "/usr", "/usr", "--perms", "0755", "--dir", "/etc"]
        for entry in sorted(os.listdir("/etc")):  # one by one: mounts may go into the image's /etc
            argv += ["--ro-bind", f"/etc/{entry}", f"/etc/{entry}"]
        for link in ("bin", "lib", "lib64", "sbin"):
            target = Path("/") / link
            if target.is_symlink():
                argv += ["--symlink", os.readlink(target), f"/{link}"]
            elif target.exists():
                argv += ["--ro-bind", str(target), f"/{link}"]
        _ensure_parents(argv, made, python_prefix + "/x")
        argv += ["--ro-bind", python_prefix, python_prefix]
        _ensure_parents(argv, made, SRC_IN_IMAGE)
        argv += ["--ro-bind", str(ROOT / "src"), SRC_IN_IMAGE]
        if self.node.image_packages is not None:
            argv += ["--ro-bind", str(self.node.image_packages), PACKAGES_IN_IMAGE]
        argv += ["--proc", "/proc", "--dev", "/dev"]
        argv += ["--ro-bind", str(self.node.sysfs or "/sys"), "/sys", "--tmpfs", "/sys/firmware"]
        argv += ["--remount-ro", "/sys/firmware"]
        prepare = self._nvidia(argv, made, env)
        self._volumes(argv, made, privileged)
        argv += ["--remount-ro", "/"]
        for name, value in env.items():
            argv += ["--setenv", name, value]
        argv += ["--unsetenv", "LD_LIBRARY_PATH", "--chdir", "/"]
        user = ["setpriv", f"--reuid={uid}", f"--regid={gid}"]
        user += [f"--groups={','.join(map(str, groups))}"] if groups else ["--clear-groups"]
        bounding = (
            "-all"
            if not caps
            else ("+all" if caps == [ALL_CAPS] else "-all," + ",".join(f"+{c.lower()}" for c in caps))
        )
        user += [f"--bounding-set={bounding}", "--inh-caps=-all"]
        if no_new_privs:
            user.append("--no-new-privs")
        program = self.container.spec.get("command") or image_entrypoint()
        if program and program[0] == "python":
            program = [sys.executable, *program[1:]]
        inner = [*argv, "--", *user, "--", *program, *self.container.spec.get("args", [])]
        # a private mount namespace for the runtime's own mounts (the NVIDIA library overlay)
        script = " && ".join([*([shlex.join(prepare)] if prepare else []), 'exec "$@"'])
        outer = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script, "sh", *inner]
        return outer, env

    def run(self, overrides: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        argv, _ = self.command(overrides)
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False, env={})

    def start(self, log: Path, overrides: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        argv, _ = self.command(overrides)
        with open(log, "wb") as out:
            return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env={}, start_new_session=True)


def stop(proc: subprocess.Popen[bytes], timeout: float = 15) -> int:
    """SIGTERM to the sandbox's process group (started by us, by PID), as the kubelet stops a pod."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
    return int(proc.returncode)


def available() -> str:
    """Why the sandbox cannot run on this machine, or "" when it can."""
    if shutil.which("bwrap") is None:
        return "bwrap is not installed (Debian package bubblewrap)"
    if os.geteuid() != 0:
        return "not applicable here: the sandbox needs root (mount namespaces, setpriv to the pod's user)"
    probe = subprocess.run(
        ["unshare", "--mount", "--", "bwrap", "--ro-bind", "/", "/", "true"],
        capture_output=True,
        timeout=30,
        check=False,
    )
    if probe.returncode != 0:
        return f"not applicable here: no mount namespaces ({probe.stderr.decode(errors='replace').strip()})"
    return ""
