from __future__ import annotations
import json, os
from pathlib import Path
from typing import Any
from .mosquitto import Broker, Collector, broker_fixture, wait_until  # noqa: F401
from .test_forward_service import Feeder, metric, running  # noqa: F401
from gpu_exporter.ring import RingBuffer


def test_dbg(tmp_path: Path, broker: Broker, running: Any) -> None:
    ring = RingBuffer(4096)
    events: list = []
    with Collector(broker) as sub:
        oc = sub.client.on_connect
        def on_conn(c, u, flags, reason, props):
            events.append(("collector_connect", flags.session_present, str(reason)))
            oc(c, u, flags, reason, props)
        sub.client.on_connect = on_conn
        if os.environ.get('SLOWSUB'): sub.client.reconnect_delay_set(3, 3)
        broker.stop()
        fwd, registry = running(ring, **{"spool.max-bytes": "64KiB", "mqtt.batch-interval": "50ms"})
        orig = fwd.link._on_ack
        acked = []
        def on_ack(mid, ok, reason):
            e = fwd._inflight.get(mid)
            if e is not None:
                acked.append((mid, ok, e.first_seq, e.last_seq, e.samples, fwd.spool._index.get(e.key) is not None))
            orig(mid, ok, reason)
        fwd.link._on_ack = on_ack
        odrop = fwd.spool._on_drop
        drops = []
        def on_drop(reason, b, s):
            drops.append((reason, b, s))
            odrop(reason, b, s)
        fwd.spool._on_drop = on_drop
        odown = fwd.link._on_down
        def on_down(msg):
            events.append(("down", msg, sorted((e.first_seq, e.last_seq) for e in fwd._inflight.values())))
            odown(msg)
        fwd.link._on_down = on_down
        with Feeder(ring, interval=0.005, noisy=True):
            assert wait_until(lambda: metric(registry, "gpu_exporter_forward_dropped_batches_total", reason="max_bytes") >= 3, 30)
        broker.start()
        last = ring.latest()
        ok1 = wait_until(lambda: metric(registry, "gpu_exporter_forward_spool_batches") == 0, 30)
        ok2 = wait_until(lambda: max(sub.seqs().get(fwd.boot, {0})) >= last.seq, 10)
        got = sub.seqs().get(fwd.boot, set())
        lost = set(range(1, last.seq + 1)) - got
        ackseq = set()
        for a in acked:
            if a[1]:
                ackseq |= set(range(a[2], a[3] + 1))
        import time as _t; _t.sleep(5)
        late = sub.seqs().get(fwd.boot, set())
        dropped = sum(d[2] for d in drops if d[0] == "max_bytes")
        bad = dropped != len(lost)
        rec = dict(bad=bad, ok1=ok1, ok2=ok2, last=last.seq, lost_n=len(lost), dropped=dropped,
                   lost_ranges=_ranges(lost), acked_not_got=_ranges(ackseq - got), acked_not_late=_ranges(ackseq - late), late_lost=len(set(range(1, last.seq + 1)) - late), not_acked=_ranges(set(range(1,last.seq+1)) - ackseq),
                   acked=acked, drops=drops, events=events, order=sub.order, log=broker.log())
        with open(os.environ.get("DBG_OUT", "/tmp/dbg.jsonl"), "a") as f:
            f.write(json.dumps(rec, default=str) + "\n")
        assert not bad


def _ranges(s):
    out = []
    for x in sorted(s):
        if out and out[-1][1] == x - 1:
            out[-1][1] = x
        else:
            out.append([x, x])
    return out
