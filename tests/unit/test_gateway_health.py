"""fairshare.gateway.health: the states of an upstream, what ejects it and what readmits it,
the gauge, and the first-byte waits ended when probes eject their upstream."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest
from aiohttp import web

from fairshare.gateway.config import HealthSettings
from fairshare.gateway.health import Health, State
from fairshare.gateway.metrics import GatewayMetrics
from harness.net import free_port

pytestmark = pytest.mark.timeout(30)

A, B = "http://a:1", "http://b:1"


def health(**settings: float) -> tuple[Health, GatewayMetrics]:
    metrics = GatewayMetrics()
    return Health(HealthSettings(**settings), [A, B], metrics=metrics), metrics  # type: ignore[arg-type]


def gauge(metrics: GatewayMetrics, url: str) -> float | None:
    return metrics.registry.get_sample_value(
        "fairshare_gateway_upstream_healthy", {"upstream": url}
    )


def test_unknown_until_probed_then_healthy() -> None:
    h, metrics = health()
    assert h.state(A) is State.UNKNOWN and not h.healthy(A) and A not in h.ejected
    assert gauge(metrics, A) == -1
    h.probed(A, None)
    assert h.healthy(A) and gauge(metrics, A) == 1


async def test_failed_probes_eject_and_one_success_readmits() -> None:
    h, metrics = health(unhealthy_after=2)
    h.probed(A, None)
    h.probed(A, "status 500")
    assert h.healthy(A)  # one failure is not enough
    h.probed(A, "no answer within 2s")
    assert h.state(A) is State.EJECTED and h.ejected == {A} and h.ejected_by_probe(A)
    assert gauge(metrics, A) == 0
    ejections = {"upstream": A, "reason": "probe"}
    assert (
        metrics.registry.get_sample_value("fairshare_gateway_upstream_ejections_total", ejections)
        == 1
    )
    h.probed(A, None)
    assert h.healthy(A) and h.ejected == frozenset() and not h.ejected_by_probe(A)


def test_consecutive_failed_requests_eject_an_answer_resets_the_count() -> None:
    h, _ = health(eject_after=3)
    h.probed(A, None)
    for _ in range(2):
        h.request_failed(A)
    h.request_answered(A)
    for _ in range(2):
        h.request_failed(A)
    assert h.healthy(A)
    h.request_failed(A)
    assert h.state(A) is State.EJECTED and not h.ejected_by_probe(A)
    assert B not in h.ejected
    h.probed(A, None)  # too soon after the ejection: the probe may have been on its way
    assert h.state(A) is State.EJECTED


def test_after_requests_ejected_it_a_later_probe_readmits_and_the_count_starts_over() -> None:
    h, _ = health(eject_after=2, interval_s=0.01)
    h.request_failed(A)
    h.request_failed(A)
    assert h.state(A) is State.EJECTED
    time.sleep(0.02)
    h.probed(A, None)  # readmitted, its count of failures forgotten
    h.request_failed(A)
    assert h.healthy(A)


async def test_probes_that_eject_end_the_first_byte_waits_there() -> None:
    h, _ = health(unhealthy_after=1)
    ended: list[str] = []

    async def wait(url: str) -> None:
        try:
            async with asyncio.timeout(30) as deadline:
                h.waiting(url, deadline)
                await asyncio.sleep(30)
        except TimeoutError:
            ended.append(url)
        finally:
            h.done_waiting(url, deadline)

    waits = [asyncio.create_task(wait(url)) for url in (A, B)]
    await asyncio.sleep(0)
    h.probed(A, "refused")
    async with asyncio.timeout(5):
        await waits[0]
    assert ended == [A] and not waits[1].done()
    waits[1].cancel()
    await asyncio.gather(waits[1], return_exceptions=True)


async def test_probe_answers_200_or_says_why_not() -> None:
    status = {"value": 200}

    async def answer(_: web.Request) -> web.Response:
        return web.Response(status=status["value"])

    app = web.Application()
    app.router.add_get("/health", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    h, _ = health(timeout_s=2.0)
    try:
        async with aiohttp.ClientSession() as session:
            url = f"http://127.0.0.1:{port}"
            assert await h.probe(session, url) is None
            status["value"] = 503
            assert await h.probe(session, url) == "status 503"
            refused = await h.probe(session, f"http://127.0.0.1:{free_port()}")
            assert refused is not None and "Connect" in refused
    finally:
        await runner.cleanup()
