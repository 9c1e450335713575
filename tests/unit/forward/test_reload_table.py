"""Every reloadable option, from one table (by class: a new live option fails here until it is listed).

The docs' list of options that take effect at once (docs/security.md, "Reload") equals the code's
(``reload.LIVE``), and each live option the forwarder applies changes the running forwarder's state
after a reload, not only its copy of the configuration (a reloaded ``--mqtt.keepalive`` must reach
the connection and the link meter).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from gpu_exporter import config as cfg
from gpu_exporter.forward.service import Forwarder
from gpu_exporter.reload import LIVE
from gpu_exporter.ring import RingBuffer
from tests.support import ROOT

FIELD_TO_NAME = {o.field: o.name for o in cfg.ALL_OPTIONS if not o.is_switch}


def _documented() -> set[str]:
    """The option names the docs' Reload section says take effect at once."""
    text = (ROOT / "docs" / "security.md").read_text(encoding="utf-8")
    section = text.split("## Reload", 1)[1].split("take effect at once", 1)[1]  # the list, from its lead-in
    section = section.split("Any other option", 1)[0]  # to where the rest is named
    names: set[str] = set()
    for flag in re.findall(r"`--([a-z0-9.\-*]+)`", section):
        if flag.endswith("*"):  # --mqtt.tls.*, --mqtt.batch-*: every option of that prefix
            prefix = flag[:-1]
            names |= {n for n in FIELD_TO_NAME.values() if n.startswith(prefix)}
        else:
            names.add(flag)
    return names


def test_the_docs_list_of_live_options_is_the_codes() -> None:
    code = {FIELD_TO_NAME[f] for f in LIVE}
    assert _documented() == code


# What each live option changes in the running forwarder (the rest, --log.*, the interval and --web.*,
# the agent's own apply in cli.py changes: AGENT_APPLIED).
State = Callable[[Forwarder], tuple[Any, ...]]
FORWARDER_STATE: dict[str, tuple[Any, State]] = {
    "mqtt_url": ("mqtt://127.0.0.1:2", lambda f: ((f.link.settings.host, f.link.settings.port),)),
    "mqtt_username": ("other", lambda f: (f.link.settings.username,)),
    "mqtt_password_file": ("{tmp}/password", lambda f: (f.link.settings.password_file,)),
    "mqtt_tls_ca_file": ("{tmp}/tls/ca.crt", lambda f: (f.link.settings.tls,)),
    "mqtt_tls_cert_file": ("{tmp}/tls/client.crt", lambda f: (f.link.settings.tls,)),
    "mqtt_tls_key_file": ("{tmp}/tls/client.key", lambda f: (f.link.settings.tls,)),
    "mqtt_keepalive": (17.0, lambda f: (f.link.settings.keepalive, f.meter.keepalive)),
    "mqtt_reconnect_max_delay": (300.0, lambda f: (f.link.settings.max_delay, f.twins.early)),
    "mqtt_max_rate": (5000.0, lambda f: (f.meter.max_rate,)),
    "mqtt_batch_interval": (7.0, lambda f: (f.adaptive.interval,)),
    "mqtt_batch_max_bytes": (4096, lambda f: (f.config.mqtt_batch_max_bytes,)),  # read at each batch
    "mqtt_batch_max_samples": (3, lambda f: (f.config.mqtt_batch_max_samples,)),  # read at each batch
    "mqtt_value_digits": (2, lambda f: (f.adaptive.digits, f.reports.digits)),
    "spool_replay_rate": (1.0, lambda f: (f.config.spool_replay_rate,)),  # read at each replay
    "metrics_include": ("^gpu_power", lambda f: (f._keys,)),
    "metrics_exclude": ("^gpu_power", lambda f: (f._keys,)),
}
AGENT_APPLIED = {
    "log_level",
    "log_format",
    "interval",
    "web_config_file",
    "web_max_connections",
    "web_read_timeout",
    "web_idle_timeout",
}


def test_every_live_option_is_in_one_table() -> None:
    assert set(FORWARDER_STATE) | AGENT_APPLIED == set(LIVE)
    assert not set(FORWARDER_STATE) & AGENT_APPLIED


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.support.tls import make_tls

    folder = tmp_path_factory.mktemp("reload")
    make_tls(folder / "tls")  # ca.crt, client.crt, client.key there
    (folder / "password").write_text("secret\n", encoding="utf-8")
    return folder


@pytest.mark.parametrize("field", sorted(FORWARDER_STATE))
def test_a_reload_changes_the_running_forwarder(tmp_path: Path, tls: Path, field: str) -> None:
    base = cfg.Config(mqtt_url="mqtts://127.0.0.1:1", node_name="edge-07", spool_dir=str(tmp_path / "spool"))
    if field.startswith("mqtt_tls_"):  # one TLS file changes, the others stay
        base = dataclasses.replace(
            base,
            mqtt_tls_ca_file=str(tls / "tls" / "ca.crt"),
            mqtt_tls_cert_file=str(tls / "tls" / "client.crt"),
            mqtt_tls_key_file=str(tls / "tls" / "client.key"),
        )
        other = tls / "tls" / f"again-{field}"
        other.write_bytes(Path(getattr(base, field)).read_bytes())  # the same content under another name
        value = str(other)
    else:
        value, _ = FORWARDER_STATE[field]
        if isinstance(value, str):
            value = value.format(tmp=tls)
    if field in ("mqtt_url",):
        base = dataclasses.replace(base, mqtt_url="mqtt://127.0.0.1:1")
    _, state = FORWARDER_STATE[field]
    forwarder = Forwarder(base, RingBuffer(8), CollectorRegistry())
    try:
        before = state(forwarder)
        changes: dict[str, Any] = {field: value}
        new = dataclasses.replace(base, **changes)
        assert new != base
        forwarder.reconfigure(new)
        forwarder._apply(new)  # what its thread does at its next turn
        assert forwarder.config == new
        after = state(forwarder)
        for was, now in zip(before, after, strict=True):  # each place the option acts in
            assert now != was, f"--{FIELD_TO_NAME[field]} reloaded, but the forwarder runs as before: {after}"
    finally:
        forwarder.link.close(status=None)
