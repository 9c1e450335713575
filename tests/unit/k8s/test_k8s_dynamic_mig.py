"""A MIG device the DRA driver makes when it prepares a claim (dynamic MIG) is listed by the NVIDIA
backend within ``MIG_RESCAN`` seconds and attributed to the claim's pod by its parent's minor and its
instance IDs, through the CDI spec and the driver's mig-minors table: its UUID is known to nobody in
advance. The backend runs over the simulated NVML library."""

from __future__ import annotations

from pathlib import Path

from gpu_exporter.backends.fake.backend import SimNvml
from gpu_exporter.backends.nvidia.backend import MIG_RESCAN, NvmlBackend
from gpu_exporter.config import Config
from gpu_exporter.k8s import PodAttributor
from gpu_exporter.model import Sample
from gpu_exporter.ring import RingBuffer
from tests.support.k8s_fakes import Claim, ClaimResource, FakeKubelet

CLAIM_UID = "f00dcafe-0000-4000-8000-000000000001"
DEVICE = "gpu-0-mig-1g10gb-19-0"


def _node(tmp_path: Path) -> tuple[Path, Path]:
    """A CDI directory with the claim's spec and a procfs with mig-minors, as the driver leaves them."""
    cdi, proc = tmp_path / "cdi", tmp_path / "proc"
    cdi.mkdir()
    (proc / "driver" / "nvidia-caps").mkdir(parents=True)
    # GPU 0 (minor 0): its GPU instance 7 and that instance's compute instance 0
    (proc / "driver" / "nvidia-caps" / "mig-minors").write_text(
        "config 1\nmonitor 2\ngpu0/gi7/access 66\ngpu0/gi7/ci0/access 67\ngpu0/gi8/access 75\ngpu0/gi8/ci0/access 76\n"
    )
    (cdi / f"k8s.gpu.nvidia.com-claim_{CLAIM_UID}.yaml").write_text(
        "cdiVersion: 0.5.0\nkind: k8s.gpu.nvidia.com/claim\ndevices:\n"
        f"- name: {CLAIM_UID}-{DEVICE}\n  containerEdits:\n    deviceNodes:\n    - path: /dev/nvidia0\n"
        "    - path: /dev/nvidia-caps/nvidia-cap66\n    - path: /dev/nvidia-caps/nvidia-cap67\n"
    )
    return cdi, proc


def test_a_mig_device_made_for_a_claim_is_listed_and_attributed(tmp_path: Path) -> None:
    cdi, proc = _node(tmp_path)
    now = [1000.0]
    sim = SimNvml(gpus=1, mig=0, clock=lambda: now[0])
    backend = NvmlBackend(Config(), nvml=sim, clock=lambda: now[0], xid_wait_ms=20)
    backend.open()
    kubelet = FakeKubelet().start()
    try:
        kubelet.pods = [
            (
                "notebook",
                "ml",
                [
                    (
                        "jupyter",
                        [],
                        [
                            Claim(
                                "nb", "ml", [ClaimResource(DEVICE, [f"k8s.gpu.nvidia.com/claim={CLAIM_UID}-{DEVICE}"])]
                            )
                        ],
                    )
                ],
            )
        ]
        config = Config(
            path_procfs=str(proc),
            k8s_pod_attribution=True,
            k8s_pod_logs_path=str(tmp_path / "logs"),
            k8s_kubelet_socket=kubelet.socket,
            k8s_cdi_spec_dirs=(str(cdi),),
        )
        attributor = PodAttributor(config, RingBuffer(8), clock=lambda: now[0])
        assert not any(s.device.is_mig for s in backend.read())
        sim.mig = 1  # the driver makes the claim's MIG device (GPU instance 7, compute instance 0)
        now[0] += MIG_RESCAN
        samples = backend.read()
        migs = [s for s in samples if s.device.is_mig]
        assert [(m.device.gpu_instance, m.device.compute_instance) for m in migs] == [("7", "0")]
        attributor.process([Sample(1, now[0], tuple(samples))])
        info = [line for line in attributor.text().splitlines() if line.startswith("gpu_pod_info{")]
        assert len(info) == 1
        assert f'uuid="{migs[0].device.uuid}"' in info[0] and 'pod="notebook"' in info[0]
        # the claim ends and the driver removes the device: gone from the backend's listing
        sim.mig = 0
        now[0] += MIG_RESCAN
        assert not any(s.device.is_mig for s in backend.read())
    finally:
        kubelet.stop()
        backend.close()
