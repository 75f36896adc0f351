"""A flood of health Watch streams against a real ``fairshare serve`` process.

The finding: 20,000 ``grpc.health.v1.Health/Watch`` streams from one client added 233 MiB
to a server, every one of them admitted. Scaled down: one client opens its bound of
streams (``server.streams``), then thousands more; each of those is refused
``RESOURCE_EXHAUSTED`` naming ``max_streams_per_client``, the server's open streams
(``fairshare_open_streams``) stay at the bound and its memory does not follow the flood
(before the bound, 6,000 more streams added about 130 MiB on the machine this was written
on). A closed stream gives its place back, and probes (Check) are never refused.
"""

from __future__ import annotations

import asyncio
import pathlib
import urllib.request
from collections.abc import AsyncIterator

import grpc
import pytest
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from harness.serve import Allocator, serving
from server.streams import DEFAULT_MAX_STREAMS_PER_CLIENT

pytestmark = pytest.mark.timeout(120)

CONFIG = "pools:\n  - name: gpu-a\n    capacity: 4\n    shares: {alpha: 1.0}\n"
FLOOD = 6000
"""Streams asked for past the bound, ``WAVE`` at a time."""
WAVE = 250
MiB = 2**20
MAX_GROWTH = 48 * MiB
"""What the flood may add to the server's memory: a third of what it took unbounded,
room for the calls being refused at once and for the collector's timing."""


@pytest.fixture
async def allocator(tmp_path: pathlib.Path) -> AsyncIterator[tuple[Allocator, str]]:
    async with serving(tmp_path, CONFIG, graceful=True) as running:
        yield running


def rss(server: Allocator) -> int:
    """The server process's resident memory, in bytes."""
    assert server.proc is not None
    status = pathlib.Path(f"/proc/{server.proc.pid}/status").read_text()
    line = next(line for line in status.splitlines() if line.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


async def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The samples of the server's metrics, by name and labels."""

    def get() -> str:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return str(answer.read().decode("utf-8"))

    text = await asyncio.to_thread(get)
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def watch(stub: health_pb2_grpc.HealthStub) -> aio.UnaryStreamCall | aio.AioRpcError:
    """One Watch: the open call once the server answered, or the call's refusal."""
    call = stub.Watch(health_pb2.HealthCheckRequest(service=""))
    try:
        first = await call.read()
    except aio.AioRpcError as e:
        return e
    assert first.status == health_pb2.HealthCheckResponse.SERVING
    return call


async def test_a_watch_flood_from_one_client_stops_at_its_bound(
    allocator: tuple[Allocator, str],
) -> None:
    server, metrics = allocator
    bound = DEFAULT_MAX_STREAMS_PER_CLIENT
    open_streams = ("fairshare_open_streams", ())
    refusals = ("fairshare_limit_refusals_total", (("limit", "max_streams_per_client"),))
    async with aio.insecure_channel(server.address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        held = [await watch(stub) for _ in range(bound)]
        assert all(isinstance(call, aio.UnaryStreamCall) for call in held)
        before = rss(server)
        refused: list[aio.AioRpcError] = []
        halfway = 0
        for wave in range(FLOOD // WAVE):
            for outcome in await asyncio.gather(*(watch(stub) for _ in range(WAVE))):
                assert isinstance(outcome, aio.AioRpcError), "a stream past the bound opened"
                refused.append(outcome)
            if wave == FLOOD // WAVE // 2 - 1:
                halfway = rss(server)
        after = rss(server)
        assert {
            (e.code(), dict(e.trailing_metadata() or ()).get("fairshare-limit")) for e in refused
        } == {(grpc.StatusCode.RESOURCE_EXHAUSTED, "max_streams_per_client")}
        samples = await scrape(metrics)
        assert samples[open_streams] == bound
        assert samples[refusals] == FLOOD
        assert after - before < MAX_GROWTH, f"+{(after - before) / MiB:.1f} MiB"
        assert after - halfway < MAX_GROWTH / 2, f"+{(after - halfway) / MiB:.1f} MiB"
        # Probes use Check, which no stream bound refuses.
        check = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
        assert check.status == health_pb2.HealthCheckResponse.SERVING
        # A stream that ends gives its place back.
        held.pop().cancel()
        for _ in range(100):
            if (await scrape(metrics))[open_streams] == bound - 1:
                break
            await asyncio.sleep(0.05)
        assert isinstance(await watch(stub), aio.UnaryStreamCall)
        assert isinstance(await watch(stub), aio.AioRpcError)
