"""The summary window on a weak link (docs/forwarding.md, "Weak links"): a window closes once it spans a
batch interval and the link has taken the previous summary, so it is as long as the link requires (no cap
of 16 batch intervals: a cap would only queue summaries behind each other on a link that cannot carry
them), and it narrows again as the link recovers. The forwarder's timing is passed in by hand: samples a
second apart, each summary on the link for its size over the link's rate."""

from __future__ import annotations

import pytest

from gpu_exporter.forward.adaptive import Adaptive
from gpu_exporter.forward.link_meter import LinkMeter
from gpu_exporter.forward.spool_index import Entry
from gpu_exporter.forward.summary import encode_summary
from gpu_exporter.model import DeviceId, DeviceSample, Sample
from gpu_exporter.payload import Batch, encode

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


@pytest.mark.parametrize("weak_before", [True, False], ids=["after-a-weak-stretch", "first-ever"])
def test_the_first_fresh_window_after_a_reconnect_with_a_backlog_spans_a_batch_interval(weak_before: bool) -> None:
    """Summarising can start on reconnect, from a backlog, with no window open: the first fresh summary
    then spans the samples taken since, not everything since the epoch (which the payload refuses, so the
    summary never went) nor since a window of an earlier weak stretch."""
    link = Link(40.0)
    if weak_before:
        link.run(30, 40.0)
    else:
        link.adaptive = Adaptive("node-a", "boot-1", link.meter, INTERVAL)
        link.adaptive.rate = 40.0
    link.adaptive._delivery = None  # the last summary acknowledged before the connection dropped
    # the outage: full-resolution batches closed while disconnected end the weak stretch
    outage = [_sample(s) for s in range(41, 51)]
    assert not link.adaptive.closed(outage, [Entry(2, 0, 9000, 41, 50, 10)], INTERVAL, connected=False)
    assert not link.adaptive.active
    for seq in range(51, 400):  # the outage goes on: samples taken, nothing summarised
        link.adaptive.add(_sample(seq))
    spooled = {
        Entry(k, 0, 9000, 10 * k + 1, 10 * k + 10, 10): encode(
            Batch("node-a", "boot-1", tuple(_sample(s) for s in range(10 * k + 1, 10 * k + 11)))
        )
        for k in range(5, 40)
    }
    assert link.adaptive.backlog(spooled, lambda e: spooled[e]) > 0
    assert link.adaptive.active
    assert link.adaptive.next_due(T0 + 400) == INTERVAL  # no fresh window yet: none is overdue
    spans = []
    for seq in range(400, 430):
        link.adaptive.add(_sample(seq))
        if link.adaptive._pending is not None:
            spans.append(link.adaptive._pending[1])
            link.adaptive._pending = None
    assert spans and spans[0] == INTERVAL, spans


def test_a_due_window_closes_when_the_link_takes_the_last_summary_not_at_the_next_sample() -> None:
    """The PUBACK of the summary on the link closes a window that spans a batch interval already: the
    next summary is ready at once, the link not left idle until the next sample (a second here; at a
    10 s sampling interval, ten)."""
    link = Link(40.0)
    adaptive = link.adaptive
    link.run(60, 40.0)  # summaries on their way, one after the other
    delivery = adaptive._delivery
    while delivery is None:  # until a summary is on the link
        link.run(1, 40.0)
        delivery = adaptive._delivery
    for _ in range(int(INTERVAL) + 2):  # the open window spans a batch interval; the link is still busy
        link.seq += 1
        adaptive.add(_sample(link.seq))
    assert adaptive._pending is None
    delivery[2].add(7)  # the summary's PUBLISH, packet id 7
    adaptive.inflight[7] = delivery[1]
    assert adaptive.acked(7, T0 + link.seq + 0.5)
    assert adaptive._pending is not None  # closed on the acknowledgement, no sample since
    assert adaptive._pending[1] >= INTERVAL
