"""Replicas with ``[tls] client_ca``: a follower presents a client certificate when it forwards to the
leader, while who the caller is stays with the caller's bearer token (docs/decisions/0101).

Real replica processes (child.py) on the test PostgreSQL, serving HTTPS with client certificates
required; certificates made with openssl (tests/integration/tlscerts.py).
"""

from __future__ import annotations

import ssl
import subprocess
import sys
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from tests.integration import tlscerts
from tests.integration.ha.replicas import HEADERS, ROOT, Replica, leader, settled

pytestmark = [pytest.mark.ha, pytest.mark.postgres]
AGENT_TOKEN = "ha-agent-token-r01-n001-0123456789"
NODE, OTHER = "r01-n001", "r02-n031"  # (child.py's simulated fleet) the agent token's node, and another


def settings(certs: Path, *, client_ca: str = "ca.crt", forward: str = "", server: str = "server") -> str:
    """A replica's extra settings (child.py): HTTPS requiring client certificates signed by ``client_ca``,
    forwarding with the ``forward`` certificate (""= the default: the replica's own), an agent token."""
    text = (f'[tls]\ncertfile = "{certs / server}.crt"\nkeyfile = "{certs / server}.key"\n'
            f'client_ca = "{certs / client_ca}"\n'
            f'[ha]\nforward_ca = "{certs / "ca.crt"}"\n')
    if forward:
        text += f'forward_certfile = "{certs / forward}.crt"\nforward_keyfile = "{certs / forward}.key"\n'
    return text + f'[[tokens]]\nname = "agent-r01-n001"\nrole = "agent"\ntoken = "{AGENT_TOKEN}"\nnodes = ["{NODE}"]\n'


def client_tls(certs: Path, cert: str | None = "agent") -> ssl.SSLContext:
    """What an agent uses: the CA, and its client certificate (None: none)."""
    ctx = ssl.create_default_context(cafile=str(certs / "ca.crt"))
    if cert is not None:
        ctx.load_cert_chain(str(certs / f"{cert}.crt"), str(certs / f"{cert}.key"))
    return ctx


def event(eid: str, node: str) -> dict[str, object]:
    return {"id": eid, "node": node, "kind": "xid", "code": 79, "time": datetime.now(UTC).isoformat()}


@pytest.fixture
def replica(tmp_path: Path, pg_url: str, certs: Path) -> Iterator[Callable[[str, str], Replica]]:
    """Makes a replica with these extra settings (not started); every one is killed at the end."""
    made: list[Replica] = []

    def make(name: str, extra: str) -> Replica:
        made.append(Replica(tmp_path, name, pg_url, 2.0, 0.5, settings=extra, tls=client_tls(certs)))
        return made[-1]
    yield make
    for r in made:
        r.close()


def test_an_agent_reports_through_a_follower_and_keeps_its_node_restriction(
        replica: Callable[[str, str], Replica], certs: Path) -> None:
    pair = [replica(name, settings(certs)) for name in ("a", "b")]  # forwarding with the replica's own certificate
    for r in pair:
        r.start()
    assert all(r.serving() for r in pair), [r.log_tail() for r in pair]
    lead, _epoch = settled(pair)
    [follower] = [r for r in pair if r is not lead]
    assert (follower.health() or {}).get("role") == "follower"
    agent = {"Authorization": f"Bearer {AGENT_TOKEN}"}
    with httpx.Client(base_url=f"{follower.base}/v1", headers=agent, verify=client_tls(certs), timeout=10) as http:
        r = http.post("/events", json={"events": [event("e-own", NODE)]})
        assert r.status_code == 202, r.text  # forwarded, with the follower's client certificate
        refused = http.post("/events", json={"events": [event("e-other", OTHER)]})
        assert refused.status_code == 403, refused.text  # the leader still applies the agent token's nodes
        assert f"may not report for {OTHER!r}" in refused.json()["detail"]
        beat = http.post(f"/nodes/{OTHER}/heartbeat", json={"time": datetime.now(UTC).isoformat()})
        assert beat.status_code == 403, beat.text
    with httpx.Client(base_url=f"{lead.base}/v1", headers=HEADERS, verify=client_tls(certs), timeout=10) as http:
        assert [e["id"] for e in http.get("/events", params={"node": NODE}).json()] == ["e-own"]
        assert http.get("/events", params={"node": OTHER}).json() == []
    with pytest.raises(httpx.TransportError):  # no client certificate: the follower's own TLS refuses it
        httpx.post(f"{follower.base}/v1/events", json={"events": [event("e-none", NODE)]}, headers=agent,
                   verify=client_tls(certs, None), timeout=10)
    # three requests passed on, each answered by the leader (its 202 and 403s): counted as forwarded
    assert forwarded(follower, certs) == {"forwarded": 3}


