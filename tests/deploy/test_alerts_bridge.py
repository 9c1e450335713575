"""The bridge's alerts (clock skew, refused samples, series limit, refused writes) under promtool."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.deploy.test_alerts import ALERT_TESTS, PROMTOOL, _promtool, _write_rules

pytestmark = pytest.mark.skipif(not Path(PROMTOOL).exists(), reason="promtool is not installed")


def test_bridge_alerts_fire_and_stay_quiet(tmp_path: Path) -> None:
    _write_rules(tmp_path / "rules.yaml", keep_annotations=False)
    shutil.copy(ALERT_TESTS / "bridge.test.yaml", tmp_path / "bridge.test.yaml")
    result = _promtool("test", "rules", str(tmp_path / "bridge.test.yaml"))
    assert result.returncode == 0, result.stdout + result.stderr
