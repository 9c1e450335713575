"""``tls_server_config`` of the web config file: the server's TLS context, rebuilt when its files change.

Every key of the Prometheus exporter toolkit is taken, with its meaning:

- ``cert_file``/``key_file``/``client_ca_file``, or the same PEM inline as ``cert``/``key``/``client_ca``
  (one of each pair, not both). Files are re-read when they change (checked at most once a second, on a
  new connection); a rotation that does not load keeps the old context and logs why.
- ``client_auth_type``: ``NoClientCert``, ``VerifyClientCertIfGiven``, ``RequireAndVerifyClientCert``.
  ``RequestClientCert`` and ``RequireAnyClientCert`` accept a certificate nobody verified, which proves
  nothing: refused with one line.
- ``client_allowed_sans``: a verified client certificate must also carry one of these subject alternative
  names (DNS, IP address, e-mail or URI, compared as written), or the connection is closed.
- ``min_version``/``max_version`` (TLS10 to TLS13; TLS12 and TLS13 by default).
- ``cipher_suites``: Go's names (``TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256``...), for TLS 1.2 and lower, as
  in Go; the TLS 1.3 names are accepted and change nothing. A list of TLS 1.3 names only leaves no suite
  for TLS 1.2: the server then speaks TLS 1.3 only, which is what such a list does in Go.
- ``prefer_server_cipher_suites`` (default true): the server's order wins.
- ``curve_preferences`` (``CurveP256``, ``CurveP384``, ``CurveP521``, ``X25519``): Python's ``ssl`` sets one
  key-exchange group, not a list, so the first one listed that this Python can set is the only one offered
  (Python 3.10 cannot set X25519: the next listed is offered, with a warning): never more than the list
  allows, and a client that supports none of it cannot connect (Go's own clients offer all four).
"""

from __future__ import annotations

import ipaddress
import logging
import os
import ssl
import tempfile
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpu_exporter.filewatch import Watched

__all__ = ["TlsFiles", "TlsState", "parse_tls", "peer_sans"]

log = logging.getLogger(__name__)

VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
# RequireAndVerifyClientCert verifies a certificate given in the handshake, as the others, but asks for
# one only on the paths that need credentials (the server refuses those without one): the kubelet's
# HTTPS probes of /healthz and /readyz cannot present a certificate.
CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_OPTIONAL,
}
_UNVERIFIED_AUTH = ("RequestClientCert", "RequireAnyClientCert", "RequireClientCert")
# Go's cipher suite names (crypto/tls CipherSuites) and OpenSSL's; None: TLS 1.3, not configurable
CIPHERS: dict[str, str | None] = {
    "TLS_AES_128_GCM_SHA256": None,
    "TLS_AES_256_GCM_SHA384": None,
    "TLS_CHACHA20_POLY1305_SHA256": None,
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    # in CipherSuites() of the Go releases older exporters are built with
    "TLS_RSA_WITH_AES_128_CBC_SHA": "AES128-SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA": "AES256-SHA",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
}
CURVES = {"CurveP256": "prime256v1", "CurveP384": "secp384r1", "CurveP521": "secp521r1", "X25519": "X25519"}
TLS_KEYS = frozenset(
    {
        "cert",
        "key",
        "client_ca",
        "cert_file",
        "key_file",
        "client_auth_type",
        "client_ca_file",
        "client_allowed_sans",
        "min_version",
        "max_version",
        "cipher_suites",
        "prefer_server_cipher_suites",
        "curve_preferences",
    }
)


