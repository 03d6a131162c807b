"""``python -m bench``: a ``--quick`` (smoke) run writes NAME.quick.json and never replaces NAME.json, the
full-size results docs/benchmarks.md cites (a quick run of ``correlate_scale`` once overwrote its
131,072-GPU results with 8,192-GPU ones in the working tree)."""

from __future__ import annotations

import json
import types
from pathlib import Path

import bench.__main__ as runner
import pytest


def _stub(calls: list[bool]) -> types.ModuleType:
    mod = types.ModuleType("bench.bench_sim")

    def run(quick: bool) -> dict[str, object]:
        calls.append(quick)
        return {"size": "small" if quick else "full"}

    mod.run = run  # type: ignore[attr-defined]
    return mod


def test_a_quick_run_writes_its_own_file_and_keeps_the_full_results(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[bool] = []
    monkeypatch.setattr("importlib.import_module", lambda name: _stub(calls))  # how the runner loads bench_NAME
    assert runner.main(["sim", "--out", str(tmp_path)]) == 0
    full = json.loads((tmp_path / "sim.json").read_text())
    assert runner.main(["sim", "--quick", "--out", str(tmp_path)]) == 0
    quick = json.loads((tmp_path / "sim.quick.json").read_text())
    assert calls == [False, True]
    assert json.loads((tmp_path / "sim.json").read_text()) == full  # untouched by the quick run
    assert (full["quick"], full["results"]) == (False, {"size": "full"})
    assert (quick["quick"], quick["results"]) == (True, {"size": "small"})


def test_an_unknown_benchmark_is_refused_and_nothing_is_written(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert runner.main(["no_such_bench", "--quick", "--out", str(tmp_path)]) == 2
    assert "no_such_bench" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
