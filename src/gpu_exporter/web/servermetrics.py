"""The endpoint's own counters (``web/server.py``'s ``Stats``, its connection table and its password checks)
as ``<prefix>_http_*`` metrics: ``gpu_exporter_http_*`` for the agent, ``gpu_exporter_bridge_http_*``
for the bridge."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

if TYPE_CHECKING:
    from gpu_exporter.web.server import WebServer

__all__ = ["ServerCollector"]


class ServerCollector:
    """The endpoint's own counters, as ``<prefix>_http_*`` metrics."""

    def __init__(self, server: Callable[[], WebServer | None], prefix: str = "gpu_exporter") -> None:
        self._server = server
        self.prefix = prefix

    def collect(self) -> Iterator[Metric]:
        server = self._server()
        if server is None:
            return
        s, p = server.stats, self.prefix
        yield GaugeMetricFamily(f"{p}_http_connections", "Open HTTP connections.", value=server.connections())
        yield GaugeMetricFamily(
            f"{p}_http_max_connections", "Cap on open HTTP connections.", value=server.limits.max_connections
        )
        yield CounterMetricFamily(f"{p}_http_connections_accepted", "HTTP connections accepted.", value=s.accepted)
        closed = CounterMetricFamily(
            f"{p}_http_connections_dropped",
            "HTTP connections refused or closed by the server: limit (cap reached, every slot busy: 503), "
            "evicted (a waiting connection closed to make room), timeout (request or idle deadline), tls.",
            labels=["reason"],
        )
        for reason, value in (
            ("limit", s.rejected),
            ("evicted", s.evicted),
            ("timeout", s.timeouts),
            ("tls", s.tls_failures),
        ):
            closed.add_metric([reason], value)
        yield closed
        yield CounterMetricFamily(
            f"{p}_http_auth_failures", "Requests refused for missing or wrong credentials.", value=s.auth_failures
        )
        auth = server.auth_state
        yield CounterMetricFamily(
            f"{p}_http_password_checks", "bcrypt checks run (pairs not remembered).", value=auth.pool.checks
        )
        yield GaugeMetricFamily(
            f"{p}_http_password_checks_queued", "Password checks waiting for the check pool.", value=auth.pool.queued()
        )
        remembered = CounterMetricFamily(
            f"{p}_http_password_checks_remembered",
            "Requests answered from a remembered check, without bcrypt: ok (a pair that passed), failed (a pair "
            "that failed within the last 5 minutes).",
            labels=["result"],
        )
        remembered.add_metric(["ok"], auth.remembered_good)
        remembered.add_metric(["failed"], auth.remembered_bad)
        yield remembered
        yield CounterMetricFamily(
            f"{p}_http_password_checks_evicted",
            "Connections closed to make room for a newcomer while their password check waited.",
            value=s.auth_evicted,
        )
        refused = CounterMetricFamily(
            f"{p}_http_requests_refused",
            "Requests answered 429: rate_limit (the web config's rate_limit), password_checks (the check "
            "pool's queue was full of older checks).",
            labels=["reason"],
        )
        refused.add_metric(["rate_limit"], s.rate_limited)
        refused.add_metric(["password_checks"], s.auth_busy)
        yield refused
