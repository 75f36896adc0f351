"""``fairshare gateway``: startup, readiness, and the stop on SIGTERM.

``run`` reads the configuration (errors: exit 2), opens the allocator client and checks
the models' pools against the allocator's (``fairshare.gateway.poolcheck``: exit 2 naming
the key; not ready, and checked at the allocator's first answer, when it does not answer),
opens one upstream ``ClientSession`` whose connection pool is ``limits.max_connections``,
the API port (``listen``: the OpenAI endpoints, ``/healthz``, ``/readyz``; its connections
bounded by ``fairshare.gateway.connections``) and the metrics port (``metrics_listen``),
then serves until SIGTERM or SIGINT. Once serving, it probes the upstreams' health
(``fairshare.gateway.health``, over a session of its own) and asks each upstream its
scheduling policy once (``fairshare.gateway.policy``), in the background.

- ``/healthz``: 200 while the event loop runs.
- ``/readyz``: 200 when every model has a healthy upstream (on its primary route) and the
  allocator answered a ListPools within the last second naming every configured pool, or
  when it does not answer (after one answer since start) but every model's pool fails
  open (the degraded mode lets requests through). 503, with the reasons, while stopping,
  while a model has no healthy upstream, before the allocator's first answer, while a
  configured pool is not among the allocator's, or when the allocator does not answer
  and some model's pool fails closed.

SIGTERM: the API port stops accepting connections and ``/readyz`` says 503; requests in
flight (streams included) run on for up to ``limits.shutdown_grace_s``; those still
running then are cancelled (their upstream requests closed); every grant is released and
the client library flushes its releases before the process exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import signal
import sys
import time
from collections.abc import Coroutine
from dataclasses import replace
from pathlib import Path
from typing import Final

import aiohttp
import grpc
from aiohttp import web
from grpc import aio

from fairshare.client import AllocatorClient
from fairshare.gateway.config import GatewayConfig, load
from fairshare.gateway.config_values import ConfigError, check_address
from fairshare.gateway.connections import (
    SPARE_FILES,
    ConnectionGuard,
    GuardedSite,
    raise_file_limit,
)
from fairshare.gateway.keys import KeysFile, KeysFileError
from fairshare.gateway.metrics import GatewayMetrics
from fairshare.gateway.policy import check_policies
from fairshare.gateway.poolcheck import PoolCheck
from fairshare.gateway.proxy import Proxy
from fairshare.modes import DegradedMode
from fairshare.wire.convert import degraded_mode
from fairshare.wire.pb.fairshare.v1 import allocator_pb2 as pb

logger = logging.getLogger(__name__)

EXIT_USAGE: Final = 2
READY_CACHE_S: Final = 1.0
"""How long a readiness answer of the allocator is reused."""
READY_PROBE_S: Final = 0.5
"""How long ``/readyz`` waits for the allocator (under a kubelet probe's 1 s timeout)."""
UPSTREAM_KEEPALIVE_S: Final = 4.0
"""How long an idle upstream connection is kept (uvicorn, vLLM's server, closes its idle
connections after 5 s)."""
POOLS_AT_START_S: Final = 3.0
"""How long the start waits for the allocator's pools before serving not ready."""
POOLS_RETRY_S: Final = 1.0
"""Between two questions for the pools while the allocator has not answered since start."""
FLUSH_TIMEOUT_S: Final = 2.0
"""How long the client library may take to send the last releases at exit."""
GC_YOUNG_THRESHOLD: Final = 10_000
"""Net allocations between two collections of the youngest generation (CPython: 700)."""


def add_gateway_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``fairshare gateway``."""
    parser.add_argument("--config", required=True, help="the gateway's YAML file")
    parser.add_argument("--listen", help="HOST:PORT of the API (overrides listen)")
    parser.add_argument(
        "--metrics-listen", help='HOST:PORT of /metrics, "" disables (overrides metrics_listen)'
    )
    parser.add_argument("--log-level", default="INFO", help="logging level (INFO)")


def configure(args: argparse.Namespace) -> GatewayConfig:
    """The file's configuration with the flags applied.

    Raises:
        ConfigError: naming the key (or flag) that is wrong.
    """
    config = load(args.config)
    if args.listen is not None:
        config = replace(config, listen=check_address("--listen", args.listen))
    if args.metrics_listen is not None:
        metrics = args.metrics_listen
        config = replace(
            config,
            metrics_listen="" if metrics == "" else check_address("--metrics-listen", metrics),
        )
    return config


def _read(path: str | None) -> bytes | None:
    return None if path is None else Path(path).read_bytes()


def allocator_client(config: GatewayConfig) -> AllocatorClient:
    """The client of the configured allocator (TLS when a CA or certificate is given)."""
    settings = config.allocator
    credentials = None
    if settings.tls_ca_file or settings.tls_cert_file:
        credentials = grpc.ssl_channel_credentials(
            root_certificates=_read(settings.tls_ca_file),
            private_key=_read(settings.tls_key_file),
            certificate_chain=_read(settings.tls_cert_file),
        )
    return AllocatorClient(
        settings.endpoints,
        holder=settings.holder,
        deadline_s=settings.deadline_s,
        credentials=credentials,
    )


def upstream_session(config: GatewayConfig) -> aiohttp.ClientSession:
    """The session of the upstream requests: a pool of ``limits.max_connections``.

    Bodies are passed on as the upstream sent them (no decompression), so none is asked
    for compressed: no ``Accept-Encoding`` goes out, and the upstream answers in identity.
    An idle connection is kept ``UPSTREAM_KEEPALIVE_S``, less than vLLM's server keeps it,
    so the gateway seldom sends on a connection the upstream is closing (the proxy sends
    again, once, when it does: ``fairshare.gateway.proxy``).
    """
    connector = aiohttp.TCPConnector(
        limit=config.limits.max_connections,
        limit_per_host=0,
        ttl_dns_cache=60,
        keepalive_timeout=UPSTREAM_KEEPALIVE_S,
    )
    return aiohttp.ClientSession(
        connector=connector,
        auto_decompress=False,
        skip_auto_headers=("User-Agent", "Accept-Encoding"),
    )


def probe_session(config: GatewayConfig) -> aiohttp.ClientSession:
    """The session of the health probes: apart from the requests' pool, so that a pool
    full of requests does not delay a probe into a failure."""
    upstreams = {u for m in config.models for r in (m.primary, *m.fallback) for u in r.upstreams}
    connector = aiohttp.TCPConnector(
        limit=len(upstreams), limit_per_host=0, keepalive_timeout=UPSTREAM_KEEPALIVE_S
    )
    return aiohttp.ClientSession(connector=connector, skip_auto_headers=("User-Agent",))


def _rpc_failure(error: Exception) -> str:
    return error.code().name if isinstance(error, aio.AioRpcError) else "no answer in time"


class Gateway:
    """One running gateway: its ports, its proxy, its clients."""

    def __init__(self, config: GatewayConfig, *, keys: KeysFile | None) -> None:
        self.config = config
        self.metrics = GatewayMetrics()
        self.client = allocator_client(config)
        client = self.client
        self.metrics.pending_releases.set_function(lambda: float(client.pending_releases))
        self.session = upstream_session(config)
        self.probes = probe_session(config)
        self.proxy = Proxy(
            config, client=self.client, session=self.session, keys=keys, metrics=self.metrics
        )
        self.guard = ConnectionGuard(
            max_connections=config.limits.max_client_connections,
            header_timeout_s=config.limits.header_timeout_s,
            metrics=self.metrics,
        )
        self.pools = PoolCheck(config)
        self.failed = asyncio.Event()
        """Set when the allocator's first answer came after the start and named a pool
        unknown: the gateway stops and exits 2."""
        self._ready_at = -READY_CACHE_S
        self._fails_closed: set[str] = set()
        self._runners: list[web.AppRunner] = []
        self._background: list[asyncio.Task[object]] = []
        self._api_site: web.BaseSite | None = None

    # -- the allocator's pools ---------------------------------------------------------------

    async def check_pools_at_start(self) -> list[str]:
        """The configuration's pools checked against the allocator's: what is wrong, or
        [] (also when the allocator did not answer: then it is checked at its first
        answer, and the gateway is not ready until then)."""
        try:
            async with asyncio.timeout(POOLS_AT_START_S):
                pools = await self.client.refresh_pools()
        except (aio.AioRpcError, TimeoutError) as e:
            logger.warning(
                "the allocator does not answer (%s): serving not ready; the models' pools "
                "are checked at its first answer",
                _rpc_failure(e),
            )
            return []
        return self.pools.observe(p.pool for p in pools)

    def _pools_answered(self, pools: list[pb.PoolInfo]) -> None:
        first = not self.pools.checked
        problems = self.pools.observe(p.pool for p in pools)
        for problem in problems:
            logger.error("%s", problem)
        if first and problems:
            for problem in problems:
                print(f"fairshare gateway: {problem}", file=sys.stderr, flush=True)
            self.failed.set()

    async def _check_pools_later(self) -> None:
        """Asks the allocator its pools until it answers once (when it did not at start)."""
        while not self.pools.checked:
            await asyncio.sleep(POOLS_RETRY_S)
            if self.pools.checked:  # a /readyz meanwhile
                return
            try:
                async with asyncio.timeout(POOLS_AT_START_S):
                    pools = await self.client.refresh_pools()
            except (aio.AioRpcError, TimeoutError):
                continue
            self._pools_answered(pools)

    # -- probes ------------------------------------------------------------------------------

    async def healthz(self, _: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    def _unhealthy_models(self) -> list[str]:
        """The models none of whose primary route's upstreams is healthy."""
        health = self.proxy.health
        return [
            f"{m.name} (pool {m.primary.pool})"
            for m in self.config.models
            if not any(health.healthy(u) for u in m.primary.upstreams)
        ]

    async def _allocator_readiness(self) -> tuple[list[str], str]:
        """Why the allocator's side is not ready ([] when it is), and a note when it is
        ready without the allocator (degraded)."""
        if time.monotonic() - self._ready_at < READY_CACHE_S:
            return self.pools.problems, ""
        try:
            async with asyncio.timeout(READY_PROBE_S):
                pools = await self.client.refresh_pools()
        except (aio.AioRpcError, TimeoutError) as e:
            why = _rpc_failure(e)
            if not self.pools.checked:
                return [f"allocator unreachable ({why}); the models' pools are not checked"], ""
            pools_needed = {m.primary.pool for m in self.config.models}
            closed = sorted(pools_needed & self._fails_closed)
            if closed:
                return [f"allocator unreachable ({why}); fail_closed: {', '.join(closed)}"], ""
            return [], f"degraded: allocator unreachable ({why})"
        self._pools_answered(pools)
        self._fails_closed = {
            p.pool for p in pools if degraded_mode(p.degraded_mode) is DegradedMode.FAIL_CLOSED
        }
        self._ready_at = time.monotonic()
        return self.pools.problems, ""

    async def readyz(self, _: web.Request) -> web.Response:
        if self.proxy.draining:
            return web.Response(status=503, text="stopping\n")
        reasons, note = await self._allocator_readiness()
        unhealthy = self._unhealthy_models()
        if unhealthy:
            reasons = [f"no healthy upstream: {', '.join(unhealthy)}", *reasons]
        if reasons:
            return web.Response(status=503, text="".join(f"{r}\n" for r in reasons))
        return web.Response(text=f"{note or 'ready'}\n")

    # -- lifecycle ---------------------------------------------------------------------------

    def api_app(self) -> web.Application:
        app = web.Application(
            client_max_size=self.config.limits.max_body_bytes + 1,
            middlewares=[self.guard.middleware],
        )
        self.proxy.add_routes(app)
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/readyz", self.readyz)
        return app

    def _spawn(self, coro: Coroutine[object, object, object]) -> None:
        self._background.append(asyncio.get_running_loop().create_task(coro))

    async def start(self) -> None:
        """Opens the ports, starts the probes (and the pools' check when still due)."""
        limits = self.config.limits
        needed = limits.max_client_connections + limits.max_connections + SPARE_FILES
        if raise_file_limit(needed) < needed:
            logger.warning(
                "the limit of open files is below the %d that limits.max_client_connections "
                "and limits.max_connections need: connections may fail before either is met",
                needed,
            )
        host, _, port = self.config.listen.rpartition(":")
        runner = web.AppRunner(self.api_app(), handler_cancellation=True, access_log=None)
        await runner.setup()
        self._runners.append(runner)
        self._api_site = GuardedSite(
            runner, host.strip("[]"), int(port), guard=self.guard, backlog=1024
        )
        await self._api_site.start()
        if self.config.metrics_listen:
            host, _, port = self.config.metrics_listen.rpartition(":")
            metrics = web.AppRunner(self.metrics.app(), access_log=None)
            await metrics.setup()
            self._runners.append(metrics)
            await web.TCPSite(metrics, host.strip("[]"), int(port)).start()
        logger.info(
            "gateway listening on %s (metrics: %s), allocator %s, holder %s",
            self.config.listen,
            self.config.metrics_listen or "off",
            ",".join(self.config.allocator.endpoints),
            self.config.allocator.holder,
        )
        print(f"gateway listening on {self.config.listen}", flush=True)
        self._spawn(self.proxy.health.watch(self.probes))
        if not self.pools.checked:
            self._spawn(self._check_pools_later())
        self._spawn(
            check_policies(self.session, self.proxy.health.urls, self.metrics.priority_scheduling)
        )

    async def stop(self) -> None:
        """Stops accepting, lets requests run up to the grace, releases everything."""
        self.proxy.draining = True
        if self._api_site is not None:
            await self._api_site.stop()
        handlers = set(self.proxy.handlers)
        if handlers:
            logger.info(
                "stopping: %d requests in flight, up to %gs",
                len(handlers),
                self.config.limits.shutdown_grace_s,
            )
            _, running = await asyncio.wait(handlers, timeout=self.config.limits.shutdown_grace_s)
            for task in running:
                task.cancel()
            if running:
                logger.warning("stopping: cancelled %d requests still running", len(running))
                await asyncio.wait(running, timeout=5.0)
        await self.proxy.wait_releases()
        for task in self._background:
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        for runner in reversed(self._runners):
            await runner.cleanup()
        await self.session.close()
        await self.probes.close()
        await self.client.close(flush_timeout_s=FLUSH_TIMEOUT_S)
        logger.info("gateway stopped")


def tune_gc() -> None:
    """Makes the cyclic garbage collector cost less per request; called once serving.

    Every request leaves reference cycles behind (those of its two allocator calls), so
    the collector runs every few requests. ``gc.freeze`` moves what startup left alive
    (modules, configuration, clients) out of its sight, so a full collection no longer
    walks it; the youngest generation is collected every ``GC_YOUNG_THRESHOLD`` net
    allocations, so fewer objects of requests still in flight are promoted and walked
    again by the older generations. Nothing is kept longer than that: cycles are still
    collected, in batches of at most a few milliseconds. Frozen objects that later become
    cyclic garbage are never collected (startup's objects live as long as the process).
    """
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, older, oldest)


