"""Field values read from pynvml's own ctypes array (groups.field_values) come out as each item's
attributes say: every value type, a per-field error, a type NVML does not define."""

from __future__ import annotations

from typing import Any

import pynvml

from gpu_exporter.backends.nvidia import groups
from gpu_exporter.backends.nvidia.devices import Device
from gpu_exporter.model import DeviceId

# (valueType, member, value): each of nvmlValue_t's members, at a value that needs its full width
VALUES = (
    (0, "dVal", -1234.5678),
    (1, "uiVal", 2**32 - 7),
    (2, "ulVal", 2**63 + 11),
    (3, "ullVal", 2**64 - 3),
    (4, "sllVal", -(2**62) - 5),
    (5, "siVal", -(2**31) + 9),
    (6, "usVal", 65_000),
)


def _array() -> Any:
    items = (pynvml.c_nvmlFieldValue_t * (len(VALUES) + 2))()
    for i, (kind, member, value) in enumerate(VALUES):
        items[i].fieldId, items[i].scopeId, items[i].valueType = 138, i, kind
        setattr(items[i].value, member, value)
    items[7].fieldId, items[7].valueType, items[7].nvmlReturn = 82, 1, pynvml.NVML_ERROR_NOT_SUPPORTED
    items[7].value.uiVal = 55  # not answered: left out, whatever the memory holds
    items[8].fieldId, items[8].valueType = 83, 9  # no such value type: left out
    return items


def test_the_array_is_read_as_its_items_attributes_say() -> None:
    items = _array()
    device = Device(index=0, id=DeviceId("0", "GPU-0"))
    got = groups.field_values(lambda *_a, **_k: items, device, [])
    assert got == {(138, i): float(value) for i, (_, _, value) in enumerate(VALUES)}
    one_by_one = {
        (int(item.fieldId), int(item.scopeId)): groups.field_value(item)
        for item in items
        if item.nvmlReturn == 0 and groups.field_value(item) is not None
    }
    assert got == one_by_one
