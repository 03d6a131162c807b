"""Repair steps run by the node's own agent: GPU reset, reboot, fabric-manager restart.

The controller queues a command (``commands`` table, keyed by the step's key); the node's agent polls
``GET /v1/nodes/{node}/commands`` with its token, runs it and posts the result to
``POST /v1/nodes/{node}/commands/{id}/result`` (docs/agent.md, "Repair commands"). A command with no
result within ``step_timeout`` is expired: the agent is told to drop it and the step counts as failed.
"""

from __future__ import annotations

from gpufleet.controller.clock import Clock
from gpufleet.controller.store.repairs import Command, CommandStatus, RepairStore
from gpufleet.domain.errors import InvalidInput
from gpufleet.lifecycle.repair import AGENT_STEPS

from .port import StepOutcome, StepRequest


class AgentExecutor:
    name = "agent"

    def __init__(self, repairs: RepairStore, clock: Clock) -> None:
        self.repairs, self.clock = repairs, clock

    def start(self, req: StepRequest) -> None:
        if req.step not in AGENT_STEPS:
            raise InvalidInput("step", req.step, f"one of {sorted(AGENT_STEPS)} (what a node's agent can do)")
        self.repairs.enqueue(req.key, req.node, req.step, self.clock.now())

    def outcome(self, req: StepRequest) -> StepOutcome | None:
        return _outcome(self.repairs.command(req.key), req.key)

    def abandon(self, req: StepRequest) -> StepOutcome | None:
        return _outcome(self.repairs.expire(req.key, self.clock.now()), req.key)


def _outcome(cmd: Command | None, key: str) -> StepOutcome | None:
    if cmd is None:
        return StepOutcome(False, f"command {key} is not queued (lost)")
    if cmd.status == CommandStatus.QUEUED:
        return None
    ok = cmd.status == CommandStatus.SUCCEEDED
    return StepOutcome(ok, cmd.detail or cmd.status)