@dataclass(frozen=True)
class TlsFiles:
    cert_file: str = ""
    key_file: str = ""
    client_ca_file: str = ""
    client_auth_type: str = "NoClientCert"
    min_version: str = "TLS12"
    max_version: str = ""
    cert: str = ""  # inline PEM, instead of cert_file
    key: str = ""
    client_ca: str = ""
    ciphers: tuple[str, ...] = ()  # Go names, as given
    prefer_server_ciphers: bool = True
    curves: tuple[str, ...] = ()
    allowed_sans: tuple[str, ...] = ()

    @property
    def requires_client_cert(self) -> bool:
        """Whether a verified client certificate is needed (on every path but /healthz and /readyz)."""
        return self.client_auth_type == "RequireAndVerifyClientCert"

    def build(self) -> ssl.SSLContext:
        """A server context from the files as they are now; ValueError naming what does not load."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = VERSIONS[self.min_version]
        if self.max_version:
            ctx.maximum_version = VERSIONS[self.max_version]
        self._load_chain(ctx)
        if self.client_ca_file:
            try:
                ctx.load_verify_locations(cafile=self.client_ca_file)
            except (OSError, ssl.SSLError) as exc:
                raise ValueError(f"cannot load client_ca_file {self.client_ca_file}: {_why(exc)}") from None
        elif self.client_ca:
            try:
                ctx.load_verify_locations(cadata=self.client_ca)
            except (ssl.SSLError, ValueError) as exc:
                raise ValueError(f"cannot load client_ca: {_why(exc)}") from None
        ctx.verify_mode = CLIENT_AUTH[self.client_auth_type]
        if self.ciphers:
            legacy = [CIPHERS[name] for name in self.ciphers if CIPHERS[name]]
            if legacy:
                try:
                    ctx.set_ciphers(":".join(name for name in legacy if name))
                except ssl.SSLError as exc:
                    raise ValueError(f"cipher_suites: this OpenSSL offers none of them ({_why(exc)})") from None
            else:
                ctx.minimum_version = ssl.TLSVersion.TLSv1_3
        if self.prefer_server_ciphers:
            ctx.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
        if self.curves:
            _set_curve(ctx, self.curves)
        return ctx

    def _load_chain(self, ctx: ssl.SSLContext) -> None:
        if not (self.cert or self.key):
            try:
                ctx.load_cert_chain(self.cert_file, self.key_file)
            except (OSError, ssl.SSLError) as exc:
                raise ValueError(
                    f"cannot load cert_file {self.cert_file} with key_file {self.key_file}: {_why(exc)}"
                ) from None
            return
        # ssl loads a certificate chain from files only: inline PEM goes through a private temporary folder
        with tempfile.TemporaryDirectory(prefix="gpu-exporter-tls-") as folder:
            paths = []
            for name, inline, path in (("cert", self.cert, self.cert_file), ("key", self.key, self.key_file)):
                if inline:
                    path = os.path.join(folder, name)
                    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                    with os.fdopen(fd, "w") as handle:
                        handle.write(inline)
                paths.append(path)
            try:
                ctx.load_cert_chain(paths[0], paths[1])
            except (OSError, ssl.SSLError) as exc:
                raise ValueError(f"cannot load the server certificate and key: {_why(exc)}") from None

    def allows(self, cert: Mapping[str, Any] | None) -> bool:
        """Whether a verified peer certificate passes ``client_allowed_sans`` (always, without the list)."""
        if not self.allowed_sans or not cert:
            return True
        return any(san in self.allowed_sans for san in peer_sans(cert))


def peer_sans(cert: Mapping[str, Any]) -> list[str]:
    """The subject alternative names of ``getpeercert()``, written as Go writes them (IPs compressed)."""
    out = []
    for kind, value in cert.get("subjectAltName", ()):
        if kind == "IP Address":
            try:
                value = str(ipaddress.ip_address(value.strip()))
            except ValueError:
                pass
        out.append(str(value))
    return out


class TlsState:
    """The current server context; rebuilt when a file changed, the old one kept when that fails."""

    def __init__(self, files: TlsFiles) -> None:
        self.files = files
        # before the read: a certificate renewed meanwhile is seen at the next look (at most once a second)
        self._watched = Watched((files.cert_file, files.key_file, files.client_ca_file), every=1.0)
        self._ctx = files.build()
        self._lock = threading.Lock()
        self.reloads = 0
        self.reload_failures = 0

    def context(self) -> ssl.SSLContext:
        with self._lock:
            if self._watched.changed() is None:
                return self._ctx
            try:
                self._ctx = self.files.build()
            except ValueError as exc:
                self.reload_failures += 1
                log.warning("web TLS: keeping the previous certificate: %s", exc)
            else:
                self.reloads += 1
                log.info("web TLS: certificate files changed; serving the new ones")
            return self._ctx


def _set_curve(ctx: ssl.SSLContext, curves: tuple[str, ...]) -> str:
    """Offer the first listed group this Python can set (3.10's ssl cannot set X25519); its name."""
    refused: list[str] = []
    for name in curves:
        try:
            ctx.set_ecdh_curve(CURVES[name])
        except (ValueError, ssl.SSLError) as exc:
            refused.append(f"{name} ({_why(exc)})")
            continue
        if refused:
            log.warning("web TLS: curve_preferences: %s offered instead of %s", name, ", ".join(refused))
        return name
    raise ValueError(f"curve_preferences: none of them is available here: {', '.join(refused)}")


def _why(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLError):
        return getattr(exc, "reason", None) or str(exc)
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc)


