"""Under mutual TLS (RequireAndVerifyClientCert) the probe paths stay open to a client without a
certificate, as the kubelet's HTTPS probes are; every other path needs a verified client certificate.

Requiring the certificate in the handshake itself would fail the kubelet's probes on every node running
deploy/components/web-tls with mTLS: the pods would be restarted for ever.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support import wait_until
from tests.support.tls import make_tls
from tests.unit.web.test_web_tls import PASSWORD, get, web_file


def test_probes_need_no_client_certificate_the_metrics_do(serve: Any, tmp_path: Path, tls: dict[str, str]) -> None:
    srv = serve(web_file(tmp_path, tls, mtls=True))
    base = f"https://127.0.0.1:{srv.port}"
    mine = (tls["client_cert"], tls["client_key"])
    assert get(base + "/healthz", tls["ca"])[0] == 200  # as the kubelet probes: no client certificate
    assert get(base + "/readyz", tls["ca"])[0] == 200
    for path in ("/metrics", "/"):
        assert get(base + path, tls["ca"], ("prometheus", PASSWORD))[0] == 403  # right password, no certificate
    status, body, _ = get(base + "/metrics", tls["ca"], ("prometheus", PASSWORD), cert=mine)
    assert status == 200 and b"gpu_power_watts" in body
    assert get(base + "/metrics", tls["ca"], cert=mine)[0] == 401  # the certificate does not stand for the password


def test_a_client_certificate_from_another_ca_is_refused_in_the_handshake(
    serve: Any,
    tmp_path: Path,
    tls: dict[str, str],
) -> None:
    other = make_tls(tmp_path / "other")
    srv = serve(web_file(tmp_path, tls, mtls=True))
    with pytest.raises(OSError):
        get(f"https://127.0.0.1:{srv.port}/healthz", tls["ca"], cert=(other["client_cert"], other["client_key"]))
    # counted on the server's connection thread, which may finish after the client saw the refusal
    assert wait_until(lambda: srv.stats.tls_failures >= 1, 5)
