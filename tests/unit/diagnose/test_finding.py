from __future__ import annotations

import pytest

from gpufleet.diagnose.finding import normalise_pci


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("0000:3b:00", "0000:3b:00.0"),
        ("PCI:0000:3B:00", "0000:3b:00.0"),
        ("3b:00.1", "0000:3b:00.1"),
        ("00000000:18:00.0", "0000:18:00.0"),
        ("10003:00:00.0", "10003:00:00.0"),
        ("0009:01:00", "0009:01:00.0"),
    ],
)
def test_normalise_pci(text: str, want: str) -> None:
    assert normalise_pci(text) == want


@pytest.mark.parametrize("text", ["", "GPU0", "0000:3b", "0000:3b:00.9", "zz:00.0", "0000:3b:00:00"])
def test_not_pci(text: str) -> None:
    assert normalise_pci(text) is None
