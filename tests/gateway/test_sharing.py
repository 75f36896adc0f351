"""What the allocator's decisions do at the stand-in: the reservation stands, and fallback
pools take what a saturated pool cannot, without two saturated pools trading requests."""

from __future__ import annotations

import asyncio
from functools import partial
from pathlib import Path

import pytest
from openai import RateLimitError

from harness.standin import Standin

from .conftest import MODEL, Stack, eventually, start_stack

pytestmark = pytest.mark.timeout(120)

MESSAGES = [{"role": "user", "content": "hello"}]


async def _arrived(stack: Stack, standin: str, count: int) -> bool:
    return len(await stack.records(standin)) >= count


def _asked(record: dict[str, object]) -> str:
    """What a request recorded by the stand-in said (its first message)."""
    body = record["body"]
    assert isinstance(body, dict)
    return str(body["messages"][0]["content"])


async def _records_by_ask(stack: Stack) -> dict[str, dict[str, object]]:
    return {_asked(r): r for r in await stack.records("a")}


async def test_a_flood_of_one_team_does_not_delay_another_teams_share(tmp_path: Path) -> None:
    """Team-a floods the pool with requests that never end on their own; team-b's request,
    within its share, then waits at the stand-in behind no borrowing request of team-a.
    Slots are freed by the test (closing flood requests), so every assertion is about the
    order of events, never about how long anything took."""

    def models(s: dict[str, Standin]) -> list[dict[str, object]]:
        return [{"name": MODEL, "pool": "gpu-a", "upstreams": [s["a"].url]}]

    async with start_stack(
        tmp_path,
        pools={"gpu-a": {"capacity": 4, "shares": {"team-a": 0.5, "team-b": 0.5}}},
        standins={"a": {"max_running": 2, "tokens_per_s": 100.0}},
        models=models,
    ) as stack:
        flood = _flood(stack, "team-a", 8)
        try:
            await eventually(lambda: _arrived(stack, "a", 8))
            await eventually(lambda: _started(stack, 2))
            seen = await _records_by_ask(stack)
            # team-a got its two within-share slots, then borrowed: none of its requests
            # had ended, so the allocator counted all eight at once.
            priorities = sorted(int(r["priority"]) for r in seen.values())  # type: ignore[call-overload]
            assert priorities[:2] == [0, 0] and all(p >= 10 for p in priorities[2:])

            late = asyncio.ensure_future(
                stack.client("team-b").chat.completions.with_raw_response.create(
                    model=MODEL,
                    messages=[{"role": "user", "content": "team-b"}],
                    max_tokens=20,
                )
            )
            await eventually(lambda: _arrived(stack, "a", 9))
            # Free one slot at a time (close a running flood request) until team-b's
            # request starts: a within-share flood request waiting before it (the same
            # priority, earlier) may take a slot first; a borrowing one may not.
            # At most the two within-share flood requests can be ahead: the third slot
            # freed is team-b's.
            for closes in range(4):
                seen = await _records_by_ask(stack)
                if seen["team-b"]["start_s"] is not None:
                    break
                assert closes < 3, "team-b's request waited behind borrowing requests"
                closed = next(a for a, r in seen.items() if a in flood and _running(r))
                flood[closed].cancel()
                await eventually(partial(_slot_taken_after, stack, closed))
            raw = await late
            assert raw.headers["x-fairshare-priority"] == "0"
            seen = await _records_by_ask(stack)
            mine = seen.pop("team-b")
            assert mine["priority"] == 0 and mine["start_s"] is not None
            # When it arrived both slots were busy with the flood...
            assert sum(1 for r in seen.values() if _running_at(r, mine["arrival_s"])) == 2  # type: ignore[arg-type]
            # ...and no borrowing flood request started between its arrival and its start.
            jumped = [
                r
                for r in seen.values()
                if r["start_s"] is not None
                and mine["arrival_s"] <= r["start_s"] < mine["start_s"]  # type: ignore[operator]
                and r["priority"] != 0
            ]
            assert jumped == []
            # Once it ended, the flood went on: its slot went to a waiting flood request.
            await eventually(lambda: _started_after(stack, mine["start_s"]))  # type: ignore[arg-type]
        finally:
            for task in flood.values():
                task.cancel()
            await asyncio.wait(flood.values())
        await eventually(lambda: _idle_pool(stack, "gpu-a"))


def _flood(stack: Stack, team: str, count: int) -> dict[str, asyncio.Future[object]]:
    """``count`` long requests of ``team`` (50 s each: ended by the test, not by the
    stand-in), by what they ask ("flood <i>")."""
    client = stack.client(team)
    return {
        f"flood {i}": asyncio.ensure_future(
            client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": f"flood {i}"}],
                max_tokens=5000,
            )
        )
        for i in range(count)
    }


def _running(record: dict[str, object]) -> bool:
    return record["start_s"] is not None and record["end_s"] is None


def _running_at(record: dict[str, object], when: float) -> bool:
    start, end = record["start_s"], record["end_s"]
    return start is not None and start < when and (end is None or end >= when)  # type: ignore[operator]


