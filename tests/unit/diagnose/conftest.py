from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from gpufleet.domain.catalog import Catalog, load_default_catalog

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "kernel-logs"


def manifest() -> list[dict[str, object]]:
    doc = tomllib.loads((FIXTURES / "manifest.toml").read_text(encoding="utf-8"))
    return list(doc["fixture"])


@pytest.fixture(scope="session")
def catalog() -> Catalog:
    return load_default_catalog()
