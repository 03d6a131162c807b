"""``scripts/real_xid.py`` — the script a GPU node runs to send a real XID through a real agent into a real
controller — run here with ``--simulate`` (the simulated device, the same two XIDs injected into its NVML
events and its kernel ring), so the script the GPU sessions rely on keeps working between them.

What it must show is what it showed on a real H200 (docs/benchmarks.md §agent): each XID reaches the
controller from both sources and is counted once, judged by the catalog, and the node stays ready.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

SCRIPT = Path(__file__).parents[2] / "scripts" / "real_xid.py"


def test_each_xid_from_nvml_and_the_kernel_log_is_one_counted_fault(tmp_path: Path) -> None:
    out = tmp_path / "xid.json"
    r = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), "--simulate", "--settle", "60"],
                       check=False, capture_output=True, text=True, timeout=180)
    assert out.exists(), (r.returncode, r.stdout, r.stderr[-3000:])
    got = json.loads(out.read_text())
    assert r.returncode == 0, (r.stdout, r.stderr[-3000:], got.get("error"), got.get("agent.log", "")[-3000:])
    xids = [e for e in got["events"] if e["kind"] == "xid"]
    assert sorted({e["code"] for e in xids}) == [31, 43]
    for code in (31, 43):
        copies = [e for e in xids if e["code"] == code]
        assert sorted(e["source"] for e in copies) == ["kmsg", "nvml"], copies
        counted = [e for e in copies if e["fault_of"] is None]
        merged = [e for e in copies if e["fault_of"] is not None]
        assert len(counted) == 1 and len(merged) == 1, copies
        assert merged[0]["fault_of"] == counted[0]["id"]
        assert all(e["severity"] == "info" for e in copies), copies  # the catalog: an application's XID
    assert got["node"]["state"] == "ready"
    assert got["decisions"] == []
    assert got["summary"]["ok"] is True
