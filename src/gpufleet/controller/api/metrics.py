"""``GET /metrics``: the controller's Prometheus series (viewer token; docs/metrics.md).

The page needs a token like every other route: the series name no node, but they show the fleet's
state. Prometheus sends one with ``authorization: {credentials_file: ...}`` in its scrape config
(deploy/prometheus/README.md). The ingest middleware here times the agents' reports on both paths (the
fast path and the framework's route), which is why it wraps the whole app.
"""

from __future__ import annotations

import re
import time
from typing import Annotated

from fastapi import Depends, FastAPI
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gpufleet.controller.ha.elector import Leadership
from gpufleet.controller.ingest import GroupCommitter
from gpufleet.controller.metrics import ControllerMetrics
from gpufleet.controller.reconciler import Reconciler
from gpufleet.controller.retention import Retention
from gpufleet.controller.service import Controller

from .auth import READ, Caller, require
from .scope import Scope as TenantScope

_HEARTBEAT = re.compile(r"^/v1/nodes/[^/]+/heartbeat$")


def install(app: FastAPI, controller: Controller, committer: GroupCommitter,
            reconciler: Reconciler | None, retention: Retention | None = None,
            scope: TenantScope | None = None, leadership: Leadership | None = None) -> ControllerMetrics:
    """Add ``/metrics`` and the ingest timing to ``app``; the metrics are kept on ``app.state.metrics``."""
    metrics = ControllerMetrics(controller)
    metrics.attach(committer, reconciler, retention)
    metrics.leadership = leadership
    metrics.refused = app.state.refused
    metrics.forwards = app.state.forwards
    app.state.metrics = metrics

    @app.get("/metrics", response_class=Response, include_in_schema=False)  # not part of the /v1 API
    def prometheus(caller: Annotated[Caller, Depends(require(READ))]) -> Response:
        if scope is not None:
            scope.fleet(caller, "/metrics")
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    app.add_middleware(IngestTiming, metrics=metrics)
    return metrics


class IngestTiming:
    """Counts and times ``POST /v1/events`` and heartbeats, from arrival to the start of the answer."""

    def __init__(self, app: ASGIApp, metrics: ControllerMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = _route(scope)
        if route is None:
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        answered = False

        async def sending(message: Message) -> None:
            nonlocal answered
            if message["type"] == "http.response.start" and not answered:
                answered = True
                self.metrics.observe_ingest(route, int(message["status"]), time.perf_counter() - started)
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except Exception:
            if not answered:  # the server answers 500 for an error nothing caught
                self.metrics.observe_ingest(route, 500, time.perf_counter() - started)
            raise


def _route(scope: Scope) -> str | None:
    if scope["type"] != "http" or scope["method"] != "POST":
        return None
    path: str = scope["path"]
    if path == "/v1/events":
        return "events"
    if _HEARTBEAT.match(path):
        return "heartbeat"
    return None
