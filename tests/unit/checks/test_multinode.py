"""The multinode level for real: 4 processes on 127.0.0.1 launched the way torchrun does (RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT), each playing one node over gloo; rank 2 is made slow with the
test-only delay knob. Rank 0's report must blame that node and only it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from gpufleet.checks.collective import free_port
from gpufleet.checks.multinode import node_results
from gpufleet.checks.pairing import Localisation, PairResult

GPUFLEET = str(Path(sys.executable).parent / "gpufleet")


def _launch(world: int, delay: str, tmp: Path) -> list[subprocess.CompletedProcess[str]]:
    port = free_port()
    procs = []
    for rank in range(world):
        env = dict(os.environ)
        env.update(
            {
                "RANK": str(rank),
                "WORLD_SIZE": str(world),
                "LOCAL_RANK": "0",
                "LOCAL_WORLD_SIZE": "1",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "GPUFLEET_NODE_NAME": f"node{rank}",
                "GPUFLEET_CHECK_TEST_DELAY": delay,
            }
        )
        out = (tmp / f"{rank}.out").open("w")
        err = (tmp / f"{rank}.err").open("w")
        # The bar at 10 % of the best pair (--tolerance 0.9), not the CPU default's 20 %: on a loaded 2-core
        # box (other test processes) a healthy pair measured 15 % of the best once. The slow peer is at
        # about 1 %: what is tested is the localisation, not the default tolerance.
        cmd = [GPUFLEET, "check", "--level", "multinode", "--device", "cpu", "--json", "--tolerance", "0.9"]
        procs.append((subprocess.Popen(cmd, env=env, stdout=out, stderr=err, text=True), out, err))
    done = []
    for rank, (p, out, err) in enumerate(procs):
        p.wait(timeout=300)
        out.close()
        err.close()
        done.append(
            subprocess.CompletedProcess(
                p.args, p.returncode, (tmp / f"{rank}.out").read_text(), (tmp / f"{rank}.err").read_text()
            )
        )
    return done


def test_four_process_gloo_run_localises_the_injected_slow_peer(tmp_path: Path) -> None:
    procs = _launch(4, "2=0.2", tmp_path)
    assert procs[0].returncode == 1, procs[0].stderr[-2000:]  # a node failed
    assert all(p.returncode == 1 for p in procs)  # every rank agrees on the verdict
    assert all(p.stdout == "" for p in procs[1:])  # only rank 0 reports
    report = json.loads(procs[0].stdout)
    detail = json.dumps(report["results"], indent=1)
    pairs = {r["node"]: r for r in report["results"] if r["check"] == "multinode_pair"}
    assert set(pairs) == {"node0", "node1", "node2", "node3"}
    assert pairs["node2"]["status"] == "fail", detail
    assert pairs["node2"]["attrs"]["peer"] != "node3", detail  # re-tested against a known-good node
    assert [n for n, r in pairs.items() if r["status"] != "pass"] == ["node2"], detail
    (allreduce,) = [r for r in report["results"] if r["check"] == "multinode_allreduce"]
    assert allreduce["value"] > 0 and allreduce["unit"] == "GB/s"


def test_runs_under_real_torchrun_with_its_agent_store() -> None:
    torchrun = str(Path(sys.executable).parent / "torchrun")
    cmd = [
        torchrun,
        "--nnodes=1",
        "--nproc-per-node=2",
        f"--master-port={free_port()}",
        "--no-python",
        GPUFLEET,
        "check",
        "--level",
        "multinode",
        "--device",
        "cpu",
        "--json",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)  # only rank 0 printed
    (res,) = report["results"]
    assert (
        res["check"] == "multinode_allreduce"
        and res["attrs"]["ranks"] == "2"
        and res["attrs"]["nodes"] == "1"
    )
    assert report["skipped"] == ["multinode_pair: needs at least 2 nodes in the allocation"]


def test_node_results_report_blame_clearance_and_links() -> None:
    loc = Localisation(
        reference=100.0,
        bar=75.0,
        pairs=(
            PairResult("a", "b", 100.0, True, "first"),
            PairResult("c", "d", 20.0, False, "first"),
            PairResult("c", "a", 19.0, False, "second"),
            PairResult("d", "b", 99.0, True, "second"),
        ),
        good=("a", "b"),
        blamed=("c",),
        cleared=("d",),
        inconclusive=(),
        blamed_links=(),
    )
    res = {r.node: r for r in node_results(loc, ["a", "b", "c", "d"])}
    assert (
        res["c"].status.value == "fail" and res["c"].value == 19.0 and "known-good peer a" in res["c"].message
    )
    assert res["d"].status.value == "pass" and res["d"].value == 99.0
    assert res["a"].value == 100.0 and dict(res["a"].attrs)["peer"] == "b"
    link = Localisation(
        reference=100.0,
        bar=75.0,
        pairs=(PairResult("a", "b", 30.0, False, "first"),),
        good=(),
        blamed=(),
        cleared=("a", "b"),
        inconclusive=(),
        blamed_links=(("a", "b"),),
    )
    out = node_results(link, [])
    assert [(r.check, r.node, dict(r.attrs)["peer"]) for r in out] == [("multinode_link", "a", "b")]
