"""A plain pass-through HTTP proxy on the gateway's HTTP stack, as the gateway benchmark's
baseline: what forwarding alone costs, with no allocator and no body rewriting.

``python -m bench.passthrough --listen HOST:PORT --upstream URL`` forwards every POST to
the same path on ``URL`` with its body and content type, and streams the answer back as it
arrives (status, content type and body). One aiohttp server and one client session, as in
``fairshare/gateway/``. Not shipped; bench/gateway.py starts it.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys

import aiohttp
from aiohttp import web

CHUNK_BYTES = 64 * 1024


def make_app(upstream: str, session_limit: int = 1000) -> web.Application:
    """The proxy's application: every POST goes to ``upstream`` + its path."""
    app = web.Application()
    base = upstream.rstrip("/")

    async def start_session(app: web.Application) -> None:
        connector = aiohttp.TCPConnector(limit=session_limit)
        app["session"] = aiohttp.ClientSession(connector=connector)

    async def close_session(app: web.Application) -> None:
        await app["session"].close()

    async def forward(request: web.Request) -> web.StreamResponse:
        session: aiohttp.ClientSession = request.app["session"]
        body = await request.read()
        headers = {"Content-Type": request.headers.get("Content-Type", "application/json")}
        async with session.post(base + request.path, data=body, headers=headers) as reply:
            answer = web.StreamResponse(status=reply.status)
            answer.content_type = reply.content_type
            await answer.prepare(request)
            async for chunk in reply.content.iter_any():
                await answer.write(chunk)
            await answer.write_eof()
            return answer

    app.on_startup.append(start_session)
    app.on_cleanup.append(close_session)
    app.router.add_post("/{tail:.*}", forward)
    return app


async def serve(listen: str, upstream: str) -> None:
    """Serves until SIGTERM or SIGINT."""
    host, _, port = listen.rpartition(":")
    runner = web.AppRunner(make_app(upstream), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, int(port))
    await site.start()
    print(f"passthrough listening on {listen}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", required=True, help="HOST:PORT to serve on")
    parser.add_argument("--upstream", required=True, help="base URL of the upstream server")
    args = parser.parse_args(argv)
    asyncio.run(serve(args.listen, args.upstream))
    return 0


if __name__ == "__main__":
    sys.exit(main())
