"""Protected rolling maintenance: which nodes, what is done to them, and how many may be out at once. Pure.

A rollout (docs/maintenance.md) takes a set of nodes (a :class:`Selector`) through one action (a
reboot, or a script the node's agent names in its own config) a few nodes at a time. Each node goes
``pending -> draining -> action -> validating -> done``; a node whose action or validation fails is
``failed`` and stays out of service (handed to repair); a node that is not serving when its turn comes
is ``skipped`` (it is out for another reason: it is never taken for maintenance behind that reason's back).

How many nodes may start now is :func:`admit`: a node starts only if, counting every node that is
unavailable **for any reason** (draining, drained, in repair, revalidating, committed to a drain, or
drained/down in the scheduler) plus the nodes this pass already started,

* the fleet has at most ``max_unavailable`` nodes out,
* each of the node's failure domains (rack, leaf switch) has at most ``max_unavailable_domain`` out,
* and the blast-radius breaker's budget (lifecycle.breaker) is not exceeded (the caller's ``breaker``).

A rollout never trips the breaker: a node that does not fit waits for a later pass, and the
rollout's status says why.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence, Set
from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum
from typing import Any

from gpufleet.domain.durations import parse_duration
from gpufleet.domain.errors import InvalidInput
from gpufleet.domain.fleet import RACK_DOMAIN, SWITCH_DOMAIN
from gpufleet.lifecycle.validation import FULL, QUICK

# A script name as the agent's config names it: ``script:<name>`` must fit the command kind (32 chars).
SCRIPT_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,24}$")
SCRIPT_PREFIX = "script:"
REBOOT = "reboot"
PXE = "pxe"  # out of band: boot once from PXE and power cycle through the node's BMC (a reimage)


class Step(StrEnum):
    PENDING = "pending"  # not started
    DRAINING = "draining"  # its job asked to checkpoint, then drained through the scheduler
    ACTION = "action"  # drained and empty: the action was queued for the node's agent
    VALIDATING = "validating"  # the action worked: a validation job decides whether it returns
    DONE = "done"  # back in service
    FAILED = "failed"  # the action or the validation failed (or a step timed out): out of service, in repair
    SKIPPED = "skipped"  # not serving when its turn came, or the rollout was aborted before it started


IN_FLIGHT = frozenset({Step.DRAINING, Step.ACTION, Step.VALIDATING})
FINISHED = frozenset({Step.DONE, Step.FAILED, Step.SKIPPED})


class RolloutState(StrEnum):
    PLANNED = "planned"  # created by ``plan``; nothing happens until ``start``
    RUNNING = "running"
    PAUSED = "paused"  # no node starts and no action is sent; nodes past their action finish
    STOPPED = "stopped"  # a node failed and on_failure = stop (start again to go on)
    ABORTING = "aborting"  # no node starts any more; nodes drained but not acted on return; the rest finish
    ABORTED = "aborted"  # aborted, and no node is in flight any more
    DONE = "done"  # every node finished


# The states whose rollouts the runner looks at each pass (nodes in flight may need it).
ACTIVE = frozenset({RolloutState.RUNNING, RolloutState.PAUSED, RolloutState.STOPPED, RolloutState.ABORTING})


class OnFailure(StrEnum):
    STOP = "stop"  # a failed node stops the rollout: nothing new starts until an operator starts it again
    CONTINUE = "continue"  # the failed node stays out (in repair); the others go on


@dataclass(frozen=True, slots=True)
class Selector:
    """Which nodes: ``all``, ``rack:<rack>``, ``switch:<leaf switch>`` or ``nodes:<n1>,<n2>,...``."""

    text: str

    @classmethod
    def parse(cls, text: str) -> Selector:
        kind, _, value = text.partition(":")
        if text == "all" or (kind in ("rack", "switch", "nodes") and value.strip(",")):
            return cls(text)
        raise InvalidInput("selector", text, "all, rack:<rack>, switch:<leaf switch> or nodes:<node>,<node>...")

    def select(self, domains: Mapping[str, frozenset[str]]) -> list[str]:
        """The selected registered nodes, in rollout order (by rack, then name). InvalidInput when the
        selector names no node, or names nodes that are not registered."""
        kind, _, value = self.text.partition(":")
        if kind == "all":
            picked = list(domains)
        elif kind == "nodes":
            picked = list(dict.fromkeys(n for n in value.split(",") if n))
            unknown = [n for n in picked if n not in domains]
            if unknown:
                raise InvalidInput("selector", self.text, f"registered nodes (unknown: {', '.join(unknown[:5])})")
        else:
            dom = (RACK_DOMAIN if kind == "rack" else SWITCH_DOMAIN) + value
            picked = [n for n, ds in domains.items() if dom in ds]
        if not picked:
            raise InvalidInput("selector", self.text, "a selector that matches at least one registered node")
        return sorted(picked, key=lambda n: (_rack(domains.get(n, frozenset())), n))


def _rack(domains: frozenset[str]) -> str:
    return min((d for d in domains if d.startswith(RACK_DOMAIN)), default="")


def check_action(action: str) -> str:
    """``reboot``, ``pxe`` (through the BMC) or ``script:<name>`` (a script the node's agent config names:
    never a command line)."""
    if action in (REBOOT, PXE) or (action.startswith(SCRIPT_PREFIX) and SCRIPT_NAME.match(action[len(SCRIPT_PREFIX):])):
        return action
    raise InvalidInput("action", action, "reboot, pxe (through the BMC), or script:<name> with a name of "
                       "lowercase letters, digits, - "
                       "and _ (at most 25) that the nodes' agent config names (maintenance_scripts)")


@dataclass(frozen=True, slots=True)
class Spec:
    """What a rollout does and its limits (stored with it as JSON: :meth:`as_dict`)."""

    selector: Selector
    action: str
    max_unavailable: int = 1  # nodes of the whole fleet out at once, whatever the reason
    max_unavailable_domain: int = 1  # nodes of one failure domain out at once, whatever the reason
    on_failure: OnFailure = OnFailure.STOP
    validate: str = FULL  # the validation level before a node returns: quick | full
    # checkpoint wait + drain: longer than the policy's checkpoint_wait_timeout (2h by default)
    drain_timeout: timedelta = timedelta(hours=3)
    action_timeout: timedelta = timedelta(minutes=30)  # the agent's result for the action
    validate_timeout: timedelta = timedelta(hours=3)  # the validation's verdict

    def __post_init__(self) -> None:
        check_action(self.action)
        for name in ("max_unavailable", "max_unavailable_domain"):
            if getattr(self, name) < 1:
                raise InvalidInput(name, getattr(self, name), "a whole number of nodes, 1 or more")
        if self.validate not in (QUICK, FULL):
            raise InvalidInput("validate", self.validate, f"{QUICK} or {FULL}")
        for name in ("drain_timeout", "action_timeout", "validate_timeout"):
            if getattr(self, name) <= timedelta(0):
                raise InvalidInput(name, str(getattr(self, name)), "a positive duration, e.g. 30m")

    def as_dict(self) -> dict[str, Any]:
        return {"selector": self.selector.text, "action": self.action, "max_unavailable": self.max_unavailable,
                "max_unavailable_domain": self.max_unavailable_domain, "on_failure": self.on_failure.value,
                "validate": self.validate, "drain_timeout": _dur(self.drain_timeout),
                "action_timeout": _dur(self.action_timeout), "validate_timeout": _dur(self.validate_timeout)}

    @classmethod
    def of_dict(cls, d: Mapping[str, Any]) -> Spec:
        """From the API's body or the stored JSON; InvalidInput names the first bad field."""
        known = set(cls.__dataclass_fields__)
        extra = sorted(set(d) - known)
        if extra:
            raise InvalidInput(extra[0], d[extra[0]], f"one of the rollout's fields: {', '.join(sorted(known))}")
        if "selector" not in d or "action" not in d:
            missing = "selector" if "selector" not in d else "action"
            raise InvalidInput(missing, None, "a value (selector: all, rack:R, switch:S or nodes:a,b; "
                                              "action: reboot, script:NAME or pxe)")
        kw: dict[str, Any] = {"selector": Selector.parse(str(d["selector"])), "action": str(d["action"])}
        for name in ("max_unavailable", "max_unavailable_domain"):
            if name in d:
                v = d[name]
                if not isinstance(v, int) or isinstance(v, bool):
                    raise InvalidInput(name, v, "a whole number of nodes, 1 or more")
                kw[name] = v
        if "on_failure" in d:
            try:
                kw["on_failure"] = OnFailure(d["on_failure"])
            except ValueError:
                raise InvalidInput("on_failure", d["on_failure"], "stop or continue") from None
        if "validate" in d:
            kw["validate"] = str(d["validate"])
        for name in ("drain_timeout", "action_timeout", "validate_timeout"):
            if name in d:
                kw[name] = _duration(name, d[name])
        return cls(**kw)

    def timeout(self, step: Step) -> timedelta:
        return {Step.DRAINING: self.drain_timeout, Step.ACTION: self.action_timeout}.get(step, self.validate_timeout)


