"""``gpufleet diagnose`` end to end through the Typer app."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpufleet.cli import app
from tests.unit.diagnose.conftest import FIXTURES

runner = CliRunner()


def test_fatal_log_exits_1_and_prints_worst_first() -> None:
    res = runner.invoke(app, ["diagnose", str(FIXTURES / "xid79-dgx-h100-dmesg.log")])
    assert res.exit_code == 1, res.output
    blocks = [ln for ln in res.output.splitlines() if ln[:1].isupper() and "action:" in ln]
    assert blocks[0].startswith("FATAL") and "0000:5d:00.0" in blocks[0] and "action: reboot" in blocks[0]


def test_benign_log_exits_0() -> None:
    res = runner.invoke(app, ["diagnose", str(FIXTURES / "benign.log")])
    assert res.exit_code == 0, res.output
    assert "no hardware faults found" in res.output


def test_json_is_an_array_of_findings() -> None:
    res = runner.invoke(app, ["diagnose", "--json", str(FIXTURES / "aer-rhel7128107.log")])
    assert res.exit_code == 1
    rows = json.loads(res.output)
    assert [(r["kind"], r["code"], r["pci"], r["severity"], r["line"]) for r in rows] == [
        ("aer", 0, "0000:03:04.0", "info", 1),
        ("aer", 5, "0000:03:04.0", "fatal", 5),
    ]
    assert rows[1]["detail"]["reporter"] == "0000:00:1b.2"


def test_stdin(tmp_path: Path) -> None:
    data = (FIXTURES / "sxid-nvsentinel.log").read_bytes()
    res = runner.invoke(app, ["diagnose", "-", "--json"], input=data)
    assert res.exit_code == 1
    assert [r["code"] for r in json.loads(res.output)] == [28006, 20009, 24007, 12033, 26006, 20009]


def test_catalog_override_file_downgrades_a_code(tmp_path: Path) -> None:
    cat = tmp_path / "catalog.toml"
    cat.write_text(
        '[[override]]\nkind = "sxid"\ncode = 24007\nseverity = "degraded"\naction = "contact_support"\n'
    )
    res = runner.invoke(
        app, ["diagnose", "--json", "--catalog", str(cat), str(FIXTURES / "sxid-nvsentinel.log")]
    )
    # the site's override is authoritative (domain/judgement.py): nothing in this log is fatal any more
    assert res.exit_code == 0
    rows = {r["code"]: r for r in json.loads(res.output)}
    assert rows[24007]["severity"] == "degraded" and rows[24007]["action"] == "contact_support"
    res2 = runner.invoke(
        app,
        ["diagnose", "--json", "--catalog", str(cat), "-"],
        input=b"nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 24007, Severity 1 Engine instance 00\n",
    )
    assert res2.exit_code == 0
    assert json.loads(res2.output)[0]["severity"] == "degraded"


def test_inventory_maps_pci_to_gpu_and_node(tmp_path: Path) -> None:
    inv = tmp_path / "inv.toml"
    inv.write_text('node = "r01-n03"\n[[gpu]]\nindex = 3\npci = "0000:5d:00.0"\nslot = "r01-n03-gpu3"\n')
    res = runner.invoke(
        app, ["diagnose", "--inventory", str(inv), str(FIXTURES / "xid79-dgx-h100-dmesg.log")]
    )
    assert "GPU 0000:5d:00.0  (gpu3 r01-n03-gpu3 on r01-n03)" in res.output
    csv = tmp_path / "smi.csv"
    csv.write_text("index, pci.bus_id, serial\n3, 00000000:5D:00.0, 1653923026510\n")
    res = runner.invoke(
        app, ["diagnose", "--json", "--inventory", str(csv), str(FIXTURES / "xid79-dgx-h100-dmesg.log")]
    )
    assert json.loads(res.output)[0]["gpu_index"] == 3


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    missing = runner.invoke(app, ["diagnose", str(tmp_path / "nope.log")])
    assert missing.exit_code == 2
    bad = tmp_path / "bad.toml"
    bad.write_text('[[override]]\nkind = "xid"\ncode = 13\nseverity = "catastrophic"\n')
    res = runner.invoke(app, ["diagnose", "--catalog", str(bad), str(FIXTURES / "benign.log")])
    assert res.exit_code == 2
    assert "override[0].severity" in res.output and "catastrophic" in res.output
    inv = tmp_path / "inv.toml"
    inv.write_text('[[gpu]]\nindex = 0\npci = "not-a-pci"\n')
    res = runner.invoke(app, ["diagnose", "--inventory", str(inv), str(FIXTURES / "benign.log")])
    assert res.exit_code == 2 and "gpu[0].pci" in res.output
    assert runner.invoke(app, ["diagnose"]).exit_code == 2


def test_json_mode_reports_garbage_counts_on_stderr() -> None:
    data = b"\x00\x01 binary\n\xff\xfe bad utf8\n" + (FIXTURES / "xid79-154-journal.log").read_bytes()
    res = runner.invoke(app, ["diagnose", "-", "--json"], input=data)
    assert res.exit_code == 1
    assert "binary_lines=1" in res.stderr and "invalid_utf8_lines=1" in res.stderr
    assert [r["code"] for r in json.loads(res.stdout)] == [79, None, 154]


def test_policy_file_overrides_judge_offline_as_the_controller_would(tmp_path: Path) -> None:
    line = b"NVRM: Xid (PCI:0000:18:00): 31, pid=1234, name=python, Ch 00000008, MMU Fault\n"
    plain = runner.invoke(app, ["diagnose", "--json", "-"], input=line)
    assert plain.exit_code == 0 and json.loads(plain.output)[0]["severity"] == "info"
    policy = tmp_path / "policy.toml"
    policy.write_text('[policy]\nevidence_window = "12h"\n\n'
                      '[[override]]\nkind = "xid"\ncode = 31\nseverity = "fatal"\n')
    res = runner.invoke(app, ["diagnose", "--json", "--policy", str(policy), "-"], input=line)
    assert res.exit_code == 1 and json.loads(res.output)[0]["severity"] == "fatal"
    bad = tmp_path / "bad.toml"
    bad.write_text('[[override]]\nkind = "xid"\ncode = 31\nseverity = "awful"\n')
    res = runner.invoke(app, ["diagnose", "--policy", str(bad), "-"], input=line)
    assert res.exit_code == 2 and "override[0].severity" in res.output


def _rows(output: str) -> list[str]:
    """The finding rows of the table (they start with a line number, maybe after the ↳ of a consequence)."""
    return [ln for ln in output.splitlines() if ln.lstrip(" ↳")[:1].isdigit()]


def test_width_cuts_findings_to_the_terminal_and_a_pipe_gets_them_whole() -> None:
    log = str(FIXTURES / "xid79-dgx-h100-dmesg.log")
    whole = runner.invoke(app, ["diagnose", log])  # CliRunner's stdout is not a terminal: nothing cut
    json_doc = json.loads(runner.invoke(app, ["diagnose", "--json", log]).stdout)
    longest = max(json_doc, key=lambda f: len(f["meaning"]))
    assert longest["meaning"] in whole.output and "…" not in whole.output
    for width in (120, 100):
        narrow = runner.invoke(app, ["diagnose", "--width", str(width), log])
        rows = _rows(narrow.output)
        assert rows and all(len(r) <= width for r in rows), [len(r) for r in rows]
        assert any(r.endswith("…") for r in rows)
        assert len(rows) == len(_rows(whole.output))  # cut, never dropped
    # a tiny terminal still gets some text of each finding (its lines wrap): more than 20 columns' worth
    tiny = _rows(runner.invoke(app, ["diagnose", "--width", "20", log]).output)
    cut_at_100 = _rows(runner.invoke(app, ["diagnose", "--width", "100", log]).output)
    assert all(20 < len(r) <= len(c) for r, c in zip(tiny, cut_at_100, strict=True))
    assert runner.invoke(app, ["diagnose", "--width", "0", log]).output == whole.output


def test_zone_less_syslog_times_are_read_in_the_zone_given_and_the_table_says_which() -> None:
    log = str(FIXTURES / "xid-old-format.log")  # "May 10 22:25:01 jambi kernel: ...": no zone, no year
    utc = json.loads(runner.invoke(app, ["diagnose", "--json", "--year", "2026", log]).stdout)[0]["time"]
    tokyo = json.loads(runner.invoke(app, ["diagnose", "--json", "--year", "2026", "--tz", "Asia/Tokyo", log]
                                     ).stdout)[0]["time"]
    assert utc == "2026-05-10T22:25:01+00:00" and tokyo == "2026-05-10T22:25:01+09:00"
    assert "read as Asia/Tokyo" in runner.invoke(app, ["diagnose", "--tz", "Asia/Tokyo", log]).output
    assert "read as UTC" in runner.invoke(app, ["diagnose", log]).output
    bad = runner.invoke(app, ["diagnose", "--tz", "Mars/Olympus", log])
    assert bad.exit_code == 2 and "--tz" in bad.output and "Mars/Olympus" in bad.output


# A log a syslog server gathered from two hosts: the same GPU address on both, one XID 94 each (two on gpu-b).
GATHERED = """\
Nov 20 10:00:01 gpu-a kernel: NVRM: Xid (PCI:0000:18:00): 94, pid=11, name=python3, Contained: SM (0x1).
Nov 20 10:00:02 gpu-b kernel: NVRM: Xid (PCI:0000:18:00): 94, pid=12, name=python3, Contained: SM (0x1).
Nov 20 10:05:02 gpu-b kernel: NVRM: Xid (PCI:0000:18:00): 94, pid=12, name=python3, Contained: SM (0x1).
"""


def test_a_gathered_syslog_is_judged_per_host_and_names_each_finding_s_host(tmp_path: Path) -> None:
    log = tmp_path / "messages"
    log.write_text(GATHERED)
    rows = json.loads(runner.invoke(app, ["diagnose", "--json", "--year", "2026", str(log)]).stdout)
    assert [r["node"] for r in rows] == ["gpu-a", "gpu-b", "gpu-b"]
    # "XID 94 twice within 24 h" counts per host: gpu-b's second one escalates, gpu-a's single one does not
    assert not rows[0]["escalated"] and not rows[1]["escalated"] and rows[2]["escalated"]
    table = runner.invoke(app, ["diagnose", "--year", "2026", str(log)]).output
    assert "(on gpu-a)" in table and "(on gpu-b)" in table and "on 2 devices" in table
    inv = tmp_path / "inv.toml"  # an inventory's node name wins over the syslog host
    inv.write_text('node = "r01-n07"\n[[gpu]]\nindex = 3\npci = "0000:18:00.0"\n')
    named = json.loads(runner.invoke(app, ["diagnose", "--json", "--inventory", str(inv), str(log)]).stdout)
    assert {r["node"] for r in named} == {"r01-n07"}


@pytest.mark.parametrize("year", ["0", "-3", "20250"])
def test_a_year_no_log_can_have_is_named(year: str) -> None:
    res = runner.invoke(app, ["diagnose", str(FIXTURES / "benign.log"), "--year", year])
    assert res.exit_code == 2 and f"--year: got {year}, expected a year from 1970" in res.output, res.output
