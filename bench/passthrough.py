"""A plain pass-through HTTP proxy on the gateway's HTTP stack, as the gateway benchmark's
baseline: what forwarding alone costs, with no allocator and no body rewriting.

``python -m bench.passthrough --listen HOST:PORT --upstream URL`` forwards every POST to
the same path on ``URL`` with its body and content type, and streams the answer back as it
arrives (status, content type and body). One aiohttp server and one client session, as in
``fairshare/gateway/``. Not shipped; bench/gateway.py starts it.

With ``--decide ADDRESS`` it first sends the request's first bytes to a durable echo
server (``bench/echo.py --sync``) at ``ADDRESS`` over gRPC, on one long-lived stream as the
client library sends its Acquires (``AcquireStream``), and forwards once that message is
answered: the floor of a gateway that decides every request durably over gRPC (the hop, a
round trip, an fdatasync) with none of the deciding itself. The messages take the stream
one at a time (the floor is measured one request at a time).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys

import aiohttp
from aiohttp import web
from grpc import aio

from bench.echo import ECHO_STREAM_METHOD

CHUNK_BYTES = 64 * 1024


DECIDE_BYTES = 64
"""What the ``--decide`` call carries of each request: about an Acquire's size."""


def make_app(
    upstream: str, session_limit: int = 1000, decide: str | None = None
) -> web.Application:
    """The proxy's application: every POST goes to ``upstream`` + its path (after a call
    to the durable echo at ``decide``, if given)."""
    app = web.Application()
    base = upstream.rstrip("/")

    async def start_session(app: web.Application) -> None:
        connector = aiohttp.TCPConnector(limit=session_limit)
        app["session"] = aiohttp.ClientSession(connector=connector)
        if decide is not None:
            app["channel"] = aio.insecure_channel(decide)
            stream = app["channel"].stream_stream(ECHO_STREAM_METHOD)()
            turn = asyncio.Lock()

            async def call(data: bytes) -> bytes:
                async with turn:
                    await stream.write(data)
                    answer: bytes = await stream.read()
                    return answer

            app["decide"] = call

    async def close_session(app: web.Application) -> None:
        await app["session"].close()
        if decide is not None:
            await app["channel"].close()

    async def forward(request: web.Request) -> web.StreamResponse:
        session: aiohttp.ClientSession = request.app["session"]
        body = await request.read()
        if decide is not None:
            await request.app["decide"](body[:DECIDE_BYTES])
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


async def serve(listen: str, upstream: str, decide: str | None = None) -> None:
    """Serves until SIGTERM or SIGINT."""
    host, _, port = listen.rpartition(":")
    runner = web.AppRunner(make_app(upstream, decide=decide), access_log=None)
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
    parser.add_argument("--decide", help="HOST:PORT of a durable echo to call first")
    args = parser.parse_args(argv)
    asyncio.run(serve(args.listen, args.upstream, args.decide))
    return 0


if __name__ == "__main__":
    sys.exit(main())
