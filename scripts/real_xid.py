"""A real XID from a real GPU through the real agent into a real controller, where the ends meet.

    PYTHONPATH=src python3 scripts/real_xid.py --out xid.json      (root, on a node with an NVIDIA GPU)

What only a GPU shows, and no simulated driver can: that the driver's own report of a fault reaches the
controller once, named and judged as the catalog says. In one run:

1. ``gpufleet controller serve`` (SQLite, the simulated scheduler, this node registered ``ready``) and
   ``gpufleet agent --device nvml --kmsg`` pushing to it, both as subprocesses;
2. a CUDA kernel that stores through an invalid pointer (the driver logs XID 31, an MMU fault, to the
   kernel log and delivers it on NVML's XID event set), then one that executes ``trap`` (XID 43 on driver
   580), each in its own process: an application's fault, which kills only its CUDA context;
3. what came of it: the driver's kernel-log lines, the agent's events (one per source: NVML's event set
   and the kernel log), the controller's judgement of each, which of them it counted and which it
   merged as the same fault from another source (``fault_of``; docs/DATA_FLOW.md step 11), and the node's
   state afterwards (an application's XID is ``restart_app``: the node stays in service).

The JSON holds every number; docs/benchmarks.md §agent records the result with date and device. Exit
status 0 when each XID code reached the controller as exactly one counted fault and the node stayed ready,
1 otherwise, 2 when there is no GPU to fault (no CuPy with a device). ``--simulate`` runs the same path
on a machine without a GPU: the simulated device with the same two XIDs injected into its NVML events
and its kernel ring (what the script itself is checked with; no driver is involved).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

ADMIN, AGENT = "real-xid-admin-token-0123456789", "real-xid-agent-token-0123456789"
NODE = "xid-node"
# Each kernel faults its own CUDA context: the store through a null-page pointer is an MMU fault (XID 31);
# ``trap`` stops the kernel (driver 580 on an H200 logged XID 43, "GPU stopped processing"; the script
# records whatever the driver says).
KERNELS = {
    "bad_store": r'extern "C" __global__ void k(int* p) { *((volatile int*)0x8) = 1; p[0] = 1; }',
    "trap": r'extern "C" __global__ void k(int* p) { p[0] = 1; asm volatile("trap;"); }',
}
FAULT = """
import sys, cupy
k = cupy.RawKernel(sys.argv[1], "k")
buf = cupy.zeros(1, dtype=cupy.int32)
k((1,), (1,), (buf,))
cupy.cuda.runtime.deviceSynchronize()
"""


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(what: str, check: Any, timeout: float, procs: list[subprocess.Popen[bytes]]) -> Any:
    end = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        dead = [p.args[3] for p in procs if p.poll() is not None]  # type: ignore[index]
        if dead:
            raise RuntimeError(f"{', '.join(map(str, dead))} exited while waiting for {what} (its log is below)")
        if time.monotonic() > end:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.2)


def _spawn(argv: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """``argv`` in ``log``'s directory, its output to ``log`` (the child keeps the file open)."""
    with log.open("wb") as f:
        return subprocess.Popen(argv, cwd=log.parent, env=env, stdout=f, stderr=subprocess.STDOUT)