def _duration(name: str, v: Any) -> timedelta:
    if not isinstance(v, str | int | float):
        raise InvalidInput(name, v, "a duration such as 30s, 10m, 2h")
    return parse_duration(v, name)


def _dur(t: timedelta) -> str:
    return f"{t.total_seconds():g}s"


Breaker = Callable[[str, Set[str]], "str | None"]


@dataclass(frozen=True, slots=True)
class Admission:
    start: tuple[str, ...]  # nodes that start now, in order
    waiting: Mapping[str, str]  # node -> why it cannot start now


def admit(candidates: Sequence[str], unavailable: Set[str], domains: Mapping[str, frozenset[str]], spec: Spec,
          breaker: Breaker) -> Admission:
    """Which of ``candidates`` (pending, serving, in rollout order) start now.

    ``unavailable``: every node of the fleet out of service now, for whatever reason; ``domains``:
    every registered node's failure domains; ``breaker(node, out)``: why the blast-radius budget
    forbids taking ``node`` out with ``out`` already out, or None. First fit in order: a node that
    does not fit does not stop a later one (in another domain) from starting."""
    out = set(unavailable)
    members: dict[str, set[str]] = {}
    for n, ds in domains.items():
        for d in ds:
            members.setdefault(d, set()).add(n)
    start: list[str] = []
    waiting: dict[str, str] = {}
    for node in candidates:
        why = _why_not(node, out, domains.get(node, frozenset()), members, spec, breaker)
        if why is None:
            start.append(node)
            out.add(node)
        else:
            waiting[node] = why
    return Admission(tuple(start), waiting)


def _why_not(node: str, out: Set[str], doms: frozenset[str], members: Mapping[str, set[str]], spec: Spec,
             breaker: Breaker) -> str | None:
    if node in out:
        return "already unavailable"
    if len(out) + 1 > spec.max_unavailable:
        return f"max_unavailable: {len(out)} node(s) of the fleet are unavailable (max {spec.max_unavailable})"
    for d in sorted(doms):
        n = len(out & members.get(d, set()))
        if n + 1 > spec.max_unavailable_domain:
            return f"max_unavailable_domain: {n} node(s) of {d} are unavailable (max {spec.max_unavailable_domain})"
    return breaker(node, out)


def waves(order: Sequence[str], unavailable: Set[str], domains: Mapping[str, frozenset[str]], spec: Spec,
          breaker: Breaker) -> list[list[str]]:
    """The batches the rollout would run in if nothing else changed: each wave is what :func:`admit`
    starts once the previous wave is back (``plan``'s preview; the real batches are admitted live)."""
    left, out = list(order), []
    while left:
        got = admit(left, unavailable, domains, spec, breaker)
        if not got.start:
            break
        out.append(list(got.start))
        left = [n for n in left if n not in got.start]
    return out
