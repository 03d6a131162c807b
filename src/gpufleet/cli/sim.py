"""``gpufleet sim``: replay a training campaign through the production lifecycle code (docs/simulator.md)."""

from __future__ import annotations

import importlib.util
import json
import logging
import sys
from pathlib import Path
from typing import Annotated, Any

import typer


def register(app: typer.Typer) -> None:
    @app.command("sim")
    def sim(
        scenario: str = typer.Option(None, help="shipped scenario: llama3-405b, coreweave-30b"),
        replicas: int = typer.Option(10, min=1, help="Monte Carlo replicas"),
        seed: int = typer.Option(1, help="seed of the first replica (replica i uses seed+i)"),
        as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
        gpus: int = typer.Option(None, help="GPUs the job spans"),
        days: float = typer.Option(None, help="campaign length in days"),
        node_failure_rate: float = typer.Option(
            None, help="failures per node-day as one Poisson rate (replaces the Llama 3 category model)"),
        checkpoint_interval: str = typer.Option(None, help="duration (15m), 'young' or 'daly'"),
        checkpoint_write: str = typer.Option(None, help="training blocked per checkpoint (10s)"),
        checkpoint_persist: str = typer.Option(
            None, help="async upload time after the blocking part (0: synchronous checkpoints)"),
        restart_overhead: str = typer.Option(None, help="start -> initialised after a (re)start (5m)"),
        restore: str = typer.Option(None, help="checkpoint load time after a restart"),
        hot_spares: int = typer.Option(None, min=0, help="spare nodes (default: a replacement is always there)"),
        planned_rate: float = typer.Option(None, help="planned stops per node-day (default: Llama 3's)"),
        warning_fraction: float = typer.Option(None, help="share of warnable failures announced in advance"),
        proactive_drain: bool = typer.Option(None, "--proactive-drain/--no-proactive-drain",
                                             help="drain warned nodes at an immediate checkpoint"),
        health_check_every: str = typer.Option(None, help="in-job health-check cadence (5m; 0: none)"),
        health_check_cost: str = typer.Option(None, help="training paused per health check"),
        repair_escape: float = typer.Option(None, help="share of repairs that leave the fault in place"),
        revalidation: str = typer.Option(None, help="post-repair validation time (30m; 0: none)"),
        nodes_per_rack: int = typer.Option(None, min=0, help="racks as failure domains for the breaker (0: none)"),
        operator_response: str = typer.Option(None, help="on-call resets a tripped breaker after (4h)"),
        verbose: bool = typer.Option(False, help="log every lifecycle transition and breaker trip"),
        policy: Annotated[Path | None, typer.Option(help="lifecycle policy file (TOML, docs/policy.md)")] = None,
        control: str = typer.Option("lifecycle", help="lifecycle (production policy) or fixed (rule table)"),
        trace: Annotated[Path | None, typer.Option(help="replay a node fault trace (InfiniteHBD format)")] = None,
        trace_nodes: int = typer.Option(None, help="servers the trace covers (default: 400 for InfiniteHBD)"),
        report: Annotated[Path | None, typer.Option(help="write an HTML report comparing policies here")] = None,
        sweep: bool = typer.Option(False, "--sweep", help="run every policy variant (and --sweep-policy files) "
                                   "x --replicas seeds; ETTR with 95 % confidence intervals"),
        sweep_policy: Annotated[list[Path] | None, typer.Option(
            help="with --sweep: also a variant deciding with this policy file (repeatable)")] = None,
        workers: int = typer.Option(None, min=1, help="with --sweep: local worker processes (default: one per "
                                    "CPU; 1: this process)"),
        ray: str = typer.Option(None, "--ray", help="with --sweep: run on the Ray cluster at this address "
                                "(ray://host:10001, auto) or on a local Ray instance (local)"),
        price: float = typer.Option(None, "--price-per-gpu-hour", help="with --sweep: TCO, the price of a useful "
                                    "GPU-hour per variant (with --mfu)"),
        mfu: float = typer.Option(None, "--mfu", help="with --price-per-gpu-hour: the model's MFU while training"),
    ) -> None:
        """Simulate a training campaign: interruptions, ETTR, MTTF and badput over Monte Carlo replicas."""
        from gpufleet.domain.durations import parse_duration
        from gpufleet.domain.errors import InvalidInput
        from gpufleet.lifecycle.config import load_policy
        from gpufleet.sim.config import IntervalRule, SimConfig
        from gpufleet.sim.control import FixedControl, LifecycleControl, NodeControl
        from gpufleet.sim.failures import uniform_node_rate
        from gpufleet.sim.repair import trace_repairs
        from gpufleet.sim.scenarios import scenario as get_scenario
        from gpufleet.sim.trace import Effect, load_trace, summarize

        def secs(value: str | None, field: str) -> float | None:
            if value is None:
                return None
            if value.strip().replace(".", "", 1).isdigit() and float(value) != 0:
                # "--checkpoint-interval 15" meant minutes as often as seconds: make the unit explicit
                raise InvalidInput(f"--{field.replace('_', '-')}", value, "a duration with its unit, e.g. 15m, 90s "
                                   "or 2h")
            return parse_duration(value, field).total_seconds()

        if report is not None and importlib.util.find_spec("matplotlib") is None:  # before minutes of simulating
            raise InvalidInput("--report", str(report), "matplotlib installed for the charts "
                               "(pip install 'gpufleet[report]')")

        sc = get_scenario(scenario) if scenario else None
        cfg = sc.config if sc is not None else SimConfig()
        changes: dict[str, Any] = {}
        if gpus is not None:
            changes["gpus"] = gpus
        if days is not None:
            changes["days"] = days
        if node_failure_rate is not None:
            changes["categories"] = uniform_node_rate(node_failure_rate, cfg.gpus_per_node)
        if checkpoint_interval is not None:
            ci = checkpoint_interval.strip().lower()
            changes["checkpoint_interval"] = (
                IntervalRule(ci) if ci in ("young", "daly") else secs(ci, "checkpoint_interval"))
        for name, value in (("checkpoint_write", checkpoint_write), ("checkpoint_persist", checkpoint_persist),
                            ("restart_overhead", restart_overhead), ("restore", restore),
                            ("health_check_every", health_check_every), ("health_check_cost", health_check_cost)):
            if value is not None:
                changes[name] = secs(value, name.replace("_", "-"))
        if hot_spares is not None:
            changes["hot_spares"] = hot_spares
        if repair_escape is not None:
            changes["repair_escape"] = repair_escape
        if revalidation is not None:
            changes["revalidation"] = secs(revalidation, "revalidation")
        if nodes_per_rack is not None:
            changes["nodes_per_rack"] = nodes_per_rack
        if operator_response is not None:
            changes["operator_response"] = secs(operator_response, "operator-response")
        if verbose:  # every transition (INFO) and breaker trip (WARNING) of the lifecycle, on stderr
            from gpufleet.cli.errors import configure_logging

            configure_logging("WARNING")
            logging.getLogger("gpufleet.lifecycle").setLevel(logging.INFO)
        else:  # a campaign replays thousands of decisions; keep the output to the summary
            logging.getLogger("gpufleet.lifecycle").setLevel(logging.ERROR)
        if planned_rate is not None:
            changes["planned_per_node_day"] = planned_rate
        if warning_fraction is not None:
            changes["warning_fraction"] = warning_fraction
        if proactive_drain is not None:
            changes["proactive_drain"] = proactive_drain
        if proactive_drain and not changes.get("warning_fraction", cfg.warning_fraction):
            raise InvalidInput("--proactive-drain", True, "together with --warning-fraction above 0 (by default no "
                               "failure announces itself, so there is nothing to drain ahead of)")
        if control not in ("lifecycle", "fixed"):
            raise InvalidInput("control", control, "lifecycle or fixed")
        policy_file = load_policy(policy) if policy is not None else None

        if trace_nodes is not None and trace is None:
            raise InvalidInput("--trace-nodes", trace_nodes, "only with --trace (the servers the trace covers)")
        fault_trace = None
        if trace is not None:
            fault_trace = load_trace(trace, nodes=trace_nodes)
            spares = changes.get("hot_spares", cfg.hot_spares) or 0
            if spares >= fault_trace.nodes:
                raise InvalidInput("--hot-spares", spares, f"fewer than the trace's {fault_trace.nodes} servers "
                                   "(the job runs on the others)")
            # the job runs on the trace's servers but the spares (sim.engine takes no more than that)
            changes.setdefault("gpus", (fault_trace.nodes - spares) * cfg.gpus_per_node)
            changes.setdefault("days", round(fault_trace.span / 86400.0, 3))
            changes["categories"] = ()  # every node fault comes from the trace
            changes.setdefault("planned_per_node_day", 0.0)
            changes["repair"] = trace_repairs(fault_trace)
            changes["name"] = f"trace:{trace.name}"
        cfg = cfg.with_(**changes)

        def make_control(c: SimConfig) -> NodeControl:
            if control == "fixed":
                return FixedControl(proactive_drain=c.proactive_drain)
            return LifecycleControl(policy_file, proactive_drain=c.proactive_drain,
                                    operator_response=c.operator_response)

        if sweep:
            from gpufleet.cli.sim_sweep import sweep_command

            sweep_command(cfg, control, policy, sweep_policy or [], replicas, seed, fault_trace, workers, ray,
                          as_json, price=price, mfu=mfu)
            return
        if sweep_policy or workers is not None or ray is not None or price is not None or mfu is not None:
            raise InvalidInput("--sweep", False, "--sweep with --sweep-policy, --workers, --ray, "
                               "--price-per-gpu-hour or --mfu")
        doc = _run(cfg, replicas, seed, fault_trace, make_control, as_json, "replay" if fault_trace else "")
        if fault_trace is not None:
            rate = fault_trace.rate_per_node_day(Effect.INTERRUPT)
            synth_cfg = cfg.with_(categories=uniform_node_rate(rate, cfg.gpus_per_node), name="synthetic")
            synth = _run(synth_cfg, replicas, seed + 10_000, None, make_control, as_json, "synthetic")
            doc["trace"] = {
                "file": str(trace),
                "nodes": fault_trace.nodes,
                "days": fault_trace.span / 86400.0,
                "interrupting_failures_per_node_day": rate,
                "faults": summarize(fault_trace),
            }
            doc["synthetic"] = synth
        if sc is not None:
            doc["published"] = {
                "source": sc.source,
                "interruptions": sc.interruptions,
                "planned": sc.planned,
                "by_cause": dict(sc.by_cause),
                "ettr_claim": sc.ettr_claim,
                "mfu_claim": sc.mfu_claim,
                "claim_verified": sc.claim_verified,
            }
            if sc.mfu_claim is not None:  # goodput ~ MFU x ETTR
                ettr = doc["ettr"]["mean"]
                doc["published"]["goodput_estimate"] = [sc.mfu_claim[0] * ettr, sc.mfu_claim[1] * ettr]
        if report is not None:
            doc["report"] = str(_report(cfg, report, max(2, min(replicas, 8)), seed, fault_trace, make_control))
        if as_json:
            typer.echo(json.dumps(doc, indent=2, default=str))
        else:
            _print(doc)


