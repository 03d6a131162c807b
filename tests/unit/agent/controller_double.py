"""A small real HTTP server on 127.0.0.1 implementing the controller's agent API (v1) for tests.

``POST /v1/events`` (Bearer token; batch accepted whole or rejected whole with 422 naming the field;
dedup by event id -> 202 {"accepted", "duplicates"}), ``POST /v1/nodes/{node}/heartbeat`` -> 200 and
``PUT /v1/nodes/{node}/inventory`` -> 200 ``{"moved": [], "missing": []}`` (422 naming the field, 404 for an
unknown node).
``stop()`` and ``start()`` again on the same port simulate a controller outage; the store survives.
"""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from pydantic import ValidationError

from gpufleet.controller.api.schemas import EventIn
from gpufleet.domain.errors import InvalidInput
from gpufleet.domain.events import HealthEvent
from gpufleet.domain.inventory import parse_inventory


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ControllerDouble:
    def __init__(self, token: str = "s3cret", port: int | None = None, nodes: set[str] | None = None) -> None:
        self.token = token
        self.nodes = nodes  # None: any node; else only these are registered
        self.port = port or free_port()
        self.events: dict[str, HealthEvent] = {}
        self.received = 0  # event copies received, duplicates included
        self.heartbeats: list[tuple[str, dict[str, Any]]] = []
        self.requests = 0
        self.paths: list[str] = []  # "METHOD path" of every request, in order
        self.inventories: list[dict[str, Any]] = []  # inventory documents registered (PUT), in order
        self.lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        double = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _reply(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_PUT(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with double.lock:
                    double.requests += 1
                    double.paths.append(f"PUT {self.path}")
                if self.headers.get("Authorization") != f"Bearer {double.token}":
                    self._reply(401, {"detail": "bad token"})
                    return
                node = self.path.split("/")[3] if self.path.startswith("/v1/nodes/") else ""
                if not self.path.endswith("/inventory"):
                    self._reply(404, {"detail": "not found"})
                    return
                try:
                    inv = parse_inventory(json.loads(raw))
                except (ValueError, InvalidInput) as err:
                    field = err.field if isinstance(err, InvalidInput) else "body"
                    self._reply(422, {"detail": [{"field": field, "value": None, "expected": str(err)}]})
                    return
                if double.nodes is not None and node not in double.nodes:
                    self._reply(404, {"detail": f"node {node!r} not found"})
                    return
                with double.lock:
                    double.inventories.append(inv.to_json())
                self._reply(200, {"moved": [], "missing": []})

            def do_POST(self) -> None:
                n = int(self.headers.get("Content-Length", "0"))
                raw = self.rfile.read(n)
                with double.lock:
                    double.requests += 1
                    double.paths.append(f"POST {self.path}")
                if self.headers.get("Authorization") != f"Bearer {double.token}":
                    self._reply(401, {"detail": "bad token"})
                    return
                try:
                    body = json.loads(raw)
                except ValueError:
                    self._reply(422, {"detail": "body: not JSON"})
                    return
                if self.path == "/v1/events":
                    self._events(body)
                elif self.path.startswith("/v1/nodes/") and self.path.endswith("/heartbeat"):
                    node = self.path.split("/")[3]
                    if double.nodes is not None and node not in double.nodes:
                        self._reply(404, {"detail": f"node {node!r} not found"})
                        return
                    with double.lock:
                        double.heartbeats.append((node, body))
                    self._reply(200, {"ok": True})
                else:
                    self._reply(404, {"detail": "not found"})

            def _events(self, body: Any) -> None:
                items = body.get("events") if isinstance(body, dict) else None
                if not isinstance(items, list):
                    self._reply(422, {"detail": "events: expected a list"})
                    return
                try:
                    parsed = [EventIn.model_validate(e).to_domain() for e in items]
                except ValidationError as err:
                    self._reply(422, {"detail": [{"field": ".".join(map(str, x["loc"])), "expected": x["msg"]}
                                                 for x in err.errors()]})
                    return
                for i, ev in enumerate(parsed):
                    if double.nodes is not None and ev.node not in double.nodes:
                        self._reply(
                            422,
                            {
                                "detail": [
                                    {
                                        "field": f"events[{i}].node",
                                        "value": ev.node,
                                        "expected": "a registered node (POST /v1/nodes)",
                                    }
                                ]
                            },
                        )
                        return
                acc = dup = 0
                with double.lock:
                    for ev in parsed:
                        double.received += 1
                        if ev.id in double.events:
                            dup += 1
                        else:
                            double.events[ev.id] = ev
                            acc += 1
                self._reply(202, {"accepted": acc, "duplicates": dup})

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            assert self._thread is not None
            self._thread.join(timeout=5)
            self._server = None
