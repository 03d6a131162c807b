from __future__ import annotations

import pytest

from gpufleet.checks import ops
from gpufleet.checks.baselines import load_baselines
from gpufleet.checks.model import Level, Status
from gpufleet.checks.runner import CheckOptions, run_node_checks
from gpufleet.checks.sdc import SdcObservation, judge_sdc
from gpufleet.domain.errors import InvalidInput


def test_the_same_computation_is_bit_identical_across_runs_and_dtypes_are_exact() -> None:
    runs = [ops.sdc_run("cpu", "fp32", 96, seed=11) for _ in range(2)]
    assert runs[0].digest == runs[1].digest
    assert all(r.exact for r in runs)
    half = ops.sdc_run("cpu", "fp16", 96, seed=11)
    assert half.exact and half.digest == runs[0].digest  # exact integers: same bits whatever the dtype
    other = ops.sdc_run("cpu", "fp32", 96, seed=12)
    assert other.digest != runs[0].digest


@pytest.mark.parametrize("bit", [0, 7, 22, 30, 31])
def test_a_flipped_bit_is_caught_by_digest_and_exact_check(bit: int) -> None:
    good = ops.sdc_run("cpu", "fp32", 64, seed=3)
    bad = ops.sdc_run("cpu", "fp32", 64, seed=3, flip_bit=bit)
    assert bad.digest != good.digest
    assert not bad.exact


def test_fp16_refuses_sizes_whose_sums_are_not_exact() -> None:
    with pytest.raises(InvalidInput) as err:
        ops.sdc_run("cpu", "fp16", 4096, seed=1)
    assert err.value.field == "sdc n"


def test_judge_blames_the_gpu_that_disagrees() -> None:
    ok = [SdcObservation("fp32", r, "aaa", True) for r in range(3)]
    flipped = [
        SdcObservation("fp32", 0, "aaa", True),
        SdcObservation("fp32", 1, "bbb", False),
        SdcObservation("fp32", 2, "aaa", True),
    ]
    results = judge_sdc({0: ok, 1: flipped, 2: ok})
    status = {r.gpu: r.status for r in results}
    assert status == {0: Status.PASS, 1: Status.FAIL, 2: Status.PASS}
    bad = results[1]
    assert bad.fatal and bad.value == 1.0 and "fp32 run 1" in bad.message


def test_consistently_wrong_gpu_is_caught_even_when_its_runs_agree() -> None:
    ok = [SdcObservation("fp32", r, "aaa", True) for r in range(2)]
    wrong = [SdcObservation("fp32", r, "ccc", True) for r in range(2)]
    results = judge_sdc({0: ok, 1: ok, 2: wrong})
    assert [r.status for r in results] == [Status.PASS, Status.PASS, Status.FAIL]


def test_injected_bit_flip_fails_that_gpu_end_to_end_on_the_cpu_path() -> None:
    opts = CheckOptions(Level.QUICK, device="cpu", cpu_devices=3, dtypes=("fp32",), inject_sdc_flip=(1, 1))
    report = run_node_checks(opts, load_baselines(), "ci-node")
    sdc = {r.gpu: r for r in report.results if r.check == "sdc"}
    assert sdc[1].status is Status.FAIL and sdc[1].fatal
    assert sdc[0].status is Status.PASS and sdc[2].status is Status.PASS
    assert report.status is Status.FAIL
