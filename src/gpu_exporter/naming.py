"""The DCGM-compatible view: our readings under dcgm-exporter's names, units, types and labels.

With ``--metrics.naming=dcgm`` the page carries ``DCGM_FI_DEV_GPU_UTIL`` (percent),
``DCGM_FI_DEV_FB_USED`` (MiB), ``DCGM_FI_DEV_SM_CLOCK`` (MHz) and so on, labelled as dcgm-exporter
labels them (``gpu``, ``UUID``, ``pci_bus_id``, ``device``, ``modelName``, ``Hostname``,
``DCGM_FI_DRIVER_VERSION``; ``GPU_I_ID`` and ``GPU_I_PROFILE`` on MIG instances; ``container``,
``namespace``, ``pod`` when pods are attributed), so that dashboards and alerts written for
dcgm-exporter work unchanged. Which catalog key feeds which field, and the factor from our base unit
to DCGM's, is recorded in the catalog (``Metric.dcgm``, ``dcgm_scale``, ``dcgm_type``); this module
adds DCGM's units and help texts and builds the view. Series without a DCGM field (per-XID counts,
NVLink per link, throttle reasons at the sample instant, the health summary, per-pod series ...) stay
served under their own names, labelled as the DCGM series are, so switching to this mode loses nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpu_exporter import catalog
from gpu_exporter.catalog import name_filter
from gpu_exporter.exposition import View, ViewFamily, ViewSeries, escape, native_view
from gpu_exporter.k8s.model import PodRef
from gpu_exporter.model import DeviceId

__all__ = ["ALIASES", "DCGM_UNITS", "DcgmField", "dcgm_fields", "dcgm_labels", "dcgm_view"]

# DCGM field -> (unit of the value dcgm-exporter serves, what it measures)
DCGM_UNITS: dict[str, tuple[str, str]] = {
    "DCGM_FI_DEV_GPU_UTIL": ("%", "GPU utilization"),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("%", "Memory utilization"),
    "DCGM_FI_DEV_ENC_UTIL": ("%", "Encoder utilization"),
    "DCGM_FI_DEV_DEC_UTIL": ("%", "Decoder utilization"),
    "DCGM_FI_DEV_FB_TOTAL": ("MiB", "Framebuffer memory total"),
    "DCGM_FI_DEV_FB_USED": ("MiB", "Framebuffer memory used"),
    "DCGM_FI_DEV_FB_FREE": ("MiB", "Framebuffer memory free"),
    "DCGM_FI_DEV_FB_RESERVED": ("MiB", "Framebuffer memory reserved"),
    "DCGM_FI_DEV_GPU_TEMP": ("C", "GPU temperature"),
    "DCGM_FI_DEV_MEMORY_TEMP": ("C", "Memory temperature"),
    "DCGM_FI_DEV_POWER_USAGE": ("W", "Power draw"),
    "DCGM_FI_DEV_POWER_MGMT_LIMIT": ("W", "Power management limit"),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": ("mJ", "Total energy consumption since the driver loaded"),
    "DCGM_FI_DEV_SM_CLOCK": ("MHz", "SM clock frequency"),
    "DCGM_FI_DEV_MEM_CLOCK": ("MHz", "Memory clock frequency"),
    "DCGM_FI_DEV_VIDEO_CLOCK": ("MHz", "Video encoder/decoder clock frequency"),
    "DCGM_FI_DEV_MAX_SM_CLOCK": ("MHz", "Maximum SM clock frequency"),
    "DCGM_FI_DEV_MAX_MEM_CLOCK": ("MHz", "Maximum memory clock frequency"),
    "DCGM_FI_DEV_PSTATE": ("state", "Performance state, 0 (maximum) to 15"),
    "DCGM_FI_DEV_FAN_SPEED": ("%", "Fan speed"),
    "DCGM_FI_PROF_PCIE_TX_BYTES": ("B/s", "PCIe transmit rate"),
    "DCGM_FI_PROF_PCIE_RX_BYTES": ("B/s", "PCIe receive rate"),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": ("count", "Total number of PCIe retries"),
    "DCGM_FI_DEV_PCIE_LINK_GEN": ("generation", "PCIe link generation"),
    "DCGM_FI_DEV_PCIE_LINK_WIDTH": ("lanes", "PCIe link width"),
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": ("count", "Single-bit volatile ECC errors"),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": ("count", "Double-bit volatile ECC errors"),
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": ("count", "Single-bit persistent ECC errors"),
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": ("count", "Double-bit persistent ECC errors"),
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": ("count", "Rows remapped for correctable errors"),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": ("count", "Rows remapped for uncorrectable errors"),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": ("bool", "Whether remapping of rows has failed"),
    "DCGM_FI_DEV_RETIRED_SBE": ("count", "Pages retired for single-bit errors"),
    "DCGM_FI_DEV_RETIRED_DBE": ("count", "Pages retired for double-bit errors"),
    "DCGM_FI_PROF_SM_ACTIVE": ("ratio", "Ratio of cycles an SM has at least one warp assigned"),
    "DCGM_FI_PROF_SM_OCCUPANCY": ("ratio", "Ratio of resident warps to the maximum on an SM"),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": ("ratio", "Ratio of cycles the tensor pipe is active"),
    "DCGM_FI_PROF_DRAM_ACTIVE": ("ratio", "Ratio of cycles the device memory interface is active"),
    "DCGM_FI_PROF_PIPE_FP64_ACTIVE": ("ratio", "Ratio of cycles the fp64 pipe is active"),
    "DCGM_FI_PROF_PIPE_FP32_ACTIVE": ("ratio", "Ratio of cycles the fp32 pipe is active"),
    "DCGM_FI_PROF_PIPE_FP16_ACTIVE": ("ratio", "Ratio of cycles the fp16 pipe is active"),
    "DCGM_FI_DEV_XID_ERRORS": ("xid", "Value of the last XID error encountered"),
    "DCGM_FI_DEV_POWER_VIOLATION": ("us", "Throttling duration due to power constraints"),
    "DCGM_FI_DEV_THERMAL_VIOLATION": ("us", "Throttling duration due to thermal constraints"),
    "DCGM_FI_DEV_SYNC_BOOST_VIOLATION": ("us", "Throttling duration due to sync-boost constraints"),
    "DCGM_FI_DEV_BOARD_LIMIT_VIOLATION": ("us", "Throttling duration due to board limit constraints"),
    "DCGM_FI_DEV_LOW_UTIL_VIOLATION": ("us", "Throttling duration due to low utilization"),
    "DCGM_FI_DEV_RELIABILITY_VIOLATION": ("us", "Throttling duration due to reliability constraints"),
}

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
        unit, what = DCGM_UNITS.get(m.dcgm, ("", m.help.rstrip(".")))
        out.append(DcgmField(m.key, m.dcgm, m.dcgm_type or "gauge", m.dcgm_scale, unit, _help(what, unit)))
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


def dcgm_labels(
    device: DeviceId, info: Mapping[str, str], hostname: str, pod: PodRef | None = None, with_pod: bool = False
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
    pairs += [("Hostname", hostname), ("DCGM_FI_DRIVER_VERSION", info.get("driver_version", ""))]
    if with_pod:
        pairs += [
            ("container", pod.container if pod else ""),
            ("namespace", pod.namespace if pod else ""),
            ("pod", pod.pod if pod else ""),
        ]
    return tuple(pairs)


def dcgm_view(
    hostname: str,
    include: str = "",
    exclude: str = "",
    enabled: Callable[[str], bool] = lambda group: True,
    pods: Callable[[str], Sequence[PodRef]] | None = None,
) -> View:
    """The view for ``--metrics.naming=dcgm``. ``pods(uuid)`` names the containers on a device; a
    device used by exactly one container carries its pod labels (empty otherwise, as dcgm-exporter)."""
    keep = name_filter(include, exclude)
    metrics = [m for m in catalog.CATALOG if enabled(m.group)]
    fields = dcgm_fields(metrics)
    families = tuple(
        ViewFamily(f.name, f.type, f.help, (ViewSeries(f.key, "", (), f.scale),)) for f in fields if keep(f.name)
    ) + _native_families([m for m in metrics if m.key not in {f.key for f in fields}], keep)

    def device_labels(device: DeviceId, info: dict[str, str]) -> str:
        pod: PodRef | None = None
        if pods is not None:
            on_device = pods(device.uuid)
            pod = on_device[0] if len(on_device) == 1 else None
        pairs = dcgm_labels(device, info, hostname, pod, with_pod=pods is not None)
        return ",".join(f'{k}="{escape(v)}"' for k, v in pairs)

    def info_labels(device: DeviceId, info: dict[str, str]) -> str:
        extra = "".join(f',{k}="{escape(v)}"' for k, v in sorted(info.items()) if k not in _IN_DCGM_LABELS)
        return device_labels(device, info) + extra

    native = native_view()  # gpu_up and gpu_info: no DCGM field, served under our names
    up = native.up if native.up is not None and keep(native.up.name) else None
    info = native.info if native.info is not None and keep(native.info.name) else None
    return View(families, up, info, device_labels, info_labels)


_IN_DCGM_LABELS = frozenset({"name", "pci_bus_id", "device", "driver_version"})  # already among dcgm_labels
