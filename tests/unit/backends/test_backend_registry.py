"""The vendor registry: each backends/<vendor>/ package registers itself, and listing the vendors loads
no vendor library."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gpu_exporter import config
from gpu_exporter.backends import registry
from gpu_exporter.backends.registry import Vendor
from tests.support import child_env


def test_every_vendor_package_is_a_choice_of_gpu_vendor_in_rank_order() -> None:
    assert registry.vendors() == ("nvidia", "amd", "jetson", "fake")
    assert ("auto", *registry.vendors()) == config.VENDORS
    assert registry.auto_order() == ("nvidia", "amd", "jetson")  # the simulator is never auto-detected
    assert registry.vendor("fake").factory == "gpu_exporter.backends.fake.backend:create"
    with pytest.raises(KeyError):
        registry.vendor("intel")


def test_a_vendor_name_cannot_be_taken_twice() -> None:
    registry.register(registry.vendor("amd"))  # a package imported again registers the same entry: fine
    with pytest.raises(ValueError, match="'amd' registered twice"):
        registry.register(Vendor("amd", "elsewhere:create", rank=9))
    assert registry.vendor("amd").factory == "gpu_exporter.backends.amd.backend:create"


def test_a_wrong_vendor_is_told_every_choice_without_loading_a_vendor_library() -> None:
    code = (
        "import sys\n"
        "from gpu_exporter import cli\n"
        "try:\n"
        "    cli.main(['--gpu-vendor=intel'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "loaded = [m for m in ('pynvml', 'amdsmi') if m in sys.modules]\n"
        "loaded += [m for m in sys.modules if m.startswith('gpu_exporter.backends.') and m.endswith('.backend')]\n"
        "print('LOADED', sorted(loaded))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=child_env(), timeout=60, check=True
    )
    assert "invalid choice 'intel' (choose from auto, nvidia, amd, jetson, fake)" in done.stderr
    assert "LOADED []" in done.stdout
