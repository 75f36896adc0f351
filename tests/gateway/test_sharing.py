"""What the allocator's decisions do at the stand-in: the reservation stands, and fallback
pools take what a saturated pool cannot, without two saturated pools trading requests."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from harness.standin import Standin

from .conftest import MODEL, Stack, eventually, start_stack

pytestmark = pytest.mark.timeout(120)

MESSAGES = [{"role": "user", "content": "hello"}]


async def _arrived(stack: Stack, standin: str, count: int) -> bool:
    return len(await stack.records(standin)) >= count


async def test_a_flood_of_one_team_does_not_delay_another_teams_share(tmp_path: Path) -> None:
    def models(s: dict[str, Standin]) -> list[dict[str, object]]:
        return [{"name": MODEL, "pool": "gpu-a", "upstreams": [s["a"].url]}]

    async with start_stack(
        tmp_path,
        pools={"gpu-a": {"capacity": 4, "shares": {"team-a": 0.5, "team-b": 0.5}}},
        standins={"a": {"max_running": 2, "tokens_per_s": 100.0}},
        models=models,
    ) as stack:
        flood_client = stack.client("team-a")
        flood = [
            asyncio.create_task(
                flood_client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=20)
            )
            for _ in range(8)
        ]
        await eventually(lambda: _arrived(stack, "a", 8))
        raw = await stack.client("team-b").chat.completions.with_raw_response.create(
            model=MODEL, messages=MESSAGES, max_tokens=20
        )
        assert raw.headers["x-fairshare-priority"] == "0"
        await asyncio.gather(*flood)
        records = await stack.records("a")
        late = records[-1]
        assert late["priority"] == 0
        # team-a got its two within-share slots, then borrowed.
        assert sorted(r["priority"] for r in records[:8])[:2] == [0, 0]
        assert all(p >= 10 for p in sorted(r["priority"] for r in records[:8])[2:])  # type: ignore[operator]
        # When team-b's request arrived, the flood held both slots and six of its requests
        # were waiting: it waited for the first slot to free and no longer (no request of
        # the flood started between its arrival and its start), then the flood went on.
        running_then = [
            r
            for r in records[:8]
            if r["start_s"] < late["arrival_s"] <= r["end_s"]  # type: ignore[operator]
        ]
        assert len(running_then) == 2
        started_before_it = [
            r
            for r in records[:8]
            if late["arrival_s"] <= r["start_s"] < late["start_s"]  # type: ignore[operator]
        ]
        assert started_before_it == []
        assert sum(r["start_s"] > late["start_s"] for r in records[:8]) == 6  # type: ignore[operator]


async def test_fallback_pools(tmp_path: Path) -> None:
    def models(s: dict[str, Standin]) -> list[dict[str, object]]:
        return [
            {
                "name": "m1",
                "pool": "gpu-a",
                "upstreams": [s["a"].url],
                "fallback": [{"pool": "gpu-b", "upstreams": [s["b"].url]}],
            },
            {
                "name": "m2",
                "pool": "gpu-b",
                "upstreams": [s["b"].url],
                "fallback": [{"pool": "gpu-a", "upstreams": [s["a"].url]}],
            },
        ]

    one = {"capacity": 1, "shares": {"team-a": 1.0}}
    async with start_stack(
        tmp_path,
        pools={"gpu-a": one, "gpu-b": one},
        standins={
            "a": {"models": ("m1", "m2"), "max_running": 8, "tokens_per_s": 50.0},
            "b": {"models": ("m1", "m2"), "max_running": 8, "tokens_per_s": 50.0},
        },
        models=models,
    ) as stack:
        client = stack.client("team-a")
        # gpu-a holds one long stream: it is at capacity.
        hold_a = await client.chat.completions.create(
            model="m1", messages=MESSAGES, max_tokens=5000, stream=True
        )
        async for _ in hold_a:
            break
        # The next m1 request finds gpu-a saturated and goes to gpu-b, which had room.
        moved = await client.chat.completions.with_raw_response.create(
            model="m1", messages=MESSAGES, max_tokens=1
        )
        assert moved.headers["x-fairshare-pool"] == "gpu-b"
        assert len(await stack.records("b")) == 1
        assert stack.metric("fairshare_gateway_fallbacks_total", pool="gpu-b") == 1
        # Now gpu-b holds a long stream too: both pools are saturated.
        hold_b = await client.chat.completions.create(
            model="m2", messages=MESSAGES, max_tokens=5000, stream=True
        )
        async for _ in hold_b:
            break
        for model, pool, standin in (("m1", "gpu-a", "a"), ("m2", "gpu-b", "b")):
            before = len(await stack.records(standin))
            stays = await client.chat.completions.with_raw_response.create(
                model=model, messages=MESSAGES, max_tokens=1
            )
            assert stays.headers["x-fairshare-pool"] == pool  # kept its own pool's grant
            assert len(await stack.records(standin)) == before + 1
        assert stack.metric("fairshare_gateway_fallbacks_total") == 1
        await hold_a.close()
        await hold_b.close()
        await eventually(lambda: _idle(stack))


async def _idle(stack: Stack) -> bool:
    return await stack.in_flight("gpu-a") == {} and await stack.in_flight("gpu-b") == {}
