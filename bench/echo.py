"""The empty-echo gRPC server the gRPC benchmark measures the service against.

A grpc.aio server in the server style of ``server/app.py`` (one server, the health service
SERVING once started, stopped by SIGTERM or SIGINT) with one proto-free unary method:
bytes in, the same bytes out, identity serializers through
``grpc.method_handlers_generic_handler``. It runs as a child process of the benchmark:
``python -m bench.echo PORT`` from the repository root (``echo_server`` builds it).

With ``--sync FILE`` every call first appends what it received to ``FILE`` and fdatasyncs
it, in the handler, before it answers: the least a durable decision over gRPC costs (one
round trip, one synchronous write), which the gateway benchmark measures as a floor.

``ECHO_STREAM_METHOD`` does the same for each message of one long-lived call, answered on
it in turn: the floor of a client that sends its decisions on an open stream, as the
client library does (``AcquireStream``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from pathlib import Path

import grpc
from grpc import aio
from grpc_health.v1 import health as grpc_health
from grpc_health.v1 import health_pb2, health_pb2_grpc

from fairshare.wire.polling import polling_environment
from harness.net import LOOPBACK, free_port
from harness.process import ServerProcess

ECHO_METHOD = "/bench.Echo/Echo"
"""The full name of the unary method, for ``channel.unary_unary``."""
ECHO_STREAM_METHOD = "/bench.Echo/EchoStream"
"""The full name of the stream method, for ``channel.stream_stream``."""


async def serve_echo(port: int, sync: Path | None = None) -> None:
    """Serves the echo on 127.0.0.1:``port`` until SIGTERM or SIGINT; with ``sync``, each
    call appends its bytes to that file durably before it answers."""
    log = None if sync is None else os.open(sync, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    async def echo(request: bytes, context: aio.ServicerContext) -> bytes:
        if log is not None:
            os.write(log, request)
            os.fdatasync(log)
        return request

    async def echo_stream(requests: object, context: aio.ServicerContext) -> None:
        while (request := await context.read()) is not aio.EOF:
            await context.write(await echo(request, context))

    handler = grpc.method_handlers_generic_handler(
        "bench.Echo",
        {
            "Echo": grpc.unary_unary_rpc_method_handler(
                echo, request_deserializer=None, response_serializer=None
            ),
            "EchoStream": grpc.stream_stream_rpc_method_handler(
                echo_stream, request_deserializer=None, response_serializer=None
            ),
        },
    )
    server = aio.server(options=[("grpc.so_reuseport", 0)])
    server.add_generic_rpc_handlers((handler,))
    health = grpc_health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    server.add_insecure_port(f"{LOOPBACK}:{port}")
    await server.start()
    await health.set("", health_pb2.HealthCheckResponse.SERVING)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(1.0)
    if log is not None:
        os.close(log)


def echo_server(work: Path, *, sync: bool = False, name: str = "echo") -> ServerProcess:
    """The echo server as a child process on a free port, logging to ``work/<name>.log``
    (with ``sync``: appending durably to ``work/<name>.data``); not started."""
    address = f"{LOOPBACK}:{free_port()}"
    args = [sys.executable, "-m", "bench.echo", address.rpartition(":")[2]]
    if sync:
        args += ["--sync", str(work / f"{name}.data")]
    # It polls its sockets as the service does (fairshare.wire.polling): a baseline alike.
    env = polling_environment(os.environ)
    return ServerProcess(args, address=address, log=work / f"{name}.log", env=env)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("port", type=int, help="the loopback port to serve on")
    parser.add_argument("--sync", type=Path, help="append each call here durably first")
    args = parser.parse_args(argv)
    asyncio.run(serve_echo(args.port, args.sync))
    return 0


if __name__ == "__main__":
    sys.exit(main())
