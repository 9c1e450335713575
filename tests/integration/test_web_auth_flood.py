"""/metrics under a wrong-password flood, on the real exporter process with real HTTP clients.

CI-sized: 16 flood clients against ``--web.max-connections=8`` (more clients than slots, as the issue's 80
against 64) and a bcrypt cost of 10; bench/bench_auth_flood.py runs the issue's 80 clients at cost 12.
Before the check pool, every slot was busy checking a wrong password and the scrapes got 503.
"""

from __future__ import annotations

from pathlib import Path

import bcrypt

from tests.support.agent_proc import FAST, Proc
from tests.support.web_flood import flood

PASSWORD = "the-right-one"


def test_scrapes_with_the_right_password_are_answered_during_a_wrong_password_flood(tmp_path: Path) -> None:
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(10)).decode()
    web = tmp_path / "web.yml"
    web.write_text(f"basic_auth_users:\n  prometheus: '{hashed}'\n")
    proc = Proc(tmp_path, *FAST, f"--web.config.file={web}", "--web.max-connections=8").start()
    try:
        # The first scrape comes during the flood: its password has not been checked before.
        result = flood(proc.port, PASSWORD, clients=16, seconds=10, every=0.5, warmup=1.5)
        assert len(result.scrapes) >= 10, result.summary()
        assert result.answered >= 0.9, result.summary()
        # the flood was refused, never let in, and it did keep the server busy
        assert "200" not in result.flood_codes and sum(result.flood_codes.values()) > 100, result.flood_codes
    finally:
        assert proc.stop() == 0