def _run(cfg: Any, replicas: int, seed: int, trace: Any, make_control: Any, quiet: bool, label: str) -> dict[str, Any]:
    from gpufleet.sim.montecarlo import run_many

    with _Progress(replicas, f"{label or cfg.name}", quiet) as step:
        summary = run_many(cfg, replicas, seed, trace=trace, control_factory=make_control, progress=step,
                           label=label)
    return summary.to_json()


class _Progress:
    """A rich progress bar on stderr (only when stderr is a terminal)."""

    def __init__(self, total: int, what: str, quiet: bool) -> None:
        self.total, self.what = total, what
        self.enabled = sys.stderr.isatty() and not quiet
        self._bar: Any = None

    def __enter__(self) -> Any:
        if not self.enabled:
            return None
        from rich.console import Console
        from rich.progress import Progress

        self._bar = Progress(console=Console(stderr=True), transient=True)
        self._bar.start()
        task = self._bar.add_task(f"sim {self.what}", total=self.total)
        return lambda done: self._bar.update(task, completed=done)

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()


def _report(cfg: Any, out: Path, replicas: int, seed: int, trace: Any, make_control: Any) -> Path:
    from gpufleet.sim.compare import interval_sweep, variants
    from gpufleet.sim.montecarlo import run_many
    from gpufleet.sim.report import write_report

    summaries = []
    for label, c in variants(cfg):
        with _Progress(replicas, label, False) as step:
            summaries.append(run_many(c, replicas, seed, trace=trace, control_factory=make_control,
                                      progress=step, label=label))
    base_interval = cfg.interval()
    sweep = []
    for label, c in interval_sweep(cfg, [base_interval * f for f in (0.25, 0.5, 1.0, 2.0, 4.0)]):
        with _Progress(replicas, f"interval {label}", False) as step:
            sweep.append(run_many(c, replicas, seed, trace=trace, control_factory=make_control,
                                  progress=step, label=label))
    return write_report(out, summaries, sweep, f"gpufleet sim: {cfg.name}")


