"""Run the real agent (``run_agent``: every piece wired as in production) in a thread, for tests."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.agent.app import run_agent
from gpufleet.agent.clock import SystemClock
from gpufleet.agent.config import AgentConfig
from gpufleet.agent.devices.port import Device


@dataclass
class Running:
    port: int
    stop: threading.Event
    thread: threading.Thread
    errors: list[BaseException] = field(default_factory=list)

    def metrics(self) -> dict[str, float]:
        """Unlabelled and labelled samples as ``name{k=v,...}`` -> value."""
        text = httpx.get(f"http://127.0.0.1:{self.port}/metrics", timeout=10).text
        out: dict[str, float] = {}
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                key = s.name + (
                    "{" + ",".join(f"{k}={v}" for k, v in sorted(s.labels.items())) + "}" if s.labels else ""
                )
                out[key] = s.value
        return out


@contextmanager
def running_agent(cfg: AgentConfig, device: Device, clock: SystemClock | None = None) -> Iterator[Running]:
    stop = threading.Event()
    ready = threading.Event()
    port: list[int] = []
    errors: list[BaseException] = []

    def target() -> None:
        try:
            run_agent(
                cfg,
                stop,
                clock=clock or SystemClock(),
                device=device,
                ready=lambda p: (port.append(p), ready.set()),
            )
        except BaseException as err:  # surfaced by the test below
            errors.append(err)
            ready.set()

    t = threading.Thread(target=target, name="agent-under-test", daemon=True)
    t.start()
    assert ready.wait(30), "agent did not start"
    if errors:
        raise errors[0]
    r = Running(port[0], stop, t, errors)
    try:
        yield r
    finally:
        stop.set()
        t.join(timeout=30)
        assert not t.is_alive(), "agent did not stop"
        if errors:
            raise errors[0]


def wait_for(cond: object, what: str, timeout_s: float = 60.0) -> None:
    """Poll ``cond()`` until true (waiting on a condition, not on a duration)."""
    done = threading.Event()
    deadline = SystemClock()
    start = deadline.monotonic()
    while not cond():  # type: ignore[operator]
        if deadline.monotonic() - start > timeout_s:
            raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        done.wait(0.05)
