"""``gpufleet tenancy pkeys``: OpenSM partitions.conf from a real topology file and real agents'
inventories (``gpufleet agent --device sim --print-inventory``: the HCA port GUIDs the InfiniBand sysfs
collector reads), checked against OpenSM's documented grammar and parsed by OpenSM itself — Debian's
``opensm`` run against ``ibsim`` (an InfiniBand fabric simulator, Debian ``ibsim-utils``) — which
reports ``PARSE ERROR`` for a file it does not accept."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gpufleet.domain.partitions import check_grammar
from tests.conftest import require_service
from tests.e2e.harness import ADMIN_TOKEN, AGENT_TOKEN, Fleet, child_env, gpufleet_argv, run_cli

pytestmark = pytest.mark.tenancy

NODES = ["r01-n01", "r01-n02", "r01-n03", "r01-n04"]
CONFIG = """scheduler = "sim"
[[tenant]]
name = "acme"
nodes = ["r01-n0[12]"]
pkey = "0x0a01"

[[tenant]]
name = "globex"
nodes = ["r01-n03", "r01-n04"]
pkey = "0x0a02"
"""
UMAD2SIM = Path("/usr/lib/x86_64-linux-gnu/umad2sim/libumad2sim.so")
NET = """Switch 8 "Switch1"
[1] "Hca1"[1]
[2] "Hca2"[1]

Hca 1 "Hca1"
[1] "Switch1"[1]

Hca 1 "Hca2"
[1] "Switch1"[2]
"""


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, list[int]]]:
    """The command's output, and each node's port GUIDs from its agent's inventory."""
    d = tmp_path_factory.mktemp("pkeys")
    run_cli("topology", "generate", "hgx", "--nodes", "4", "--out", str(d / "topo.json"))
    guids: dict[str, list[int]] = {}
    with (d / "inventories.jsonl").open("w") as out:
        for n in NODES:
            inv = json.loads(run_cli("agent", "--device", "sim", "--node", n, "--print-inventory").stdout)
            out.write(json.dumps(inv) + "\n")
            guids[n] = [int(p["guid"], 16) for nic in inv["nics"] for p in nic["ports"]]
    (d / "controller.toml").write_text(CONFIG)
    text = run_cli("tenancy", "pkeys", "--topology", str(d / "topo.json"), "--config", str(d / "controller.toml"),
                   "--inventories", str(d / "inventories.jsonl")).stdout
    return text, guids


def _partitions(text: str) -> dict[str, set[int]]:
    out: dict[str, set[int]] = {}
    for st in re.sub(r"#.*", "", text).split(";"):
        if ":" in st:
            head, _, ports = st.partition(":")
            members = {int(p.split("=")[0], 16) for p in ports.replace("\n", " ").split(",")
                       if p.strip().startswith("0x")}
            out.setdefault(head.split(",")[0].strip(), set()).update(members)
    return out


def test_each_tenant_gets_its_nodes_port_guids_and_nothing_else(generated: tuple[str, dict[str, list[int]]]) -> None:
    text, guids = generated
    parts = _partitions(text)
    assert set(parts) == {"Default=0x7fff", "acme=0x0a01", "globex=0x0a02"}
    assert parts["acme=0x0a01"] == set(guids["r01-n01"] + guids["r01-n02"]) and len(parts["acme=0x0a01"]) == 16
    assert parts["globex=0x0a02"] == set(guids["r01-n03"] + guids["r01-n04"])
    assert "ALL=limited, SELF=full" in text, "every other port only a limited member of the default partition"
    assert check_grammar(text) == []


def test_the_grammar_check_finds_what_opensm_would_refuse() -> None:
    good = "Default=0x7fff, ipoib : ALL=limited, SELF=full ;\nacme=0x0a01, ipoib, defmember=full : 0x1, 0x2=full ;\n"
    assert check_grammar(good) == []
    for bad, why in [("acme=0x0a01 : 0x1", "does not end with ';'"),
                     ("acme=0x0a01 0x1 ;", "no ':'"),
                     ("acme=0x1ffff : 0x1 ;", "not a 16-bit number"),
                     ("acme=0x0a01, ipoib, defmember=most : 0x1 ;", "flag"),
                     ("acme=0x0a01 : r01-n01 ;", "is not a GUID"),
                     ("acme=0x0a01 : 0x1=owner ;", "membership"),
                     ("a=0x0a01 : 0x1 ; b=0x8a01 : 0x2 ;", "also partition 'a'"),
                     ("acme=0x0a01 : " + ", ".join(f"0x{i:016x}" for i in range(300)) + " ;", "characters")]:
        problems = check_grammar(bad)
        assert problems and why in problems[0], (bad[:60], problems)


