"""A real headless Chromium (the Debian package) driven over the Chrome DevTools Protocol.

Just enough of the protocol for the UI tests: open a page, read the DOM with JavaScript, type, click
(real mouse events at the element's centre), take a screenshot. The browser runs with its own profile
directory under the test's tmp dir and is stopped by PID at teardown like every other process.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import shutil
from pathlib import Path
from typing import Any

import httpx
import websocket

from tests.conftest import require_service
from tests.e2e.harness import Fleet, Proc, wait_until


def chromium_binary() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    require_service(found is not None, "chromium binary (apt-get install chromium)")
    assert found is not None
    return found


class Browser:
    def __init__(self, proc: Proc, ws: websocket.WebSocket) -> None:
        self.proc = proc
        self.ws = ws
        self._ids = itertools.count(1)

    @classmethod
    def start(cls, fleet: Fleet, width: int = 1440, height: int = 900) -> Browser:
        profile = fleet.root / "chromium"
        profile.mkdir(parents=True, exist_ok=True)
        argv = [chromium_binary(), "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
                "--disable-extensions", "--disable-background-networking", "--disable-sync", "--mute-audio",
                "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0", "--remote-allow-origins=*",
                f"--user-data-dir={profile}", f"--window-size={width},{height}", "about:blank"]
        proc = Proc.spawn("chromium", argv, fleet.root / "chromium.log")
        fleet.procs.append(proc)
        port_file = profile / "DevToolsActivePort"

        def port() -> int | None:
            lines = port_file.read_text().splitlines() if port_file.exists() else []
            return int(lines[0]) if lines and lines[0].isdigit() else None

        devtools = wait_until(lambda: port() or (None if proc.alive else -1),
                              lambda: f"Chromium's DevTools port; log:\n{proc.text(3000)}", 60)
        assert devtools > 0, f"Chromium exited; log:\n{proc.text(3000)}"

        def page_target() -> str | None:
            try:
                targets = httpx.get(f"http://127.0.0.1:{devtools}/json/list", timeout=5).json()
            except httpx.HTTPError:
                return None
            return next((str(t["webSocketDebuggerUrl"]) for t in targets if t.get("type") == "page"), None)

        url = wait_until(page_target, "a page target in Chromium", 30)
        browser = cls(proc, websocket.create_connection(url, timeout=30, suppress_origin=True))
        browser.call("Page.enable")
        browser.call("Runtime.enable")
        browser.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1,
                     mobile=False)
        return browser

    def close(self) -> None:
        with contextlib.suppress(Exception):  # already gone: the fleet stops the process by PID anyway
            self.call("Browser.close")
        self.ws.close()

    # ---- the protocol ----------------------------------------------------------------------
    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """Send one command and return its result (events that arrive meanwhile are dropped)."""
        mid = next(self._ids)
        self.ws.send(json.dumps({"id": mid, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == mid:
                if "error" in msg:
                    raise AssertionError(f"{method}: {msg['error']}")
                return dict(msg.get("result", {}))

    def js(self, expression: str) -> Any:
        r = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            raise AssertionError(f"{expression}: {r['exceptionDetails']}")
        return r["result"].get("value")

    # ---- what a person does ----------------------------------------------------------------
    def goto(self, url: str) -> None:
        self.call("Page.navigate", url=url)
        self.loaded()

    def loaded(self) -> str:
        """Wait for the document to finish loading; returns its path."""
        return str(wait_until(lambda: self.js("document.readyState === 'complete' && location.pathname"),
                              "the page loaded", 30))

    def path(self) -> str:
        return str(self.js("location.pathname"))

    def text(self, selector: str = "body") -> str:
        return str(self.js(f"(document.querySelector({json.dumps(selector)}) || {{innerText: ''}}).innerText"))

    def exists(self, selector: str) -> bool:
        return bool(self.js(f"document.querySelector({json.dumps(selector)}) !== null"))

    def click(self, selector: str) -> None:
        """A real left click at the centre of the element (scrolled into view first)."""
        box = self.js(f"""(() => {{ const el = document.querySelector({json.dumps(selector)});
            if (!el) return null; el.scrollIntoView({{block: 'center'}});
            const r = el.getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; }})()""")
        assert box is not None, f"no element {selector} on {self.path()}:\n{self.text()[:2000]}"
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", type=kind, x=box[0], y=box[1], button="left", clickCount=1)

    def type(self, selector: str, text: str) -> None:
        self.js(f"document.querySelector({json.dumps(selector)}).focus()")
        self.call("Input.insertText", text=text)

    def follow(self, selector: str, what: str) -> str:
        """Click something that loads another page (a link, a form's button); wait for it; its path."""
        before = self.path()
        self.js("window.__gpufleet_old = true")
        self.click(selector)
        wait_until(lambda: self.js("window.__gpufleet_old !== true && document.readyState === 'complete'"),
                   lambda: f"{what} (still on {before}: {self.text()[:500]})", 30)
        return self.path()

    def screenshot(self, out: Path) -> bytes:
        """The whole page (not only the window) as PNG, written to ``out``."""
        height = int(self.js("Math.min(document.documentElement.scrollHeight, 4000)"))
        width = int(self.js("document.documentElement.clientWidth"))
        shot = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True,
                         clip={"x": 0, "y": 0, "width": width, "height": height, "scale": 1})
        data = base64.b64decode(shot["data"])
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(data)
        return data
