"""Headless Chromium for tests, driven over the Chrome DevTools Protocol (CDP).

Starts the system's ``chromium`` (Debian's package; nothing is downloaded) with
``--remote-debugging-port=0`` in a throw-away profile, reads the port it chose from the
``DevToolsActivePort`` file it writes there (a file, unlike its stderr, needs no reader
for as long as the browser runs), and speaks CDP over one websocket
(aiohttp) in flattened session mode: a ``Tab`` is a target attached with its own
session id on the browser's socket.

Guarantees: every wait is bounded (``timeout_s`` of the call or ``CALL_TIMEOUT_S``);
``close`` (also on leaving ``async with``) kills the browser and removes the profile,
whatever state the browser is in. Not guaranteed: anything about pages the test does not
wait for (a page's own timers run as they run).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Final

import aiohttp

CANDIDATES: Final = ("chromium", "chromium-browser", "google-chrome")
"""Names of the browser executable, looked up on PATH in this order."""
START_TIMEOUT_S: Final = 30.0
CALL_TIMEOUT_S: Final = 10.0
_PORT_FILE_LINES: Final = 2
FLAGS: Final = (
    "--headless",
    "--no-sandbox",  # tests run as root in containers
    "--disable-gpu",
    "--remote-debugging-port=0",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--mute-audio",
    "--hide-scrollbars",
)


class BrowserError(RuntimeError):
    """The browser did not start, or a CDP call returned an error."""


def find_chromium() -> str | None:
    """The path of an installed Chromium, or None."""
    for name in CANDIDATES:
        path = shutil.which(name)
        if path is not None:
            return path
    return None


class Browser:
    """One headless Chromium process and its CDP connection (see module)."""

    def __init__(self, executable: str | None = None, *, extra: Sequence[str] = ()) -> None:
        self._executable = executable or find_chromium()
        self._extra = tuple(extra)
        self._profile: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._http: aiohttp.ClientSession | None = None
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._reader: asyncio.Task[None] | None = None
        self._ids = itertools.count(1)
        self._calls: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._events: dict[str, list[tuple[str, asyncio.Future[dict[str, Any]]]]] = {}

    async def __aenter__(self) -> Browser:
        await self.start(START_TIMEOUT_S)
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        await self.close()

    async def start(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Starts the browser and connects to it.

        Raises:
            BrowserError: no Chromium installed, it exited, or it did not open its
                DevTools port within ``timeout_s`` (the message has its log's end).
        """
        if self._executable is None:
            raise BrowserError(f"no Chromium found on PATH (tried {', '.join(CANDIDATES)})")
        self._profile = Path(tempfile.mkdtemp(prefix="fairshare-chromium-"))
        log = self._profile / "chromium.log"
        self._proc = await asyncio.to_thread(self._spawn, self._executable, log)
        port_file = self._profile / "profile" / "DevToolsActivePort"
        deadline = time.monotonic() + timeout_s
        while True:
            # Two lines: the port, then the browser target's path.
            lines = await asyncio.to_thread(_lines, port_file)
            if len(lines) >= _PORT_FILE_LINES:
                break
            if self._proc.poll() is not None or time.monotonic() > deadline:
                tail = (await asyncio.to_thread(_lines, log))[-20:]
                state = (
                    f"exited with {self._proc.returncode}"
                    if self._proc.poll() is not None
                    else f"opened no DevTools port in {timeout_s:g}s"
                )
                await self.close()
                raise BrowserError(f"chromium {state}:\n" + "\n".join(tail))
            await asyncio.sleep(0.05)
        url = f"ws://127.0.0.1:{lines[0]}{lines[1]}"
        self._http = aiohttp.ClientSession()
        async with asyncio.timeout(max(1.0, deadline - time.monotonic())):
            self._ws = await self._http.ws_connect(url, max_msg_size=0)
        self._reader = asyncio.create_task(self._read(), name="cdp-reader")

    def _spawn(self, executable: str, log: Path) -> subprocess.Popen[bytes]:
        """Starts the browser in its own process group, its output in ``log`` and its
        temporary files in the profile (removed with it)."""
        assert self._profile is not None
        with log.open("wb") as out:
            return subprocess.Popen(
                [
                    executable,
                    *FLAGS,
                    f"--user-data-dir={self._profile / 'profile'}",
                    *self._extra,
                    "about:blank",
                ],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                start_new_session=True,
                env={**os.environ, "TMPDIR": str(self._profile)},
            )

    async def call(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        *,
        session: str | None = None,
        timeout_s: float = CALL_TIMEOUT_S,
    ) -> dict[str, Any]:
        """One CDP command; returns its result.

        Raises:
            BrowserError: the browser answered with an error, or the connection ended.
            TimeoutError: no answer within ``timeout_s``.
        """
        if self._ws is None:
            raise BrowserError("the browser is not started")
        ident = next(self._ids)
        message: dict[str, Any] = {"id": ident, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        answer: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._calls[ident] = answer
        try:
            await self._ws.send_str(json.dumps(message))
            async with asyncio.timeout(timeout_s):
                return await answer
        finally:
            self._calls.pop(ident, None)

    def expect(self, event: str, session: str) -> asyncio.Future[dict[str, Any]]:
        """A future set to the params of the next ``event`` of ``session``; ask before
        the command that causes it."""
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._events.setdefault(event, []).append((session, future))
        return future

    async def new_tab(self, width: int = 1280, height: int = 900) -> Tab:
        """A new blank tab with a ``width`` x ``height`` viewport."""
        target = await self.call("Target.createTarget", {"url": "about:blank"})
        attached = await self.call(
            "Target.attachToTarget", {"targetId": target["targetId"], "flatten": True}
        )
        tab = Tab(self, attached["sessionId"])
        await tab.call("Page.enable")
        await tab.call("Runtime.enable")
        await tab.resize(width, height)
        return tab

    async def close(self) -> None:
        """Kills the browser and removes its profile; safe to call twice."""
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader
            self._reader = None
        if self._ws is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(2.0):
                    await self._ws.close()
            self._ws = None
        if self._http is not None:
            await self._http.close()
            self._http = None
        if self._proc is not None:
            if self._proc.poll() is None:
                # Its own process group (started so): the renderers and helpers go too.
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self._proc.pid, signal.SIGKILL)
            try:
                await asyncio.to_thread(self._proc.wait, 10.0)
            except subprocess.TimeoutExpired as e:
                raise BrowserError(f"chromium {self._proc.pid} did not die when killed") from e
            self._proc = None
        if self._profile is not None:
            shutil.rmtree(self._profile, ignore_errors=True)
            self._profile = None
        for future in self._calls.values():
            if not future.done():
                future.set_exception(BrowserError("the browser was closed"))

    async def _read(self) -> None:
        assert self._ws is not None
        try:
            async for frame in self._ws:
                if frame.type is not aiohttp.WSMsgType.TEXT:
                    continue
                self._dispatch(json.loads(frame.data))
        finally:
            for future in self._calls.values():
                if not future.done():
                    future.set_exception(BrowserError("the DevTools connection ended"))

    def _dispatch(self, message: dict[str, Any]) -> None:
        if "id" in message:
            future = self._calls.get(message["id"])
            if future is None or future.done():
                return
            if "error" in message:
                future.set_exception(BrowserError(f"CDP error: {message['error']}"))
            else:
                future.set_result(message.get("result", {}))
            return
        waiting = self._events.get(message.get("method", ""), [])
        session = message.get("sessionId", "")
        for entry in list(waiting):
            wanted, future = entry
            if wanted == session:
                waiting.remove(entry)
                if not future.done():
                    future.set_result(message.get("params", {}))