def forwarded(r: Replica, certs: Path) -> dict[str, int]:
    """The replica's gpufleet_forwarded_requests_total, by outcome (its /metrics, read as an admin)."""
    text = httpx.get(f"{r.base}/metrics", headers=HEADERS, verify=client_tls(certs), timeout=10).text
    prefix = 'gpufleet_forwarded_requests_total{outcome="'
    return {line[len(prefix):].split('"', 1)[0]: int(float(line.rsplit(" ", 1)[1]))
            for line in text.splitlines() if line.startswith(prefix)}


def test_a_forward_certificate_the_leader_refuses_is_a_502_naming_the_setting(
        replica: Callable[[str, str], Replica], certs: Path) -> None:
    # the follower trusts a second CA (a rotation half done) and forwards with a certificate from it;
    # the leader trusts only the first
    tlscerts.make_ca(certs, "ca2")
    tlscerts.issue(certs, "outsider", "replica-b", ca="ca2")
    (certs / "both.crt").write_text((certs / "ca.crt").read_text() + (certs / "ca2.crt").read_text())
    a = replica("a", settings(certs))
    a.start()
    assert a.serving(), a.log_tail()
    assert leader([a])[0] is a
    b = replica("b", settings(certs, client_ca="both.crt", forward="outsider"))
    b.start()
    assert b.serving(), b.log_tail()
    settled([a, b])
    agent = {"Authorization": f"Bearer {AGENT_TOKEN}"}
    with httpx.Client(base_url=f"{b.base}/v1", headers=agent, verify=client_tls(certs), timeout=10) as http:
        r = http.post("/events", json={"events": [event("e1", NODE)]})
        assert r.status_code == 502, r.text
        detail = r.json()["detail"]
        assert f"TLS with the leader at {a.base} failed" in detail
        assert "refused this replica's client certificate; check this replica's ha.forward_certfile" in detail
        assert str(certs) not in detail  # the files are named in the follower's log, not to the caller
    assert f"ha.forward_certfile = {certs / 'outsider.crt'}" in b.log_tail()
    assert forwarded(b, certs) == {"tls_refused": 1}
    with httpx.Client(base_url=f"{a.base}/v1", headers=HEADERS, verify=client_tls(certs), timeout=10) as http:
        assert http.get("/events", params={"node": NODE}).json() == []


@pytest.mark.parametrize(("case", "says"), [
    ("server-only", "tls.certfile (the default of ha.forward_certfile): got '{certs}/serveronly.crt', expected a "
                    "client certificate the leader accepts"),
    ("missing", "ha.forward_certfile: got '{certs}/missing.crt', expected an existing, readable PEM file"),
    ("other-ca", "ha.forward_certfile: got '{certs}/outsider.crt', expected a client certificate the leader accepts"),
], ids=["server-only", "missing", "other-ca"])
def test_a_replica_without_a_usable_forward_certificate_refuses_to_start(
        tmp_path: Path, pg_url: str, certs: Path, case: str, says: str) -> None:
    tlscerts.issue(certs, "serveronly", "127.0.0.1", ext=f"{tlscerts.SERVER_SAN}\nextendedKeyUsage=serverAuth")
    tlscerts.make_ca(certs, "ca2")
    tlscerts.issue(certs, "outsider", "replica-b", ca="ca2")
    extra = {"server-only": settings(certs, server="serveronly"), "missing": settings(certs, forward="missing"),
             "other-ca": settings(certs, forward="outsider")}[case]
    config = tmp_path / "c.toml"
    config.write_text(f'database_url = "{pg_url}"\nscheduler = "sim"\nport = 0\n{extra}', encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "gpufleet.cli", "controller", "serve", "--config", str(config)],
                          check=False, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr[-2000:]
    assert says.format(certs=certs) in done.stderr, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    if case == "server-only":
        assert "certificate purpose" in done.stderr  # OpenSSL 3: "unsuitable", 1.1: "unsupported"
