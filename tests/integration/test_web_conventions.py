"""node_exporter's endpoint conventions, through the CLI as users run it: a socket passed the way systemd
passes it (``systemd-socket-activate``), several listen addresses at once, the exporter's own metrics
left out, and every collector off but those named."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import (
    SRC,
    Exporter,
    child_env,
    exporter_cmd,
    free_port,
    http_get,
    promtool_check,
    stop_process,
    wait_until,
)
from tests.support.procs import one_line_exit_2, run_cli

pytestmark = pytest.mark.integration

FAKE = ("--gpu-vendor=fake", "--fake.gpus=1", "--gpu-metrics-collection-interval=200ms")


def _activate() -> str:
    tool = shutil.which("systemd-socket-activate")
    if tool is None:
        pytest.fail("systemd-socket-activate is needed (Debian package systemd)")
    return tool


def _ready(url: str, proc: subprocess.Popen[bytes]) -> bool:
    if proc.poll() is not None:
        raise AssertionError(f"exited early: {proc.communicate()[0].decode(errors='replace')[-3000:]}")
    return http_get(url, timeout=2)[0] == 200


@pytest.fixture
def activated() -> Iterator[tuple[subprocess.Popen[bytes], int, int]]:
    """The agent under ``systemd-socket-activate``: the socket on ``port`` is opened by the tool and passed
    as fd 3 with LISTEN_FDS/LISTEN_PID; the tool execs the agent on the first connection. ``unused`` is the
    agent's own --web.listen-address, which it must not bind."""
    port, unused = free_port(), free_port()
    command = [
        _activate(),
        f"--listen=127.0.0.1:{port}",
        f"--setenv=PYTHONPATH={SRC}",  # it passes only the variables it is told
        "--setenv=PYTHONUNBUFFERED=1",
        *exporter_cmd(*FAKE, "--web.systemd-socket", f"--web.listen-address=127.0.0.1:{unused}"),
    ]
    proc = subprocess.Popen(command, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        yield proc, port, unused
    finally:
        stop_process(proc)
        if proc.stdout is not None:
            proc.stdout.close()


def test_a_socket_passed_as_systemd_does_is_served(activated: tuple[subprocess.Popen[bytes], int, int]) -> None:
    proc, port, unused = activated
    # the first connection starts the agent (systemd's on-demand start); it answers on the passed socket
    wait_until(lambda: _ready(f"http://127.0.0.1:{port}/readyz", proc), timeout=30, what="/readyz on the socket")
    status, body, _ = http_get(f"http://127.0.0.1:{port}/metrics")
    page = body.decode()
    assert status == 200 and 'gpu_up{gpu="0"' in page
    promtool_check(page)
    with pytest.raises(OSError):  # it served the passed socket instead of binding its listen address
        socket.create_connection(("127.0.0.1", unused), timeout=2).close()
    assert stop_process(proc, signal.SIGTERM) == 0
    out = proc.communicate()[0].decode()
    assert f"serving /metrics on 127.0.0.1:{port} (port {port}, passed by systemd)" in out
    assert "Traceback" not in out


def _with_fd3(passed: socket.socket | None, pid: str = "$$") -> subprocess.CompletedProcess[str]:
    """The agent with ``--web.systemd-socket``, LISTEN_FDS=1, LISTEN_PID=``pid`` (``$$``: the agent's own,
    since the shell execs it) and as fd 3 ``passed``, or /dev/null."""
    fd3 = f"3<&{passed.fileno()}" if passed is not None else "3</dev/null"
    return subprocess.run(
        [
            "bash",
            "-c",
            f'LISTEN_FDS=1 LISTEN_PID={pid} exec "$@" {fd3}',
            "bash",
            *exporter_cmd(*FAKE, "--web.systemd-socket"),
        ],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=60,
        pass_fds=(passed.fileno(),) if passed is not None else (),
    )


def test_no_socket_passed_is_one_line_exit_2() -> None:
    line = one_line_exit_2(run_cli(*FAKE, "--web.systemd-socket"))
    assert "--web.systemd-socket: no socket was passed (LISTEN_FDS is not set)" in line


def test_sockets_meant_for_another_process_are_not_taken() -> None:
    line = one_line_exit_2(_with_fd3(None, pid="1"))
    assert "--web.systemd-socket: the sockets were passed to process 1, not to this one" in line


def test_a_descriptor_that_is_not_a_listening_tcp_socket_is_one_line() -> None:
    line = one_line_exit_2(_with_fd3(None))
    assert "file descriptor 3 is not a socket" in line
    with socket.socket() as idle:  # bound, never listening
        idle.bind(("127.0.0.1", 0))
        line = one_line_exit_2(_with_fd3(idle))
    assert "file descriptor 3 is not listening" in line
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        line = one_line_exit_2(_with_fd3(udp))
    assert "file descriptor 3 is not a TCP stream socket" in line


def test_the_flag_alone_is_true_and_false_turns_it_off(exporter: type[Exporter]) -> None:
    """``--web.systemd-socket=false`` binds --web.listen-address as without the flag."""
    proc = exporter(*FAKE, "--web.systemd-socket=false").start()
    assert "gpu_up" in proc.scrape()
    assert proc.stop() == 0


def _families(page: str) -> set[str]:
    return {line.split("{")[0].split(" ")[0] for line in page.splitlines() if line and not line.startswith("#")}


def test_two_listen_addresses_serve_at_once(exporter: type[Exporter]) -> None:
    second = free_port()
    proc = exporter(*FAKE, f"--web.listen-address=127.0.0.2:{second}").start()
    first = proc.scrape()
    status, body, _ = http_get(f"http://127.0.0.2:{second}/metrics")
    assert status == 200 and 'gpu_up{gpu="0"' in body.decode() and 'gpu_up{gpu="0"' in first

    def accepted() -> float:  # one server: its counter counts both listeners' connections
        page = http_get(f"http://127.0.0.2:{second}/metrics")[1].decode()
        return float(
            next(s for s in page.splitlines() if s.startswith("gpu_exporter_http_connections_accepted")).split()[-1]
        )

    wait_until(lambda: accepted() >= 3, timeout=10, what="connections of both addresses counted")
    assert proc.stop() == 0
    assert f"serving /metrics on 127.0.0.1:{proc.port}, 127.0.0.2:{second}" in proc.output()


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
        return True
    except OSError:
        return False


def test_ipv4_and_ipv6_loopback_on_one_port(exporter: type[Exporter]) -> None:
    if not _ipv6_loopback():
        pytest.skip("not applicable here: the machine has no IPv6 loopback (::1)")
    port = free_port()
    proc = exporter(*FAKE, f"--web.listen-address=[::1]:{port}", port=port).start()
    for url in (f"http://127.0.0.1:{port}/metrics", f"http://[::1]:{port}/metrics"):
        status, body, _ = http_get(url)
        assert status == 200 and "gpu_up" in body.decode(), url
    assert proc.stop() == 0


def test_listen_addresses_from_the_environment_comma_separated(tmp_path: Path) -> None:
    first, second = free_port(), free_port()
    env = child_env(GPU_EXPORTER_WEB_LISTEN_ADDRESS=f"127.0.0.1:{first}, 127.0.0.2:{second}")
    proc = subprocess.Popen(exporter_cmd(*FAKE), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        for host, port in (("127.0.0.1", first), ("127.0.0.2", second)):
            wait_until(lambda h=host, p=port: _ready(f"http://{h}:{p}/readyz", proc), timeout=30, what=host)
    finally:
        assert stop_process(proc) == 0
        assert proc.stdout is not None
        proc.stdout.close()


def test_one_busy_address_of_two_is_one_line_exit_1() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.2", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run_cli(
            *FAKE, f"--web.listen-address=127.0.0.1:{free_port()}", f"--web.listen-address=127.0.0.2:{port}"
        )
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert (
        result.stderr.strip().splitlines()[-1]
        == f"gpu-exporter: cannot listen on 127.0.0.2:{port}: address already in use"
    )


def test_disable_exporter_metrics_leaves_out_the_process_and_the_endpoint(exporter: type[Exporter]) -> None:
    plain = exporter(*FAKE).start()
    with_all = _families(plain.scrape())
    assert plain.stop() == 0
    proc = exporter(*FAKE, "--web.disable-exporter-metrics").start()
    page = proc.scrape()
    assert proc.stop() == 0
    promtool_check(page)
    served = _families(page)
    left_out = with_all - served
    assert left_out and all(n.startswith(("process_", "gpu_exporter_http_")) for n in left_out), left_out
    assert {n for n in with_all if n.startswith("process_")} <= left_out
    assert not any(n.startswith(("process_", "gpu_exporter_http_", "python_")) for n in served)
    # what node_exporter keeps beside node_scrape_collector_*: the collection's health and the build info
    for kept in ("gpu_exporter_build_info", "gpu_exporter_collects_total", "gpu_exporter_ring_samples", "gpu_up"):
        assert kept in served


POWER = {"gpu_power_watts", "gpu_power_limit_watts", "gpu_energy_joules_total"}


def _device_families(page: str) -> set[str]:
    return {n for n in _families(page) if n.startswith("gpu_") and not n.startswith("gpu_exporter_")}


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        (("--collector.disable-defaults", "--collector.power"), {}, {"gpu_up", "gpu_info", *POWER}),
        (
            ("--collector.disable-defaults", "--collector.power", "--collector.temperature"),
            {},
            {"gpu_up", "gpu_info", "gpu_temperature_celsius", *POWER},
        ),
        (("--collector.disable-defaults",), {}, {"gpu_up", "gpu_info"}),
        # the environment's forms: the switch and a collector named on
        ((), {"GPU_EXPORTER_COLLECTOR_DISABLE_DEFAULTS": "true", "GPU_EXPORTER_COLLECTOR_POWER": "true"}, None),
    ],
    ids=["power", "power+temperature", "none", "environment"],
)
def test_disable_defaults_serves_only_the_collectors_named(
    exporter: type[Exporter], args: tuple[str, ...], env: dict[str, str], expected: set[str] | None
) -> None:
    proc = exporter(*FAKE, *args, env=child_env(**env)).start()
    page = proc.scrape()
    assert proc.stop() == 0
    promtool_check(page)
    assert _device_families(page) == (expected or {"gpu_up", "gpu_info", *POWER})


def test_without_disable_defaults_every_collector_serves(exporter: type[Exporter]) -> None:
    """The control: the fake GPU serves far more than the power families when no collector is turned off,
    and --no-collector.X still turns one off alone."""
    proc = exporter(*FAKE, "--no-collector.power").start()
    families = _device_families(proc.scrape())
    assert proc.stop() == 0
    assert not families & POWER
    assert {"gpu_utilization_ratio", "gpu_memory_used_bytes", "gpu_temperature_celsius"} <= families
