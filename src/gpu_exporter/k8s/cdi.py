"""GPU identities from the CDI spec files on the node (Container Device Interface), read offline.

A DRA driver prepares a claim by writing a CDI spec, and the kubelet reports the claim's CDI device
names (``vendor/class=name``) in pod-resources. NVIDIA's DRA driver (gpu.nvidia.com) writes one
transient spec per claim, ``/var/run/cdi/k8s.gpu.nvidia.com-claim_<claim uid>.yaml``, of kind
``k8s.gpu.nvidia.com/claim`` with one device per claimed device, named ``<claim uid>-<device>``
(``gpu-0``, or a MIG device such as ``gpu-0-mig-1g10gb-19-0``); its releases before 25.x wrote a base
spec of kind ``k8s.gpu.nvidia.com/device`` (devices ``gpu-0`` ...) and claim specs holding only edits.
Such a spec names no UUID: a whole GPU is its device node ``/dev/nvidia<minor>``; a MIG device adds
the two capability nodes ``/dev/nvidia-caps/nvidia-cap<m>`` of its GPU and compute instance, which the
driver's ``/proc/driver/nvidia-caps/mig-minors`` maps to ``gpu<minor>/gi<id>/ci<id>``. Specs that do
name one are read too: a device named by UUID (``nvidia.com/gpu=GPU-...``, as ``nvidia-ctk cdi
generate --device-name-strategy=uuid`` writes) or an ``NVIDIA_VISIBLE_DEVICES`` of UUIDs in its edits.

Every file is read bounded (``MAX_BYTES``, at most ``MAX_FILES`` per directory); one that does not
parse is skipped and counted.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpu_exporter import safeyaml

__all__ = ["DEFAULT_DIRS", "CdiDevice", "CdiIndex", "MigMinors", "parse_spec", "read_mig_minors", "scan"]

DEFAULT_DIRS = ("/etc/cdi", "/var/run/cdi")
MAX_FILES = 1024  # spec files read per directory
MAX_BYTES = 1024 * 1024  # per file; a claim's spec with the driver's common edits is tens of kB

_UUID = re.compile(r"^(?:GPU|MIG)-[0-9A-Za-z-]+(?:/\d+/\d+)?$")
_GPU_NODE = re.compile(r"^/dev/nvidia(\d+)$")
_CAP_NODE = re.compile(r"^/dev/nvidia-caps/nvidia-cap(\d+)$")
_MIG_MINOR = re.compile(r"^gpu(\d+)/gi(\d+)/(?:ci(\d+)/)?access\s+(\d+)$")


@dataclass(frozen=True, slots=True)
class CdiDevice:
    """What one CDI device injects that names a GPU."""

    uuids: tuple[str, ...] = ()  # GPU or MIG UUIDs, from the name or NVIDIA_VISIBLE_DEVICES
    minors: tuple[int, ...] = ()  # /dev/nvidia<minor>
    caps: tuple[int, ...] = ()  # /dev/nvidia-caps/nvidia-cap<minor>: a MIG device's instances


@dataclass(frozen=True)
class CdiIndex:
    """Every CDI device on the node by qualified name (``kind=name``)."""

    devices: dict[str, CdiDevice] = field(default_factory=dict)
    rejected: int = 0  # files that could not be read or parsed


@dataclass(frozen=True)
class MigMinors:
    """``mig-minors``: a capability node's minor -> (GPU minor, GPU instance, compute instance or None)."""

    by_minor: dict[int, tuple[int, int, int | None]] = field(default_factory=dict)


def _env_uuids(env: Any) -> tuple[str, ...]:
    out: list[str] = []
    for item in env if isinstance(env, list) else ():
        if isinstance(item, str) and item.startswith("NVIDIA_VISIBLE_DEVICES="):
            values = item.partition("=")[2].split(",")
            out.extend(v.strip() for v in values if _UUID.match(v.strip()))
    return tuple(out)


def _nodes(edits: dict[str, Any]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    minors: list[int] = []
    caps: list[int] = []
    nodes = edits.get("deviceNodes")
    for node in nodes if isinstance(nodes, list) else ():
        path = node.get("path") if isinstance(node, dict) else None
        if not isinstance(path, str):
            continue
        if match := _GPU_NODE.match(path):
            minors.append(int(match.group(1)))
        elif match := _CAP_NODE.match(path):
            caps.append(int(match.group(1)))
    return tuple(minors), tuple(caps)


def parse_spec(data: Any) -> dict[str, CdiDevice]:
    """The devices of one parsed spec file by qualified name; ValueError when it is not a CDI spec."""
    if not isinstance(data, dict) or not isinstance(data.get("kind"), str) or "/" not in data["kind"]:
        raise ValueError("not a CDI spec (no vendor/class kind)")
    kind = data["kind"]
    devices = data.get("devices")
    if not isinstance(devices, list):
        raise ValueError("not a CDI spec (no devices list)")
    out: dict[str, CdiDevice] = {}
    for device in devices:
        if not isinstance(device, dict) or not isinstance(device.get("name"), str):
            continue
        name = device["name"]
        edits = device.get("containerEdits")
        edits = edits if isinstance(edits, dict) else {}
        uuids = (name,) if _UUID.match(name) else ()
        minors, caps = _nodes(edits)
        out[f"{kind}={name}"] = CdiDevice(uuids + _env_uuids(edits.get("env")), minors, caps)
    return out


def _spec_files(directory: Path) -> list[Path]:
    try:
        with os.scandir(directory) as entries:
            names = []
            for entry in entries:
                if entry.name.endswith((".yaml", ".json")) and entry.is_file():
                    names.append(entry.name)
                    if len(names) >= MAX_FILES:
                        break
    except OSError:
        return []
    return [directory / name for name in sorted(names)]


def scan(dirs: tuple[str, ...] = DEFAULT_DIRS) -> CdiIndex:
    """Index the spec files of ``dirs``; a later directory's device of the same name wins, as in CDI."""
    devices: dict[str, CdiDevice] = {}
    rejected = 0
    for directory in dirs:
        for path in _spec_files(Path(directory)):
            try:
                data = safeyaml.strip_lines(safeyaml.load_file(str(path), MAX_BYTES, "CDI spec"))
                devices.update(parse_spec(data))
            except ValueError:
                rejected += 1
    return CdiIndex(devices, rejected)


def read_mig_minors(procfs: str | Path) -> MigMinors:
    """``<procfs>/driver/nvidia-caps/mig-minors`` (absent without MIG support: empty)."""
    path = Path(procfs) / "driver" / "nvidia-caps" / "mig-minors"
    try:
        text = safeyaml.read_text(str(path), MAX_BYTES, "mig-minors")
    except ValueError:
        return MigMinors()
    out: dict[int, tuple[int, int, int | None]] = {}
    for line in text.splitlines():
        if match := _MIG_MINOR.match(line.strip()):
            gpu, gi, ci, minor = match.groups()
            out[int(minor)] = (int(gpu), int(gi), int(ci) if ci is not None else None)
    return MigMinors(out)
