"""The bridge's replay detection against a plain set of seen sequence numbers (by class, not by instance).

The model is the module's documented contract (bridge/dedup.py): what was marked is seen, except that
at most ``max_ranges`` runs of consecutive numbers are kept per (node, boot), the lowest going first,
and at most ``max_streams`` (node, boot) pairs, the least recently marked going first.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_exporter.bridge.dedup import SeqTracker


def _runs(seen: set[int]) -> list[tuple[int, int]]:
    """The maximal runs of consecutive numbers in ``seen``, ascending."""
    runs: list[tuple[int, int]] = []
    for s in sorted(seen):
        if runs and s == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], s)
        else:
            runs.append((s, s))
    return runs


class Model:
    def __init__(self, max_streams: int, max_ranges: int) -> None:
        self.max_streams = max_streams
        self.max_ranges = max_ranges
        self.streams: dict[tuple[str, str], set[int]] = {}  # insertion order = least recently marked first

    def mark(self, key: tuple[str, str], seqs: list[int]) -> None:
        seen = self.streams.pop(key, None)
        if seen is None:
            seen = set()
        self.streams[key] = seen  # now the most recently marked
        while len(self.streams) > self.max_streams:
            del self.streams[next(iter(self.streams))]
        seen.update(seqs)
        runs = _runs(seen)
        for lo, hi in runs[: max(0, len(runs) - self.max_ranges)]:  # the oldest (lowest) runs go
            seen.difference_update(range(lo, hi + 1))

    def seen(self, key: tuple[str, str], seq: int) -> bool:
        return seq in self.streams.get(key, set())


def _batch(start: int, draw: st.DrawFn) -> list[int]:
    """One batch as the agent sends it: ascending, mostly consecutive, sometimes with gaps."""
    n = draw(st.integers(1, 12))
    seqs = [start]
    for _ in range(n - 1):
        seqs.append(seqs[-1] + draw(st.sampled_from([1, 1, 1, 1, 2, 3, 50])))
    return seqs


@st.composite
def streams(draw: st.DrawFn) -> list[tuple[tuple[str, str], list[int]]]:
    """Marks over a few (node, boot) pairs: in order, out of order, replays, gaps, large jumps."""
    keys = [("n1", "b1"), ("n1", "b2"), ("n2", "b1")]
    nxt = {k: draw(st.integers(0, 5)) for k in keys}
    done: dict[tuple[str, str], list[list[int]]] = {k: [] for k in keys}
    ops = []
    for _ in range(draw(st.integers(1, 40))):
        key = draw(st.sampled_from(keys))
        kind = draw(st.sampled_from(["next", "next", "next", "gap", "jump", "replay", "old", "any"]))
        if kind == "replay" and done[key]:
            seqs = draw(st.sampled_from(done[key]))  # the broker delivered it twice, a spool resent
        elif kind == "old":
            seqs = _batch(draw(st.integers(0, max(0, nxt[key]))), draw)  # out of order, overlapping
        elif kind == "any":
            seqs = sorted(set(draw(st.lists(st.integers(0, 300), min_size=1, max_size=8))))
        else:
            start = nxt[key] + {"next": 0, "gap": draw(st.integers(2, 9)), "jump": 10**12}.get(kind, 0)
            seqs = _batch(start, draw)
            nxt[key] = max(nxt[key], seqs[-1] + 1)
        done[key].append(seqs)
        ops.append((key, seqs))
    return ops


def _check(tracker: SeqTracker, model: Model, key: tuple[str, str], probe: list[int]) -> None:
    expect = [i for i, s in enumerate(probe) if not model.seen(key, s)]
    assert tracker.unseen(*key, probe) == expect, (key, probe, tracker.ranges(*key))
    for s in probe:
        assert tracker.seen(*key, s) == model.seen(key, s), (key, s, tracker.ranges(*key))
    # the ranges are what the set holds, as disjoint, ascending, non-touching runs
    assert tracker.ranges(*key) == _runs(model.streams.get(key, set()))


@settings(max_examples=150, deadline=None)
@given(
    ops=streams(),
    max_ranges=st.integers(1, 6),
    max_streams=st.integers(1, 3),
    extra=st.lists(st.integers(0, 400), max_size=10),
)
def test_dedup_says_new_exactly_when_the_set_model_does(
    ops: list[tuple[tuple[str, str], list[int]]], max_ranges: int, max_streams: int, extra: list[int]
) -> None:
    tracker = SeqTracker(max_streams=max_streams, max_ranges=max_ranges)
    model = Model(max_streams, max_ranges)
    for key, seqs in ops:
        # the bridge's use: ask which are new, write those, mark the batch
        probe = seqs + [s - 1 for s in seqs] + [s + 1 for s in seqs] + extra
        _check(tracker, model, key, probe)
        tracker.mark(*key, seqs)
        model.mark(key, seqs)
        _check(tracker, model, key, probe)
        assert len(tracker) == len(model.streams)
    for key in list(model.streams):
        _check(tracker, model, key, sorted(model.streams[key]) + extra)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 10**15), min_size=1, max_size=60), st.integers(1, 8))
def test_single_numbers_in_any_order(seqs: list[int], max_ranges: int) -> None:
    """One number per mark, in any order, replays and huge values included."""
    tracker = SeqTracker(max_ranges=max_ranges)
    model = Model(1, max_ranges)
    key = ("n", "b")
    for s in seqs:
        assert tracker.unseen(*key, [s]) == ([] if model.seen(key, s) else [0])
        tracker.mark(*key, [s])
        model.mark(key, [s])
        assert tracker.ranges(*key) == _runs(model.streams[key])
