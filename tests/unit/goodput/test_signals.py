"""The checkpoint-request contract: the signal sets a flag; a durable checkpoint is POSTed to the controller."""

from __future__ import annotations

import json
import os
import signal
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from gpufleet.domain.errors import InvalidInput
from gpufleet.goodput.signals import CheckpointRequest, ControllerReporter


def test_the_signal_asks_for_one_checkpoint() -> None:
    req = CheckpointRequest("USR1")
    old = signal.getsignal(signal.SIGUSR1)
    try:
        req.install()
        assert req.take() is False
        os.kill(os.getpid(), signal.SIGUSR1)
        assert req.take() is True
        assert req.take() is False
    finally:
        signal.signal(signal.SIGUSR1, old)


def test_a_bad_signal_name_is_refused() -> None:
    with pytest.raises(InvalidInput) as err:
        CheckpointRequest("NOPE")
    assert err.value.field == "GPUFLEET_CHECKPOINT_SIGNAL"


class _Ctl(BaseHTTPRequestHandler):
    seen: list[tuple[str, str, dict[str, str]]] = []
    status = 202

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _Ctl.seen.append((self.path, self.headers["Authorization"], body))
        self.send_response(_Ctl.status)
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def controller() -> Iterator[str]:
    srv = HTTPServer(("127.0.0.1", 0), _Ctl)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    _Ctl.seen.clear()
    _Ctl.status = 202
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


def test_a_durable_checkpoint_is_reported_to_the_controller(controller: str) -> None:
    rep = ControllerReporter(controller, "tok", "4242")
    assert rep.checkpointed(1795000000.25) is True
    assert _Ctl.seen == [("/v1/jobs/4242/checkpoint", "Bearer tok", {"time": "2026-11-18T11:06:40.250000Z"})]


def test_a_refused_report_is_logged_not_raised(controller: str) -> None:
    _Ctl.status = 500
    assert ControllerReporter(controller, "tok", "1").checkpointed(0.0) is False
    assert ControllerReporter("http://127.0.0.1:9", "tok", "1", timeout_s=0.5).checkpointed(0.0) is False


def test_reporter_from_env(tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUFLEET_CONTROLLER", raising=False)
    assert ControllerReporter.from_env() is None
    monkeypatch.setenv("GPUFLEET_CONTROLLER", "http://ctl:8470")
    monkeypatch.setenv("GPUFLEET_TOKEN_FILE", "/nonexistent/token")
    with pytest.raises(InvalidInput) as err:
        ControllerReporter.from_env()
    assert err.value.field == "GPUFLEET_TOKEN_FILE"
