"""``--web.config.file``: TLS, basic auth and response headers, in the Prometheus exporter-toolkit format.

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
    basic_auth_users:
      prometheus: $2b$12$...   # bcrypt hash

The certificate, key and client CA are re-read when their files change (checked at most once a second,
on a new connection), so a rotated certificate is served without a restart; a rotation that does not
load keeps the old one and logs why. Every problem in the file is a ``ValueError`` of one line.
"""

from __future__ import annotations

import logging
import os
import re
import ssl
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpu_exporter import safeyaml
from gpu_exporter.web.auth import BasicAuth

__all__ = ["TlsFiles", "WebConfig", "load_web_config"]

log = logging.getLogger(__name__)

_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
# RequireAndVerifyClientCert verifies a certificate given in the handshake, as the others, but asks for
# one only on the paths that need credentials (the server refuses those without one): the kubelet's
# HTTPS probes of /healthz and /readyz cannot present a certificate.
_CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_OPTIONAL,
}
_TLS_KEYS = {"cert_file", "key_file", "client_auth_type", "client_ca_file", "min_version", "max_version"}
_BCRYPT = re.compile(r"^\$2[aby]?\$\d\d\$[./A-Za-z0-9]{53}$")
_HEADER_NAME = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$")
_OWN_HEADERS = {"content-type", "content-length", "content-encoding", "vary", "connection", "www-authenticate"}


