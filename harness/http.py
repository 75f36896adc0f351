"""Waiting for an HTTP server started as a child process to answer.

``wait_http`` is the one wait of the harness for HTTP servers (the stand-in vLLM server,
the gateway, the benchmark's proxy): it asks ``url`` every ``interval_s``, each call bounded
by ``PROBE_TIMEOUT_S`` (a server that accepts and never answers does not stall the wait),
and counts a refused, failed or timed-out call as "not yet".

Guarantees: it returns only after a 200 (or, with ``any_status``, any HTTP answer); it
raises ``ServerExited`` as soon as it sees the given process gone and ``TimeoutError``
after ``timeout_s``. Not guaranteed: that the server still answers at the caller's next call.
"""

from __future__ import annotations

import asyncio
import time
from http import HTTPStatus

import aiohttp

from harness.process import ServerProcess
from harness.serve import ServerExited

PROBE_TIMEOUT_S = 0.5
"""How long one call may take."""


async def wait_http(
    url: str,
    *,
    process: ServerProcess | None = None,
    timeout_s: float = 30.0,
    interval_s: float = 0.05,
    post_json: object = None,
    any_status: bool = False,
) -> None:
    """Waits until ``url`` answers (see the module doc): a GET, or a POST of ``post_json``
    when it is given.

    Raises:
        ServerExited: ``process`` ended first.
        TimeoutError: no answer within ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    probe = aiohttp.ClientTimeout(total=PROBE_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=probe) as session:
        while True:
            try:
                call = session.get(url) if post_json is None else session.post(url, json=post_json)
                async with call as reply:
                    await reply.read()
                    if any_status or reply.status == HTTPStatus.OK:
                        return
            except (aiohttp.ClientError, TimeoutError):
                pass
            if process is not None and process.proc is not None and not process.alive:
                raise ServerExited(f"the server behind {url} exited:\n{process.log_tail()}")
            if time.monotonic() > deadline:
                tail = "" if process is None else f":\n{process.log_tail()}"
                raise TimeoutError(f"{url} did not answer in {timeout_s}s{tail}")
            await asyncio.sleep(interval_s)
