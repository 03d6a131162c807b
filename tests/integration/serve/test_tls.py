"""The controller over TLS: a server certificate, and optionally client certificates for agents.

Certificates are made in the test with the openssl command line (a throwaway CA, a server certificate
for 127.0.0.1 and a client certificate), and the real controller (uvicorn) serves on a free port.
"""

from __future__ import annotations

import shutil
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gpufleet.controller.runtime import Runtime, build
from gpufleet.controller.settings import ControllerSettings, Role, SchedulerKind, TlsSettings, TokenConfig
from gpufleet.schedulers.sim import SimScheduler
from tests.conftest import require_service

TOKEN = "tls-viewer-token-0001"


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture
def certs(tmp_path: Path) -> Path:
    require_service(shutil.which("openssl") is not None, "the openssl command")
    d = tmp_path / "tls"
    d.mkdir()
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=test-ca",
             "-keyout", "ca.key", "-out", "ca.crt", cwd=d)
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n", encoding="utf-8")
    for name, cn in (("server", "127.0.0.1"), ("agent", "agent-r01")):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={cn}", "-keyout", f"{name}.key",
                 "-out", f"{name}.csr", cwd=d)
        ext = ["-extfile", "san.ext"] if name == "server" else []
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                 "-days", "2", "-out", f"{name}.crt", *ext, cwd=d)
    return d


def _serve(tmp_path: Path, tls: TlsSettings) -> Iterator[str]:
    settings = ControllerSettings(database_url=f"sqlite:///{tmp_path / 'c.db'}", host="127.0.0.1", port=0,
                                  scheduler=SchedulerKind.SIM, tls=tls,
                                  tokens=(TokenConfig(name="vera", role=Role.VIEWER, token=TOKEN),))
    rt: Runtime = build(settings, SimScheduler([]))
    ports: list[int] = []
    rt.start_api(in_thread=True, on_started=ports.append)
    try:
        yield f"https://127.0.0.1:{ports[0]}"
    finally:
        rt.shutdown()


def test_the_controller_serves_https_with_its_certificate(tmp_path: Path, certs: Path) -> None:
    for url in _serve(tmp_path, TlsSettings(certfile=certs / "server.crt", keyfile=certs / "server.key")):
        r = httpx.get(f"{url}/v1/health", headers={"Authorization": f"Bearer {TOKEN}"},
                      verify=ssl.create_default_context(cafile=str(certs / "ca.crt")))
        assert r.status_code == 200 and r.json()["status"] == "ok"
        with pytest.raises(httpx.ConnectError):  # a client that does not trust the CA refuses the server
            httpx.get(f"{url}/v1/health", verify=True)
        with pytest.raises(httpx.HTTPError):  # and plain HTTP is not served on the TLS port
            httpx.get(url.replace("https://", "http://") + "/v1/health", timeout=5)


def test_with_a_client_ca_only_clients_with_a_certificate_get_in(tmp_path: Path, certs: Path) -> None:
    tls = TlsSettings(certfile=certs / "server.crt", keyfile=certs / "server.key", client_ca=certs / "ca.crt")
    for url in _serve(tmp_path, tls):
        trusted = ssl.create_default_context(cafile=str(certs / "ca.crt"))
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"{url}/v1/health", headers={"Authorization": f"Bearer {TOKEN}"}, verify=trusted, timeout=5)
        with_cert = ssl.create_default_context(cafile=str(certs / "ca.crt"))
        with_cert.load_cert_chain(str(certs / "agent.crt"), str(certs / "agent.key"))
        r = httpx.get(f"{url}/v1/health", headers={"Authorization": f"Bearer {TOKEN}"}, verify=with_cert)
        assert r.status_code == 200


def test_half_a_tls_setting_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match="certfile and keyfile"):
        TlsSettings(certfile=Path("server.crt"))
    with pytest.raises(ValueError, match="client_ca"):
        TlsSettings(client_ca=Path("ca.crt"))
