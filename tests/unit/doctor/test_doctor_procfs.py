"""doctor's pod-attribution check tells the host's /proc from the container's own under cgroup v2.

With cgroup v2 the runtime gives each container its own cgroup namespace, so the container's own PID 1
reads ``0::/`` - no ``kubepods`` in sight. The host's PID namespace always holds the kernel's threads
(PID 2 is kthreadd); a container's never does.
"""

from __future__ import annotations

from pathlib import Path

from gpu_exporter.config import Config
from gpu_exporter.doctor import checks
from gpu_exporter.doctor.checks import Node


def _proc(root: Path, cgroup: str, kthreadd: bool) -> str:
    (root / "1").mkdir(parents=True)
    (root / "1" / "cgroup").write_text(cgroup)
    if kthreadd:
        (root / "2").mkdir()
        (root / "2" / "comm").write_text("kthreadd\n")
    return str(root)


def _check(procfs: str, logs: Path) -> checks.Result:
    config = Config(k8s_pod_attribution=True, path_procfs=procfs, k8s_pod_logs_path=str(logs))
    return checks.pod_attribution(Node(config))


def test_the_containers_own_proc_in_a_cgroup_namespace_fails(tmp_path: Path) -> None:
    logs = tmp_path / "pods"
    logs.mkdir()
    own = _check(_proc(tmp_path / "own", "0::/\n", kthreadd=False), logs)
    assert own.status == "fail", own
    assert "--path.procfs" in own.fix
    host = _check(_proc(tmp_path / "host", "0::/\n", kthreadd=True), logs)  # an init outside any scope
    assert host.status == "ok", host
