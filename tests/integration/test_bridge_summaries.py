"""The bridge with summary batches (docs/bridge.md, "Summaries"), real Mosquitto and VictoriaMetrics:
a summary and the raw samples of the same window are both written, as different series, each once."""

from __future__ import annotations

import time
import uuid

import pytest

from gpu_exporter.forward.summary import encode_summary, summarize
from gpu_exporter.payload import encode
from tests.integration.test_bridge_service import Running, broker  # noqa: F401  (broker: the fixture, a plain Mosquitto)
from tests.support.bridge_helpers import Publisher, make_batch
from tests.support.tsdb import MosquittoServer, VictoriaMetricsServer, victoria_fixture, wait_until

pytestmark = pytest.mark.integration

victoria = victoria_fixture()


def test_a_summary_first_and_the_raw_samples_after_are_both_written_once(
    broker: MosquittoServer,  # noqa: F811
    victoria: VictoriaMetricsServer,
) -> None:
    node = f"edge-{uuid.uuid4().hex[:8]}"
    raw = make_batch(node, "boot-1", list(range(1, 13)), time.time() - 600)
    summary = encode_summary(node, "boot-1", [summarize(raw.samples[:6]), summarize(raw.samples[6:])], 30.0)
    bridge = Running(broker, victoria.write_url, client_id=f"b-{node}")
    pub = Publisher(broker.port)
    try:
        for payload in (summary, encode(raw), summary):  # summaries first, full resolution, a repeat
            pub.publish(f"t/{node}/batch", payload)
        wait_until(lambda: bridge.value("gpu_exporter_bridge_duplicate_samples_total") == 2, 20, "the repeat")

        def stored(name: str) -> dict[str, list[tuple[int, float]]]:
            found = victoria.samples(f'{name}{{node="{node}"}}')
            return {dict(k)["gpu"]: v for k, v in found.items()}

        wait_until(lambda: len(stored("gpu_temperature_celsius").get("0", ())) == 12, 20, "every raw sample")
        peaks = stored("gpu_temperature_celsius_max")
        assert sorted(peaks) == ["0", "1"]
        for gpu, points in peaks.items():  # one point per window, written once, at the window's end
            temps = [s.devices[int(gpu)].values[("temp_gpu", ())] for s in raw.samples]
            ends = [round(raw.samples[i].timestamp * 1000) for i in (5, 11)]
            assert points == [(ends[0], max(temps[:6])), (ends[1], max(temps[6:]))]
        clock = stored("gpu_clock_hertz_min")["0"]  # held still: sent as :last, written as min too
        assert [v for _, v in clock] == [1_410_000_000.0] * 2
        assert not stored("gpu_up_last") and len(stored("gpu_up")["0"]) == 12
    finally:
        pub.close()
        bridge.stop()
