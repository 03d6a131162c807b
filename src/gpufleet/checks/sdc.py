"""Judging silent data corruption. Pure: no torch.

Every GPU computes the same deterministic product several times. A healthy fleet produces one bit
pattern (the inputs make the result exact; ``ops.sdc_inputs``), so the reference is the digest most
runs agree on. A GPU fails — fatally: it computes wrong answers — when any of its runs differs from
the reference, differs from its own other runs, or fails the exact Freivalds check.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpufleet.checks.model import CheckResult, Status


@dataclass(frozen=True, slots=True)
class SdcObservation:
    dtype: str
    run: int
    digest: str
    exact: bool


def judge_sdc(observations: Mapping[int, Sequence[SdcObservation]]) -> list[CheckResult]:
    """One ``sdc`` result per GPU: value = runs that disagree with the reference (expected 0)."""
    refs: dict[str, str] = {}
    for dtype in sorted({o.dtype for obs in observations.values() for o in obs}):
        votes = Counter(o.digest for obs in observations.values() for o in obs if o.dtype == dtype)
        refs[dtype] = votes.most_common(1)[0][0]
    out: list[CheckResult] = []
    for gpu in sorted(observations):
        obs = observations[gpu]
        bad = [o for o in obs if o.digest != refs[o.dtype] or not o.exact]
        reasons = []
        if any(not o.exact for o in obs):
            reasons.append("result differs from the exact product (Freivalds check)")
        if any(o.digest != refs[o.dtype] for o in obs):
            where = ", ".join(f"{o.dtype} run {o.run}" for o in bad)
            reasons.append(f"bits differ from the other GPUs/runs ({where})")
        status = Status.FAIL if bad else Status.PASS
        out.append(
            CheckResult(
                check="sdc",
                gpu=gpu,
                value=float(len(bad)),
                unit="mismatches",
                expected=0.0,
                status=status,
                margin=None,
                message="; ".join(reasons),
                fatal=bool(bad),
                attrs=(("runs", str(len(obs))),),
            )
        )
    return out
