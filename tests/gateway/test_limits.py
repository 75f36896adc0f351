"""A gateway at its allocator's bound on grants in flight: 429, ``Retry-After``, the limit
named, while another team within its share is still served; room again once its requests
end. Real processes, the ``openai`` SDK as client."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import openai
import pytest

from harness.standin import Standin

from .conftest import MODEL, Stack, eventually, start_stack

pytestmark = pytest.mark.timeout(120)

MESSAGES = [{"role": "user", "content": "hello"}]
HOLDER_BOUND = 3


def models(s: dict[str, Standin]) -> list[dict[str, object]]:
    return [{"name": MODEL, "pool": "gpu-a", "upstreams": [s["a"].url]}]


async def test_a_gateway_at_its_bound_answers_429_with_retry_after(tmp_path: Path) -> None:
    async with start_stack(
        tmp_path,
        pools={"gpu-a": {"capacity": 2, "max_in_flight_per_holder": HOLDER_BOUND}},
        standins={"a": {"max_running": 8, "tokens_per_s": 5.0}},
        models=models,
    ) as stack:
        client = stack.client("team-a")

        async def long_request() -> None:
            await client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=200)

        running = [asyncio.create_task(long_request()) for _ in range(HOLDER_BOUND)]
        try:
            await eventually(lambda: _in_flight(stack, HOLDER_BOUND))
            # team-a holds its one reserved slot and borrows two: one more would borrow.
            with pytest.raises(openai.RateLimitError) as refused:
                await client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=1)
            answer = refused.value.response
            assert answer.status_code == 429
            assert answer.headers["retry-after"] == "1"
            assert answer.headers["x-fairshare-limit"] == "max_in_flight_per_holder"
            error = answer.json()["error"]
            assert set(error) == {"message", "type", "code"}
            assert error["type"] == "rate_limit_error"
            assert error["code"] == "allocator_refused"
            assert "max_in_flight_per_holder" in error["message"]
            assert await stack.metric("fairshare_gateway_requests_total", status="429") == 1
            # team-b asks for no more than its share (its one slot): served all the same.
            raw = await stack.client("team-b").chat.completions.with_raw_response.create(
                model=MODEL, messages=MESSAGES, max_tokens=1
            )
            assert raw.headers["x-fairshare-standing"] == "within"
        finally:
            for task in running:
                task.cancel()
            for task in running:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        # The clients went away: the gateway released their grants, and there is room.
        await eventually(lambda: _in_flight(stack, 0))
        raw = await client.chat.completions.with_raw_response.create(
            model=MODEL, messages=MESSAGES, max_tokens=1
        )
        assert raw.http_response.status_code == 200


async def _in_flight(stack: Stack, count: int) -> bool:
    return sum((await stack.in_flight("gpu-a")).values()) == count
