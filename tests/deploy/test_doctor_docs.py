"""The documented way to run the doctor in the pod passes it the agent's own options.

``kubectl exec`` starts a new process with the container's environment, not the agent's arguments: a
doctor started without the DaemonSet's ``--config.file`` and ``--path.sysfs`` checks the defaults (no
broker, the container's own /sys), not what the agent runs with.
"""

from __future__ import annotations

import re
import shlex

import pytest

from tests.deploy.test_deploy import OVERLAYS, ROOT, _agent, _render

DOCS = ("README.md", "docs/kubernetes.md")


def _documented(path: str) -> list[list[str]]:
    text = (ROOT / path).read_text(encoding="utf-8").replace("\n", " ")
    commands = re.findall(r"`(kubectl [^`]*exec ds/gpu-exporter -- gpu-exporter\s+doctor[^`]*)`", text)
    assert commands, f"{path} no longer shows the doctor command"
    return [shlex.split(c) for c in commands]


@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.parametrize("doc", DOCS)
def test_the_documented_doctor_command_gets_the_agents_options(doc: str, overlay: str) -> None:
    args = _agent(_render(overlay))["args"]
    for command in _documented(doc):
        missing = [a for a in args if a not in command]
        assert not missing, f"{doc}: {' '.join(command)} lacks the agent's {missing}"
