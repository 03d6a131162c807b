"""Policy variants to compare against a base campaign (used by ``--report`` and the benchmarks)."""

from __future__ import annotations

from gpufleet.sim.config import IntervalRule, SimConfig


def variants(base: SimConfig) -> list[tuple[str, SimConfig]]:
    """The base plus one change at a time: checkpoint rule, blocking vs async, spares, proactive
    drain on early warnings, health-check cadence."""
    out: list[tuple[str, SimConfig]] = [("base", base)]
    out.append(("young interval", base.with_(checkpoint_interval=IntervalRule.YOUNG)))
    out.append(("daly interval", base.with_(checkpoint_interval=IntervalRule.DALY)))
    if base.checkpoint_persist > 0:
        blocking = base.checkpoint_write + base.checkpoint_persist
        out.append(("blocking checkpoints", base.with_(checkpoint_write=blocking, checkpoint_persist=0.0)))
    else:
        out.append(("async checkpoints", base.with_(checkpoint_persist=base.checkpoint_write,
                                                    checkpoint_write=max(1.0, base.checkpoint_write / 20))))
    if base.hot_spares is not None:  # without a limit a replacement is always there: spares change nothing
        more = max(1, base.nodes // 256)
        out.append((f"{more} more hot spares", base.with_(hot_spares=base.hot_spares + more)))
        out.append((f"{4 * more} more hot spares", base.with_(hot_spares=base.hot_spares + 4 * more)))
    out.append(("proactive drain (50% warned)", base.with_(warning_fraction=0.5, proactive_drain=True)))
    out.append(("health checks every 5m (2s)", base.with_(health_check_every=300.0, health_check_cost=2.0)))
    out.append(("health checks every 30m (10s)", base.with_(health_check_every=1800.0, health_check_cost=10.0)))
    if base.repair_escape > 0:
        out.append(("30m revalidation after repair", base.with_(revalidation=1800.0)))
    return out


def interval_sweep(base: SimConfig, intervals: list[float]) -> list[tuple[str, SimConfig]]:
    return [(f"{int(i // 60)}m", base.with_(checkpoint_interval=i)) for i in intervals]


