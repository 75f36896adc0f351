"""``fairshare serve`` processes on loopback: the command line, the start, the wait.

Every test, drill and benchmark that runs the allocator as a real process builds its
command line with ``serve_args``, so the way the server is started is written once
(``SERVE``), and waits for it with ``wait_serving``.

``wait_serving`` guarantees: it returns only once ``probe`` answered true (by default: the
standard health check of the whole server says SERVING); it raises ``ServerExited`` as soon
as it sees the process gone (when given the process) and ``TimeoutError`` after
``timeout_s``, each with the end of the log when the process is known. It does not
guarantee that the server still serves when the caller's next call arrives.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path

from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from harness.net import LOOPBACK, free_port
from harness.process import ROOT, ServerProcess

SERVE = (sys.executable, "-m", "fairshare.cli", "serve")
"""How the allocator is started: the module the ``fairshare`` command runs."""

PROBE_TIMEOUT_S = 0.5
"""How long one probe call may take."""

Probe = Callable[[aio.Channel], Awaitable[bool]]
"""One call that says whether the server at the other end of the channel serves."""


class ServerExited(RuntimeError):
    """The process ended before it served."""


def serve_args(
    config: Path,
    *,
    listen: str,
    advertise: str | None = None,
    metrics_listen: str = "",
    state_dir: Path | None = None,
    node_id: str | None = None,
    etcd: str | None = None,
    prefix: str | None = None,
    extra: Sequence[str] = (),
) -> list[str]:
    """The command line of ``fairshare serve`` with these flags (a flag left None is left
    out; ``metrics_listen`` "" serves no metrics); ``extra`` is appended as is."""
    args = [*SERVE, "--config", str(config), "--listen", listen]
    if advertise is not None:
        args += ["--advertise", advertise]
    args += ["--metrics-listen", metrics_listen]
    flags = {"--state-dir": state_dir, "--node-id": node_id, "--etcd": etcd, "--prefix": prefix}
    for flag, value in flags.items():
        if value is not None:
            args += [flag, str(value)]
    return [*args, *extra]


class Allocator(ServerProcess):
    """One replica: ``fairshare serve`` on ``address`` (a free loopback port by default),
    advertising it, metrics (and the status page) on ``metrics_listen`` ("": none), node
    id ``node``, its state in ``workdir/state-<node>`` and its log in
    ``workdir/<node>.log``; embedded mode unless ``etcd`` names the endpoints
    (comma-separated). Not started: ``start`` it (again, after a stop: same address and
    state, as a restarted pod)."""

    def __init__(
        self,
        workdir: Path,
        config: Path,
        *,
        node: str = "allocator-0",
        etcd: str | None = None,
        prefix: str | None = None,
        address: str | None = None,
        env: Mapping[str, str] | None = None,
        metrics_listen: str = "",
    ) -> None:
        self.node = node
        self.state_dir = workdir / f"state-{node}"
        address = address or f"{LOOPBACK}:{free_port()}"
        args = serve_args(
            config,
            listen=address,
            advertise=address,
            metrics_listen=metrics_listen,
            state_dir=self.state_dir,
            node_id=node,
            etcd=etcd,
            prefix=prefix,
        )
        super().__init__(args, address=address, log=workdir / f"{node}.log", env=env)


def run_serve(
    args: Sequence[str], *, timeout_s: float = 30.0, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Runs a ``fairshare serve`` expected to end by itself (one that cannot start), from
    the repository root, and returns its status and output.

    Raises:
        subprocess.TimeoutExpired: it still ran after ``timeout_s`` (it is killed).
    """
    return subprocess.run(
        list(args),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=dict(os.environ if env is None else env),
        cwd=ROOT,
        check=False,
    )


async def health_serving(channel: aio.Channel) -> bool:
    """The probe of ``wait_serving`` by default: the overall health is SERVING."""
    stub = health_pb2_grpc.HealthStub(channel)
    reply = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=PROBE_TIMEOUT_S)
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


async def wait_serving(
    address: str,
    *,
    timeout_s: float = 30.0,
    process: ServerProcess | None = None,
    probe: Probe = health_serving,
    connect: Callable[[str], aio.Channel] = aio.insecure_channel,
    interval_s: float = 0.05,
) -> None:
    """Waits until ``probe`` says the server at ``address`` serves, calling it every
    ``interval_s`` on one channel that ``connect`` opens (a call that fails counts as "not
    yet").

    Raises:
        ServerExited: ``process`` ended first.
        TimeoutError: no true answer within ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    async with connect(address) as channel:
        while True:
            try:
                if await probe(channel):
                    return
            except aio.AioRpcError:
                pass
            if process is not None and process.proc is not None and not process.alive:
                raise ServerExited(
                    f"{address} exited with {process.proc.returncode} before it served:\n"
                    f"{process.log_tail()}"
                )
            if time.monotonic() > deadline:
                tail = "" if process is None else f":\n{process.log_tail()}"
                raise TimeoutError(f"{address} does not serve after {timeout_s}s{tail}")
            await asyncio.sleep(interval_s)


@contextlib.asynccontextmanager
async def serving(
    workdir: Path, config_text: str, *, graceful: bool = False
) -> AsyncIterator[tuple[Allocator, str]]:
    """A ``fairshare serve`` of ``config_text`` (written to ``workdir/pools.yaml``), embedded,
    with metrics on a free port, once it serves; yields it with its metrics URL. It is
    killed at the end, or stopped (SIGTERM, waited for) when ``graceful``."""
    config = workdir / "pools.yaml"
    config.write_text(config_text, encoding="utf-8")
    metrics = f"{LOOPBACK}:{free_port()}"
    server = Allocator(workdir, config, metrics_listen=metrics)
    server.start()
    try:
        await wait_serving(server.address, process=server)
        yield server, f"http://{metrics}/metrics"
    finally:
        if graceful:
            server.stop()
        else:
            server.kill()
