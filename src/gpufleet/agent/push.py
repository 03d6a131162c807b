"""Push to the controller: event batches and a heartbeat, at-least-once, with backoff and jitter.

Contract (controller API v1):

* ``POST /v1/events`` ``{"events": [...]}`` with ``Authorization: Bearer <token>`` -> 202
  ``{"accepted": n, "duplicates": m}``. A batch is accepted or rejected whole; 422 names the field.
* ``POST /v1/nodes/{node}/heartbeat`` ``{"time": ISO, "agent_version": str}`` -> 200.
* ``PUT /v1/nodes/{node}/inventory`` with the ``gpufleet.inventory/v1`` document -> 200
  ``{"moved": [...], "missing": [...]}``.
* 409: an event id this node already used for another event; handled like a 422 (isolated and dropped).
* 401/403: bad token (logged as an error with the fix; retried at the backoff cap, never dropped).
* 429 (the controller's ingest queue is full) with ``Retry-After``: nothing is sent before that many
  seconds have passed (spread over up to twice that, so agents refused together do not come back together).

The :class:`Pusher` takes events from the :class:`~gpufleet.agent.spool.Spool` oldest first and deletes
them only after a 202, so a crash or a timeout resends (the controller deduplicates by event id). A 422
batch is split in halves until the bad event is alone; that one is dropped with an ERROR log (it can never
be accepted) and the rest go through. Connection errors and 5xx back off exponentially with jitter.

Given the node's inventory, the pusher registers it before it pushes any event (the controller names
events with topology ids from it), retried with the same backoff while the events wait in the spool;
:meth:`Pusher.set_inventory` with a changed inventory registers it again. A 422 for the inventory can
never succeed: it is logged as an error and the events go on without it.
"""

from __future__ import annotations

import json
import logging
import random
import ssl
import threading
from dataclasses import dataclass
from datetime import datetime

import httpx

from gpufleet import __version__
from gpufleet.agent.clock import AgentClock
from gpufleet.agent.spool import Spool
from gpufleet.domain.errors import InvalidInput
from gpufleet.domain.inventory import NodeInventory

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PushResult:
    ok: bool
    status: int | None = None  # HTTP status, None when the request never got an answer
    accepted: int = 0
    duplicates: int = 0
    error: str = ""
    retry_after_s: float | None = None  # a 429's (or 503's) Retry-After: the controller is busy


class Backoff:
    """Exponential backoff with "equal jitter".

    The n-th delay is uniform in [d/2, d] with d = min(cap, base * 2**n): never zero, never in lockstep.
    """

    def __init__(self, base_s: float = 1.0, cap_s: float = 60.0, rng: random.Random | None = None) -> None:
        if base_s <= 0 or cap_s < base_s:
            raise InvalidInput("backoff", (base_s, cap_s), "0 < base <= cap")
        self.base_s, self.cap_s = base_s, cap_s
        self.attempt = 0
        self._rng = rng or random.Random()

    def next(self) -> float:
        d = min(self.cap_s, self.base_s * (2 ** min(self.attempt, 30)))
        self.attempt += 1
        return float(d / 2 + self._rng.uniform(0.0, d / 2))

    def reset(self) -> None:
        self.attempt = 0

    def jitter(self) -> float:
        """Uniform in [0, 1): spreads retries the controller scheduled (Retry-After)."""
        return self._rng.random()


