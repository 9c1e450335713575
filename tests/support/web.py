"""The metrics endpoint in process behind a --web.config.file, for the web tests (TLS, auth, limits)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import bcrypt
import pytest
from prometheus_client import CollectorRegistry

from gpu_exporter.exposition import Exposition, MetricsServer, native_view
from gpu_exporter.web.webconfig import load_web_config

from .samples import fixed_sample


def bcrypt_hash(password: str | bytes, cost: int = 4) -> str:
    """A basic_auth_users hash (cost 4: quick; the cost the server pays is the hash's own)."""
    raw = password.encode() if isinstance(password, str) else password
    return bcrypt.hashpw(raw, bcrypt.gensalt(cost)).decode()


@pytest.fixture
def serve() -> Iterator[Callable[[str], MetricsServer]]:
    """``serve(web_config_path)``: a started MetricsServer on a free port serving two simulated GPUs; stopped
    when the test ends."""
    servers: list[MetricsServer] = []

    def start(web_path: str) -> MetricsServer:
        exposition = Exposition(CollectorRegistry(), native_view())
        exposition.update(fixed_sample(mig=0))
        srv = MetricsServer("127.0.0.1:0", "/metrics", exposition, lambda: (True, "ready"), load_web_config(web_path))
        srv.start()
        servers.append(srv)
        return srv

    yield start
    for srv in servers:
        srv.stop()
