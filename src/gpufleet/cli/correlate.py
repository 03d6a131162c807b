"""``gpufleet correlate``: root-cause a topology's event file into ranked suspects;
``gpufleet correlate-eval``: score the engine on generated scenarios."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer

from gpufleet.domain.false_alarms import FALSE_ALARM_BUDGET

if TYPE_CHECKING:
    from gpufleet.correlate.model import Suspect

_E = TypeVar("_E", bound=StrEnum)


def register(app: typer.Typer) -> None:
    @app.command()
    def correlate(
        topology: Annotated[Path, typer.Option("--topology", help="gpufleet.topology/v1 file.")],
        events: Annotated[
            Path, typer.Option("--events", help="gpufleet.event/v1 JSON Lines file ('-' for stdin).")
        ],
        as_json: Annotated[bool, typer.Option("--json", help="Print the verdicts document.")] = False,
        window: Annotated[str, typer.Option("--window", help="Sliding window, e.g. 30m, 2h.")] = "30m",
        at: Annotated[str, typer.Option("--at", help="Judge at this time (default: last event).")] = "",
        stream: Annotated[bool, typer.Option("--stream", help="Print each verdict change.")] = False,
        top: Annotated[int, typer.Option("--top", help="Suspects in the table (0: all).")] = 10,
        budget: Annotated[
            float, typer.Option("--false-alarm-budget", help="False verdicts per node-day the coherence statistic "
                                                              "may cost (docs/correlate.md).")
        ] = FALSE_ALARM_BUDGET,
    ) -> None:
        """Explain the events by the components they share; exit 1 when a suspect needs action."""
        import gc

        from gpufleet.cli.errors import EXIT_FOUND_PROBLEM
        from gpufleet.correlate.engine import Engine
        from gpufleet.correlate.model import SuspectAction, verdicts_json
        from gpufleet.domain.catalog import load_default_catalog
        from gpufleet.domain.durations import parse_duration
        from gpufleet.domain.errors import NotFound
        from gpufleet.domain.eventio import FileEvent, parse_time, read_event_fields
        from gpufleet.domain.events import Severity
        from gpufleet.domain.false_alarms import false_alarm_budget
        from gpufleet.domain.judgement import judge
        from gpufleet.domain.topology import load_topology

        span = parse_duration(window, "--window")  # the flags first: a bad one costs no topology load
        fa_budget = false_alarm_budget(budget, "--false-alarm-budget")
        topo = load_topology(topology)
        gc.freeze()  # the topology lives for the whole run: keep the collector from re-scanning it
        engine = Engine(topo, window=span, false_alarm_budget=fa_budget)
        if str(events) == "-":
            lines = sys.stdin
        else:
            try:
                lines = events.open(encoding="utf-8")
            except FileNotFoundError:
                raise NotFound("events file", str(events)) from None
        catalog = load_default_catalog()
        unplaced: list[str] = []  # fatal events naming a component the topology lacks: unexplained
        with lines:
            for ev in read_event_fields(lines):  # plain tuples: no FileEvent per line on this hot path
                before = engine.unknown
                verdicts = engine.observe_fields(ev)
                if engine.unknown > before:
                    e = FileEvent(*ev)
                    if judge(catalog, e.kind, e.code, stated=e.severity).severity is Severity.FATAL:
                        unplaced.append(f"line {e.line}: {e.kind}{'' if e.code is None else f' {e.code}'} on "
                                        f"{e.component or e.link or e.node or '?'}")
                for v in verdicts:
                    if stream:
                        s = v.suspect
                        typer.echo(
                            f"line {ev[0]}: {v.status} {s.component} ({s.kind}) "
                            f"confidence {s.confidence:.2f} -> {s.action}",
                            err=as_json,
                        )
        suspects = engine.suspects(parse_time(at, "--at") if at else None)
        if engine.unknown:
            typer.echo(
                f"warning: {engine.unknown} event(s) name components or links not in the topology", err=True
            )
        if engine.late:
            typer.echo(f"warning: {engine.late} event(s) were older than the window on arrival", err=True)
        if as_json:
            typer.echo(verdicts_json(suspects))
        else:
            _table(suspects[: top or None], unexplained=bool(engine.unknown))
        if unplaced:
            shown = "; ".join(unplaced[:5]) + ("; ..." if len(unplaced) > 5 else "")
            typer.echo(f"error: {len(unplaced)} fatal event(s) name components not in the topology, so nothing "
                       f"explains them (fix the topology or the event): {shown}", err=True)
        if unplaced or any(s.action is not SuspectAction.OBSERVE for s in suspects):
            raise typer.Exit(EXIT_FOUND_PROBLEM)

    @app.command("correlate-eval")
    def correlate_eval(
        kind: Annotated[str, typer.Option("--kind", help="hgx, nvl72 or all.")] = "all",
        noise: Annotated[str, typer.Option("--noise", help="none, realistic or heavy.")] = "realistic",
        seeds: Annotated[int, typer.Option("--seeds", help="Scenarios per fault type.")] = 10,
        fault: Annotated[str, typer.Option("--fault", help="Only this fault type.")] = "",
        suite: Annotated[
            str, typer.Option("--suite", help="strong (count-crossing faults) or weak (weak-signal scenarios).")
        ] = "strong",
        split: Annotated[
            str, typer.Option("--split", help="weak suite: tune (used in development) or heldout (report only).")
        ] = "tune",
        counts_only: Annotated[
            bool, typer.Option("--counts-only", help="Score the engine without the coherence statistic (v1).")
        ] = False,
        dump: Annotated[
            Path | None,
            typer.Option("--dump", help="Also write each scenario here (topology, events, truth)."),
        ] = None,
        warmup: Annotated[
            str, typer.Option("--warmup", help="weak suite: background before each scenario, e.g. 30m (as a "
                                                "running controller has seen it); 0: a cold start.")
        ] = "0",
        budget: Annotated[
            float, typer.Option("--false-alarm-budget", help="False verdicts per node-day the coherence statistic "
                                                              "may cost.")
        ] = FALSE_ALARM_BUDGET,
    ) -> None:
        """Score the engine on generated scenarios (top-1/top-3, healthy switches blamed; weak suite:
        also false alarms on noise-only windows and lead time before a failure)."""
        import json
        from datetime import timedelta

        from gpufleet.correlate.scenarios import FAULTS, FaultType, Noise, Scenario, TopologyKind, generate
        from gpufleet.correlate.scoring import closest, score, summary
        from gpufleet.correlate.weak import WEAK_FAULTS, Split, WeakFault, generate_weak, weak_topology
        from gpufleet.domain.durations import parse_duration
        from gpufleet.domain.errors import InvalidInput
        from gpufleet.domain.eventio import format_event
        from gpufleet.domain.false_alarms import false_alarm_budget
        from gpufleet.domain.topology import dump_topology
        from gpufleet.domain.topology_gen import generate_hgx, generate_nvl72

        kinds = list(TopologyKind) if kind == "all" else [_choice(TopologyKind, kind, "--kind")]
        level = _choice(Noise, noise, "--noise")
        weak = _choice(_Suite, suite, "--suite") is _Suite.WEAK
        part = _choice(Split, split, "--split")
        if seeds < 1:
            raise InvalidInput("--seeds", seeds, "at least 1")
        fa_budget = false_alarm_budget(budget, "--false-alarm-budget")
        warm = timedelta(0) if warmup.strip() == "0" else parse_duration(warmup, "--warmup")
        if warm and not weak:
            raise InvalidInput("--warmup", warmup, "0 with --suite strong (a warm-up is for the weak suite)")
        if warm and level is Noise.NONE:
            raise InvalidInput("--warmup", warmup, "0 with --noise none (a warm-up is background noise)")
        if not timedelta(0) <= warm <= timedelta(hours=2):
            raise InvalidInput("--warmup", warmup, "a duration from 0 to 2h")
        for k in kinds:
            scs: list[Scenario]
            if weak:
                wonly = _choice(WeakFault, fault, "--fault") if fault else None
                topo = weak_topology(k)
                scs = [generate_weak(topo, k, f, level, s, part, warm) for f in WEAK_FAULTS[k]
                       if wonly in (None, f) for s in range(seeds)]
            else:
                only = _choice(FaultType, fault, "--fault") if fault else None
                topo = generate_hgx(64) if k is TopologyKind.HGX else generate_nvl72(2)
                scs = [generate(topo, k, f, level, s) for f in FAULTS[k] if only in (None, f) for s in range(seeds)]
            if dump is not None:
                dump.mkdir(parents=True, exist_ok=True)
                (dump / f"{k}.topology.json").write_text(dump_topology(topo), encoding="utf-8")
                for sc in scs:
                    stem = sc.name.replace("/", "-")
                    text = "".join(format_event(e) + "\n" for e in sc.events)
                    (dump / f"{stem}.jsonl").write_text(text, encoding="utf-8")
                    (dump / f"{stem}.truth").write_text(sc.truth + "\n", encoding="utf-8")
            result = score(topo, scs, coherence=not counts_only, budget=fa_budget)
            by_fault = {
                f: {"n": n, "top1": round(t1, 3), "top3": round(t3, 3)}
                for f, (n, t1, t3) in result.by(1).items()
            }
            doc = {"topology": k.value, "noise": level.value, "false_alarm_budget": fa_budget, **summary(result),
                   "by_fault": by_fault}
            typer.echo(json.dumps(doc, indent=1))
            for miss in result.misses():
                how = "" if counts_only else f", {closest(miss.closest)}"  # counts only: no coherence pattern
                typer.echo(f"miss {miss.scenario}: truth {miss.truth}, ranked {list(miss.top)}{how}", err=True)


class _Suite(StrEnum):
    STRONG = "strong"
    WEAK = "weak"


def _choice(enum: type[_E], value: str, field: str) -> _E:
    from gpufleet.domain.errors import InvalidInput

    try:
        return enum(value)
    except ValueError:
        raise InvalidInput(field, value, f"one of {[m.value for m in enum]}") from None


def _table(suspects: Sequence[Suspect], *, unexplained: bool = False) -> None:
    if not suspects:
        typer.echo("no suspects among the events the topology places (see the warning about the others)"
                   if unexplained else "no suspects: nothing in the window needs explaining")
        return
    for rank, s in enumerate(suspects, 1):
        ev = ", ".join(str(e) for e in s.evidence[:8]) + (", ..." if len(s.evidence) > 8 else "")
        typer.echo(
            f"{rank:>2}. {s.component}  [{s.kind}, serial {s.serial or '-'}]  "
            f"confidence {s.confidence:.2f}  action {s.action}"
        )
        if s.reason:
            typer.echo(f"    why: {s.reason}")
        if s.affected_nodes:
            nodes = ", ".join(s.affected_nodes[:6]) + (", ..." if len(s.affected_nodes) > 6 else "")
            typer.echo(f"    affects {len(s.affected_nodes)} node(s): {nodes}")
        typer.echo(f"    evidence lines: {ev}")
