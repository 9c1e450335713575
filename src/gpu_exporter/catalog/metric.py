"""What one catalog entry says about a device metric, and the helpers the entry modules share."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, NamedTuple

__all__ = [
    "CLOCK_HELP",
    "MAXCLOCK_HELP",
    "PCIE_HELP",
    "POD_LABELS",
    "PROCESS_LABELS",
    "TEMP_HELP",
    "Metric",
    "MetricType",
    "MiB",
    "Variant",
    "entry",
    "family",
]

MetricType = Literal["gauge", "counter"]

MiB = 1.0 / (1024 * 1024)


@dataclass(frozen=True, slots=True)
class Metric:
    key: str
    name: str
    type: MetricType
    help: str
    group: str
    const_labels: tuple[tuple[str, str], ...] = ()
    labels: tuple[str, ...] = ()  # dynamic labels, values supplied with each reading
    dcgm: str = ""  # dcgm-exporter's field name for the same quantity, if it has one
    dcgm_scale: float = 1.0  # multiply our base-unit value by this to get DCGM's unit
    dcgm_type: MetricType | None = None
    dcgm_unit: str = ""  # the unit of DCGM's value ("MiB", "%", "count"); set with ``dcgm``
    dcgm_help: str = ""  # what the DCGM field measures; the page adds the unit (naming.py)
    # an alert waits for it: a change closes the agent's open batch at once, and every summary carries
    # it whatever the link (forward/summary.py)
    event: bool = False
    # the gpu_health subsystem whose rule reads it (backends/health.py, docs/health.md); "" for none
    health: str = ""


def entry(
    key: str,
    name: str,
    type_: MetricType,
    help_: str,
    group: str,
    const: dict[str, str] | None = None,
    labels: tuple[str, ...] = (),
    dcgm: str = "",
    scale: float = 1.0,
    dcgm_type: MetricType | None = None,
    dcgm_unit: str = "",
    dcgm_help: str = "",
    event: bool = False,
    health: str = "",
) -> Metric:
    const_labels = tuple((const or {}).items())
    return Metric(
        key,
        name,
        type_,
        help_,
        group,
        const_labels,
        labels,
        dcgm,
        scale,
        dcgm_type,
        dcgm_unit,
        dcgm_help,
        event,
        health,
    )


class Variant(NamedTuple):
    """One entry of a ``family``: its key, constant labels, DCGM field and what that measures, and flags."""

    key: str
    const: dict[str, str]
    dcgm: str = ""
    dcgm_help: str = ""
    event: bool = False
    health: str = ""


def family(
    name: str,
    type_: MetricType,
    help_: str,
    group: str,
    *variants: Variant,
    scale: float = 1.0,
    dcgm_type: MetricType | None = None,
    dcgm_unit: str = "",
) -> tuple[Metric, ...]:
    """The entries of one Prometheus family that tell themselves apart by constant labels, one per
    variant; ``scale``, ``dcgm_type`` and ``dcgm_unit`` apply to those with a DCGM field."""
    return tuple(
        entry(
            v.key,
            name,
            type_,
            help_,
            group,
            v.const,
            dcgm=v.dcgm,
            scale=scale if v.dcgm else 1.0,
            dcgm_type=dcgm_type if v.dcgm else None,
            dcgm_unit=dcgm_unit if v.dcgm else "",
            dcgm_help=v.dcgm_help,
            event=v.event,
            health=v.health,
        )
        for v in variants
    )


TEMP_HELP = "Temperature in degrees Celsius, by sensor."
CLOCK_HELP = "Current clock frequency in hertz, by clock domain."
MAXCLOCK_HELP = "Maximum clock frequency in hertz, by clock domain."
PCIE_HELP = "PCIe throughput in bytes per second, by direction."
# labels of the per-pod series; pod_uid last, so that a bridge reading an older agent's three values
# still names them right
POD_LABELS = ("namespace", "pod", "container", "pod_uid")
# labels of the per-process series (opt-in, --processes.series): the process, then its pod ("" for none)
PROCESS_LABELS = ("pid", "process_name", *POD_LABELS)
