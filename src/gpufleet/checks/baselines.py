"""Per-SKU expectations for the active checks, loaded from ``data/baselines.toml`` (or an operator's
own file with the same schema). Pure: no torch.

Schema (see the shipped file for every field with its source)::

    [defaults]
    warn_margin = 0.10          # below expected * (1 - warn_margin) -> warn
    relative_tolerance = 0.10   # more than this below the node's best GPU -> fail

    [[sku]]
    name = "H100-SXM"
    match = ["H100 80GB HBM3"]  # substrings of torch.cuda.get_device_name()
    relative_tolerance = 0.10   # optional per-SKU override

    [[baseline]]
    sku = "H100-SXM"
    check = "gemm_bf16"
    unit = "TFLOPS"
    floor = 547.5               # below -> fail (required)
    expected = 730.0            # typical healthy value (optional; defaults to floor)
    peak = 989.4                # datasheet peak (optional; reported as % of peak)
    min_bytes = 0               # all-reduce bars only: message size the bar was measured at
    source = "..."              # required: where the numbers come from
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from gpufleet.domain.errors import InvalidInput

CPU_SKU = "cpu"
UNKNOWN_SKU = "unknown"


@dataclass(frozen=True, slots=True)
class Baseline:
    sku: str
    check: str
    unit: str
    floor: float
    expected: float
    source: str
    peak: float | None = None
    min_bytes: int = 0


@dataclass(frozen=True, slots=True)
class Sku:
    name: str
    match: tuple[str, ...]
    relative_tolerance: float


@dataclass(frozen=True, slots=True)
class Baselines:
    """All SKUs and their bars. Look-ups never raise: a missing bar means "judge relatively only"."""

    skus: tuple[Sku, ...]
    entries: tuple[Baseline, ...]
    warn_margin: float = 0.10
    relative_tolerance: float = 0.10

    def sku_for_device(self, device_name: str) -> str:
        """The SKU whose ``match`` substring occurs in ``device_name`` (case-insensitive), else
        ``"unknown"``. Longer matches win, so "H100 80GB HBM3" beats a bare "H100"."""
        name = device_name.lower()
        best, best_len = UNKNOWN_SKU, 0
        for sku in self.skus:
            for pattern in sku.match:
                if pattern.lower() in name and len(pattern) > best_len:
                    best, best_len = sku.name, len(pattern)
        return best

    def tolerance(self, sku: str) -> float:
        """How far below the node's best GPU a GPU may be before it fails."""
        for s in self.skus:
            if s.name == sku:
                return s.relative_tolerance
        return self.relative_tolerance

    def lookup(self, sku: str, check: str, message_bytes: int | None = None) -> Baseline | None:
        """The bar for ``check`` on ``sku``. For message-size-dependent bars (all-reduce), the entry
        with the largest ``min_bytes`` not above ``message_bytes``; None when nothing applies."""
        candidates = [b for b in self.entries if b.sku == sku and b.check == check]
        if message_bytes is not None:
            candidates = [b for b in candidates if b.min_bytes <= message_bytes]
        if not candidates:
            return None
        return max(candidates, key=lambda b: b.min_bytes)


def load_baselines(path: Path | None = None) -> Baselines:
    """Load ``path``, or the shipped ``gpufleet/checks/data/baselines.toml`` when None."""
    if path is None:
        text = resources.files("gpufleet.checks").joinpath("data/baselines.toml").read_text("utf-8")
        where = "baselines.toml"
    else:
        try:
            text = path.read_text("utf-8")
        except OSError as err:
            raise InvalidInput("baselines", str(path), f"a readable TOML file ({err.strerror})") from err
        where = str(path)
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise InvalidInput(where, str(err), "valid TOML") from err
    return parse_baselines(doc, where)


def parse_baselines(doc: Mapping[str, object], where: str = "baselines") -> Baselines:
    """Validate a parsed TOML document; errors name the field path, the value and the expectation."""
    defaults = _table(doc.get("defaults", {}), f"{where}.defaults")
    warn_margin = _fraction(defaults.get("warn_margin", 0.10), f"{where}.defaults.warn_margin")
    rel_tol = _fraction(defaults.get("relative_tolerance", 0.10), f"{where}.defaults.relative_tolerance")
    skus: list[Sku] = []
    for i, raw in enumerate(_array(doc.get("sku", []), f"{where}.sku")):
        t = _table(raw, f"{where}.sku[{i}]")
        name = _text(t.get("name"), f"{where}.sku[{i}].name")
        match = t.get("match", [])
        if not isinstance(match, list) or not all(isinstance(m, str) and m for m in match):
            raise InvalidInput(f"{where}.sku[{i}].match", match, "a list of non-empty strings")
        tol = _fraction(t.get("relative_tolerance", rel_tol), f"{where}.sku[{i}].relative_tolerance")
        skus.append(Sku(name=name, match=tuple(match), relative_tolerance=tol))
    known = {s.name for s in skus}
    entries: list[Baseline] = []
    for i, raw in enumerate(_array(doc.get("baseline", []), f"{where}.baseline")):
        f = f"{where}.baseline[{i}]"
        t = _table(raw, f)
        sku = _text(t.get("sku"), f"{f}.sku")
        if sku not in known:
            raise InvalidInput(f"{f}.sku", sku, f"one of the [[sku]] names {sorted(known)}")
        floor = _positive(t.get("floor"), f"{f}.floor", allow_zero=True)
        expected = _positive(t.get("expected", floor), f"{f}.expected", allow_zero=True)
        if expected < floor:
            raise InvalidInput(f"{f}.expected", expected, f"a value at least the floor ({floor})")
        peak_raw = t.get("peak")
        peak = None if peak_raw is None else _positive(peak_raw, f"{f}.peak")
        min_bytes = t.get("min_bytes", 0)
        if not isinstance(min_bytes, int) or isinstance(min_bytes, bool) or min_bytes < 0:
            raise InvalidInput(f"{f}.min_bytes", min_bytes, "a non-negative integer number of bytes")
        entries.append(
            Baseline(
                sku=sku,
                check=_text(t.get("check"), f"{f}.check"),
                unit=_text(t.get("unit"), f"{f}.unit"),
                floor=floor,
                expected=expected,
                source=_text(t.get("source"), f"{f}.source"),
                peak=peak,
                min_bytes=min_bytes,
            )
        )
    return Baselines(tuple(skus), tuple(entries), warn_margin=warn_margin, relative_tolerance=rel_tol)


def _table(value: object, field: str) -> Mapping[str, object]:
    if not isinstance(value, dict):
        raise InvalidInput(field, value, "a TOML table")
    return value


def _array(value: object, field: str) -> list[object]:
    if not isinstance(value, list):
        raise InvalidInput(field, value, "an array of tables")
    return value


def _text(value: object, field: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidInput(field, value, "a non-empty string")
    return value


def _positive(value: object, field: str, *, allow_zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidInput(field, value, "a number")
    if value < 0 or (value == 0 and not allow_zero):
        raise InvalidInput(field, value, "a non-negative number" if allow_zero else "a positive number")
    return float(value)


def _fraction(value: object, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1:
        raise InvalidInput(field, value, "a fraction in [0, 1)")
    return float(value)
