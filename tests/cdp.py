"""A tiny Chrome DevTools Protocol client for tests: headless Chromium driven over
``--remote-debugging-pipe`` (CDP messages, NUL-separated JSON, on file descriptors 3 and
4 of the browser).

Why a pipe and not the websocket of ``--remote-debugging-port``: no TCP port to pick or
collide on (other test sessions share the machine), no websocket library to add (the
project has none), and the browser cannot outlive the pipe's owner unnoticed.
Why not playwright: it downloads its own browser build and needs Node; Debian's
``chromium`` is what the issue asks to test with.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--remote-debugging-pipe",
)


def find_chromium() -> str | None:
    """Debian's browser binary itself (its /usr/bin/chromium wrapper script only adds
    desktop defaults), else what is on PATH."""
    if os.access("/usr/lib/chromium/chromium", os.X_OK):
        return "/usr/lib/chromium/chromium"
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


class CdpError(RuntimeError):
    pass


class Browser:
    """One headless Chromium; :meth:`page` opens a tab to drive."""

    def __init__(
        self,
        binary: str,
        *,
        timeout_s: float = 30.0,
        startup_timeout_s: float = 120.0,
        flags: Sequence[str] = (),
    ) -> None:
        self.timeout_s = timeout_s
        #: The first answer waits for the browser to start: on a loaded 2-core CI machine
        #: (three test workers, other browsers) that took over 30 s once.
        self.startup_timeout_s = startup_timeout_s
        self._answered = False
        self.profile = tempfile.mkdtemp(prefix="sgs-chromium-")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()

        def child_fds() -> None:  # runs in the child between fork and exec
            os.dup2(to_browser_r, 3)
            os.dup2(from_browser_w, 4)

        self.proc = subprocess.Popen(
            [binary, *CHROMIUM_FLAGS, *flags, f"--user-data-dir={self.profile}", "about:blank"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=child_fds,
            # 3 and 4 are kept open across exec (the dup2 above runs before the
            # close of unlisted descriptors).
            pass_fds=(3, 4, to_browser_r, from_browser_w),
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        os.set_blocking(self._from_browser, False)
        self._ids = itertools.count(1)
        self._buf = b""
        self._pending: list[dict[str, Any]] = []

    # -------------------------------------------------------------- protocol

    def send(
        self, method: str, params: dict[str, Any] | None = None, session: str | None = None
    ) -> dict[str, Any]:
        """Send one command and wait (bounded) for its result; events are queued."""
        msg_id = next(self._ids)
        msg: dict[str, Any] = {"id": msg_id, "method": method, "params": params or {}}
        if session is not None:
            msg["sessionId"] = session
        os.write(self._to_browser, json.dumps(msg).encode() + b"\0")
        wait_s = self.timeout_s if self._answered else self.startup_timeout_s
        deadline = time.monotonic() + wait_s
        answer: dict[str, Any] | None = None
        while answer is None:
            for m in self._read(deadline):  # every message read is looked at
                if m.get("id") == msg_id:
                    answer = m
                elif m.get("method") == "Runtime.exceptionThrown":
                    self._pending.append(m)  # other events are not kept
        self._answered = True
        if "error" in answer:
            raise CdpError(f"{method}: {answer['error']}")
        result: dict[str, Any] = answer.get("result", {})
        return result

    def _read(self, deadline: float) -> list[dict[str, Any]]:
        """The complete messages the browser has sent (waits for at least one)."""
        while b"\0" not in self._buf:
            if time.monotonic() > deadline:
                raise TimeoutError("no answer from Chromium")
            if self.proc.poll() is not None:
                raise CdpError(f"Chromium exited with {self.proc.returncode}")
            try:
                chunk = os.read(self._from_browser, 1 << 20)
            except BlockingIOError:
                time.sleep(0.01)
                continue
            if not chunk:
                raise CdpError("Chromium closed the pipe")
            self._buf += chunk
        *messages, self._buf = self._buf.split(b"\0")
        return [json.loads(raw) for raw in messages]

    def page(self, width: int = 1440, height: int = 1500) -> Page:
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})[
            "sessionId"
        ]
        p = Page(self, session)
        p.send("Page.enable")
        p.send("Runtime.enable")
        p.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )
        return p

    def close(self) -> None:
        with contextlib.suppress(OSError, CdpError, TimeoutError):
            self.send("Browser.close")
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        for fd in (self._to_browser, self._from_browser):
            with contextlib.suppress(OSError):
                os.close(fd)
        shutil.rmtree(self.profile, ignore_errors=True)


class Page:
    def __init__(self, browser: Browser, session: str) -> None:
        self.browser = browser
        self.session = session

    def send(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.browser.send(method, params, self.session)

    def exceptions(self) -> list[str]:
        """Uncaught JavaScript exceptions of this page so far."""
        self.js("0")  # read what the browser has sent meanwhile
        return [
            str(m["params"]["exceptionDetails"].get("exception", {}).get("description"))
            for m in self.browser._pending
            if m.get("sessionId") == self.session
        ]

    def goto(self, url: str) -> None:
        self.send("Page.navigate", {"url": url})
        self.wait("document.readyState === 'complete'", what=f"{url} to load")

    def js(self, expression: str) -> Any:
        """The value of ``expression`` in the page (awaited if it is a promise)."""
        result = self.send(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
        )
        if "exceptionDetails" in result:
            raise CdpError(f"{expression[:80]}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait(self, expression: str, timeout_s: float = 30.0, what: str = "") -> Any:
        """Poll ``expression`` until it is truthy; fail after ``timeout_s``. (A DOM node
        comes back as ``{}``, which Python finds false: test nodes with ``!!``.)"""
        deadline = time.monotonic() + timeout_s
        while True:
            value = self.js(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                shown = self.js("document.body ? document.body.innerText.slice(0, 3000) : ''")
                raise AssertionError(
                    f"timed out after {timeout_s}s waiting for {what or expression}; "
                    f"the page shows:\n{shown}"
                )
            time.sleep(0.1)

    def text(self, selector: str) -> str:
        value = self.js(f"(document.querySelector({json.dumps(selector)}) || {{}}).innerText || ''")
        return str(value)

    def click(self, selector: str) -> None:
        self.js(f"document.querySelector({json.dumps(selector)}).click()")

    def fill(self, selector: str, value: str) -> None:
        """Set a field's value and fire ``input``, as typing would."""
        self.js(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)}); "
            f"e.value = {json.dumps(value)}; "
            "e.dispatchEvent(new Event('input', {bubbles: true})); })()"
        )

    def screenshot(self, path: Path) -> None:
        data = self.send(
            "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": False}
        )
        path.write_bytes(base64.b64decode(data["data"]))
