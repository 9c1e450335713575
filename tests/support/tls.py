"""Certificates for the TLS tests: a private CA, a server certificate for 127.0.0.1, client certificates
(the openssl CLI, which .ci/run installs), and the one ``tls`` fixture that makes them once per session."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest


def make_tls(dirpath: Path, client: bool = True) -> dict[str, str]:
    """A private CA, a server certificate for 127.0.0.1, and a client certificate (openssl CLI)."""
    d = dirpath
    d.mkdir(parents=True, exist_ok=True)

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=d)

    run(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "2",
        "-subj",
        "/CN=test-ca",
    )
    for name, ext in (("server", "subjectAltName=IP:127.0.0.1"), ("client", "extendedKeyUsage=clientAuth")):
        if name == "client" and not client:
            continue
        run(
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            f"{name}.key",
            "-out",
            f"{name}.csr",
            "-subj",
            f"/CN={name}",
        )
        (d / f"{name}.ext").write_text(ext + "\n")
        run(
            "x509",
            "-req",
            "-in",
            f"{name}.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            f"{name}.crt",
            "-days",
            "2",
            "-extfile",
            f"{name}.ext",
        )
    os.chmod(d / "server.key", 0o644)
    return {
        "ca": str(d / "ca.crt"),
        "cert": str(d / "server.crt"),
        "key": str(d / "server.key"),
        "client_cert": str(d / "client.crt"),
        "client_key": str(d / "client.key"),
        "ca_key": str(d / "ca.key"),
    }


def client_cert(tls: dict[str, str], folder: Path, san: str) -> tuple[str, str]:
    """A client certificate signed by ``tls``'s CA with ``san`` as its subject alternative name, in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=folder)

    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "san.key", "-out", "san.csr", "-subj", "/CN=san")
    (folder / "san.ext").write_text(f"extendedKeyUsage=clientAuth\nsubjectAltName={san}\n")
    run("x509", "-req", "-in", "san.csr", "-CA", tls["ca"], "-CAkey", tls["ca_key"], "-CAcreateserial",
        "-CAserial", "san.srl", "-out", "san.crt", "-days", "2", "-extfile", "san.ext")  # fmt: skip
    return str(folder / "san.crt"), str(folder / "san.key")


@pytest.fixture(scope="session")
def tls(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """One CA with server and client certificates for the session (per pytest-xdist worker): treat as read-only."""
    return make_tls(tmp_path_factory.mktemp("tls"))