def _names(section: Mapping[str, Any], key: str, known: Iterable[str]) -> tuple[str, ...]:
    value = section.get(key)
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"tls_server_config.{key} must be a list of names")
    allowed = set(known)
    for name in value:
        if name not in allowed:
            raise ValueError(f"tls_server_config.{key}: unknown name {name!r}")
    return tuple(value)


def _bool(section: Mapping[str, Any], key: str, default: bool) -> bool:
    value = section.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ValueError(f"tls_server_config.{key} must be true or false")
    return value


def parse_tls(section: Mapping[str, Any], base: str) -> TlsFiles:
    """``tls_server_config`` checked and loaded once; ValueError (one line) for anything wrong."""
    unknown = set(section) - TLS_KEYS
    if unknown:
        raise ValueError(f"tls_server_config: unknown key {sorted(map(str, unknown))[0]!r}")
    values = {k: str(v) for k, v in section.items() if v is not None and not isinstance(v, (list, dict, bool))}
    for key in ("cert_file", "key_file", "client_ca_file"):
        if values.get(key) and not os.path.isabs(values[key]):
            values[key] = os.path.join(base, values[key])  # relative to the web config file, as the toolkit does
    for inline, path in (("cert", "cert_file"), ("key", "key_file"), ("client_ca", "client_ca_file")):
        if values.get(inline) and values.get(path):
            raise ValueError(f"tls_server_config: give {inline} or {path}, not both")
    if not (values.get("cert_file") or values.get("cert")) or not (values.get("key_file") or values.get("key")):
        raise ValueError("tls_server_config needs both cert_file and key_file (or cert and key inline)")
    auth = values.get("client_auth_type", "") or "NoClientCert"
    if auth in _UNVERIFIED_AUTH:
        raise ValueError(
            f"tls_server_config.client_auth_type {auth} accepts client certificates nobody verified; "
            "use RequireAndVerifyClientCert (or VerifyClientCertIfGiven) with client_ca_file"
        )
    if auth not in CLIENT_AUTH:
        raise ValueError(f"tls_server_config.client_auth_type {auth!r} is not supported (use {', '.join(CLIENT_AUTH)})")
    has_ca = bool(values.get("client_ca_file") or values.get("client_ca"))
    if auth != "NoClientCert" and not has_ca:
        raise ValueError(f"tls_server_config.client_auth_type {auth} needs client_ca_file")
    if auth == "NoClientCert" and has_ca:
        raise ValueError("tls_server_config: a client CA is configured without client_auth_type")
    for key in ("min_version", "max_version"):
        if values.get(key) and values[key] not in VERSIONS:
            raise ValueError(f"tls_server_config.{key} {values[key]!r} is not one of {', '.join(VERSIONS)}")
    sans = section.get("client_allowed_sans")
    if sans is not None and (not isinstance(sans, list) or not all(isinstance(s, str) for s in sans)):
        raise ValueError("tls_server_config.client_allowed_sans must be a list of names")
    files = TlsFiles(
        cert_file=values.get("cert_file", ""),
        key_file=values.get("key_file", ""),
        client_ca_file=values.get("client_ca_file", ""),
        client_auth_type=auth,
        min_version=values.get("min_version") or "TLS12",
        max_version=values.get("max_version", ""),
        cert=values.get("cert", ""),
        key=values.get("key", ""),
        client_ca=values.get("client_ca", ""),
        ciphers=_names(section, "cipher_suites", CIPHERS),
        prefer_server_ciphers=_bool(section, "prefer_server_cipher_suites", True),
        curves=_names(section, "curve_preferences", CURVES),
        allowed_sans=tuple(sans or ()),
    )
    if files.curves[1:]:
        log.info("web TLS: curve_preferences: one group is offered, the first listed that Python's ssl can set")
    files.build()  # a certificate or key that does not load is a start-up error
    return files
