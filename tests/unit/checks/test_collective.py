from __future__ import annotations

import pytest

from gpufleet.checks.collective import bus_bandwidth, node_allreduce
from gpufleet.domain.errors import ExternalError, InvalidInput


def test_bus_bandwidth_uses_the_nccl_tests_factor() -> None:
    # nccl-tests PERFORMANCE.md: all-reduce busbw = algbw * 2 (n-1) / n.
    assert bus_bandwidth(8_000_000_000, 1.0, 8) == pytest.approx(8.0 * 2 * 7 / 8)
    assert bus_bandwidth(1_000_000_000, 0.5, 2) == pytest.approx(2.0)
    with pytest.raises(InvalidInput):
        bus_bandwidth(1, 1.0, 1)
    with pytest.raises(InvalidInput):
        bus_bandwidth(1, 0.0, 2)


def test_two_process_gloo_all_reduce_measures_a_bandwidth() -> None:
    bw = node_allreduce(2, cuda=False, nbytes=1 << 20, iters=3, warmup=1)
    assert bw > 0


def test_a_failing_rank_is_reported_not_hung(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUFLEET_CHECK_TEST_DELAY", "oops")  # every rank rejects the knob and exits 1
    with pytest.raises(ExternalError) as err:
        node_allreduce(2, cuda=False, nbytes=1 << 16, iters=1, warmup=0, timeout_s=120)
    assert "rank 0 exited 1" in str(err.value)
    assert "GPUFLEET_CHECK_TEST_DELAY" in str(err.value)
