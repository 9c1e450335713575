"""The Pod Security Standards' "restricted" profile (Kubernetes 1.30), as the admission controller checks a
pod spec: ``restricted_violations`` names each rule the spec breaks, the way `kubectl label namespace ...
pod-security.kubernetes.io/enforce=restricted` would refuse the pod.

Baseline: no host namespaces, ports or paths, not privileged, capabilities added only from the baseline
set, seccomp not Unconfined. Restricted on top: only the volume types listed below, no privilege
escalation, non-root, seccomp RuntimeDefault or Localhost, every capability dropped and at most
NET_BIND_SERVICE added.
"""

from __future__ import annotations

from typing import Any

__all__ = ["restricted_violations"]

VOLUME_TYPES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}
SECCOMP = {"RuntimeDefault", "Localhost"}


def restricted_violations(spec: dict[str, Any]) -> list[str]:
    """Every rule of the restricted profile that the pod ``spec`` breaks (empty: admitted)."""
    bad = [f"host namespace: {key}" for key in ("hostNetwork", "hostPID", "hostIPC") if spec.get(key)]
    for volume in spec.get("volumes", []):
        kinds = set(volume) - {"name"}
        if not kinds <= VOLUME_TYPES:
            bad.append(f"volume {volume['name']}: type {sorted(kinds - VOLUME_TYPES)} not allowed")
    pod = spec.get("securityContext") or {}
    containers = [*spec.get("initContainers", []), *spec.get("containers", [])]
    for container in containers:
        name, ctx = container["name"], container.get("securityContext") or {}
        if any(port.get("hostPort") for port in container.get("ports", [])):
            bad.append(f"{name}: hostPort")
        if ctx.get("privileged"):
            bad.append(f"{name}: privileged")
        if ctx.get("allowPrivilegeEscalation") is not False:
            bad.append(f"{name}: allowPrivilegeEscalation is not false")
        if ctx.get("runAsNonRoot", pod.get("runAsNonRoot")) is not True:
            bad.append(f"{name}: runAsNonRoot is not true")
        if ctx.get("runAsUser", pod.get("runAsUser")) == 0:
            bad.append(f"{name}: runAsUser 0")
        seccomp = (ctx.get("seccompProfile") or pod.get("seccompProfile") or {}).get("type")
        if seccomp not in SECCOMP:
            bad.append(f"{name}: seccompProfile {seccomp or 'unset'}")
        caps = ctx.get("capabilities") or {}
        if "ALL" not in caps.get("drop", []):
            bad.append(f"{name}: capabilities do not drop ALL")
        if set(caps.get("add", [])) - {"NET_BIND_SERVICE"}:
            bad.append(f"{name}: capabilities add {sorted(set(caps['add']) - {'NET_BIND_SERVICE'})}")
    return bad
