"""``--web.config.file``: TLS, basic auth, response headers and a rate limit, in the Prometheus exporter
toolkit's format (the keys of its ``web-configuration.md``: any other key is refused with one line).

::

    tls_server_config:
      cert_file: /etc/gpu-exporter/tls/tls.crt
      key_file: /etc/gpu-exporter/tls/tls.key
      client_auth_type: RequireAndVerifyClientCert   # mTLS; needs client_ca_file
      client_ca_file: /etc/gpu-exporter/tls/ca.crt
      min_version: TLS12
    http_server_config:
      headers:
        Strict-Transport-Security: max-age=31536000
    rate_limit:
      interval: 100ms   # one request per interval on average ...
      burst: 20         # ... and up to this many at once
    basic_auth_users:
      prometheus: $2b$12$...   # bcrypt hash

TLS is ``tls.py``, the rate limit ``ratelimit.py``, the password checks ``auth.py``. Every problem in the
file is a ``ValueError`` of one line.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpu_exporter import safeyaml
from gpu_exporter.web.ratelimit import RateLimiter, parse_go_duration
from gpu_exporter.web.tls import TlsFiles, TlsState, parse_tls

__all__ = ["TlsFiles", "WebConfig", "load_web_config"]

log = logging.getLogger(__name__)

_TOP_KEYS = {"tls_server_config", "http_server_config", "basic_auth_users", "rate_limit"}
_BCRYPT = re.compile(r"^\$2[aby]?\$\d\d\$[./A-Za-z0-9]{53}$")
_HEADER_NAME = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$")
_OWN_HEADERS = {"content-type", "content-length", "content-encoding", "vary", "connection", "www-authenticate"}


@dataclass(frozen=True)
class WebConfig:
    path: str = ""
    tls: TlsFiles | None = None
    users: Mapping[str, str] = field(default_factory=dict)
    headers: tuple[tuple[str, str], ...] = ()
    rate_interval: float = 0.0  # seconds between two tokens; 0: no rate limit
    rate_burst: int = 0

    def tls_state(self) -> TlsState | None:
        return TlsState(self.tls) if self.tls is not None else None

    def limiter(self) -> RateLimiter | None:
        return RateLimiter(self.rate_interval, self.rate_burst) if self.rate_interval > 0 else None


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(f"{where} must be a mapping")
    return {k: v for k, v in value.items() if k != "__lines__"}


def _rate_limit(section: Mapping[str, Any]) -> tuple[float, int]:
    unknown = set(section) - {"interval", "burst"}
    if unknown:
        raise ValueError(f"rate_limit: unknown key {sorted(map(str, unknown))[0]!r}")
    try:
        interval = parse_go_duration(section.get("interval", 0) or 0)
    except ValueError as exc:
        raise ValueError(f"rate_limit.interval: {exc}") from None
    burst = section.get("burst", 0)
    if isinstance(burst, bool) or not isinstance(burst, int) or not 0 <= burst <= 1_000_000:
        raise ValueError("rate_limit.burst must be a whole number from 0 to 1000000")
    if interval > 0 and burst == 0:
        log.warning("web config: rate_limit.burst is 0: every request but the probes is refused (429)")
    return max(0.0, interval), burst


def _users(section: Mapping[str, Any]) -> dict[str, str]:
    users = {}
    for user, hashed in section.items():
        if not isinstance(hashed, str) or not _BCRYPT.match(hashed):
            raise ValueError(f"basic_auth_users.{user}: not a bcrypt hash ($2b$..., 60 characters)")
        if ":" in str(user) or not str(user):
            raise ValueError(f"basic_auth_users: invalid user name {user!r}")
        users[str(user)] = hashed
    return users


def _headers(http: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    unknown = set(http) - {"headers", "http2"}
    if unknown:
        raise ValueError(f"http_server_config: unknown key {sorted(map(str, unknown))[0]!r}")
    if not isinstance(http.get("http2", True), bool):
        raise ValueError("http_server_config.http2 must be true or false")
    headers = []
    for name, value in _mapping(http.get("headers"), "http_server_config.headers").items():
        name = str(name)
        if not _HEADER_NAME.match(name) or name.lower() in _OWN_HEADERS:
            raise ValueError(f"http_server_config.headers: header {name!r} cannot be set")
        text = str(value)
        if "\r" in text or "\n" in text:
            raise ValueError(f"http_server_config.headers: the value of {name!r} has a line break")
        headers.append((name, text))
    return tuple(headers)


def load_web_config(path: str) -> WebConfig:
    """The parsed and checked file; ValueError (one line) for anything wrong with it."""
    if not path:
        return WebConfig()
    try:
        data = safeyaml.load_file(path, what="web config file")
    except ValueError as exc:
        raise ValueError(str(exc)) from None
    try:
        top = _mapping(data, "the file")
        unknown = set(top) - _TOP_KEYS
        if unknown:
            raise ValueError(f"unknown key {sorted(map(str, unknown))[0]!r}")
        tls_section = _mapping(top.get("tls_server_config"), "tls_server_config")
        tls = parse_tls(tls_section, os.path.dirname(os.path.abspath(path))) if tls_section else None
        users = _users(_mapping(top.get("basic_auth_users"), "basic_auth_users"))
        headers = _headers(_mapping(top.get("http_server_config"), "http_server_config"))
        interval, burst = _rate_limit(_mapping(top.get("rate_limit"), "rate_limit"))
    except ValueError as exc:
        raise ValueError(f"web config file {path}: {exc}") from None
    return WebConfig(path, tls, users, headers, interval, burst)