@dataclass(frozen=True)
class TlsFiles:
    cert_file: str
    key_file: str
    client_ca_file: str = ""
    client_auth_type: str = "NoClientCert"
    min_version: str = "TLS12"
    max_version: str = ""

    @property
    def requires_client_cert(self) -> bool:
        """Whether a verified client certificate is needed (on every path but /healthz and /readyz)."""
        return self.client_auth_type == "RequireAndVerifyClientCert"

    def build(self) -> ssl.SSLContext:
        """A server context from the files as they are now; ValueError naming what does not load."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = _VERSIONS[self.min_version]
        if self.max_version:
            ctx.maximum_version = _VERSIONS[self.max_version]
        try:
            ctx.load_cert_chain(self.cert_file, self.key_file)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(
                f"cannot load cert_file {self.cert_file} with key_file {self.key_file}: {_why(exc)}"
            ) from None
        if self.client_ca_file:
            try:
                ctx.load_verify_locations(cafile=self.client_ca_file)
            except (OSError, ssl.SSLError) as exc:
                raise ValueError(f"cannot load client_ca_file {self.client_ca_file}: {_why(exc)}") from None
        ctx.verify_mode = _CLIENT_AUTH[self.client_auth_type]
        return ctx

    def stamp(self) -> tuple[tuple[int, int], ...]:
        out = []
        for path in (self.cert_file, self.key_file, self.client_ca_file):
            try:
                st = os.stat(path) if path else None
            except OSError:
                st = None
            out.append((st.st_mtime_ns, st.st_size) if st is not None else (0, 0))
        return tuple(out)


class TlsState:
    """The current server context; rebuilt when a file changed, the old one kept when that fails."""

    def __init__(self, files: TlsFiles) -> None:
        self.files = files
        self._ctx = files.build()
        self._stamp = files.stamp()
        self._checked = time.monotonic()
        self._lock = threading.Lock()
        self.reloads = 0
        self.reload_failures = 0

    def context(self) -> ssl.SSLContext:
        now = time.monotonic()
        with self._lock:
            if now - self._checked < 1.0:
                return self._ctx
            self._checked = now
            stamp = self.files.stamp()
            if stamp == self._stamp:
                return self._ctx
            self._stamp = stamp
            try:
                self._ctx = self.files.build()
            except ValueError as exc:
                self.reload_failures += 1
                log.warning("web TLS: keeping the previous certificate: %s", exc)
            else:
                self.reloads += 1
                log.info("web TLS: certificate files changed; serving the new ones")
            return self._ctx


@dataclass(frozen=True)
class WebConfig:
    path: str = ""
    tls: TlsFiles | None = None
    users: Mapping[str, str] = field(default_factory=dict)
    headers: tuple[tuple[str, str], ...] = ()

    def auth(self) -> BasicAuth:
        return BasicAuth(self.users)

    def tls_state(self) -> TlsState | None:
        return TlsState(self.tls) if self.tls is not None else None


def _why(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLError):
        return exc.reason or str(exc)
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc)


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(f"{where} must be a mapping")
    return {k: v for k, v in value.items() if k != "__lines__"}


def _tls(section: Mapping[str, Any], base: str) -> TlsFiles:
    unknown = set(section) - _TLS_KEYS
    if unknown:
        raise ValueError(f"tls_server_config: unsupported key {sorted(unknown)[0]!r}")
    values = {k: str(v) for k, v in section.items() if v is not None}
    for key in ("cert_file", "key_file", "client_ca_file"):
        if values.get(key) and not os.path.isabs(values[key]):
            values[key] = os.path.join(base, values[key])  # relative to the web config file, as the toolkit does
    if not values.get("cert_file") or not values.get("key_file"):
        raise ValueError("tls_server_config needs both cert_file and key_file")
    auth = values.get("client_auth_type", "") or "NoClientCert"
    if auth not in _CLIENT_AUTH:
        raise ValueError(
            f"tls_server_config.client_auth_type {auth!r} is not supported (use {', '.join(_CLIENT_AUTH)})"
        )
    if auth != "NoClientCert" and not values.get("client_ca_file"):
        raise ValueError(f"tls_server_config.client_auth_type {auth} needs client_ca_file")
    for key in ("min_version", "max_version"):
        if values.get(key) and values[key] not in _VERSIONS:
            raise ValueError(f"tls_server_config.{key} {values[key]!r} is not one of {', '.join(_VERSIONS)}")
    files = TlsFiles(
        cert_file=values["cert_file"],
        key_file=values["key_file"],
        client_ca_file=values.get("client_ca_file", ""),
        client_auth_type=auth,
        min_version=values.get("min_version") or "TLS12",
        max_version=values.get("max_version", ""),
    )
    files.build()  # a certificate or key that does not load is a start-up error
    return files


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
        unknown = set(top) - {"tls_server_config", "http_server_config", "basic_auth_users"}
        if unknown:
            raise ValueError(f"unknown key {sorted(map(str, unknown))[0]!r}")
        tls_section = _mapping(top.get("tls_server_config"), "tls_server_config")
        tls = _tls(tls_section, os.path.dirname(os.path.abspath(path))) if tls_section else None
        users = {}
        for user, hashed in _mapping(top.get("basic_auth_users"), "basic_auth_users").items():
            if not isinstance(hashed, str) or not _BCRYPT.match(hashed):
                raise ValueError(f"basic_auth_users.{user}: not a bcrypt hash ($2b$..., 60 characters)")
            if ":" in str(user) or not str(user):
                raise ValueError(f"basic_auth_users: invalid user name {user!r}")
            users[str(user)] = hashed
        http = _mapping(top.get("http_server_config"), "http_server_config")
        unknown = set(http) - {"headers", "http2"}
        if unknown:
            raise ValueError(f"http_server_config: unsupported key {sorted(map(str, unknown))[0]!r}")
        if http.get("http2"):
            raise ValueError("http_server_config.http2: HTTP/2 is not supported; remove the key or set false")
        headers = []
        for name, value in _mapping(http.get("headers"), "http_server_config.headers").items():
            name = str(name)
            if not _HEADER_NAME.match(name) or name.lower() in _OWN_HEADERS:
                raise ValueError(f"http_server_config.headers: header {name!r} cannot be set")
            text = str(value)
            if "\r" in text or "\n" in text:
                raise ValueError(f"http_server_config.headers: the value of {name!r} has a line break")
            headers.append((name, text))
    except ValueError as exc:
        raise ValueError(f"web config file {path}: {exc}") from None
    return WebConfig(path=path, tls=tls, users=users, headers=tuple(headers))
