"""``--level multinode``: run under srun or torchrun, one process per GPU across an allocation.

1. Every rank learns every rank's node name (``all_gather_object``).
2. An all-reduce across all ranks gives the allocation's bus bandwidth (``multinode_allreduce``).
3. Node pairs are measured in rounds of disjoint pairs (``pairing.localise``): each pair gets its own
   process group, pairs of a round run at once, and the per-pair times are shared with every rank so
   each rank computes the same next round. Suspects are re-paired with known-good nodes before blame.

Every rank returns the same :class:`Report`; the CLI prints and posts it from rank 0 only.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gpufleet.checks._torch import require_torch
from gpufleet.checks.baselines import CPU_SKU, Baselines
from gpufleet.checks.collective import INIT_TIMEOUT, bus_bandwidth, timed_allreduce
from gpufleet.checks.events import ALLOCATION
from gpufleet.checks.judge import Measurement, judge_node
from gpufleet.checks.launch import LaunchEnv, injected_delay
from gpufleet.checks.model import CheckResult, Level, Report, Status
from gpufleet.checks.pairing import Localisation, Pair, localise
from gpufleet.checks.profile import sizes_for
from gpufleet.domain.errors import ExternalError, InvalidInput

log = logging.getLogger(__name__)

Progress = Callable[[str, int, int], None]

# Pairs cross the network, whose spread between healthy pairs is wider than between the GPUs of one
# node: a pair fails more than 25 % below the best pair (or the SKU's wider tolerance, e.g. the CPU path).
PAIR_TOLERANCE = 0.25


def node_results(loc: Localisation, nodes: Sequence[str], unit: str = "GB/s") -> list[CheckResult]:
    """One ``multinode_pair`` result per node (and one ``multinode_link`` per blamed link). Pure."""

    def evidence(node: str) -> tuple[float, str]:
        """A suspect's verdict is its re-test with a good peer; anyone else shows its best pair."""
        if node in loc.blamed or node in loc.cleared:
            r = [p for p in loc.pairs if p.stage == "second" and p.a == node][-1]
            return r.busbw, r.b
        mine = [p for p in loc.pairs if node in (p.a, p.b)]
        if not mine:
            return 0.0, ""
        best = max(mine, key=lambda p: p.busbw)
        return best.busbw, best.b if best.a == node else best.a

    out: list[CheckResult] = []
    for node in nodes:
        value, peer = evidence(node)
        if node in loc.blamed:
            status, why = (
                Status.FAIL,
                f"slow with known-good peer {peer} ({value:.4g} < bar {loc.bar:.4g} {unit})",
            )
        elif node in loc.inconclusive:
            status, why = Status.WARN, "in a slow pair, and no known-good node to re-test against"
        else:
            status, why = Status.PASS, ""
        margin = None if not loc.reference else round((value - loc.reference) / loc.reference, 4)
        out.append(
            CheckResult(
                check="multinode_pair",
                gpu=None,
                value=value,
                unit=unit,
                expected=loc.reference,
                status=status,
                margin=margin,
                message=why,
                node=node,
                attrs=(("bar", f"{loc.bar:.6g}"), ("peer", peer)),
            )
        )
    for a, b in loc.blamed_links:
        value = next(r.busbw for r in loc.pairs if {r.a, r.b} == {a, b})
        out.append(
            CheckResult(
                check="multinode_link",
                gpu=None,
                value=value,
                unit=unit,
                expected=loc.reference,
                status=Status.FAIL,
                margin=None,
                node=a,
                attrs=(("peer", b),),
                message=f"{a} and {b} are each fine with other peers but slow together: "
                "suspect the path between them",
            )
        )
    return out


def _gather(dist: Any, obj: object, world: int) -> list[Any]:
    box: list[Any] = [None] * world
    dist.all_gather_object(box, obj)
    return box