async def serve(config: GatewayConfig, *, keys: KeysFile | None) -> int:
    """Runs the gateway until SIGTERM or SIGINT (with the collector tuned: ``tune_gc``).

    Returns:
        The exit status: 0, or 2 when a model's pool is not the allocator's (at start, or
        at the allocator's first answer after it).
    """
    gateway = Gateway(config, keys=keys)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    try:
        problems = await gateway.check_pools_at_start()
        if problems:
            for problem in problems:
                print(f"fairshare gateway: {problem}", file=sys.stderr)
            return EXIT_USAGE
        await gateway.start()
        tune_gc()
        ending = [asyncio.ensure_future(e.wait()) for e in (stopping, gateway.failed)]
        try:
            await asyncio.wait(ending, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in ending:
                task.cancel()
    finally:
        await gateway.stop()
    return EXIT_USAGE if gateway.failed.is_set() else 0


def run(args: argparse.Namespace) -> int:
    """``fairshare gateway``: returns the exit status (2 for a configuration error)."""
    logging.basicConfig(
        level=str(args.log_level).upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        config = configure(args)
        keys = None if config.auth.keys_file is None else KeysFile(config.auth.keys_file)
    except (ConfigError, KeysFileError) as e:
        print(f"fairshare gateway: {e}", file=sys.stderr)
        return EXIT_USAGE
    if not config.auth.any_source:
        print(
            "fairshare gateway: auth: give keys_file, team_header or fairness_id; "
            "without one every request is refused",
            file=sys.stderr,
        )
        return EXIT_USAGE
    try:
        status = asyncio.run(serve(config, keys=keys))
    except OSError as e:
        print(f"fairshare gateway: {e}", file=sys.stderr)
        return EXIT_USAGE
    with contextlib.suppress(Exception):
        logging.shutdown()
    return status
