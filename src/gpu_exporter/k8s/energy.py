"""Per-pod GPU energy, as Kepler does it.

For each interval between two samples of a GPU: the energy the GPU used (from its energy counter when
it has one, else power x time), less what it would have used idle (idle power x time), is the *active*
energy; it is split among the pods on the GPU in proportion to their processes' SM utilization and
added to each pod's running total. Idle power is configured, or else the lowest power seen on the GPU.

If the driver reports no SM utilization for any process, the active energy is split evenly among the
processes. If it reports utilization and all of it is zero, nobody computed: nothing is attributed.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["EnergyMeter"]


@dataclass
class _GpuState:
    timestamp: float
    energy: float | None
    min_power: float


class EnergyMeter:
    def __init__(self, idle_power: float | None = None, max_gap: float = 60.0) -> None:
        if idle_power is not None and idle_power < 0:
            raise ValueError(f"idle power must be 0 or more watts, got {idle_power}")
        self.idle_power = idle_power
        self.max_gap = max_gap  # longer gaps (agent paused, samples lost) are not integrated
        self._gpus: dict[Hashable, _GpuState] = {}
        self._totals: dict[tuple[Hashable, Hashable], float] = {}

    def idle(self, gpu: Hashable) -> float | None:
        if self.idle_power is not None:
            return self.idle_power
        state = self._gpus.get(gpu)
        return state.min_power if state else None

    def step(
        self,
        gpu: Hashable,
        timestamp: float,
        power: float | None,
        energy: float | None,
        weights: Mapping[Any, float],
    ) -> None:
        """Account one sample of ``gpu``: ``weights`` are each pod's summed SM ratio on it."""
        state = self._gpus.get(gpu)
        if state is None:
            if power is not None:
                self._gpus[gpu] = _GpuState(timestamp, energy, power)
            return
        dt = timestamp - state.timestamp
        previous_energy = state.energy
        if power is not None:
            state.min_power = min(state.min_power, power)
        if dt <= 0:
            return
        state.timestamp, state.energy = timestamp, energy
        if dt > self.max_gap:
            return
        if energy is not None and previous_energy is not None and energy >= previous_energy:
            used = energy - previous_energy
        elif power is not None:
            used = power * dt
        else:
            return
        idle = self.idle_power if self.idle_power is not None else state.min_power
        active = max(0.0, used - idle * dt)
        total = sum(w for w in weights.values() if w > 0)
        if active <= 0 or total <= 0:
            return
        for pod, weight in weights.items():
            if weight > 0:
                key = (gpu, pod)
                self._totals[key] = self._totals.get(key, 0.0) + active * weight / total

    def total(self, gpu: Hashable, pod: Hashable) -> float:
        return self._totals.get((gpu, pod), 0.0)

    def retain(self, keep: Iterable[tuple[Hashable, Hashable]]) -> None:
        """Forget the totals of pods no longer on their GPU (a finished pod's series disappears)."""
        wanted = set(keep)
        for key in [k for k in self._totals if k not in wanted]:
            del self._totals[key]
