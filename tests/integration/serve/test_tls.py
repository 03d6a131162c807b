"""The controller over TLS: a server certificate, and optionally client certificates for agents.

Certificates are made in the test with the openssl command line (the ``certs`` fixture,
tests/integration/tlscerts.py: a throwaway CA, a server certificate for 127.0.0.1 and a client
certificate), and the real controller (uvicorn) serves on a free port. A real ``gpufleet agent`` process
pushes to it over mutual TLS with its ``ca_file``/``client_cert``/``client_key``.
"""

from __future__ import annotations

import asyncio
import ssl
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

import httpx
import pytest

from gpufleet.agent.push import ControllerClient
from gpufleet.agent.tls import client_tls
from gpufleet.controller.api.leaderclient import LeaderClient, LeaderTlsRefused
from gpufleet.controller.runtime import Runtime, build
from gpufleet.controller.settings import (
    ControllerSettings,
    Role,
    SchedulerKind,
    TlsSettings,
    TokenConfig,
    load_settings,
)
from gpufleet.controller.store.repo import Page, Store
from gpufleet.domain.errors import InvalidInput
from gpufleet.domain.fleet import Fleet, Gpu, Node
from gpufleet.schedulers.sim import SimScheduler
from tests.integration import tlscerts
from tests.integration.agent.harness import wait_for

TOKEN = "tls-viewer-token-0001"
NODE = "r01-n007"
AGENT_TOKEN = "tls-agent-token-r01-n007-0001"


def _serve(tmp_path: Path, tls: TlsSettings, runtimes: list[Runtime] | None = None) -> Iterator[str]:
    settings = ControllerSettings(database_url=f"sqlite:///{tmp_path / 'c.db'}", host="127.0.0.1", port=0,
                                  scheduler=SchedulerKind.SIM, tls=tls,
                                  tokens=(TokenConfig(name="vera", role=Role.VIEWER, token=TOKEN),
                                          TokenConfig(name="agent", role=Role.AGENT, token=AGENT_TOKEN,
                                                      nodes=(NODE,))))
    rt: Runtime = build(settings, SimScheduler([NODE]))
    gpus = tuple(Gpu(f"{NODE}-gpu{i}", i, f"GPU-{i:04d}") for i in range(2))
    rt.controller.register_fleet(Fleet.of([Node(id=NODE, rack="r01", gpus=gpus)]))
    if runtimes is not None:
        runtimes.append(rt)
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
    with pytest.raises(InvalidInput, match="forward_certfile is set but forward_keyfile is not"):
        load_settings(None, scheduler="sim", ha={"forward_certfile": "/etc/gpufleet/forward.crt"})


def test_the_forwarding_client_presents_its_certificate_and_names_a_tls_refusal(tmp_path: Path, certs: Path) -> None:
    """LeaderClient (a follower's connection to the leader) against a real controller requiring client
    certificates: with one it is answered; trusting another CA, the failure is a TLS refusal, not 'unreachable'."""
    tlscerts.make_ca(certs, "ca2")
    tls = TlsSettings(certfile=certs / "server.crt", keyfile=certs / "server.key", client_ca=certs / "ca.crt")
    cert = (str(certs / "agent.crt"), str(certs / "agent.key"))
    auth = [(b"authorization", f"Bearer {TOKEN}".encode())]

    async def health(client: LeaderClient, url: str) -> int:
        try:
            return (await client.request(url, "GET", "/v1/health", auth, b"")).status
        finally:
            await client.close()
    for url in _serve(tmp_path, tls):
        assert asyncio.run(health(LeaderClient(10, ca=str(certs / "ca.crt"), cert=cert), url)) == 200
        with pytest.raises(LeaderTlsRefused, match="self-signed certificate in certificate chain"):
            asyncio.run(health(LeaderClient(10, ca=str(certs / "ca2.crt"), cert=cert), url))


def test_a_real_agent_process_pushes_over_mutual_tls(tmp_path: Path, certs: Path) -> None:
    tls = TlsSettings(certfile=certs / "server.crt", keyfile=certs / "server.key", client_ca=certs / "ca.crt")
    runtimes: list[Runtime] = []
    for url in _serve(tmp_path, tls, runtimes):
        (tmp_path / "token").write_text(AGENT_TOKEN + "\n")
        (tmp_path / "agent.toml").write_text(
            f'controller = "{url}"\n'
            f'token_file = "{tmp_path / "token"}"\n'
            f'ca_file = "{certs / "ca.crt"}"\n'
            f'client_cert = "{certs / "agent.crt"}"\n'
            f'client_key = "{certs / "agent.key"}"\n'
            f'state_dir = "{tmp_path / "state"}"\n'
            "heartbeat_s = 1\npush_backoff_base_s = 0.1\npush_backoff_cap_s = 1\n",
            encoding="utf-8")
        agent = subprocess.Popen(
            [sys.executable, "-m", "gpufleet.cli", "agent", "--config", str(tmp_path / "agent.toml"),
             "--node", NODE, "--device", "sim", "--gpus", "2", "--no-kmsg", "--metrics-port", "0",
             "--metrics-addr", "127.0.0.1", "--inject", "xid:79@gpu1", "--duration", "60"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            wait_for(partial(_xid_arrived, agent, runtimes[0].controller.store),
                     "the agent's XID 79 stored by the controller over mutual TLS", timeout_s=60)
        finally:
            agent.terminate()
            agent.wait(timeout=30)


def _xid_arrived(agent: subprocess.Popen[str], store: Store) -> bool:
    if agent.poll() is not None:
        said = agent.stderr.read() if agent.stderr else ""
        raise AssertionError(f"the agent exited {agent.returncode}: {said[-2000:]}")
    return any(e.code == 79 for e in store.events(node=NODE, kind="xid", page=Page(limit=10)))


def test_an_agent_without_its_client_certificate_is_refused_and_keeps_its_events(
        tmp_path: Path, certs: Path) -> None:
    tls = TlsSettings(certfile=certs / "server.crt", keyfile=certs / "server.key", client_ca=certs / "ca.crt")
    for url in _serve(tmp_path, tls):
        now = datetime.now(UTC)
        without = ControllerClient(url, AGENT_TOKEN, verify=client_tls(url, certs / "ca.crt"))
        refused = without.heartbeat(NODE, now)
        assert not refused.ok and refused.status is None and refused.error  # the handshake, not a 4xx
        with_cert = ControllerClient(url, AGENT_TOKEN, verify=client_tls(url, certs / "ca.crt", certs / "agent.crt",
                                                                         certs / "agent.key"))
        assert with_cert.heartbeat(NODE, now).ok


def test_an_agent_that_does_not_trust_the_controllers_ca_refuses_it(tmp_path: Path, certs: Path) -> None:
    for url in _serve(tmp_path, TlsSettings(certfile=certs / "server.crt", keyfile=certs / "server.key")):
        system_store = ControllerClient(url, AGENT_TOKEN, verify=client_tls(url))
        r = system_store.heartbeat(NODE, datetime.now(UTC))
        assert not r.ok and r.status is None and "CERTIFICATE_VERIFY_FAILED" in r.error