@pytest.fixture
def ibsim(tmp_path: Path) -> Iterator[Path]:
    require_service(shutil.which("opensm") is not None and shutil.which("ibsim") is not None
                    and UMAD2SIM.exists(), "OpenSM and ibsim (Debian packages opensm, ibsim-utils)")
    (tmp_path / "net").write_text(NET)
    proc = subprocess.Popen(["ibsim", "-s", str(tmp_path / "net")], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, cwd=tmp_path, text=True)
    assert proc.stdout is not None
    try:
        for line in proc.stdout:  # until it listens (or exits: EOF)
            if "simulator ready" in line:
                break
        else:
            raise AssertionError(f"ibsim exited {proc.wait()} before it was ready")
        threading.Thread(target=proc.stdout.read, daemon=True).start()  # keep its pipe from filling
        yield tmp_path
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def _opensm(d: Path, conf: str) -> str:
    """One sweep of OpenSM over the simulated fabric with ``conf`` as its partitions.conf; its log."""
    (d / "partitions.conf").write_text(conf)
    log = d / "opensm.log"
    log.unlink(missing_ok=True)
    env = {**os.environ, "LD_PRELOAD": str(UMAD2SIM)}
    subprocess.run(["opensm", "--once", "-P", str(d / "partitions.conf"), "-f", str(log), "-V"], env=env,
                   cwd=d, capture_output=True, timeout=60, check=False)
    return log.read_text(errors="replace")


def test_opensm_parses_the_generated_file(generated: tuple[str, dict[str, list[int]]], ibsim: Path) -> None:
    text, guids = generated
    log = _opensm(ibsim, text)
    assert "osm_prtn_make_partitions" in log or "osm_prtn" in log, "OpenSM read a partition configuration"
    assert "PARSE ERROR" not in log and "Partition configuration in error" not in log, \
        [line for line in log.splitlines() if "PARSE" in line or "in error" in line][:5]
    # every tenant port went through OpenSM's parser (none is in the simulated fabric: "not found")
    seen = {int(m, 16) for m in re.findall(r"osm_prtn_add_port: port (0x[0-9a-f]+) not found", log)}
    assert seen == {g for n in NODES for g in guids[n]}
    broken = _opensm(ibsim, text.replace("globex=0x0a02, ipoib, defmember=full :", "globex=0x0a02, ipoib"))
    assert "PARSE ERROR" in broken or "Partition configuration in error" in broken, "the check can fail"


def test_live_owners_leave_a_node_being_moved_out_of_every_partition(tmp_path: Path) -> None:
    """``--live``: owners and inventories from a running controller; a node mid-move is in no partition."""
    fleet = Fleet(tmp_path)
    try:
        config = CONFIG.replace('scheduler = "sim"\n', "") + '[tenancy]\nwipe = "script:reimage"\n'
        ctl = fleet.controller(nodes=NODES, extra_config=config)
        run_cli("topology", "generate", "hgx", "--nodes", "4", "--out", str(tmp_path / "topo.json"))
        guids = {}
        for n in NODES:
            inv = json.loads(run_cli("agent", "--device", "sim", "--node", n, "--print-inventory").stdout)
            guids[n] = {int(p["guid"], 16) for nic in inv["nics"] for p in nic["ports"]}
            r = httpx.put(f"{ctl.api.url}/nodes/{n}/inventory", json=inv,
                          headers={"Authorization": f"Bearer {AGENT_TOKEN}"}, timeout=10)
            assert r.status_code == 200, r.text
        ctl.api.post("/nodes/r01-n01/tenant", {"to": "globex"})  # released now; handed over much later
        (tmp_path / "token").write_text(ADMIN_TOKEN)
        (tmp_path / "controller.toml").write_text(CONFIG)
        out = subprocess.run(gpufleet_argv("tenancy", "--url", ctl.api.url.removesuffix("/v1"), "--token-file",
                                           str(tmp_path / "token"), "pkeys", "--topology", str(tmp_path / "topo.json"),
                                           "--config", str(tmp_path / "controller.toml"), "--live"),
                             check=False, capture_output=True, text=True, timeout=60, env=child_env())
        assert out.returncode == 0, out.stderr
        parts = _partitions(out.stdout)
        assert parts["acme=0x0a01"] == guids["r01-n02"], "r01-n01 is being moved: in neither partition"
        assert parts["globex=0x0a02"] == guids["r01-n03"] | guids["r01-n04"]
    finally:
        fleet.close()