class ControllerClient:
    """Thin HTTP client for the two agent endpoints. Never raises for network errors: returns PushResult."""

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout_s: float = 10.0,
        transport: httpx.BaseTransport | None = None,
        verify: ssl.SSLContext | bool = True,
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise InvalidInput("controller", base_url, "an http:// or https:// URL")
        self.base_url = base_url.rstrip("/")
        self._http = httpx.Client(
            base_url=base_url.rstrip("/"),
            timeout=timeout_s,
            transport=transport,
            verify=verify,  # agent/tls.py: the site CA and this node's client certificate
            headers={
                "Authorization": f"Bearer {token}",
                "Content-Type": "application/json",
                "User-Agent": f"gpufleet-agent/{__version__}",
            },
        )

    def post_events(self, bodies: list[str]) -> PushResult:
        payload = '{"events":[' + ",".join(bodies) + "]}"
        try:
            r = self._http.post("/v1/events", content=payload)
        except httpx.HTTPError as err:
            return PushResult(False, None, error=f"{type(err).__name__}: {err}")
        if r.status_code == 202:
            try:
                doc = r.json()
                return PushResult(True, 202, int(doc.get("accepted", 0)), int(doc.get("duplicates", 0)))
            except (ValueError, AttributeError, TypeError):
                return PushResult(True, 202)
        return _refused(r)

    def heartbeat(self, node: str, now: datetime) -> PushResult:
        body = json.dumps({"time": now.isoformat(), "agent_version": __version__})
        try:
            r = self._http.post(f"/v1/nodes/{node}/heartbeat", content=body)
        except httpx.HTTPError as err:
            return PushResult(False, None, error=f"{type(err).__name__}: {err}")
        return PushResult(True, 200) if r.status_code == 200 else _refused(r)

    def put_inventory(self, inv: NodeInventory) -> PushResult:
        """Register ``inv`` for its node; ``accepted`` is the number of moves the controller saw in it."""
        try:
            r = self._http.put(f"/v1/nodes/{inv.node}/inventory", content=json.dumps(inv.to_json()))
        except httpx.HTTPError as err:
            return PushResult(False, None, error=f"{type(err).__name__}: {err}")
        if r.status_code != 200:
            return _refused(r)
        try:
            moved = len(r.json().get("moved", []))
        except (ValueError, AttributeError, TypeError):
            moved = 0
        return PushResult(True, 200, accepted=moved)

    def close(self) -> None:
        self._http.close()


def _refused(r: httpx.Response) -> PushResult:
    """A refused request; with the Retry-After (seconds) the controller asked for, if any."""
    after = r.headers.get("retry-after", "")
    try:
        retry = min(float(after), 3600.0) if after else None
    except ValueError:
        retry = None
    return PushResult(False, r.status_code, error=r.text[:2000], retry_after_s=retry)


def _detail(error_body: str) -> object:
    """The ``detail`` of a controller's JSON error body (FastAPI's shape), or None when it has none."""
    try:
        return json.loads(error_body).get("detail")
    except (ValueError, AttributeError):
        return None


def _names_node(error_body: str) -> bool:
    """True when a 422 blames the node (not registered / not ours): a setup problem, never the event's."""
    detail = _detail(error_body)
    fields = [d.get("field", "") for d in detail] if isinstance(detail, list) else []
    fields += [str(detail)] if isinstance(detail, str) else []
    return any(str(f).endswith(".node") or str(f) == "node" for f in fields if isinstance(f, str))


