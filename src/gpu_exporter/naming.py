"""The DCGM-compatible view: our readings under dcgm-exporter's names, units, types and labels.

With ``--metrics.naming=dcgm`` the page carries ``DCGM_FI_DEV_GPU_UTIL`` (percent),
``DCGM_FI_DEV_FB_USED`` (MiB), ``DCGM_FI_DEV_SM_CLOCK`` (MHz) and so on, labelled as dcgm-exporter
labels them (``gpu``, ``UUID``, ``pci_bus_id``, ``device``, ``modelName``, ``hostname`` (``Hostname``
before dcgm-exporter's #655), ``DCGM_FI_DRIVER_VERSION``; ``GPU_I_ID`` and ``GPU_I_PROFILE`` on MIG
instances; ``container``, ``namespace``, ``pod``, ``pod_uid`` when pods are attributed, and ``vgpu``
with ``--k8s.virtual-gpus``), so that dashboards and alerts written for dcgm-exporter work unchanged.
With ``--k8s.virtual-gpus`` (dcgm-exporter's ``--kubernetes-virtual-gpus``) a device held by pods is
served once per pod, with that pod's labels; ``DCGM_FI_DEV_GPU_UTIL`` and ``DCGM_FI_DEV_FB_USED`` keep
their device-wide series too and carry each pod's own share (its processes' SM utilization and memory,
0 for an idle holder), as dcgm-exporter splits them on time-sliced GPUs. Which catalog key feeds which field, the factor from our base unit to
DCGM's, DCGM's type, unit and what the field measures are recorded in the catalog entry (``Metric.dcgm``,
``dcgm_scale``, ``dcgm_type``, ``dcgm_unit``, ``dcgm_help``); this module builds the view from them,
adding the older fields served beside two of them (``ALIASES``). Series without a DCGM field (per-XID counts,
NVLink per link, throttle reasons at the sample instant, the health summary, per-pod series ...) stay
served under their own names, labelled as the DCGM series are, so switching to this mode loses nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpu_exporter import catalog
from gpu_exporter.catalog import name_filter
from gpu_exporter.exposition import Split, View, ViewFamily, ViewSeries, escape, native_view
from gpu_exporter.k8s.model import PodRef, PodShare
from gpu_exporter.model import DeviceId, DeviceSample

__all__ = ["ALIASES", "DcgmField", "dcgm_fields", "dcgm_labels", "dcgm_view"]

# Fields of older dcgm-exporter releases' default list (and of Grafana dashboard 12239) for a quantity
# the catalog maps to a newer field: served under both names. (catalog key, field, scale, type, unit, what)
ALIASES: tuple[tuple[str, str, float, str, str, str], ...] = (
    ("pcie_tx", "DCGM_FI_DEV_PCIE_TX_THROUGHPUT", 1 / 1024, "counter", "KB", "PCIe transmit throughput per second"),
    ("pcie_rx", "DCGM_FI_DEV_PCIE_RX_THROUGHPUT", 1 / 1024, "counter", "KB", "PCIe receive throughput per second"),
)

_UNITLESS = ("count", "bool", "ratio", "state", "generation", "lanes", "xid")


@dataclass(frozen=True, slots=True)
class DcgmField:
    key: str  # catalog key
    name: str  # DCGM field name, the family name on the page
    type: str  # gauge or counter, as dcgm-exporter declares it
    scale: float  # our base-unit value times this is DCGM's value
    unit: str
    help: str


def dcgm_fields(metrics: Iterable[catalog.Metric] = catalog.CATALOG) -> tuple[DcgmField, ...]:
    """One field per catalog key that has a DCGM name, in catalog order."""
    out: list[DcgmField] = []
    seen: set[str] = set()
    keys: set[str] = set()
    for m in metrics:
        if not m.dcgm or m.labels:  # DCGM fields are one value per device: no dynamic labels
            continue
        if m.dcgm in seen:
            raise ValueError(f"two catalog keys map to {m.dcgm}")
        seen.add(m.dcgm)
        keys.add(m.key)
        unit = m.dcgm_unit
        out.append(DcgmField(m.key, m.dcgm, m.dcgm_type or "gauge", m.dcgm_scale, unit, _help(m.dcgm_help, unit)))
    for key, name, scale, type_, unit, what in ALIASES:
        if key in keys and name not in seen:
            out.append(DcgmField(key, name, type_, scale, unit, _help(what, unit)))
    return tuple(out)


def _help(what: str, unit: str) -> str:
    return f"{what} (in {unit})." if unit and unit not in _UNITLESS else f"{what}."


def _native_families(metrics: Sequence[catalog.Metric], keep: Callable[[str], bool]) -> tuple[ViewFamily, ...]:
    """Our own families, in our units, for the keys that have no DCGM field."""
    out = []
    for fam in catalog.families(metrics):
        if keep(fam.name):
            series = tuple(
                ViewSeries(m.key, "".join(f',{k}="{escape(v)}"' for k, v in m.const_labels), m.labels)
                for m in fam.metrics
            )
            out.append(ViewFamily(fam.name, fam.type, fam.help, series))
    return tuple(out)


# The keys dcgm-exporter splits by process on a shared GPU (--kubernetes-virtual-gpus): their pod copies
# carry the pod's own share, and the device-wide series stays beside them.
PER_POD_KEYS = frozenset({"utilization", "memory_used"})


def dcgm_labels(
    device: DeviceId,
    info: Mapping[str, str],
    hostname: str,
    pod: PodRef | None = None,
    with_pod: bool = False,
    uid: str = "",
    vgpu: str | None = None,
) -> tuple[tuple[str, str], ...]:
    """dcgm-exporter's labels for one GPU or MIG instance (MIG instances carry their parent's UUID)."""
    pairs: list[tuple[str, str]] = [
        ("gpu", device.gpu),
        ("UUID", device.parent_uuid if device.is_mig else device.uuid),
        ("pci_bus_id", info.get("pci_bus_id", "")),
        ("device", info.get("device", "")),
        ("modelName", info.get("name", "")),
    ]
    if device.is_mig:
        pairs += [("GPU_I_PROFILE", device.mig_profile), ("GPU_I_ID", device.gpu_instance)]
    pairs += [("hostname", hostname), ("DCGM_FI_DRIVER_VERSION", info.get("driver_version", ""))]
    if with_pod:
        pairs += [
            ("container", pod.container if pod else ""),
            ("namespace", pod.namespace if pod else ""),
            ("pod", pod.pod if pod else ""),
            ("pod_uid", uid),
        ]
    if vgpu is not None:
        pairs.append(("vgpu", vgpu))
    return tuple(pairs)


def dcgm_view(
    hostname: str,
    include: str = "",
    exclude: str = "",
    enabled: Callable[[str], bool] = lambda group: True,
    pods: Callable[[str], Sequence[PodRef]] | None = None,
    shares: Callable[[str], Sequence[PodShare]] | None = None,
) -> View:
    """The view for ``--metrics.naming=dcgm``. ``pods(uuid)`` names the containers on a device; a
    device used by exactly one container carries its pod labels (empty otherwise, as dcgm-exporter).
    ``shares(uuid)`` (``--k8s.virtual-gpus``) splits a device held by pods into one copy per pod."""
    keep = name_filter(include, exclude)
    metrics = [m for m in catalog.CATALOG if enabled(m.group)]
    fields = dcgm_fields(metrics)
    families = tuple(
        ViewFamily(f.name, f.type, f.help, (ViewSeries(f.key, "", (), f.scale),)) for f in fields if keep(f.name)
    ) + _native_families([m for m in metrics if m.key not in {f.key for f in fields}], keep)

    def text(pairs: Iterable[tuple[str, str]]) -> str:
        return ",".join(f'{k}="{escape(v)}"' for k, v in pairs)

    def one_owner(device: DeviceId) -> PodShare | None:
        if shares is not None:
            found = shares(device.uuid)
            return found[0] if len(found) == 1 else None
        if pods is not None:
            on_device = pods(device.uuid)
            return PodShare(on_device[0]) if len(on_device) == 1 else None
        return None

    with_pod = pods is not None or shares is not None

    def device_labels(device: DeviceId, info: dict[str, str]) -> str:
        owner = one_owner(device)
        pod, uid = (owner.pod, owner.uid) if owner else (None, "")
        vgpu = (owner.vgpu if owner else "") if shares is not None else None
        return text(dcgm_labels(device, info, hostname, pod, with_pod, uid, vgpu))

    def splits(sample: DeviceSample) -> list[Split]:
        found = shares(sample.device.uuid) if shares is not None else ()
        if not found:
            return []
        device, info = sample.device, sample.info
        out = [Split(text(dcgm_labels(device, info, hostname, None, True, "", "")), only=PER_POD_KEYS)]
        for share in found:
            labels = text(dcgm_labels(device, info, hostname, share.pod, True, share.uid, share.vgpu))
            out.append(Split(labels, {"utilization": share.sm, "memory_used": share.memory}))
        return out

    def info_labels(device: DeviceId, info: dict[str, str]) -> str:
        extra = "".join(f',{k}="{escape(v)}"' for k, v in sorted(info.items()) if k not in _IN_DCGM_LABELS)
        return device_labels(device, info) + extra

    native = native_view()  # gpu_up and gpu_info: no DCGM field, served under our names
    up = native.up if native.up is not None and keep(native.up.name) else None
    info = native.info if native.info is not None and keep(native.info.name) else None
    return View(families, up, info, device_labels, info_labels, splits if shares is not None else None)


_IN_DCGM_LABELS = frozenset({"name", "pci_bus_id", "device", "driver_version"})  # already among dcgm_labels