async def _started(stack: Stack, count: int) -> bool:
    return sum(1 for r in await stack.records("a") if r["start_s"] is not None) >= count


async def _slot_taken_after(stack: Stack, closed: str) -> bool:
    """The request ``closed`` ended and a waiting request took its slot."""
    seen = await _records_by_ask(stack)
    end = seen[closed]["end_s"]
    return end is not None and any(
        r["start_s"] is not None and r["start_s"] >= end  # type: ignore[operator]
        for r in seen.values()
    )


async def _started_after(stack: Stack, when: float) -> bool:
    seen = await _records_by_ask(stack)
    return any(
        a != "team-b" and r["start_s"] is not None and r["start_s"] > when  # type: ignore[operator]
        for a, r in seen.items()
    )


async def _idle_pool(stack: Stack, pool: str) -> bool:
    return await stack.in_flight(pool) == {}


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
        assert await stack.metric("fairshare_gateway_fallbacks_total", pool="gpu-b") == 1
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
        assert await stack.metric("fairshare_gateway_fallbacks_total") == 1
        await hold_a.close()
        await hold_b.close()
        await eventually(lambda: _idle(stack))


async def _idle(stack: Stack) -> bool:
    return await stack.in_flight("gpu-a") == {} and await stack.in_flight("gpu-b") == {}


async def test_a_team_that_lends_nothing_finds_its_slots_free_under_a_flood(
    tmp_path: Path,
) -> None:
    """Issue 30: team-a lends none of its idle reservation (2 of C = 4). Team-b floods
    with long requests: 2 run (its reservation), the rest are held at the allocator, with
    no slot at the stand-in, instead of filling the stand-in's slots. Team-a's request then
    starts at once; a held request whose client goes away leaves the queue; one that stays
    goes to the stand-in when a slot opens. A pool that holds nobody (``max_held: 0``)
    and refuses at a wait's end answers 429 naming the limit."""

    def models(s: dict[str, Standin]) -> list[dict[str, object]]:
        return [
            {"name": MODEL, "pool": "gpu-a", "upstreams": [s["a"].url]},
            {"name": "strict", "pool": "gpu-s", "upstreams": [s["a"].url]},
        ]

    shares = {"team-a": 0.5, "team-b": 0.5}
    lending = {"capacity": 4, "shares": shares, "lend": {"team-a": 0.0}}
    async with start_stack(
        tmp_path,
        pools={
            "gpu-a": lending,
            # team-a keeps both slots: nothing is lent, and nobody may be held.
            "gpu-s": {**lending, "shares": {"team-a": 1.0}, "max_held": 0, "on_wait_end": "refuse"},
        },
        standins={"a": {"models": (MODEL, "strict"), "max_running": 4, "tokens_per_s": 100.0}},
        models=models,
    ) as stack:
        flood = _flood(stack, "team-b", 5)
        try:
            await eventually(lambda: _started(stack, 2))
            await eventually(
                lambda: _metric_is(stack, "fairshare_gateway_acquiring", 3, pool="gpu-a")
            )
            assert len(await stack.records("a")) == 2  # the held ones never reached it
            mine = await stack.client("team-a").chat.completions.with_raw_response.create(
                model=MODEL, messages=MESSAGES, max_tokens=1
            )
            assert mine.headers["x-fairshare-standing"] == "within"
            seen = await _records_by_ask(stack)
            record = seen.pop("hello")
            # It found a free slot (fewer than max_running ran): it started at once.
            assert sum(1 for r in seen.values() if _running_at(r, record["arrival_s"])) == 2  # type: ignore[arg-type]
            # A held request whose client goes away leaves the queue.
            gone = next(f for f in flood.values() if not f.done())
            gone.cancel()
            await eventually(
                lambda: _metric_is(stack, "fairshare_gateway_acquiring", 2, pool="gpu-a")
            )
            # Closing a running flood request lets one held request in.
            running = [a for a, r in (await _records_by_ask(stack)).items() if _running(r)]
            flood[running[0]].cancel()
            await eventually(
                lambda: _metric_is(stack, "fairshare_gateway_acquiring", 1, pool="gpu-a")
            )
            await eventually(lambda: _started(stack, 4))  # 2 flood + team-a's + the one let in
            # Past the lending limit with nobody held: 429, and the SDK is told to wait.
            with pytest.raises(RateLimitError) as refused:
                await stack.client("team-b").chat.completions.create(
                    model="strict", messages=MESSAGES, max_tokens=1
                )
            assert refused.value.response.headers["x-fairshare-limit"] == "max_held"
            assert refused.value.response.headers["retry-after"] == "1"
        finally:
            for task in flood.values():
                task.cancel()
            await asyncio.wait(flood.values())
        await eventually(lambda: _idle_pool(stack, "gpu-a"))


async def _metric_is(stack: Stack, name: str, value: float, **labels: str) -> bool:
    return await stack.metric(name, **labels) == value
