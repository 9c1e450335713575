"""The layering of src/gpu_exporter, enforced: which package may import which (docs/architecture.md).

Every import of the package's own modules is read from the source (``ast``: imports inside functions and
under ``TYPE_CHECKING`` count too, as a dependency is one wherever it is written) and checked against four
rules:

- the backends know nothing of the page, the forwarder, the bridge, the network or pod attribution;
- the payload codec and the MQTT layer know nothing of the agent (nor of the forwarder or the bridge);
- configuration imports no feature package;
- the bridge imports nothing that only the agent uses.

``KNOWN`` lists the imports that break a rule today, each with what removes it; the test fails on any
import that breaks a rule and is not listed, and on a listed one that is gone (the list only shrinks).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "src" / "gpu_exporter"

# modules and packages only the agent uses (the exporter command: sampling, the page, forwarding, pods)
AGENT_ONLY = frozenset(
    {
        "cli",
        "sampler",
        "exposition",
        "naming",
        "reload",
        "agent_options",
        "ring",
        "limits",
        "backends",
        "k8s",
        "forward",
    }
)
FEATURES = frozenset({"backends", "bridge", "forward", "k8s", "mqtt", "web", "agent_options", "doctor"})

RULES: dict[str, frozenset[str]] = {
    # importing package -> the top-level names of gpu_exporter it must not import
    "backends": frozenset({"exposition", "forward", "bridge", "web", "mqtt", "payload", "sampler", "cli", "k8s"}),
    "payload": AGENT_ONLY | {"bridge", "web", "mqtt", "config"},
    "mqtt": AGENT_ONLY | {"bridge", "web", "config"},
    "config": FEATURES,
    "bridge": AGENT_ONLY,
}
# what a rule allows of a package it otherwise bans: the leaf parsers every option table is built from
ALLOWED = frozenset({"gpu_exporter.config.parsers"})

# (importing file, imported module): the imports that break a rule today, and what removes each
KNOWN = frozenset(
    {
        # configuration inherits the option tables of every area (the move: a Config composed of tables)
        ("config/__init__.py", "gpu_exporter.backends.options"),
        ("config/checks.py", "gpu_exporter.mqtt.tls"),
        ("config/checks.py", "gpu_exporter.web.webconfig"),
        ("config/commands.py", "gpu_exporter.agent_options"),
        ("config/commands.py", "gpu_exporter.backends.options"),
        ("config/commands.py", "gpu_exporter.bridge.options"),
        ("config/commands.py", "gpu_exporter.forward.options"),
        ("config/commands.py", "gpu_exporter.k8s.options"),
        ("config/commands.py", "gpu_exporter.web.options"),
        ("config/model.py", "gpu_exporter.agent_options"),
        ("config/model.py", "gpu_exporter.backends.options"),
        ("config/model.py", "gpu_exporter.bridge.options"),
        ("config/model.py", "gpu_exporter.forward.options"),
        ("config/model.py", "gpu_exporter.k8s.options"),
        ("config/model.py", "gpu_exporter.web.options"),
        # MQTT settings typed against the agent's configuration (the move: one MqttOptions)
        ("mqtt/settings.py", "gpu_exporter.config"),
        # the bridge borrows the forwarder's option texts and TLS fields (the move: one MqttOptions)
        ("bridge/cli.py", "gpu_exporter.forward.options"),
        ("bridge/settings.py", "gpu_exporter.forward.options"),
    }
)


def _imports(path: Path, root: Path) -> set[str]:
    """The gpu_exporter modules ``path`` imports (``from gpu_exporter import x`` as ``gpu_exporter.x``)."""
    package = ["gpu_exporter", *path.relative_to(root).parent.parts]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "gpu_exporter")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1])
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            if module == "gpu_exporter":
                found.update(f"gpu_exporter.{a.name}" for a in node.names)
            elif module.startswith("gpu_exporter."):
                found.add(module)
    return found


def violations(root: Path = ROOT) -> set[tuple[str, str]]:
    out = set()
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        banned = RULES.get(rel.split("/")[0]) if "/" in rel else None
        if not banned:
            continue
        for module in _imports(path, root):
            top = module.split(".")[1]
            if top in banned and not any(module == a or module.startswith(a + ".") for a in ALLOWED):
                out.add((rel, module))
    return out


def test_every_import_keeps_the_layering_or_is_a_known_exception() -> None:
    found = violations()
    new = sorted(found - KNOWN)
    assert not new, f"imports that break the layering (tests/unit/test_layering.py): {new}"
    gone = sorted(KNOWN - found)
    assert not gone, f"no longer imported: remove from KNOWN: {gone}"


def test_an_agent_only_import_added_to_the_bridge_is_caught(tmp_path: Path) -> None:
    """The rule sees what it must: a copy of the tree whose bridge imports the sampler, under
    TYPE_CHECKING and inside a function, breaks it twice."""
    bridge = tmp_path / "bridge"
    bridge.mkdir()
    (bridge / "extra.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from gpu_exporter.sampler import Sampler\n"
        "def f() -> None:\n    from ..exposition import render\n"
    )
    (tmp_path / "payload").mkdir()
    (tmp_path / "payload" / "ok.py").write_text("from gpu_exporter.model import Sample\nfrom . import types\n")
    assert violations(tmp_path) == {
        ("bridge/extra.py", "gpu_exporter.sampler"),
        ("bridge/extra.py", "gpu_exporter.exposition"),
    }