class Pusher:
    """Drains the spool to the controller. Call :meth:`step` (it returns how long to wait) or :meth:`run`."""

    def __init__(
        self,
        spool: Spool,
        client: ControllerClient,
        node: str,
        clock: AgentClock,
        *,
        batch_size: int = 500,
        heartbeat_s: float = 30.0,
        backoff: Backoff | None = None,
        inventory: NodeInventory | None = None,
    ) -> None:
        if batch_size < 1:
            raise InvalidInput("push.batch_size", batch_size, "at least 1")
        self.spool, self.client, self.node, self.clock = spool, client, node, clock
        self.batch_size = batch_size
        self.heartbeat_s = heartbeat_s
        self.backoff = backoff or Backoff()
        self.kick = threading.Event()
        self.pushed = 0
        self.duplicates = 0
        self.failures = 0
        self.controller_up = False
        self.last_success: datetime | None = None
        self._next_heartbeat = 0.0
        self._retry_at = 0.0
        self.inventory: NodeInventory | None = None
        self._registered: NodeInventory | None = None  # the inventory last registered (or refused for good)
        if inventory is not None:
            self.set_inventory(inventory)

    def set_inventory(self, inv: NodeInventory) -> None:
        """Register ``inv`` before the next push, unless it is the one already registered."""
        if inv.node != self.node:
            raise InvalidInput("inventory.node", inv.node, f"this agent's node ({self.node!r})")
        if inv != self.inventory:
            self.inventory = inv
            self.kick.set()

    @property
    def inventory_due(self) -> bool:
        """True while the current inventory is not registered yet (events wait for it)."""
        return self.inventory is not None and self.inventory != self._registered

    def step(self) -> float:
        """One round: heartbeat if due, then push batches until the spool is empty or a push fails."""
        mono = self.clock.monotonic()
        if mono < self._retry_at:
            return self._retry_at - mono
        if mono >= self._next_heartbeat:
            hb = self.client.heartbeat(self.node, self.clock.now())
            self._next_heartbeat = mono + self.heartbeat_s
            if hb.ok:
                self._succeeded()
            elif hb.status is None or hb.status == 429:  # no answer, or busy: events would not get through either
                return self._failed(hb, "heartbeat")
            else:  # e.g. 404 node not registered: say so, but still try the events
                log.error("controller refused the heartbeat of %s (%s %s)", self.node, hb.status, hb.error[:200])
        if self.inventory_due and not self._register_inventory():
            return max(0.0, self._retry_at - self.clock.monotonic())
        while len(self.spool):
            batch = self.spool.peek(self.batch_size)
            if not batch:
                break
            if not self._send(batch):
                return max(0.0, self._retry_at - self.clock.monotonic())
        return max(0.0, self._next_heartbeat - self.clock.monotonic())

    def _register_inventory(self) -> bool:
        """PUT the inventory; False (retry scheduled) when the events must keep waiting for it."""
        inv = self.inventory  # one snapshot: a newer one set meanwhile stays due
        assert inv is not None
        res = self.client.put_inventory(inv)
        if res.ok:
            self._registered = inv
            log.info("registered the inventory of %s (%d GPUs, %d NICs; %d move(s) seen)",
                     self.node, len(inv.gpus), len(inv.nics), res.accepted)
            self._succeeded()
            return True
        if res.status == 422:
            self._registered = inv
            log.error("controller refused the inventory of %s for good (%s); events are pushed without it: "
                      "fix the inventory (gpufleet agent --print-inventory)", self.node, res.error[:300])
            return True
        self._failed(res, "inventory")
        return False

    def _send(self, batch: list[tuple[int, str]]) -> bool:
        res = self.client.post_events([b for _, b in batch])
        if res.ok:
            self.spool.ack([s for s, _ in batch])
            self.pushed += res.accepted
            self.duplicates += res.duplicates
            self._succeeded()
            return True
        # 422 (invalid) and 409 (an id already used for another event) can never succeed: isolate and drop.
        if (res.status == 409 or (res.status == 422 and not _names_node(res.error))):
            if len(batch) == 1:
                self.spool.drop([batch[0][0]], f"{res.status} {res.error} for {batch[0][1][:300]}")
                return True
            mid = len(batch) // 2
            return self._send(batch[:mid]) and self._send(batch[mid:])
        self._failed(res, f"{len(batch)} events")
        return False

    def _unknown_node(self, res: PushResult) -> bool:
        """A 404 saying this node is not found (not registered), not a wrong URL's plain 404."""
        if res.status != 404:
            return False
        detail = _detail(res.error)
        return isinstance(detail, str) and repr(self.node) in detail and "not found" in detail

    def _succeeded(self) -> None:
        if not self.controller_up:
            log.info("controller %s reachable; %d events in the spool", self.client.base_url, len(self.spool))
        self.controller_up = True
        self.last_success = self.clock.now()
        self.backoff.reset()

    def _failed(self, res: PushResult, what: str) -> float:
        """Record a failure and schedule the retry; returns the delay (the round stops)."""
        self.failures += 1
        self.controller_up = False
        delay = self.backoff.next()
        if res.retry_after_s is not None:  # the controller is busy: come back when it said, not sooner,
            # spread over up to twice that so the agents it refused together do not return together
            delay = max(delay, res.retry_after_s * (1.0 + self.backoff.jitter()))
        if res.status == 429:
            log.info("controller busy (429) for %s; %d events kept in the spool, retrying in %.1fs",
                     what, len(self.spool), delay)
        elif res.status in (401, 403):
            log.error(
                "controller refused the node token (%s) for %s: check --token-file; retrying in %.0fs",
                res.status,
                what,
                delay,
            )
        elif res.status == 422 or self._unknown_node(res):
            log.error(
                "controller does not know node %s (%s): an admin registers it (gpufleet fleet register %s --rack "
                "RACK, or POST /v1/nodes); %d events kept in the spool, retrying in %.0fs",
                self.node,
                res.error[:200],
                self.node,
                len(self.spool),
                delay,
            )
        else:
            log.warning(
                "push of %s failed (%s %s); %d events spooled; retrying in %.1fs",
                what,
                res.status or "no answer",
                res.error[:200],
                len(self.spool),
                delay,
            )
        self._retry_at = self.clock.monotonic() + delay
        return delay

    def run(self, stop: threading.Event) -> None:
        """Loop until ``stop`` is set; wakes early when :attr:`kick` is set (new events spooled)."""
        while not stop.is_set():
            try:
                wait = self.step()
            except Exception:  # a bug here must not kill the push thread: log and retry later
                log.exception("push worker failed; retrying")
                wait = self.backoff.next()
            if len(self.spool) and self.clock.monotonic() >= self._retry_at:
                wait = 0.0
            self.kick.wait(timeout=max(0.05, wait))
            self.kick.clear()
