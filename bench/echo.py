"""The empty-echo gRPC server the gRPC benchmark measures the service against.

A grpc.aio server in the server style of ``server/app.py`` (one server, the health service
SERVING once started, stopped by SIGTERM or SIGINT) with one proto-free unary method:
bytes in, the same bytes out, identity serializers through
``grpc.method_handlers_generic_handler``. It runs as a child process of the benchmark:
``python -m bench.echo PORT`` from the repository root (``echo_server`` builds it).
"""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

import grpc
from grpc import aio
from grpc_health.v1 import health as grpc_health
from grpc_health.v1 import health_pb2, health_pb2_grpc

from harness.net import LOOPBACK, free_port
from harness.process import ServerProcess

ECHO_METHOD = "/bench.Echo/Echo"
"""The full name of the one method, for ``channel.unary_unary``."""


async def serve_echo(port: int) -> None:
    """Serves the echo on 127.0.0.1:``port`` until SIGTERM or SIGINT."""

    async def echo(request: bytes, context: aio.ServicerContext) -> bytes:
        return request

    handler = grpc.method_handlers_generic_handler(
        "bench.Echo",
        {
            "Echo": grpc.unary_unary_rpc_method_handler(
                echo, request_deserializer=None, response_serializer=None
            )
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


def echo_server(work: Path) -> ServerProcess:
    """The echo server as a child process on a free port, logging to ``work/echo.log``;
    not started."""
    address = f"{LOOPBACK}:{free_port()}"
    args = [sys.executable, "-m", "bench.echo", address.rpartition(":")[2]]
    return ServerProcess(args, address=address, log=work / "echo.log")


if __name__ == "__main__":
    asyncio.run(serve_echo(int(sys.argv[1])))