class Tab:
    """One page of the browser, by its CDP session."""

    def __init__(self, browser: Browser, session: str) -> None:
        self._browser = browser
        self.session = session

    async def call(
        self, method: str, params: dict[str, Any] | None = None, timeout_s: float = CALL_TIMEOUT_S
    ) -> dict[str, Any]:
        """One CDP command in this tab's session."""
        return await self._browser.call(method, params, session=self.session, timeout_s=timeout_s)

    async def resize(self, width: int, height: int) -> None:
        """Sets the viewport to ``width`` x ``height`` CSS pixels."""
        await self.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )

    async def goto(self, url: str, timeout_s: float = CALL_TIMEOUT_S) -> None:
        """Navigates to ``url`` and waits for its load event.

        Raises:
            BrowserError: the navigation failed (e.g. connection refused).
            TimeoutError: no load event within ``timeout_s``.
        """
        loaded = self._browser.expect("Page.loadEventFired", self.session)
        try:
            reply = await self.call("Page.navigate", {"url": url}, timeout_s)
            if reply.get("errorText"):
                raise BrowserError(f"navigating to {url}: {reply['errorText']}")
            async with asyncio.timeout(timeout_s):
                await loaded
        finally:
            loaded.cancel()

    async def evaluate(self, expression: str, timeout_s: float = CALL_TIMEOUT_S) -> Any:
        """The value of a JavaScript expression (awaited if a promise), as JSON values.

        Raises:
            BrowserError: the expression threw (the message has the exception).
        """
        reply = await self.call(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
            timeout_s,
        )
        if "exceptionDetails" in reply:
            details = reply["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text")
            raise BrowserError(f"{expression[:80]!r} threw: {text}")
        return reply.get("result", {}).get("value")

    async def wait_for(
        self, expression: str, timeout_s: float = CALL_TIMEOUT_S, interval_s: float = 0.1
    ) -> Any:
        """Evaluates ``expression`` until it is truthy and returns that value.

        Raises:
            TimeoutError: still falsy after ``timeout_s`` (the message has the expression).
        """
        deadline = time.monotonic() + timeout_s
        while True:
            value = await self.evaluate(expression, timeout_s)
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"{expression!r} still false after {timeout_s:g}s")
            await asyncio.sleep(interval_s)

    async def screenshot(self, path: Path, *, full_page: bool = True) -> None:
        """Saves a PNG of the page (its whole height with ``full_page``) to ``path``."""
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            metrics = await self.call("Page.getLayoutMetrics")
            size = metrics.get("cssContentSize") or metrics["contentSize"]
            params["clip"] = {
                "x": 0,
                "y": 0,
                "width": size["width"],
                "height": size["height"],
                "scale": 1,
            }
            params["captureBeyondViewport"] = True
        reply = await self.call("Page.captureScreenshot", params)
        await asyncio.to_thread(_write, path, base64.b64decode(reply["data"]))


def _lines(path: Path) -> list[str]:
    """The lines of a text file; none while it does not exist."""
    try:
        return path.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return []


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
