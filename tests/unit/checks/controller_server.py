"""A tiny real HTTP server standing in for the controller's ``POST /v1/events`` in tests."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Recorder:
    token: str = "s3cret"
    status: int = 202
    bodies: list[dict[str, object]] = field(default_factory=list)
    auth: list[str] = field(default_factory=list)
    url: str = ""


@contextmanager
def controller(token: str = "s3cret", status: int = 202) -> Iterator[Recorder]:
    rec = Recorder(token=token, status=status)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            body = json.loads(self.rfile.read(length))
            rec.auth.append(self.headers.get("Authorization", ""))
            if self.path != "/v1/events":
                code = 404
            elif self.headers.get("Authorization") != f"Bearer {rec.token}":
                code = 401
            else:
                code = rec.status
            if code == 202:
                rec.bodies.append(body)
            payload = json.dumps(
                {"accepted": len(body.get("events", []))} if code == 202 else {"detail": "no"}
            )
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload.encode())

        def log_message(self, format: str, *args: object) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    rec.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield rec
    finally:
        server.shutdown()
        server.server_close()
