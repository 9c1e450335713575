"""A wrong-password flood against an endpoint, and Prometheus-style scrapes beside it.

Shared by tests/integration/test_web_auth_flood.py (CI-sized) and bench/bench_auth_flood.py (the issue's 80 clients).
The flood runs in a child process (``python -m tests.support.web_flood``): each client is a thread with a real
HTTP/1.1 keep-alive connection that sends ``GET /metrics`` with basic auth and a fresh random wrong
password every time (so that no cache of failures can spare a bcrypt round), and sends the next request as
soon as an answer came, reconnecting when the server closes the connection. The scrapes come from this
process, as Prometheus sends them: the right password, ``Accept-Encoding: gzip``, a 10 s timeout.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import os
import secrets
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

from . import paths

ROOT = paths.ROOT


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def request(port: int, user: str, password: str, timeout: float = 10.0) -> tuple[int, float]:
    """One scrape on a fresh connection, as Prometheus sends it: (status, or 0 for a timeout and -1 for a
    connection closed without an answer; seconds)."""
    started = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(
            "GET",
            "/metrics",
            headers={
                "Authorization": basic(user, password),
                "Accept-Encoding": "gzip",
                "User-Agent": "Prometheus/2.42.0",
                "X-Prometheus-Scrape-Timeout-Seconds": str(timeout),
            },
        )
        response = conn.getresponse()
        response.read()
        return response.status, time.monotonic() - started
    except TimeoutError:
        return 0, time.monotonic() - started
    except (OSError, http.client.HTTPException):  # refused, reset or closed before an answer
        return -1, time.monotonic() - started
    finally:
        conn.close()


def _client(port: int, user: str, stop: threading.Event, codes: dict[int, int], lock: threading.Lock) -> None:
    conn: http.client.HTTPConnection | None = None
    while not stop.is_set():
        if conn is None:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            conn.request("GET", "/metrics", headers={"Authorization": basic(user, secrets.token_hex(8))})
            response = conn.getresponse()
            response.read()
            code = response.status
            if response.will_close:
                conn.close()
                conn = None
        except (OSError, http.client.HTTPException):
            code = 0
            conn.close()
            conn = None
        with lock:
            codes[code] = codes.get(code, 0) + 1
    if conn is not None:
        conn.close()


def flood_main(argv: list[str] | None = None) -> int:
    """The flood itself (the child process): runs until SIGTERM, then prints its answer codes as JSON."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--clients", type=int, required=True)
    parser.add_argument("--user", default="prometheus")
    args = parser.parse_args(argv)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    codes: dict[int, int] = {}
    lock = threading.Lock()
    threads = [
        threading.Thread(target=_client, args=(args.port, args.user, stop, codes, lock), daemon=True)
        for _ in range(args.clients)
    ]
    for thread in threads:
        thread.start()
    print("flooding", flush=True)
    while not stop.is_set():
        stop.wait(0.2)
    for thread in threads:
        thread.join(35)
    print(json.dumps({str(k): v for k, v in sorted(codes.items())}), flush=True)
    return 0


@dataclass
class FloodResult:
    scrapes: list[tuple[int, float]] = field(default_factory=list)  # (status, seconds) per scrape
    flood_codes: dict[str, int] = field(default_factory=dict)

    @property
    def answered(self) -> float:
        """Share of the scrapes answered with the page (200)."""
        return sum(1 for code, _ in self.scrapes if code == 200) / max(1, len(self.scrapes))

    def summary(self) -> str:
        times = [t for code, t in self.scrapes if code == 200] or [0.0]
        codes: dict[int, int] = {}
        for code, _ in self.scrapes:
            codes[code] = codes.get(code, 0) + 1
        return (
            f"{sum(1 for c, _ in self.scrapes if c == 200)}/{len(self.scrapes)} scrapes answered "
            f"({100 * self.answered:.0f} %), codes {codes}, latency median {statistics.median(times):.3f} s "
            f"max {max(times):.3f} s; flood answers {self.flood_codes}"
        )


def flood(
    port: int,
    password: str,
    *,
    clients: int,
    seconds: float,
    every: float,
    user: str = "prometheus",
    warmup: float = 2.0,
) -> FloodResult:
    """Start the flood, let it build up for ``warmup`` seconds, scrape every ``every`` seconds for
    ``seconds``, stop the flood (by its PID). The first scrape comes during the flood: the right password
    has not been checked before unless the caller scraped already."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.support.web_flood", f"--port={port}", f"--clients={clients}", f"--user={user}"],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    result = FloodResult()
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "flooding"
        time.sleep(warmup)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            started = time.monotonic()
            result.scrapes.append(request(port, user, password))
            time.sleep(max(0.0, every - (time.monotonic() - started)))
    finally:
        child.send_signal(signal.SIGTERM)
        try:
            out, _ = child.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            child.kill()
            out, _ = child.communicate(timeout=10)
    lines = [line for line in out.splitlines() if line.startswith("{")]
    result.flood_codes = json.loads(lines[-1]) if lines else {}
    return result


def wrong_password_times(port: int, users: list[str], count: int) -> dict[str, list[float]]:
    """Seconds to a refusal for ``count`` requests of each user, each with a fresh wrong password, the
    users taking turns in alternating order (so that a change in the machine's load falls on all alike)."""
    times: dict[str, list[float]] = {user: [] for user in users}
    for round_ in range(count):
        for user in users if round_ % 2 == 0 else users[::-1]:
            code, seconds = request(port, user, secrets.token_hex(8))
            assert code == 401, code
            times[user].append(seconds)
    return times


def queued_checks(port: int, user: str, password: str) -> float:
    """``gpu_exporter_http_password_checks_queued`` as the endpoint says it (scraped with the right pair)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/metrics", headers={"Authorization": basic(user, password)})
        body = conn.getresponse().read().decode()
    finally:
        conn.close()
    for line in body.splitlines():
        if line.startswith("gpu_exporter_http_password_checks_queued "):
            return float(line.split()[1])
    raise AssertionError("no gpu_exporter_http_password_checks_queued on the page")


if __name__ == "__main__":
    raise SystemExit(flood_main())
