"""Every Secret file the agent mounts is readable by the agent's user, in every overlay and component.

The kubelet writes a Secret volume's files as root, with the volume's defaultMode, and gives their group
to the pod's fsGroup only when one is set: a 0440 file without fsGroup is root:root, unreadable by
UID 65532, and the agent stops at start-up on its own certificate or password.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.deploy.test_deploy import OVERLAYS, _agent, _pod_spec, _render, render_with


def _unreadable(docs: list[dict[str, Any]]) -> list[str]:
    spec = _pod_spec(docs)
    pod_ctx = spec.get("securityContext", {})
    ctx = {**pod_ctx, **_agent(docs).get("securityContext", {})}
    uid, group = ctx.get("runAsUser", 0), pod_ctx.get("fsGroup")
    mounted = {m["name"] for m in _agent(docs)["volumeMounts"]}
    bad = []
    for volume in spec["volumes"]:
        secret = volume.get("secret")
        if secret is None or volume["name"] not in mounted:
            continue
        modes = [item.get("mode", secret.get("defaultMode", 0o644)) for item in secret.get("items", [])] or [
            secret.get("defaultMode", 0o644)
        ]
        for mode in modes:
            readable = uid == 0 or mode & 0o004 or (mode & 0o040 and group is not None)
            if not readable:
                bad.append(f"{volume['name']} (mode {mode:o}, user {uid}, fsGroup {group})")
    return bad


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_secrets_are_readable_by_the_agent(overlay: str) -> None:
    assert _unreadable(_render(overlay)) == []


@pytest.mark.parametrize("component", ["web-tls", "amd", "jetson-processes"])
def test_component_secrets_are_readable_by_the_agent(tmp_path: Path, component: str) -> None:
    assert _unreadable(render_with(tmp_path, component)) == []
