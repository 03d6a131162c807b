from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpufleet.agent.collectors.host import HostCollector
from gpufleet.agent.config import load_config, read_token
from gpufleet.domain.errors import InvalidInput


def edac_tree(root: Path) -> None:
    for mc, ce, ue in (("mc0", 12, 0), ("mc1", 0, 2)):
        d = root / "devices/system/edac/mc" / mc
        d.mkdir(parents=True)
        (d / "ce_count").write_text(f"{ce}\n")
        (d / "ue_count").write_text(f"{ue}\n")
    (root / "devices/system/edac/mc/power").mkdir()  # not a controller


def test_edac_and_mounts(tmp_path: Path) -> None:
    edac_tree(tmp_path)

    def statvfs(path: str) -> os.statvfs_result:
        if path == "/data":
            return os.statvfs_result((4096, 4096, 1000, 100, 40, 0, 0, 0, 0, 255))
        raise FileNotFoundError(path)

    h = HostCollector(tmp_path, {"data": "/data", "checkpoint": "/ckpt"}, statvfs=statvfs).read()
    assert [(e.mc, e.correctable, e.uncorrectable) for e in h.edac] == [("mc0", 12, 0), ("mc1", 0, 2)]
    ck, data = h.mounts
    assert (ck.role, ck.present) == ("checkpoint", False)
    assert (data.free_bytes, data.total_bytes, data.free_fraction) == (40 * 4096, 1000 * 4096, 0.04)


def test_no_edac_is_empty(tmp_path: Path) -> None:
    assert HostCollector(tmp_path).read().edac == ()


def test_config_layers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "agent.toml"
    f.write_text(
        'node = "r01-n003"\ndevice = "sim"\ngpus = 4\n[cadence]\nslow_s = 10\n'
        '[thresholds]\nib_expected_rate_gbps = 400\n[mounts]\ndata = "/data"\n'
    )
    monkeypatch.setenv("GPUFLEET_AGENT_METRICS_PORT", "9500")
    cfg = load_config(f, gpus=8, controller=None)
    assert (cfg.node, cfg.device, cfg.gpus, cfg.metrics_port) == ("r01-n003", "sim", 8, 9500)
    assert cfg.cadence.build().slow_s == 10 and cfg.cadence.build().fast_s == 1
    assert cfg.thresholds.build().ib_expected_rate_gbps == 400 and cfg.mounts == {"data": "/data"}


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ('device = "dcgm"', "device"),
        ("gpus = -1", "gpus"),
        ("[cadence]\nfast_s = 0", "cadence.fast_s"),
        ("unknown_key = 1", "unknown_key"),
        ("[thresholds]\nthermal = 80", "thresholds.thermal"),
        ("metrics_port = 70000", "metrics_port"),
    ],
)
def test_bad_config_names_the_field(tmp_path: Path, text: str, field: str) -> None:
    f = tmp_path / "agent.toml"
    f.write_text(text + "\n")
    with pytest.raises(InvalidInput) as err:
        load_config(f)
    assert err.value.field == field


def test_unreadable_and_broken_config(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="readable TOML"):
        load_config(tmp_path / "missing.toml")
    (tmp_path / "bad.toml").write_text("node = \n")
    with pytest.raises(InvalidInput, match="valid TOML"):
        load_config(tmp_path / "bad.toml")


def test_token(tmp_path: Path) -> None:
    (tmp_path / "t").write_text("  abc123  \nignored\n")
    assert read_token(tmp_path / "t") == "abc123"
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(InvalidInput, match="non-empty token"):
        read_token(tmp_path / "empty")
    with pytest.raises(InvalidInput, match="readable file"):
        read_token(tmp_path / "absent")
    with pytest.raises(InvalidInput, match="no-push"):
        read_token(None)
