"""The C stand-in for the driver's libnvidia-ml.so.1 (fake_nvml.c): building it, giving a process a
scenario through it, and the same scenario as a ``SimNvml`` (the Python simulator).

nvidia-ml-py loads the library by name (``CDLL("libnvidia-ml.so.1")``), so a process finds it through
``LD_LIBRARY_PATH`` set before it starts: a scenario runs in a child process (``python -m
tests.fakes.nvml_run``), never in the test process, whose own ``pynvml`` must keep finding no driver.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pynvml

from gpu_exporter.backends.fake.backend import SimNvml

__all__ = ["LIBRARY", "Scenario", "board_environment", "build", "device_nodes", "run_real"]

ROOT = Path(__file__).resolve().parents[2]

SOURCE = Path(__file__).with_name("fake_nvml.c")
LIBRARY = "libnvidia-ml.so.1"
# no fused multiply-add: the readings are computed operation by operation as the simulator does
CFLAGS = ("-shared", "-fPIC", "-O1", "-ffp-contract=off")

# pynvml's function -> the library's symbols behind it (the others have the same name)
SYMBOLS: Mapping[str, tuple[str, ...]] = {
    "nvmlInit": ("nvmlInitWithFlags",),
    "nvmlDeviceGetCount": ("nvmlDeviceGetCount_v2",),
    "nvmlDeviceGetHandleByIndex": ("nvmlDeviceGetHandleByIndex_v2",),
    "nvmlDeviceGetPciInfo": ("nvmlDeviceGetPciInfo_v3",),
    "nvmlDeviceGetMemoryInfo": ("nvmlDeviceGetMemoryInfo", "nvmlDeviceGetMemoryInfo_v2"),
    "nvmlDeviceGetComputeRunningProcesses": ("nvmlDeviceGetComputeRunningProcesses_v3",),
}


def symbols(name: str) -> tuple[str, ...]:
    return SYMBOLS.get(name, (name,))


def build(folder: Path) -> Path:
    """Compile fake_nvml.c to ``folder/libnvidia-ml.so.1``; raises RuntimeError without a C compiler."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise RuntimeError("a C compiler is needed to build the simulated NVML library (Debian package gcc)")
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / LIBRARY
    subprocess.run([compiler, *CFLAGS, "-o", str(out), str(SOURCE), "-lm"], check=True, timeout=120)
    return out


