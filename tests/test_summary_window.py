"""The summary window on a weak link (docs/forwarding.md, "Weak links"): a window closes once it spans a
batch interval and the link has taken the previous summary, so it is as long as the link requires (no cap
of 16 batch intervals: a cap would only queue summaries behind each other on a link that cannot carry
them), and it narrows again as the link recovers. The forwarder's timing is passed in by hand: samples a
second apart, each summary on the link for its size over the link's rate."""

from __future__ import annotations

from gpu_exporter.forward.adaptive import Adaptive
from gpu_exporter.forward.link_meter import LinkMeter
from gpu_exporter.forward.spool_index import Entry
from gpu_exporter.forward.summary import encode_summary
from gpu_exporter.model import DeviceId, DeviceSample, Sample

INTERVAL = 10.0  # --mqtt.batch-interval
T0 = 1e9


def _sample(seq: int) -> Sample:
    values = {("temp_gpu", ()): 60.0 + seq % 7, ("power", ()): 200.0 + seq % 5, ("energy", ()): 100.0 * seq}
    return Sample(seq, T0 + seq, (DeviceSample(DeviceId("0", "GPU-0"), True, values, {}),))


class Link:
    """Fresh summaries on a link of ``rate`` bytes per second, one after the other."""

    def __init__(self, rate: float) -> None:
        self.meter = LinkMeter(None)
        self.meter.sent(1, 1000, 0.0)
        self.meter.acked(1, 1000 / rate, latency=0.0)
        self.meter.produced(9000, INTERVAL)  # full resolution: 900 B/s, more than these links
        self.adaptive = Adaptive("node-a", "boot-1", self.meter, INTERVAL)
        self.adaptive.rate = rate
        first = [_sample(s) for s in range(1, 11)]
        assert self.adaptive.closed(first, [Entry(1, 0, 9000, 1, 10, 10)], INTERVAL, connected=True)
        self.seq = 10
        self.arrives = 0.0

    def run(self, seconds: int, rate: float) -> list[float]:
        """``seconds`` more samples on a link of ``rate`` B/s; the windows (seconds) of the summaries made."""
        self.adaptive.rate = rate
        windows = []
        for _ in range(seconds):
            self.seq += 1
            now = T0 + self.seq
            if self.adaptive._delivery is not None and now >= self.arrives:
                self.adaptive._delivery = None  # its last part acknowledged
            self.adaptive.add(_sample(self.seq))
            if self.adaptive._pending is not None:
                point, span, _ = self.adaptive._pending
                windows.append(span)
                size = len(encode_summary("node-a", "boot-1", [point], span))
                self.adaptive._pending, self.adaptive._delivery = None, [now, size, set(), True]
                self.arrives = now + size / rate
        return windows


def test_on_a_link_far_too_thin_the_window_is_as_long_as_the_link_takes_a_summary() -> None:
    link = Link(0.5)
    windows = link.run(4000, 0.5)
    assert len(windows) >= 3, windows
    assert max(windows) > 16 * INTERVAL  # the link requires it: one summary at a time, never a queue of them
    assert not link.adaptive.queue


def test_the_window_narrows_again_as_the_link_recovers() -> None:
    link = Link(1.0)
    assert link.run(2000, 1.0)[-1] > 4 * INTERVAL
    windows = link.run(300, 400.0)  # still short of full resolution, but summaries fit easily
    assert windows[-1] == INTERVAL, windows  # back to one summary per batch interval
    assert windows[-5:] == [INTERVAL] * 5
