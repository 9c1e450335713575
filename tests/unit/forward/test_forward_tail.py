"""What `gpu-exporter tail` prints for a batch: one JSON object per device and sample."""

from __future__ import annotations

import io
import json

import pytest

from gpu_exporter.forward.tail import lines, main
from gpu_exporter.model import DeviceId, DeviceSample, Sample
from gpu_exporter.payload import Batch


def test_each_device_and_sample_is_one_line_with_prometheus_names() -> None:
    mig = DeviceId("0", "MIG-1", gpu_instance="7", compute_instance="0", mig_profile="1g.10gb", parent_uuid="GPU-0")
    values = {
        ("temp_gpu", ()): 54.0,
        ("clock_event_reason", ("sw_power_cap",)): 1.0,
        ("a_future_metric", ()): 3.0,
    }
    batch = Batch(
        "edge-1",
        "b00t",
        (
            Sample(7, 1_764_000_000.25, (DeviceSample(DeviceId("0", "GPU-0"), True, values), DeviceSample(mig, False))),
            Sample(8, 1_764_000_005.25, (DeviceSample(DeviceId("0", "GPU-0"), True, values),)),
        ),
    )
    rows = [json.loads(json.dumps(row)) for row in lines(batch)]
    assert [(r["seq"], r["uuid"]) for r in rows] == [(7, "GPU-0"), (7, "MIG-1"), (8, "GPU-0")]
    first = rows[0]
    assert first["node"] == "edge-1" and first["boot"] == "b00t"
    assert first["timestamp"] == "2025-11-24T16:00:00.250Z"
    assert first["values"] == {
        'gpu_temperature_celsius{sensor="gpu"}': 54.0,
        'gpu_clock_event_reason_active{reason="sw_power_cap"}': 1.0,
        "a_future_metric": 3.0,
    }
    assert rows[1]["mig_profile"] == "1g.10gb" and rows[1]["up"] is False and rows[1]["values"] == {}


def test_usage_errors_exit_2_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    out = io.StringIO()
    for argv, message in (
        ([], "--mqtt.url is required"),
        (["--mqtt.url=http://x"], "invalid MQTT URL"),
        (["--mqtt.url=mqtt://127.0.0.1:1", "--node=a/b"], "invalid --node"),
    ):
        assert main(argv, out=out) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1
    assert out.getvalue() == ""


def test_an_unreachable_broker_is_exit_1_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--mqtt.url=mqtt://127.0.0.1:1"], out=io.StringIO()) == 1
    err = capsys.readouterr().err
    assert "cannot connect to the broker at 127.0.0.1:1" in err and len(err.strip().splitlines()) == 1
