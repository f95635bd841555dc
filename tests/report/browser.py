"""A page opened in headless Chromium, driven over the DevTools protocol on a pipe.

Chromium's --remote-debugging-pipe reads protocol messages from fd 3 and writes them to
fd 4, each a JSON object ended by a NUL byte: the standard library is enough, no websocket
or driver. `load(page)` opens a file, waits for its load event and returns what the page
reported: uncaught exceptions, console and log errors, failed loads, and the value of a
script run in it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

NAMES = ("chromium", "chromium-browser", "google-chrome")


def chromium() -> str | None:
    """The Chromium binary on PATH (None: none installed)."""
    return next((path for name in NAMES if (path := shutil.which(name))), None)


@dataclass
class Loaded:
    """What a page reported while it loaded, and its script's value."""

    errors: list[str] = field(default_factory=list)
    value: Any = None


class _Pipe:
    def __init__(self, write_fd: int, read_fd: int, timeout_s: float) -> None:
        self.write_fd, self.read_fd = write_fd, read_fd
        self.deadline = time.monotonic() + timeout_s
        self.buffer = b""
        self.next_id = 0
        self.events: list[dict[str, Any]] = []

    def send(self, method: str, params: dict[str, Any] | None = None, session: str = "") -> int:
        self.next_id += 1
        message: dict[str, Any] = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self.write_fd, json.dumps(message).encode() + b"\0")
        return self.next_id

    def _message(self) -> dict[str, Any]:
        while b"\0" not in self.buffer:
            left = self.deadline - time.monotonic()
            if left <= 0 or not select.select([self.read_fd], [], [], left)[0]:
                raise TimeoutError("Chromium did not answer in time")
            chunk = os.read(self.read_fd, 1 << 16)
            if not chunk:
                raise ConnectionError("Chromium closed its pipe")
            self.buffer += chunk
        raw, self.buffer = self.buffer.split(b"\0", 1)
        return dict(json.loads(raw))

    def call(self, method: str, params: dict[str, Any] | None = None, session: str = "") -> Any:
        """Send and wait for the answer (events meanwhile are kept in `events`)."""
        wanted = self.send(method, params, session)
        while True:
            message = self._message()
            if message.get("id") == wanted:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            self.events.append(message)

    def until(self, method: str) -> None:
        """Wait for an event named `method` (kept in `events` with the rest)."""
        while not any(e.get("method") == method for e in self.events):
            self.events.append(self._message())


def _errors(events: list[dict[str, Any]]) -> list[str]:
    out = []
    for e in events:
        method, params = e.get("method"), e.get("params", {})
        if method == "Runtime.exceptionThrown":
            out.append(f"exception: {params['exceptionDetails'].get('text')}")
        elif method == "Runtime.consoleAPICalled" and params.get("type") == "error":
            out.append(f"console: {params.get('args')}")
        elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
            out.append(f"log: {params['entry'].get('text')} {params['entry'].get('url', '')}")
        elif method == "Network.loadingFailed":
            out.append(f"failed load: {params.get('errorText')}")
    return out


def _high(fds: tuple[int, int]) -> tuple[int, int]:
    """`fds` moved above 9, so that putting one on 3 or 4 never replaces the other."""
    moved = tuple(fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in fds)
    for fd in fds:
        os.close(fd)
    return moved[0], moved[1]


def load(page: Path, script: str, *, timeout_s: float = 60.0) -> Loaded:
    """Open `page` in headless Chromium, wait for its load event, run `script` (an
    expression whose value is JSON) and return it with the errors the page reported."""
    exe = chromium()
    if exe is None:
        raise FileNotFoundError("no Chromium on PATH")
    to_browser_r, to_browser_w = _high(os.pipe())
    from_browser_r, from_browser_w = _high(os.pipe())
    with tempfile.TemporaryDirectory(prefix="pipecast-chromium-") as profile:
        args = [
            exe, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
            "--remote-debugging-pipe", f"--user-data-dir={profile}", "about:blank",
        ]  # fmt: skip

        def onto_3_and_4() -> None:  # in the child, before it closes the other fds
            os.dup2(to_browser_r, 3)
            os.dup2(from_browser_w, 4)

        proc = subprocess.Popen(
            args,
            pass_fds=(3, 4),
            preexec_fn=onto_3_and_4,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        pipe = _Pipe(to_browser_w, from_browser_r, timeout_s)
        try:
            target = pipe.call("Target.createTarget", {"url": "about:blank"})["targetId"]
            session = pipe.call("Target.attachToTarget", {"targetId": target, "flatten": True})[
                "sessionId"
            ]
            for domain in ("Runtime", "Log", "Page", "Network"):
                pipe.call(f"{domain}.enable", session=session)
            pipe.call("Page.navigate", {"url": page.resolve().as_uri()}, session=session)
            pipe.until("Page.loadEventFired")
            result = pipe.call(
                "Runtime.evaluate",
                {"expression": script, "returnByValue": True, "awaitPromise": True},
                session=session,
            )
            if "exceptionDetails" in result:
                raise RuntimeError(f"the script failed: {result['exceptionDetails']}")
            return Loaded(_errors(pipe.events), result["result"].get("value"))
        finally:
            with contextlib.suppress(OSError):
                pipe.send("Browser.close")
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            os.close(to_browser_w)
            os.close(from_browser_r)
