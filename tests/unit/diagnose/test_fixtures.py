"""Every real-log fixture yields exactly the findings its manifest lists — in both reading modes."""

from __future__ import annotations

import gzip
import io
from pathlib import Path

import pytest

from gpufleet.diagnose.decoder import Decoder
from gpufleet.diagnose.finding import Finding
from gpufleet.diagnose.reader import decode_stream, open_log
from gpufleet.diagnose.report import analyse
from gpufleet.domain.catalog import Catalog
from tests.unit.diagnose.conftest import FIXTURES, manifest

CASES = manifest()


def _summary(findings: tuple[Finding, ...]) -> list[dict[str, object]]:
    out = []
    for f in findings:
        row: dict[str, object] = {"line": f.line, "kind": f.kind.value, "severity": f.severity.value}
        if f.code is not None:
            row["code"] = f.code
        if f.pci is not None:
            row["pci"] = f.pci
        if f.root_line is not None:
            row["root"] = f.root_line
        out.append(row)
    return out


def _stream(path: Path, catalog: Catalog, year: int) -> list[dict[str, object]]:
    dec = Decoder(catalog, year=year)
    with open_log(str(path)) as fh:
        return _summary(analyse(decode_stream(fh, dec), catalog, dec.stats).findings)


def _per_line(path: Path, catalog: Catalog, year: int) -> list[dict[str, object]]:
    dec = Decoder(catalog, year=year)
    found = []
    for raw in path.read_bytes().splitlines():
        found += dec.feed(raw)
    found += dec.flush()
    return _summary(analyse(found, catalog, dec.stats).findings)


@pytest.mark.parametrize("case", CASES, ids=[str(c["file"]) for c in CASES])
def test_fixture_findings_match_manifest(case: dict[str, object], catalog: Catalog) -> None:
    path = FIXTURES / str(case["file"])
    year = int(case.get("year", 2025))  # type: ignore[call-overload]
    assert case.get("source"), "every fixture names its source"
    assert _stream(path, catalog, year) == case["expect"]


@pytest.mark.parametrize("case", CASES, ids=[str(c["file"]) for c in CASES])
def test_line_mode_agrees_with_block_mode(case: dict[str, object], catalog: Catalog) -> None:
    path = FIXTURES / str(case["file"])
    year = int(case.get("year", 2025))  # type: ignore[call-overload]
    assert _per_line(path, catalog, year) == _stream(path, catalog, year)


def test_every_benign_line_alone_yields_nothing(catalog: Catalog) -> None:
    for raw in (FIXTURES / "benign.log").read_text(encoding="utf-8").splitlines():
        dec = Decoder(catalog, year=2026)
        assert dec.feed(raw) + dec.flush() == [], raw


def test_gzipped_bug_report_decodes_like_the_plain_file(catalog: Catalog, tmp_path: Path) -> None:
    plain = FIXTURES / "xid79-dgx-h100-dmesg.log"
    gz = tmp_path / "nvidia-bug-report.log.gz"
    gz.write_bytes(gzip.compress(plain.read_bytes()))
    assert _stream(gz, catalog, 2025) == _stream(plain, catalog, 2025)


def test_stdin_is_read_through_the_same_path(catalog: Catalog) -> None:
    data = (FIXTURES / "sxid-nvsentinel.log").read_bytes()
    dec = Decoder(catalog)
    with open_log("-", io.BytesIO(data)) as fh:
        codes = [f.code for f in decode_stream(fh, dec)]
    assert codes == [28006, 20009, 24007, 12033, 26006, 20009]


def test_gpu_uuid_from_both_driver_generations_is_attached(catalog: Catalog) -> None:
    for name, pci, uuid in [
        ("xid16-kernlog-bumblebee329.log", "0000:01:00.0", "GPU-009fc6be-db2e-11be-ceae-9ba664de1bac"),
        ("xid79-dgx-h100-dmesg.log", "0000:5d:00.0", "GPU-f1906b9b-557a-e961-045c-9fe4be3ce012"),
    ]:
        dec = Decoder(catalog)
        with open_log(str(FIXTURES / name)) as fh:
            found = [f for f in decode_stream(fh, dec) if f.pci == pci]
        assert found and all(f.get("uuid") == uuid for f in found)
