"""Shipped scenarios. Every number not taken from a source is marked as an assumption.

``llama3-405b`` — Llama 3 405B pre-training (arXiv:2407.21783, section 3.3.4): 16,384 H100 GPUs, a
54-day snapshot, 419 unexpected + 47 planned interruptions (Table 5 rates, see ``sim.failures``),
"effective training time > 90 %". The paper does not state the checkpoint interval, checkpoint
cost or restart time; the values below are assumptions chosen inside the published ranges
(shared reference, section 7): asynchronous two-stage checkpoints blocking 10 s (MegaScale:
"several seconds") and durable 60 s later (about 5.7 TB of weights + optimizer state at Tectonic's
2-7 TB/s), a snapshot every 15 minutes, 3 minutes to restart (NCCL init < 30 s at >10K GPUs, plus
launch), 1 minute to load the checkpoint (ByteCheckpoint: 129 s for 405B on 8,960 GPUs), a
10-minute collective watchdog and 30 s of scheduler requeue.

``coreweave-30b`` — the 30B-parameter run on 1,024 GPUs described in the project's seed material
(51-52 % MFU and 97-98 % ETTR *claimed*; the shared reference could not find the primary document,
so the claim is shown for comparison only and is unverified). Failure rates: Llama 3's per-GPU
rates (same H100 generation). Duration (30 days), checkpointing (async, 5 s blocking, 20 s to
durable, every 10 minutes; about 420 GB of state) and restart (2 min + 30 s restore) are assumptions.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.domain.errors import InvalidInput
from gpufleet.sim.config import SimConfig


@dataclass(frozen=True, slots=True)
class Scenario:
    config: SimConfig
    source: str
    # Published figures to compare against (None where the source gives none).
    interruptions: int | None = None
    planned: int | None = None
    by_cause: tuple[tuple[str, int], ...] = ()
    ettr_claim: tuple[float, float] | None = None  # (low, high) as published or claimed
    mfu_claim: tuple[float, float] | None = None  # model FLOPs utilisation (low, high)
    claim_verified: bool = True


def _llama() -> Scenario:
    cfg = SimConfig(
        name="llama3-405b",
        gpus=16_384,
        days=54.0,
        checkpoint_interval=900.0,
        checkpoint_write=10.0,
        checkpoint_persist=60.0,
        restart_overhead=180.0,
        restore=60.0,
        requeue=30.0,
        maintenance_downtime=300.0,
        watchdog=600.0,
        silent_detection=3600.0,
        description="Llama 3 405B pre-training, 16,384 H100, 54-day snapshot (arXiv:2407.21783 section 3.3.4)",
    )
    return Scenario(
        config=cfg,
        source="Meta, The Llama 3 Herd of Models, arXiv:2407.21783, section 3.3.4, Table 5",
        interruptions=466,
        planned=47,
        by_cause=(("faulty_gpu", 148), ("gpu_hbm3", 72), ("software_bug", 54), ("network", 35),
                  ("host_maintenance", 32)),
        ettr_claim=(0.90, 1.0),
        mfu_claim=(0.38, 0.43),  # Table 4, BF16, 8K-16K GPUs
    )


def _coreweave() -> Scenario:
    cfg = SimConfig(
        name="coreweave-30b",
        gpus=1_024,
        days=30.0,
        checkpoint_interval=600.0,
        checkpoint_write=5.0,
        checkpoint_persist=20.0,
        restart_overhead=120.0,
        restore=30.0,
        requeue=30.0,
        maintenance_downtime=300.0,
        silent_detection=3600.0,
        description="30B model on 1,024 H100 (seed material; 97-98 % ETTR claimed, unverified)",
    )
    return Scenario(
        config=cfg,
        source="project seed material (CoreWeave, Aug 2025); primary document not found (shared reference §6)",
        ettr_claim=(0.97, 0.98),
        mfu_claim=(0.51, 0.52),
        claim_verified=False,
    )


SCENARIOS = {"llama3-405b": _llama, "coreweave-30b": _coreweave}


def scenario(name: str) -> Scenario:
    try:
        return SCENARIOS[name]()
    except KeyError:
        raise InvalidInput("scenario", name, f"one of {sorted(SCENARIOS)}") from None