def run_multinode(
    env: LaunchEnv,
    baselines: Baselines,
    *,
    device: str = "auto",
    tolerance: float | None = None,
    progress: Progress | None = None,
    environ: Mapping[str, str] | None = None,
    known_good: Sequence[str] = (),
) -> Report:
    """Run the multi-node level as rank ``env.rank`` of ``env.world_size``. ``tolerance``: how far
    below the best pair a pair may be (default: ``PAIR_TOLERANCE`` or the SKU's wider tolerance).
    ``known_good``: nodes of the allocation known to be healthy (``pairing.localise``)."""
    torch = require_torch()
    dist = torch.distributed
    environ = os.environ if environ is None else environ
    if env.world_size < 2:
        raise InvalidInput("WORLD_SIZE", env.world_size, "at least 2 ranks (launch with srun or torchrun)")
    if device == "cuda" and not torch.cuda.is_available():
        raise InvalidInput("--device", device, "a machine where torch sees a CUDA GPU (use --device cpu)")
    cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    if cuda:
        torch.cuda.set_device(env.local_rank)
    dev = f"cuda:{env.local_rank}" if cuda else "cpu"
    sizes = sizes_for(Level.MULTINODE, cuda)
    sku = baselines.sku_for_device(torch.cuda.get_device_name(env.local_rank)) if cuda else CPU_SKU
    delay = injected_delay(environ, env.rank)
    t0 = time.perf_counter()
    try:
        # Under torchrun the agent already serves a store on MASTER_PORT: env:// joins it (as a client
        # when TORCHELASTIC_USE_AGENT_STORE is set); under srun, rank 0 hosts the store itself.
        init = "env://" if env.launcher == "torchrun" else f"tcp://{env.master_addr}:{env.master_port}"
        dist.init_process_group(
            "nccl" if cuda else "gloo",
            init_method=init,
            rank=env.rank,
            world_size=env.world_size,
            timeout=INIT_TIMEOUT,
        )
    except Exception as err:
        raise ExternalError("rendezvous", f"{env.master_addr}:{env.master_port}: {err}") from err
    try:
        names = _gather(dist, env.node, env.world_size)
        nodes = list(dict.fromkeys(names))
        ranks_of = {n: [r for r, name in enumerate(names) if name == n] for n in nodes}
        total = 1 + (1 if len(nodes) >= 2 else 0)
        if progress:
            progress("all-reduce across the allocation", 0, total)
        secs = timed_allreduce(dev, sizes.multinode_bytes, sizes.nccl_iters, sizes.nccl_warmup, delay_s=delay)
        slowest = max(float(s) for s in _gather(dist, secs, env.world_size))
        bw = bus_bandwidth(sizes.multinode_bytes, slowest, env.world_size)
        meas = Measurement(
            "multinode_allreduce",
            None,
            bw,
            "GB/s",
            message_bytes=sizes.multinode_bytes,
            attrs=(("ranks", str(env.world_size)), ("nodes", str(len(nodes))), ("scope", ALLOCATION)),
        )
        results = judge_node([meas], baselines, sku)
        if progress:
            progress("all-reduce across the allocation", 1, total)
        if len(nodes) >= 2:
            groups: dict[frozenset[str], Any] = {}

            def measure(pairs: Sequence[Pair]) -> dict[Pair, float]:
                mine: Pair | None = None
                for pair in pairs:  # every rank creates every group, in the same order
                    key = frozenset(pair)
                    if key not in groups:
                        groups[key] = dist.new_group(sorted(ranks_of[pair[0]] + ranks_of[pair[1]]))
                    if env.node in pair:
                        mine = pair
                t = -1.0
                if mine is not None:
                    t = timed_allreduce(
                        dev,
                        sizes.pair_bytes,
                        sizes.nccl_iters,
                        sizes.nccl_warmup,
                        group=groups[frozenset(mine)],
                        delay_s=delay,
                    )
                out: dict[Pair, float] = {}
                for pair, s in _gather(dist, (mine, t), env.world_size):
                    if pair is not None:
                        got: Pair = (str(pair[0]), str(pair[1]))
                        out[got] = max(out.get(got, 0.0), float(s))
                ranks = {p: len(ranks_of[p[0]]) + len(ranks_of[p[1]]) for p in pairs}
                return {p: bus_bandwidth(sizes.pair_bytes, out[p], ranks[p]) for p in pairs}

            bar = baselines.lookup(sku, "multinode_pair", sizes.pair_bytes)
            tol = tolerance if tolerance is not None else max(PAIR_TOLERANCE, baselines.tolerance(sku))
            loc = localise(nodes, measure, floor=bar.floor if bar else 0.0, tolerance=tol,
                           known_good=[n for n in known_good if n in nodes])
            results += node_results(loc, nodes)
            if progress:
                progress("pairwise localisation", 2, total)
    finally:
        dist.destroy_process_group()
    skipped = () if len(nodes) >= 2 else ("multinode_pair: needs at least 2 nodes in the allocation",)
    return Report(
        node=env.node,
        level=Level.MULTINODE,
        device="cuda" if cuda else "cpu",
        sku=sku,
        gpus=env.world_size,
        results=tuple(results),
        skipped=skipped,
        wall_s=time.perf_counter() - t0,
    )
