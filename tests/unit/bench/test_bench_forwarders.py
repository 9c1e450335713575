"""The forwarder bench's pure parts: what its options accept, what it makes of the samples the cloud
holds (stored, behind, lost), when a node has caught up, the table, and the peers' configuration.

bench/bench_forwarders.py itself runs real processes behind a real kernel link for minutes; its figures
are printed, never asserted. These check that the figures it prints mean what its table says.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support import paths

sys.path.insert(0, str(paths.ROOT / "bench"))

from forwarder_peers import peer_command, scrape_config
from forwarder_table import (
    Accounting,
    Result,
    account,
    caught_up_after,
    from_json,
    parse_forwarders,
    parse_rates,
    table,
)


def test_rates_are_read_as_bytes_per_second_with_unthrottled_as_zero() -> None:
    assert parse_rates("unthrottled, 2k,500,150") == [0.0, 2000.0, 500.0, 150.0]
    assert parse_rates("0,1.5k") == [0.0, 1500.0]


@pytest.mark.parametrize("text", ["", "fast", "5", "-150", "nan", "150,,x"])
def test_a_rate_no_link_can_have_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="--rates"):
        parse_rates(text)


def test_forwarders_are_checked_by_name() -> None:
    assert parse_forwarders("all")[0] == "ours-2m"
    assert parse_forwarders("vmagent-best, ours-10s") == ["vmagent-best", "ours-10s"]
    with pytest.raises(ValueError, match="telegraf"):
        parse_forwarders("ours-10s,telegraf")


def test_bad_options_end_in_one_line_and_exit_2() -> None:
    bench = paths.ROOT / "bench" / "bench_forwarders.py"
    for bad in (["--rates", "fast"], ["--forwarders", "fluentbit"], ["--minutes", "5", "--outage-minutes", "5"]):
        done = subprocess.run([sys.executable, str(bench), *bad], capture_output=True, text=True, timeout=60)
        assert done.returncode == 2, done.stderr
        assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr


def test_every_reading_stored_is_nothing_lost_even_when_readings_jitter() -> None:
    stamps = {str(g): [100.4 + i + (0.2 if i % 2 else -0.2) for i in range(100)] for g in range(2)}
    assert account(stamps, 2, 100.0, 200.0, 1.0) == Accounting(expected=200, stored=200, behind=0, lost=0)


def test_a_hole_is_lost_and_what_is_newer_than_the_newest_is_behind() -> None:
    gpu0 = [100.0 + i for i in range(50)] + [160.0 + i for i in range(30)]  # 150-159 missing, 190-199 not yet
    got = account({"0": gpu0}, 2, 100.0, 200.0, 1.0)  # GPU 1: nothing at all yet
    assert got == Accounting(expected=200, stored=80, behind=10 + 100, lost=10)


def test_samples_outside_the_window_do_not_count() -> None:
    got = account({"0": [50.0, 99.9, 100.0, 101.0, 200.0, 250.0]}, 1, 100.0, 102.0, 1.0)
    assert got == Accounting(expected=2, stored=2, behind=0, lost=0)


def test_caught_up_is_the_first_reading_after_the_return_near_the_usual_lag() -> None:
    readings = [(0.0, 5.0), (10.0, 6.0), (20.0, 7.0), (30.0, 300.0), (40.0, 200.0), (50.0, 17.0), (60.0, 12.0)]
    assert (
        caught_up_after(readings, 30.0, [5.0, 6.0, 7.0]) == 30.0
    )  # 17 s is not within 10 s of the median 6 s, 12 s is
    assert caught_up_after(readings[:5], 30.0, [5.0, 6.0, 7.0]) == math.inf  # never, while the run lasted


def _result(forwarder: str, rate: float, uplink: int, lag: float, caught_up: float = math.nan) -> Result:
    return Result(
        forwarder=forwarder,
        rate=rate,
        seconds=100.0,
        gpus=8,
        uplink_bytes=uplink,
        stored_all=800,
        accounting=Accounting(800, 790, 10, 0),
        series=850,
        lag=[(30.0, math.inf), (70.0, lag), (130.0, lag + 1)],
        caught_up=caught_up,
    )


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def test_the_table_gives_medians_in_order_unthrottled_first() -> None:
    results = [
        _result("vmagent", 150.0, 15_000, 200.0),
        _result("vmagent", 0.0, 1_600_000, 1.0),
        _result("ours-10s", 0.0, 60_000, 10.0),
        _result("ours-10s", 0.0, 80_000, 12.0),
        _result("ours-10s", 0.0, 70_000, 50.0),
    ]
    rows = [_cells(line) for line in table(results, 3).splitlines() if line.startswith("| ")]
    assert rows[0][:4] == ["forwarder", "link", "runs", "uplink B/s"]
    ours, peer, thin = rows[1], rows[2], rows[3]
    assert ours[:6] == ["ours-10s", "unthrottled", "3", "700", "88", "88"]  # 70,000 B / 100 s / 8 GPUs
    assert ours[6] == "790 of 800 (99 %)" and ours[10] == "12 s"  # minute 2: the median of 10, 12, 50
    assert peer[:4] == ["vmagent", "unthrottled", "1", "16,000"]
    assert thin[:2] == ["vmagent", "150 B/s"]
    assert "caught up after the outage" not in rows[0]  # no outage in these runs
    lag_rows = [r for r in rows if r[:2] == ["ours-10s", "unthrottled"]]
    assert lag_rows[-1][2:] == ["none yet", "12", "13"]  # the minutes: 1, 2, 3


def test_the_table_says_how_long_catching_up_took_or_that_it_never_did() -> None:
    text = table([_result("ours-10s", 0.0, 1, 1.0, 40.0), _result("vmagent", 0.0, 1, math.inf, math.inf)], 3)
    rows = [_cells(line) for line in text.splitlines() if line.startswith("| ")]
    assert rows[0][-1] == "caught up after the outage"
    assert rows[1][-1] == "40 s"
    assert rows[2][-1] == "never"
    assert rows[2][10] == "none yet"  # no data at all in minute 2: not the same as never catching up


def test_kept_results_give_the_same_table() -> None:
    results = [_result("ours-2m", 500.0, 9_000, 80.0), _result("prometheus-best", 500.0, 50_000, 300.0)]
    from dataclasses import asdict

    kept = from_json(json.loads(json.dumps([asdict(r) for r in results])))
    assert table(kept, 3) == table(results, 3)


def test_both_peers_scrape_every_second_the_same_series_with_the_node_label(tmp_path: Path) -> None:
    url = "http://10.231.0.1:9/api/v1/write"
    config = yaml.safe_load(scrape_config("10.231.0.6:9400", "edge-x", url, best=True))
    assert config["global"]["scrape_interval"] == "1s"
    job = config["scrape_configs"][0]
    assert job["static_configs"] == [{"targets": ["10.231.0.6:9400"], "labels": {"node": "edge-x"}}]
    assert job["metric_relabel_configs"][0]["action"] == "drop"
    queue = config["remote_write"][0]["queue_config"]
    assert config["remote_write"][0]["url"] == url and queue["max_shards"] == 1
    vm = peer_command("vmagent-best", tmp_path, "10.231.0.6:9400", "edge-x", url)
    assert f"-remoteWrite.url={url}" in vm and "-remoteWrite.queues=1" in vm
    assert yaml.safe_load((tmp_path / "scrape.yml").read_text())["scrape_configs"] == config["scrape_configs"]
    plain = peer_command("prometheus", tmp_path, "10.231.0.6:9400", "edge-x", url)
    assert "--enable-feature=agent" in plain
    assert "queue_config" not in (tmp_path / "prometheus.yml").read_text()  # the defaults: none set
    with pytest.raises(ValueError, match="unknown peer"):
        peer_command("telegraf", tmp_path, "t", "n", url)
