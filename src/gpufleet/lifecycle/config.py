"""The policy file (TOML): thresholds, windows, budgets and catalog overrides — never hard-coded.

Every key has a documented default (docs/policy.md); an unknown key or a bad value is rejected with
the key's path, the value and what was expected. Example::

    [policy]
    evidence_window = "24h"
    checkpoint_wait_timeout = "2h"
    checkpoint_risk_budget = 64        # GPU-hours at risk before a drain stops waiting

    [breaker]
    max_unavailable_fleet = 0.10
    max_unavailable_domain = 0.25

    [[escalation]]
    kind = "xid"
    code = 94
    count = 2
    window = "24h"
    severity = "fatal"
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from gpufleet.domain.catalog import Catalog, load_default_catalog
from gpufleet.domain.durations import format_duration, parse_duration
from gpufleet.domain.errors import InvalidInput
from gpufleet.domain.false_alarms import FALSE_ALARM_BUDGET, false_alarm_budget

# The range of a "deadline" setting (validation_start_timeout): never 0 (a job could not be submitted and
# seen before it), and no longer than a day (a node kept out of service that long for want of a start is stuck).
DEADLINE_MIN, DEADLINE_MAX = timedelta(seconds=1), timedelta(days=1)


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    dry_run: bool = False  # decide and audit, but change nothing in the scheduler
    # How far back the policy looks at a node's events (escalation windows may look further).
    evidence_window: timedelta = timedelta(hours=24)
    # "drain after checkpoint" stops waiting and drains after this long.
    checkpoint_wait_timeout: timedelta = timedelta(hours=2)
    # How often the reconciler re-checks a node waiting for its job's checkpoint.
    checkpoint_poll: timedelta = timedelta(seconds=30)
    # The wait for a requested checkpoint ends when the job's GPUs x time since its last checkpoint
    # reaches this many GPU-hours (lifecycle.checkpoint), but not before checkpoint_grace after the
    # request nor after checkpoint_wait_timeout.
    checkpoint_risk_budget: float = 64.0
    checkpoint_grace: timedelta = timedelta(minutes=10)  # the shortest wait after asking a job to checkpoint
    # GPUs per node, for a job whose scheduler does not report its GPUs (Slurm without gres).
    gpus_per_node: int = 8
    # Drained nodes are handed to repair without an operator.
    auto_repair: bool = True
    # New nodes start burn-in without an operator.
    auto_burn_in: bool = True
    # Suspect nodes stay schedulable but are placed last (Slurm: weight; Kubernetes: PreferNoSchedule).
    place_suspects_last: bool = True
    # Agents' clocks may lag the controller's by this much: evidence stamped up to this long before a
    # node's last transition still counts as new.
    clock_skew: timedelta = timedelta(minutes=5)
    # An agent silent for this long produces a heartbeat_lost event (0 disables).
    heartbeat_timeout: timedelta = timedelta(minutes=2)
    # A validation job still pending (never started: e.g. Slurm's ReqNodeNotAvail on a node someone drained)
    # this long after it was submitted is cancelled, and the validation fails with the pending reason (the
    # repair ladder does not count it as the fault coming back; a pairing job kept waiting by a partner that
    # is not free is paired again instead).
    validation_start_timeout: timedelta = timedelta(minutes=10)
    # Blast-radius budget: at most this share of the fleet / of any rack or switch domain unavailable.
    max_unavailable_fleet: float = 0.10
    max_unavailable_domain: float = 0.25  # per rack / switch domain (max_unavailable_fleet: the fleet)
    # The same fault seen by two sources (NVML and the kernel log, a check) within this long is one
    # fault: the later observation is stored, merged onto the first, and not counted again.
    merge_window: timedelta = timedelta(seconds=30)
    # With a topology, a link event toward a shared part (a leaf switch, an NVSwitch) waits this long
    # for the correlator before the per-node policy judges it: a failing switch is one decision.
    correlation_hold: timedelta = timedelta(seconds=20)
    # With a topology, the false verdicts per node-day the correlator's coherence statistic may cost:
    # a larger budget names weaker patterns sooner and wrongly more often (docs/correlate.md, §What the
    # budget buys).
    correlation_false_alarm_budget: float = FALSE_ALARM_BUDGET
    # Reconciler retry policy for failed scheduler actions.
    retry_base: timedelta = timedelta(seconds=2)
    retry_cap: timedelta = timedelta(minutes=5)  # the longest delay between retries (doubling from retry_base)
    max_attempts: int = 50  # after this many failed attempts an action is given up (retry: POST /v1/actions/{id}/retry)
    # The repair escalation ladder (lifecycle.repair; section [repair]): this many reboots for the same
    # fault within reboot_window, and the next repair is a hardware ticket; lemon_repairs repairs of a
    # node within lemon_window, and it is recommended for retirement. A repair step (GPU reset, reboot)
    # with no result within step_timeout counts as failed.
    reboot_limit: int = 2
    reboot_window: timedelta = timedelta(days=7)  # reboots for the same fault counted over this long
    lemon_repairs: int = 4  # repairs of one node within lemon_window that make it a lemon (retire ticket)
    lemon_window: timedelta = timedelta(days=30)  # repairs counted over this long
    step_timeout: timedelta = timedelta(minutes=30)  # a repair step with no result after this has failed


_POLICY_KEYS: dict[str, str] = {
    "dry_run": "bool",
    "evidence_window": "duration",
    "checkpoint_wait_timeout": "duration",
    "checkpoint_poll": "duration",
    "checkpoint_risk_budget": "gpu_hours",
    "checkpoint_grace": "duration",
    "gpus_per_node": "count",
    "auto_repair": "bool",
    "auto_burn_in": "bool",
    "place_suspects_last": "bool",
    "heartbeat_timeout": "duration",
    "validation_start_timeout": "deadline",
    "clock_skew": "duration",
    "merge_window": "duration",
    "correlation_hold": "duration",
    "correlation_false_alarm_budget": "per_node_day",
}
_BREAKER_KEYS = {"max_unavailable_fleet": "share", "max_unavailable_domain": "share"}
_RECONCILER_KEYS = {"retry_base": "duration", "retry_cap": "duration", "max_attempts": "count"}
_REPAIR_KEYS = {"reboot_limit": "count", "reboot_window": "duration", "lemon_repairs": "count",
                "lemon_window": "duration", "step_timeout": "duration"}
#: Every table of the policy file with its keys and their kinds (the loader and docs/configuration.md).
SECTIONS: tuple[tuple[str, dict[str, str]], ...] = (
    ("policy", _POLICY_KEYS), ("breaker", _BREAKER_KEYS), ("reconciler", _RECONCILER_KEYS), ("repair", _REPAIR_KEYS))


@dataclass(frozen=True, slots=True)
class PolicyFile:
    config: PolicyConfig
    catalog: Catalog


def parse_policy(doc: Mapping[str, Any], base: Catalog | None = None) -> PolicyFile:
    """Validate a parsed policy document. Nothing is applied unless everything is valid."""
    allowed = {name for name, _ in SECTIONS} | {"override", "escalation"}
    for key in doc:
        if key not in allowed:
            raise InvalidInput(key, doc[key], f"one of the sections {sorted(allowed)}")
    values: dict[str, Any] = {}
    for section, keys in SECTIONS:
        table = doc.get(section, {})
        if not isinstance(table, dict):
            raise InvalidInput(section, table, "a table")
        for key, value in table.items():
            kind = keys.get(key)
            path = f"{section}.{key}"
            if kind is None:
                raise InvalidInput(path, value, f"one of the keys {sorted(keys)}")
            values[key] = _coerce(kind, value, path)
    catalog = (base or load_default_catalog()).with_overrides(
        {k: doc[k] for k in ("override", "escalation") if k in doc}, source="policy file"
    )
    config = PolicyConfig(**values)
    _check_together(config, set(values))
    return PolicyFile(config=config, catalog=catalog)


def _check_together(c: PolicyConfig, given: set[str]) -> None:
    """Settings valid alone but contradictory together (a drill had them accepted silently). Only a value
    the file sets is refused: a short checkpoint_wait_timeout alone under the default grace is fine (the
    wait ends at the timeout)."""
    if "checkpoint_grace" in given and c.checkpoint_grace > c.checkpoint_wait_timeout:
        raise InvalidInput("policy.checkpoint_grace", str(c.checkpoint_grace),
                           f"at most policy.checkpoint_wait_timeout ({c.checkpoint_wait_timeout}): the wait after "
                           "asking a job to checkpoint ends at the timeout whatever the grace")
    if "retry_base" in given and c.retry_base > c.retry_cap:
        raise InvalidInput("reconciler.retry_base", str(c.retry_base),
                           f"at most reconciler.retry_cap ({c.retry_cap}): retries double from the base up to the cap")


def load_policy(path: Path | str | None = None, base: Catalog | None = None) -> PolicyFile:
    """Load a policy file (``None``: all defaults and the shipped catalog)."""
    if path is None:
        return parse_policy({}, base)
    p = Path(path)
    try:
        doc = tomllib.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InvalidInput("policy_file", str(p), "an existing TOML file") from None
    except tomllib.TOMLDecodeError as err:
        raise InvalidInput("policy_file", str(p), f"valid TOML ({err})") from None
    return parse_policy(doc, base)


def _coerce(kind: str, value: Any, path: str) -> Any:
    if kind == "bool":
        if not isinstance(value, bool):
            raise InvalidInput(path, value, "true or false")
        return value
    if kind == "duration":
        return parse_duration(value, path)
    if kind == "deadline":
        d = parse_duration(value, path)
        if not DEADLINE_MIN <= d <= DEADLINE_MAX:
            raise InvalidInput(path, value, f"a duration from {format_duration(DEADLINE_MIN)} to "
                                            f"{format_duration(DEADLINE_MAX)}, e.g. 10m")
        return d
    if kind == "share":
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
            raise InvalidInput(path, value, "a fraction in (0, 1], e.g. 0.10 for 10 %")
        return float(value)
    if kind == "gpu_hours":
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise InvalidInput(path, value, "a positive number of GPU-hours, e.g. 64")
        return float(value)
    if kind == "per_node_day":
        return false_alarm_budget(value, path)
    if kind == "count":
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidInput(path, value, "an integer >= 1")
        return value
    raise AssertionError(kind)