def device_nodes(folder: Path, gpus: int) -> Path:
    """A folder standing for /dev on a node with ``gpus`` GPUs (what the library checks at nvmlInit)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("nvidiactl", *(f"nvidia{i}" for i in range(gpus))):
        (folder / name).touch()
    return folder


def board_environment(folder: Path, board: str, gpus: int = 1, **extra: str) -> dict[str, str]:
    """What a child process needs to load the C library as ``board``'s NVML ("thor", "orin": a Jetson's,
    "" data-centre GPUs; ``FAKE_NVML_BOARD``), built into ``folder``: two processes per GPU, the clock
    frozen, ``extra`` FAKE_NVML_* variables on top. Raises RuntimeError without a C compiler."""
    if not (folder / LIBRARY).exists():
        build(folder)
    scenario = Scenario(gpus=gpus, processes_per_gpu=2)
    env = scenario.environment(device_nodes(folder / f"dev{gpus}", gpus))
    env.update(LD_LIBRARY_PATH=str(folder), FAKE_NVML_BOARD=board, **extra)
    return env


@dataclass(frozen=True)
class Scenario:
    """One simulated node, given the same way to the C library (environment) and to SimNvml.

    Names of calls are pynvml's (``nvmlDeviceGetPcieThroughput``); errors are NVML codes.
    """

    gpus: int = 2
    mig: int = 0
    seed: int = 0
    elapsed: float = 100.0  # seconds since the simulator started, frozen
    processes_per_gpu: int = 1
    throttle: Mapping[int, float] = field(default_factory=lambda: {0: 0.05, 1: 0.01})
    cost_ms: Mapping[str, int] = field(default_factory=dict)
    missing: tuple[str, ...] = ()
    lost: tuple[int, ...] = ()
    fail: tuple[tuple[int | None, str, int], ...] = ()  # (GPU or None for all, call, NVML error code)
    xids: tuple[tuple[int, int], ...] = ()  # (GPU, XID), in order
    cycles: int = 3
    disabled: tuple[str, ...] = ()  # collectors
    budget: float | None = 0.005  # the backend's slow-call budget (None: every call in line)

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "throttle": {str(k): v for k, v in self.throttle.items()}}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Scenario:
        def tuples(value: Any) -> Any:
            return tuple(tuples(v) for v in value) if isinstance(value, list) else value

        fields = {k: tuples(v) for k, v in data.items()}
        fields["throttle"] = {int(k): v for k, v in data["throttle"].items()}
        fields["cost_ms"] = dict(data["cost_ms"])
        return cls(**fields)

    def environment(self, devices: Path, log: Path | None = None) -> dict[str, str]:
        """The C library's variables for this scenario (it reads them at each nvmlInit)."""

        def listed(items: list[str]) -> str:
            return ",".join(items)

        env = dict(
            FAKE_NVML_DEV_DIR=str(devices),
            FAKE_NVML_TIME=repr(float(self.elapsed)),
            FAKE_NVML_SEED=str(self.seed),
            FAKE_NVML_MIG=str(self.mig),
            FAKE_NVML_PROCESSES=str(self.processes_per_gpu),
            # (an empty variable is the library's default: "-1=0" names no policy)
            FAKE_NVML_THROTTLE=listed([f"{p}={share!r}" for p, share in self.throttle.items()]) or "-1=0",
            FAKE_NVML_COST_MS=listed([f"{s}={ms}" for name, ms in self.cost_ms.items() for s in symbols(name)]),
            FAKE_NVML_MISSING=listed([s for name in self.missing for s in symbols(name)]),
            FAKE_NVML_LOST=listed([str(i) for i in self.lost]),
            FAKE_NVML_FAIL=listed(
                [
                    f"{s}{'' if gpu is None else f'@{gpu}'}={code}"
                    for gpu, name, code in self.fail
                    for s in symbols(name)
                ]
            ),
            FAKE_NVML_XIDS=listed([f"{gpu}:{xid}" for gpu, xid in self.xids]),
        )
        if log is not None:
            env["FAKE_NVML_LOG"] = str(log)
        return env

    def sim(self) -> SimNvml:
        """The same node as a SimNvml, its clock frozen ``elapsed`` seconds after it started."""
        sim = SimNvml(
            gpus=self.gpus,
            mig=self.mig,
            seed=self.seed,
            clock=lambda: float(self.elapsed),
            processes_per_gpu=self.processes_per_gpu,
            throttle=self.throttle,
            call_cost={name: ms / 1000 for name, ms in self.cost_ms.items()},
        )
        sim.start = 0.0
        sim.missing.update(self.missing)
        sim.lost.update(self.lost)
        for gpu, name, code in self.fail:
            sim.fail(gpu, name, pynvml.nvmlExceptionClass(code))
        for gpu, xid in self.xids:
            sim.xid(gpu, xid)
        return sim


def run_real(scenarios: list[Scenario], folder: Path, log: Path | None = None, timeout: float = 120) -> list[Any]:
    """Each scenario through the real nvidia-ml-py over the C library, in one child process; what
    ``tests.fakes.nvml_run.run`` returns for each. ``folder`` holds the library and the device nodes."""
    library = folder / LIBRARY
    if not library.exists():
        build(folder)
    jobs = [
        {"scenario": s.to_json(), "env": s.environment(device_nodes(folder / f"dev{s.gpus}", s.gpus), log)}
        for s in scenarios
    ]
    spec = folder / "scenarios.json"
    spec.write_text(json.dumps(jobs))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FAKE_NVML_", "GPU_EXPORTER_"))}
    env["LD_LIBRARY_PATH"] = str(folder)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT)])
    done = subprocess.run(
        [sys.executable, "-m", "tests.fakes.nvml_run", str(spec)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the scenarios failed through the real pynvml:\n{done.stderr}")
    return list(json.loads(done.stdout))
