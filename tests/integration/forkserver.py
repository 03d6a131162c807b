"""Controller processes for a storm test, forked from one process that imported the controller once.

The crash-safety storm kills its controller with SIGKILL twenty times or more and starts it again each
time. Started as ``python -m tests.integration.crash.child``, every start imported FastAPI, SQLAlchemy,
Alembic and the controller: about 2.3 s of CPU on the 2-core reference box, most of the test's 90 s.
Here one server process imports the child's module once and forks a process per start that runs the
module's ``cli`` with the start's arguments: a real process running the production runtime, killed with
a real SIGKILL, that shares only the imported modules with the server. The server holds no thread when it forks (checked
before each fork) and opens nothing but its two pipes, which the child replaces at once.

    python -m tests.integration.forkserver MODULE     # then, per line on stdin: {"args": [...], "log": PATH}

MODULE (``tests.integration.crash.child``, ``tests.integration.ha.child``) has ``cli(args)``, which its
``python -m`` entry calls with ``sys.argv[1:]`` too.

It answers each request with the child's pid on a line, and exits when its stdin closes. Its children
are reaped by the kernel (SIGCHLD ignored), so a dead child's pid is gone at once: :meth:`Forked.alive`
asks the kernel.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


class Forked:
    """A child of the fork server (not of this process: it cannot be waited for, only asked about)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def alive(self) -> bool:
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        return True

    def kill9(self, timeout: float = 10.0) -> None:
        """SIGKILL, then return once the kernel has reaped it."""
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + timeout
        while self.alive():
            assert time.monotonic() < deadline, f"process {self.pid} still there {timeout:.0f} s after SIGKILL"
            time.sleep(0.005)


class ForkServer:
    """The test's end: start the server for ``module`` (whose ``cli`` takes the request's args)."""

    def __init__(self, module: str, log: Path) -> None:
        self._log_path = log
        self._log = log.open("ab")
        self._proc = subprocess.Popen([sys.executable, "-m", "tests.integration.forkserver", module], cwd=ROOT,
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True)

    def spawn(self, args: list[str], log: Path) -> Forked:
        """A new process running ``module.cli(args)``, its output appended to ``log``."""
        stdin, stdout = self._proc.stdin, self._proc.stdout
        assert stdin is not None and stdout is not None
        try:
            stdin.write(json.dumps({"args": args, "log": str(log)}) + "\n")
            stdin.flush()
            line = stdout.readline()
        except BrokenPipeError:
            line = ""
        assert line.strip().isdigit(), (f"the fork server answered {line!r} (exit {self._proc.poll()}): "
                                        f"{self._log_path.read_text(errors='replace')[-2000:]}")
        return Forked(int(line))

    def close(self) -> None:
        if self._proc.stdin is not None:
            self._proc.stdin.close()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        if self._proc.stdout is not None:
            self._proc.stdout.close()
        self._log.close()


def _child(cli: Any, args: list[str], log: str) -> None:
    """In the forked process: output to ``log``, default signal handling, run ``cli``; never return."""
    code = 0
    try:
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        os.close(null)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        cli(args)
    except BaseException:  # a child's crash goes to its log, whatever it is
        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def serve(module: str) -> None:
    cli = importlib.import_module(module).cli
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the children
    for line in sys.stdin:
        req = json.loads(line)
        assert threading.active_count() == 1, f"fork server holds threads: {threading.enumerate()}"
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            _child(cli, list(req["args"]), str(req["log"]))
        print(pid, flush=True)


if __name__ == "__main__":
    serve(sys.argv[1])
