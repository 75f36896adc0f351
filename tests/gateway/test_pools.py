"""The models' pools checked against the allocator's: at start (exit 2 naming the key), at
the allocator's first answer when it was unreachable at start (not ready until then), and
a request that still meets an unknown pool (500 that the ``openai`` SDK does not retry).
Real processes: the allocator, the gateway, a stand-in."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import openai
import pytest

from harness.gateway import Gateway, wait_gateway
from harness.net import free_port
from harness.serve import Allocator, wait_serving
from harness.standin import Standin

from .conftest import MODEL, eventually, gateway_config, model_on_a, pools_yaml, start_stack

pytestmark = pytest.mark.timeout(120)

MESSAGES = [{"role": "user", "content": "hello"}]


def _model(name: str, pool: str, upstream: str, *fallback: str) -> dict[str, object]:
    return {
        "name": name,
        "pool": pool,
        "upstreams": [upstream],
        "fallback": [{"pool": p, "upstreams": [upstream]} for p in fallback],
    }


async def _status(url: str) -> int:
    async with aiohttp.ClientSession() as session, session.get(url) as r:
        return r.status


async def _exited(process: Gateway) -> int | None:
    return await asyncio.to_thread(process.wait, 30)


async def test_a_pool_the_allocator_lacks_stops_the_start_with_status_2(tmp_path: Path) -> None:
    config = tmp_path / "pools.yaml"
    config.write_text(pools_yaml({"gpu-a": {}}))
    allocator = Allocator(tmp_path, config)
    allocator.start()
    try:
        await wait_serving(allocator.address, process=allocator)
        upstream = f"http://127.0.0.1:{free_port()}"
        models = [
            _model("m", "gpu-a", upstream, "gpu-x"),
            _model("n", "gpu-y", upstream),
        ]
        gateway = Gateway(tmp_path, gateway_config(allocator, models))
        gateway.start()
        assert await _exited(gateway) == 2
        log = gateway.log_text()
        assert (
            "fairshare gateway: models[0].fallback[0].pool: 'gpu-x' is not a pool of the "
            "allocator (its pools: gpu-a)"
        ) in log
        assert "fairshare gateway: models[1].pool: 'gpu-y' is not a pool" in log
        assert "gateway listening" not in log  # it never served
    finally:
        allocator.stop()


async def test_without_the_allocator_at_start_it_serves_not_ready_and_checks_at_its_answer(
    tmp_path: Path,
) -> None:
    config = tmp_path / "pools.yaml"
    config.write_text(pools_yaml({"gpu-a": {}}))
    allocator = Allocator(tmp_path, config)  # not started yet
    standin = Standin(tmp_path)
    standin.start()
    right = Gateway(
        tmp_path, gateway_config(allocator, [_model(MODEL, "gpu-a", standin.url)]), name="right"
    )
    wrong = Gateway(
        tmp_path, gateway_config(allocator, [_model(MODEL, "gpu-x", standin.url)]), name="wrong"
    )
    try:
        right.start()
        wrong.start()
        for gateway in (right, wrong):
            await wait_gateway(gateway, path="/healthz")
        async with aiohttp.ClientSession() as session, session.get(right.url + "/readyz") as r:
            assert r.status == 503
            assert "the models' pools are not checked" in await r.text()
        allocator.start()
        await wait_serving(allocator.address, process=allocator)
        await wait_gateway(right)  # ready once the allocator answered
        assert await _exited(wrong) == 2
        assert "models[0].pool: 'gpu-x' is not a pool of the allocator" in wrong.log_text()
        assert right.alive
    finally:
        for process in (right, wrong, standin, allocator):
            process.stop()


async def test_a_request_meeting_an_unknown_pool_gets_a_500_the_sdk_does_not_retry(
    tmp_path: Path,
) -> None:
    async with start_stack(
        tmp_path,
        pools={"gpu-a": {"capacity": 4}},
        standins={"a": {"tokens_per_s": 200.0}},
        models=model_on_a,
    ) as stack:
        # The allocator comes back without gpu-a (a new configuration, a new state).
        stack.allocator.stop()
        other = tmp_path / "other-pools.yaml"
        other.write_text(pools_yaml({"gpu-b": {}}))
        replacement = Allocator(
            tmp_path, other, node="allocator-1", address=stack.allocator.address
        )
        replacement.start()
        try:
            await wait_serving(replacement.address, process=replacement)
            client = stack.client().with_options(max_retries=2)
            with pytest.raises(openai.InternalServerError) as failed:
                await client.chat.completions.create(model=MODEL, messages=MESSAGES)
            answer = failed.value.response
            assert answer.status_code == 500
            assert "retry-after" not in answer.headers
            assert answer.headers["x-should-retry"] == "false"
            error = answer.json()["error"]
            assert (error["type"], error["code"]) == ("server_error", "pool_not_configured")
            assert "unknown pool 'gpu-a'" in error["message"]
            # Asked once: the SDK did not retry it.
            assert await stack.metric("fairshare_gateway_requests_total", status="500") == 1
            assert await stack.records("a") == []
            readyz = stack.gateway.url + "/readyz"
            await eventually(lambda: _not_ready(readyz))
            async with aiohttp.ClientSession() as session, session.get(readyz) as r:
                assert "models[0].pool: 'gpu-a' is not a pool of the allocator" in await r.text()
        finally:
            replacement.stop()


async def _not_ready(url: str) -> bool:
    return await _status(url) == 503
