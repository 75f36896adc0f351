"""Routing across a model's upstreams: with the shipped router (``fewest-ahead``), a team
flooding a pool of four instances does not delay another team's within-share requests
beyond one service time (issue 14's end-to-end check of docs/simulation.md's result)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from openai import AsyncOpenAI

from harness.standin import Standin

from .conftest import MODEL, Stack, eventually, start_stack

pytestmark = pytest.mark.timeout(180)

INSTANCES = ("a", "b", "c", "d")
SLOTS = 2
"""Requests each instance runs at once (``--max-running``)."""
TOKENS_PER_S = 10.0
FLOOD_TOKENS = 40
"""A flood request's length: the stand-in sends token i at i / TOKENS_PER_S after its start,
so its service time is about (FLOOD_TOKENS - 1) / TOKENS_PER_S, longer under load."""
WITHIN = 4
"""Each team's share of the pool (capacity 8, half each), in requests."""
BORROWERS = 12


def _messages(text: str) -> list[Any]:
    return [{"role": "user", "content": text}]


def _text(record: dict[str, Any]) -> str:
    return str(record["body"]["messages"][0]["content"])


async def _all(stack: Stack) -> dict[str, list[dict[str, Any]]]:
    return {name: await stack.records(name) for name in INSTANCES}


async def _flood_one(client: AsyncOpenAI, text: str) -> None:
    """One long streaming request, read to its end unless cancelled (then closed)."""
    stream = await client.chat.completions.create(
        model=MODEL, messages=_messages(text), max_tokens=FLOOD_TOKENS, stream=True
    )
    try:
        async for _ in stream:
            pass
    finally:
        await stream.close()


async def _arrived(stack: Stack, count: int) -> bool:
    return sum(len(r) for r in (await _all(stack)).values()) >= count


async def _steady(stack: Stack) -> bool:
    """Every instance runs SLOTS flood requests, each some tokens into its stream."""
    for records in (await _all(stack)).values():
        running = [r for r in records if r["start_s"] is not None and r["end_s"] is None]
        if len(running) < SLOTS or any(r["completion_tokens"] < 4 for r in running):
            return False
    return True


async def _nothing_in_flight(stack: Stack) -> bool:
    return await stack.metric("fairshare_gateway_upstream_in_flight") == 0


async def _stop(tasks: Sequence[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_a_flood_does_not_delay_another_teams_share_across_instances(
    tmp_path: Path,
) -> None:
    def models(s: dict[str, Standin]) -> list[dict[str, object]]:
        upstreams = [s[name].url for name in INSTANCES]
        return [{"name": MODEL, "pool": "gpu-a", "upstreams": upstreams}]

    standin = {"max_running": SLOTS, "tokens_per_s": TOKENS_PER_S}
    async with start_stack(
        tmp_path,
        pools={"gpu-a": {"capacity": 8, "shares": {"team-a": 0.5, "team-b": 0.5}}},
        standins={name: dict(standin) for name in INSTANCES},
        models=models,
    ) as stack:
        flood_client = stack.client("team-a")
        flood: list[asyncio.Task[None]] = []
        try:
            # team-a's first requests are within its share, the next ones borrow.
            for i in range(WITHIN + BORROWERS):
                flood.append(asyncio.create_task(_flood_one(flood_client, f"flood {i}")))
                if i == WITHIN - 1:
                    await eventually(lambda: _arrived(stack, WITHIN), timeout_s=30)
            await eventually(lambda: _arrived(stack, WITHIN + BORROWERS), timeout_s=30)
            await eventually(lambda: _steady(stack), timeout_s=30)

            # team-b's within-share requests, while every slot is held by the flood.
            client_b = stack.client("team-b")
            answers = await asyncio.gather(
                *(
                    client_b.chat.completions.with_raw_response.create(
                        model=MODEL, messages=_messages(f"share {i}"), max_tokens=1
                    )
                    for i in range(WITHIN)
                )
            )
            assert [a.headers["x-fairshare-priority"] for a in answers] == ["0"] * WITHIN
            records = await _all(stack)
        finally:
            await _stop(flood)  # the rest of the flood is closed, not waited for

        flood_records = [r for rs in records.values() for r in rs if _text(r).startswith("flood")]
        assert len(flood_records) == WITHIN + BORROWERS
        priorities = sorted(r["priority"] for r in flood_records)
        assert priorities[:WITHIN] == [0] * WITHIN
        assert all(p > 0 for p in priorities[WITHIN:])  # borrowing
        # The flood's service time, as the stand-ins ran it (longer than nominal under load).
        finished = [r for r in flood_records if r["end_s"] is not None and not r["disconnected"]]
        assert finished, "team-b started only after flood requests ended"
        service_s = max(r["end_s"] - r["start_s"] for r in finished)
        assert service_s >= (FLOOD_TOKENS - 1) / TOKENS_PER_S  # the last token's time

        shared = 0
        for rs in records.values():
            for r in (r for r in rs if _text(r).startswith("share")):
                shared += 1
                assert r["priority"] == 0
                # Spread where it could start: no within-share request was waiting on its
                # instance when it arrived (two sent to the same instance, one waits
                # behind the other for a second slot).
                waiting = [
                    o
                    for o in rs
                    if o is not r
                    and o["priority"] == 0
                    and o["arrival_s"] < r["arrival_s"]
                    and (o["start_s"] is None or o["start_s"] > r["arrival_s"])
                ]
                assert waiting == [], (r, waiting)
                # It started within one service time of its arrival: every request running
                # on its instance when it arrived had started before and ended within one.
                assert r["start_s"] - r["arrival_s"] <= service_s
                # And ahead of every borrower waiting there: nothing but a within-share
                # request that arrived before it started on its instance in between.
                jumped = [
                    o
                    for o in rs
                    if o is not r
                    and o["start_s"] is not None
                    and r["arrival_s"] <= o["start_s"] < r["start_s"]
                ]
                assert all(o["priority"] == 0 and o["arrival_s"] < r["arrival_s"] for o in jumped)
        assert shared == WITHIN

        url = {name: stack.standins[name].url for name in INSTANCES}
        sent = "fairshare_gateway_upstream_sent_total"
        assert await stack.metric(sent, standing="within") == 2 * WITHIN
        assert await stack.metric(sent, standing="borrowing") == BORROWERS
        for name in INSTANCES:
            assert await stack.metric(sent, pool="gpu-a", upstream=url[name]) > 0
        await eventually(lambda: _nothing_in_flight(stack), timeout_s=30)
