"""The TLS context for mqtts:// (the agent's, and the bridge's towards its broker), and the one-line reason
of a TLS or OS error."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpu_exporter.config.parsers import ConfigError

if TYPE_CHECKING:
    import ssl

__all__ = ["error_reason", "tls_context"]


def tls_context(ca_file: str = "", cert_file: str = "", key_file: str = "") -> ssl.SSLContext:
    """The TLS settings for mqtts:// from the --mqtt.tls.* files ("": the system's CA store, no client
    certificate), or ConfigError naming the file that does not load."""
    import ssl

    try:
        ctx = ssl.create_default_context(cafile=ca_file or None)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"--mqtt.tls.ca-file={ca_file}: cannot load: {error_reason(exc)}") from None
    if cert_file:
        try:
            ctx.load_cert_chain(cert_file, key_file or None)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(
                f"--mqtt.tls.cert-file={cert_file}: cannot load the certificate and key: {error_reason(exc)}"
            ) from None
    return ctx


def error_reason(exc: BaseException) -> str:
    """The useful part of an OSError or SSL error, for one-line messages."""
    import ssl

    if isinstance(exc, ssl.SSLCertVerificationError):
        return exc.verify_message or str(exc)
    if isinstance(exc, ssl.SSLError):
        return exc.reason or str(exc)
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__