def _print(doc: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    sections = [("", doc)] + ([("(same node-day rate as the trace)", doc["synthetic"])] if "synthetic" in doc else [])
    for title, d in sections:
        spares = d["policy"]["hot_spares"]
        t = Table(title=f"{d['scenario']} {title}".strip() + f" — {d['gpus']} GPUs ({d['nodes']} nodes"
                  + (f" + {spares} hot spares" if spares else "") + f"), {d['days']:g} days, {d['replicas']} replicas")
        t.add_column("metric")
        t.add_column("value", justify="right")
        e, i = d["ettr"], d["interruptions"]
        t.add_row("ETTR mean [p5, p95]", f"{e['mean']:.4f} [{e['p5']:.4f}, {e['p95']:.4f}]")
        t.add_row("interruptions (planned / unexpected)",
                  f"{i['total']:.1f} ({i['planned']:.1f} / {i['unexpected']:.1f})")
        mttf = d["mttf_hours"]
        t.add_row("MTTF", f"{mttf:.2f} h" if mttf is not None else "no failures")
        for cause, n in list(i["by_cause"].items())[:6]:
            t.add_row(f"  cause: {cause}", f"{n:.1f}")
        for k, v in d["badput"]["fraction"].items():
            if v > 0:
                t.add_row(f"  badput: {k}", f"{100 * v:.2f} %")
        th = d["theory"]
        if th.get("ettr_exact") is not None:
            t.add_row("closed form ETTR (exact renewal / first order)",
                      f"{th['ettr_exact']:.4f} / {th['ettr_first_order']:.4f}")
            young, daly = th["young_interval_s"] / 60, th["daly_interval_s"] / 60
            t.add_row("Young / Daly interval", f"{young:.1f} / {daly:.1f} min")
        t.add_row("checkpoint interval used", f"{d['policy']['checkpoint_interval_s'] / 60:.1f} min")
        console.print(t)
    pub = doc.get("published")
    if pub:
        parts = [f"published ({pub['source']}):"]
        if pub["interruptions"] is not None:
            parts.append(f"{pub['interruptions']} interruptions ({pub['planned']} planned);")
        if pub["ettr_claim"]:
            lo, hi = pub["ettr_claim"]
            parts.append(f"ETTR {lo:.0%}" + (f"-{hi:.0%};" if hi < 1 else " or more;"))
        if pub.get("mfu_claim"):
            lo, hi = pub["mfu_claim"]
            g_lo, g_hi = pub["goodput_estimate"]
            parts.append(f"MFU {lo:.0%}-{hi:.0%}, so goodput ~ MFU x simulated ETTR = {g_lo:.1%}-{g_hi:.1%}")
        if not pub["claim_verified"]:
            parts.append("(claims unverified: primary source not found)")
        console.print(" ".join(parts), markup=False, highlight=False)
    if "report" in doc:
        console.print(f"report: {doc['report']}")
