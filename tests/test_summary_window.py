"""The summary window on a weak link (docs/forwarding.md, "Weak links"): it widens as the link shrinks,
but never past 16 batch intervals, so the cloud hears from a node at least that often however thin
its link; and it narrows again as the link recovers. The forwarder's timing is passed in by hand."""

from __future__ import annotations

from gpu_exporter.forward.adaptive import Adaptive
from gpu_exporter.forward.batch import decode
from gpu_exporter.forward.link_meter import LinkMeter
from gpu_exporter.forward.spool import Entry
from gpu_exporter.model import DeviceId, DeviceSample, Sample

INTERVAL = 10.0  # --mqtt.batch-interval
LONGEST = 16 * INTERVAL  # the documented cap on a summary window
RAW_BATCH = 5000  # payload bytes of one full-resolution batch: 500 B/s


def _measure(meter: LinkMeter, rate: float, start: float, times: int = 12) -> float:
    """PUBACKs that show the link carrying ``rate`` bytes per second; the time after them."""
    now = start
    for mid in range(times):
        meter.sent(1000 + mid, 100, now)
        now += 100 / rate
        meter.acked(1000 + mid, now, latency=0.0)
    return now


class Node:
    """Closes one full-resolution batch per interval into ``adaptive``, as the forwarder does."""

    def __init__(self, adaptive: Adaptive) -> None:
        self.adaptive = adaptive
        self.seq = 0

    def batches(self, n: int) -> list[float]:
        """Close ``n`` batches; the windows (seconds) of the summaries they produced."""
        queued = len(self.adaptive.queue)
        for _ in range(n):
            samples = []
            for _ in range(5):
                self.seq += 1
                values = {("temp_gpu", ()): 60.0 + self.seq % 7, ("power", ()): 200.0 + self.seq % 5}
                samples.append(
                    Sample(self.seq, 1e9 + self.seq * 2.0, (DeviceSample(DeviceId("0", "GPU-0"), True, values, {}),))
                )
            entry = Entry(self.seq, 0, RAW_BATCH, self.seq - 4, self.seq, 5)
            assert self.adaptive.closed(samples, [entry], INTERVAL, connected=True), "not weak: raw went ahead"
        made = list(self.adaptive.queue)[queued:]
        return [decode(data).summary_ms / 1000 for data in made]


def test_on_a_link_of_1_byte_a_second_the_window_stops_at_16_intervals() -> None:
    meter = LinkMeter(None)
    _measure(meter, 1.0, 0.0)
    node = Node(Adaptive("node-a", "boot-1", meter, INTERVAL))
    windows = node.batches(200)  # over half an hour of batches
    assert windows, "no summary at all"
    assert max(windows) <= LONGEST * 1.001, windows
    assert windows[-3:] == [LONGEST] * 3  # it did grow all the way, and stays there
    # a summary at least every 16 intervals: 200 batches give at least 200 / 16 of them
    assert len(windows) >= 200 // 16


def test_the_window_narrows_again_as_the_link_recovers() -> None:
    meter = LinkMeter(None)
    now = _measure(meter, 1.0, 0.0)
    node = Node(Adaptive("node-a", "boot-1", meter, INTERVAL))
    assert node.batches(120)[-1] == LONGEST
    _measure(meter, 400.0, now)  # still short of the 500 B/s full resolution takes, but summaries fit easily
    windows = node.batches(60)
    assert windows[-1] == INTERVAL, windows  # back to one summary per batch interval
    assert windows == sorted(windows, reverse=True)
