"""An SXid's switch port names the GPU on its far end, from ``nvidia-smi nvlink -R`` read backwards.

The capture (tests/fixtures/kernel-logs/nvlink-remote-a100-nvsentinel.txt) is the two-GPU excerpt of a
DGX A100's ``nvidia-smi nvlink -R`` that NVIDIA/NVSentinel's syslog health monitor tests with
(health-monitors/syslog-health-monitor/pkg/sxid/lsnvlink, "actual A100 8-GPU system output"). The SXid
lines below are in the kernel's format (as in tests/fixtures/kernel-logs/sxid-nvsentinel.log) with
switch addresses and ports of that capture: composed for the test, not captured.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpufleet.agent.decoding import default_decoder
from gpufleet.cli import app
from gpufleet.diagnose.decoder import Decoder
from gpufleet.diagnose.nvlink_remote import load_nvlink_remote, parse_nvlink_remote
from gpufleet.domain.catalog import load_default_catalog
from gpufleet.domain.errors import InvalidInput
from tests.unit.diagnose.conftest import FIXTURES

CAPTURE = FIXTURES / "nvlink-remote-a100-nvsentinel.txt"
SXID = "[ 1108.858286] nvidia-nvswitch{n}: SXid (PCI:0000:{bus}:00.0): 20034, Fatal, Link {port} LTSSM Fault Up"


def test_the_capture_reads_backwards_port_by_port() -> None:
    ports = load_nvlink_remote(CAPTURE)
    assert len(ports) == 24  # 2 GPUs x 12 links, every one to a switch
    # "GPU 1 ... Link 2: Remote Device 00000000:CA:00.0: Link 10" in the capture:
    assert ports.peer("00000000:CA:00.0", 10) == (1, 2)
    assert ports.peer("0000:ca:00.0", 10) == (1, 2)  # any spelling of the address
    assert ports.peer("0000:ca:00.0", 12) is None  # a port the capture does not list
    assert ports.peer("0000:cd:00.0", 25) == (0, 0)


def test_an_sxid_names_the_gpu_behind_its_port() -> None:
    dec = Decoder(load_default_catalog(), switch_ports=load_nvlink_remote(CAPTURE))
    lines = [SXID.format(n=2, bus="cc", port=29), SXID.format(n=3, bus="cd", port=40)]
    found = [f for n, ln in enumerate(lines, 1) for f in dec.feed(ln, n)] + dec.flush()
    mapped, unmapped = found
    assert (mapped.get("peer_gpu"), mapped.get("peer_nvlink"), mapped.get("link")) == ("1", "5", "29")
    assert mapped.name.endswith("[port 29: GPU 1 link 5]") and len(mapped.name) > len("[port 29: GPU 1 link 5]")
    assert unmapped.get("peer_gpu") == "" and unmapped.get("link") == "40"  # port 40 is not in the capture


def test_the_agents_sxid_event_carries_switch_and_peer() -> None:
    dec = default_decoder("r01-n01", {}, parse_nvlink_remote(CAPTURE.read_text()))
    when = datetime(2026, 11, 24, tzinfo=UTC)
    events = dec.feed(SXID.format(n=2, bus="cc", port=29).split("] ", 1)[1], 7, when) + dec.flush()
    ((_, ev),) = events
    assert (ev.attr("nvswitch"), ev.attr("peer_gpu"), ev.attr("peer_nvlink"), ev.attr("port")) == ("2", "1", "5", "29")


def test_bad_captures_are_refused_with_the_line() -> None:
    with pytest.raises(InvalidInput) as err:
        parse_nvlink_remote("         Link 0: Remote Device 00000000:CD:00.0: Link 25\n")
    assert "line 1" in err.value.field
    twice = ("GPU 0: A\n Link 0: Remote Device 00000000:CD:00.0: Link 25\n"
             "GPU 1: B\n Link 3: Remote Device 0000:cd:00.0: Link 25\n")
    with pytest.raises(InvalidInput) as err:
        parse_nvlink_remote(twice)
    assert "line 4" in err.value.field and "port 25" in err.value.expected


def test_cli_nvlink_option(tmp_path: Path) -> None:
    log = tmp_path / "k.log"
    log.write_text(SXID.format(n=0, bus="ce", port=26) + "\n")
    res = CliRunner().invoke(app, ["diagnose", str(log), "--json", "--nvlink", str(CAPTURE)])
    assert res.exit_code == 1, res.output  # fatal SXid
    assert '"peer_gpu": "1"' in res.output and '"peer_nvlink": "11"' in res.output
    empty = tmp_path / "empty.txt"
    empty.write_text("GPU 0: NVIDIA H100 (UUID: GPU-1)\n")
    res = CliRunner().invoke(app, ["diagnose", str(log), "--nvlink", str(empty)])
    assert res.exit_code == 2 and "--nvlink" in res.output