def _dmesg_xids() -> list[str]:
    try:
        text = subprocess.run(["dmesg"], check=False, capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [f"(dmesg unavailable: {exc})"]
    return [ln for ln in text.splitlines() if "Xid" in ln or "NVRM" in ln]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="write the results here (JSON)")
    p.add_argument("--settle", type=float, default=30.0, help="at most this long for the events to arrive")
    p.add_argument("--simulate", action="store_true", help="the simulated device, XIDs injected (no GPU)")
    a = p.parse_args()
    if not a.simulate:
        try:
            probe = subprocess.run([sys.executable, "-c", "import cupy; assert cupy.cuda.runtime.getDeviceCount() > 0"],
                                   check=False, capture_output=True, text=True, timeout=120)
            why = (probe.stderr.strip().splitlines() or ["?"])[-1] if probe.returncode else ""
        except subprocess.TimeoutExpired:
            why = "CuPy did not answer in 120 s"
        if why:
            print(f"no GPU to fault: {why}", file=sys.stderr)
            return 2
    root = Path(tempfile.mkdtemp(prefix="real-xid-"))
    try:
        return _run(a, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _run(a: argparse.Namespace, root: Path) -> int:
    port = _port()
    import gpufleet  # the subprocesses run in a scratch directory: give them this package, wherever it is

    pkg = str(Path(gpufleet.__file__).resolve().parents[1])
    # no GPUFLEET_* setting from the caller's shell: it would override the config written here
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLEET_")}
    env |= {"PYTHONUNBUFFERED": "1", "PYTHONPATH": os.pathsep.join(p for p in (pkg, env.get("PYTHONPATH", "")) if p)}
    (root / "policy.toml").write_text("[policy]\nauto_repair = false\n")
    (root / "agent-token").write_text(AGENT + "\n")
    (root / "controller.toml").write_text("\n".join([
        f'database_url = "sqlite:///{root / "controller.db"}"', f'policy_file = "{root / "policy.toml"}"',
        'host = "127.0.0.1"', f"port = {port}", 'scheduler = "sim"', "",
        "[[tokens]]", 'name = "admin"', 'role = "admin"', f'token = "{ADMIN}"', "",
        "[[tokens]]", 'name = "agents"', 'role = "agent"', f'token = "{AGENT}"', 'nodes = ["*"]', ""]))
    (root / "sim.json").write_text(json.dumps({"nodes": [[NODE, False, False, ""]], "jobs": [], "next_job": 1,
                                               "effects": []}))
    (root / "agent.toml").write_text("heartbeat_s = 1\n[cadence]\nfast_s = 0.5\nslow_s = 1\n")
    cli = [sys.executable, "-m", "gpufleet.cli"]
    procs: list[subprocess.Popen[bytes]] = []
    out: dict[str, Any] = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    api = httpx.Client(base_url=f"http://127.0.0.1:{port}/v1", headers={"Authorization": f"Bearer {ADMIN}"},
                       timeout=10)
    try:
        procs.append(_spawn([*cli, "controller", "serve", "--config", str(root / "controller.toml"),
                             "--sim-state", str(root / "sim.json")], root / "controller.log", env))

        def answers() -> bool:
            try:
                return api.get("/health").status_code == 200
            except httpx.TransportError:
                return False

        _wait("the controller", answers, 60, procs)
        api.post("/nodes", json={"nodes": [{"id": NODE, "rack": "r01", "leaves": []}], "state": "ready"}) \
            .raise_for_status()
        # The faults' XIDs are the events from here on: a fresh agent reads the whole kernel ring, earlier
        # XIDs of this boot included, and kernel-log times are exact to the microsecond (decision 0117).
        since = datetime.now(UTC) - timedelta(seconds=1)
        device = ["--device", "sim", "--gpus", "2", "--kmsg-path", str(root / "sim-kmsg"),
                  "--inject", "xid:31@gpu0@+3", "--inject", "xid:43@gpu1@+4"] if a.simulate else ["--device", "nvml"]
        procs.append(_spawn([*cli, "agent", *device, "--controller", f"http://127.0.0.1:{port}",
                             "--token-file", str(root / "agent-token"), "--node", NODE, "--state-dir",
                             str(root / "agent"), "--config", str(root / "agent.toml"), "--kmsg",
                             "--metrics-port", "0", "--metrics-addr", "127.0.0.1"], root / "agent.log", env))
        _wait("the agent's first heartbeat",
              lambda: api.get(f"/nodes/{NODE}").json()["node"].get("last_heartbeat"), 60, procs)
        dmesg_before = set(_dmesg_xids())
        out["faults"] = {}
        for name, kernel in KERNELS.items():
            if a.simulate:
                out["faults"][name] = {"rc": None, "error": "simulated: injected by the agent"}
                continue
            r = subprocess.run([sys.executable, "-c", FAULT, kernel], check=False, capture_output=True, text=True,
                               timeout=60)
            out["faults"][name] = {"rc": r.returncode, "error": (r.stderr.strip().splitlines() or [""])[-1][:300]}
            time.sleep(1.0)  # the two faults apart in time (each its own process and context)

        def new_events() -> list[dict[str, Any]]:
            got = api.get("/events", params={"node": NODE, "limit": 1000}).json()
            return [e for e in got if datetime.fromisoformat(e["time"].replace("Z", "+00:00")) >= since]

        def arrived() -> bool:  # an XID per kernel, each from both sources (NVML's event set, the kernel log)
            seen: dict[int, set[str]] = {}
            for e in new_events():
                if e["kind"] == "xid":
                    seen.setdefault(e["code"], set()).add(e["source"])
            return len(seen) >= len(KERNELS) and all(len(v) >= 2 for v in seen.values())

        try:  # up to --settle seconds for them to arrive; what arrived is reported either way
            _wait("an XID per kernel from both sources", arrived, a.settle, procs)
        except TimeoutError as exc:
            out["wait"] = str(exc)
        out["kernel_log"] = [ln for ln in _dmesg_xids() if ln not in dmesg_before]
        events = new_events()
        out["events"] = [{k: e.get(k) for k in ("id", "kind", "code", "component", "source", "severity", "fault_of",
                                                 "message", "time", "attrs")} for e in events]
        out["node"] = api.get(f"/nodes/{NODE}").json()["node"]
        out["decisions"] = api.get("/decisions", params={"node": NODE, "limit": 100}).json()
        xids = [e for e in out["events"] if e["kind"] == "xid"]
        codes = sorted({e["code"] for e in xids})
        counted = {c: [e for e in xids if e["code"] == c and not e.get("fault_of")] for c in codes}
        out["summary"] = {
            "xid_codes": codes,
            "sources_per_code": {c: sorted({e["source"] for e in xids if e["code"] == c}) for c in codes},
            "counted_per_code": {c: len(v) for c, v in counted.items()},
            "node_state": out["node"].get("state"),
        }
        ok = ("wait" not in out and len(codes) >= len(KERNELS)
              and all(s == ["kmsg", "nvml"] for s in out["summary"]["sources_per_code"].values())
              and all(len(v) == 1 for v in counted.values()) and out["node"].get("state") == "ready")
        out["summary"]["ok"] = ok
        return 0 if ok else 1
    except Exception as exc:  # what went wrong goes in the report, with the logs, and the exit status says so
        out["error"] = repr(exc)
        return 1
    finally:
        api.close()
        for proc in reversed(procs):
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
        for name in ("controller.log", "agent.log"):
            f = root / name
            out[name] = f.read_text(errors="replace")[-6000:] if f.exists() else ""
        a.out.write_text(json.dumps(out, indent=1, default=str))
        print(json.dumps(out.get("summary", {"error": out.get("error")}), indent=1))


if __name__ == "__main__":
    sys.exit(main())
