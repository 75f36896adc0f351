"""``fairshare.client.batches``: items coalesced per key, in order, at most ``in_flight`` out."""

from __future__ import annotations

import asyncio

import pytest

from fairshare.client.batches import Batches

pytestmark = pytest.mark.timeout(10)


class Sender:
    """A ``send`` that holds each list until the test lets it go."""

    def __init__(self) -> None:
        self.lists: list[tuple[str, list[int]]] = []
        self.out = 0
        self.most_out = 0
        self.gate = asyncio.Event()
        self.fail: Exception | None = None

    async def __call__(self, key: str, items: list[int]) -> list[int | BaseException]:
        self.lists.append((key, items))
        self.out += 1
        self.most_out = max(self.most_out, self.out)
        try:
            await self.gate.wait()
        finally:
            self.out -= 1
        if self.fail is not None:
            raise self.fail
        return [ValueError(item) if item < 0 else item * 10 for item in items]


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_lone_item_leaves_alone_and_at_once() -> None:
    send = Sender()
    send.gate.set()
    batches = Batches(send, in_flight=2, max_items=8)
    assert await batches.submit("p", 1) == 10
    assert send.lists == [("p", [1])]
    assert (batches.calls, batches.items) == (1, 1)


async def test_items_that_wait_leave_together_in_order_within_in_flight() -> None:
    send = Sender()
    batches = Batches(send, in_flight=2, max_items=8)
    calls = [asyncio.create_task(batches.submit("p", n)) for n in range(12)]
    await settle()
    # Submitted together: two lists out at once, the first as long as max_items allows.
    assert send.lists == [("p", list(range(8))), ("p", list(range(8, 12)))]
    later = [asyncio.create_task(batches.submit("p", n)) for n in range(12, 15)]
    await settle()
    assert len(send.lists) == 2  # these wait for a list to end
    send.gate.set()
    assert await asyncio.gather(*calls, *later) == [n * 10 for n in range(15)]
    assert send.most_out == 2
    assert send.lists[2] == ("p", [12, 13, 14])
    assert (batches.calls, batches.items) == (3, 15)


async def test_keys_are_batched_apart() -> None:
    send = Sender()
    batches = Batches(send, in_flight=1, max_items=8)
    calls = [asyncio.create_task(batches.submit(key, n)) for n, key in enumerate("abab")]
    await settle()
    assert sorted(send.lists) == [("a", [0, 2]), ("b", [1, 3])]
    send.gate.set()
    assert await asyncio.gather(*calls) == [0, 10, 20, 30]


async def test_an_item_refused_fails_its_caller_only() -> None:
    send = Sender()
    send.gate.set()
    batches = Batches(send, in_flight=1, max_items=8)
    calls = [asyncio.create_task(batches.submit("p", n)) for n in (1, -2, 3)]
    results = await asyncio.gather(*calls, return_exceptions=True)
    assert results[0] == 10 and results[2] == 30
    assert isinstance(results[1], ValueError)


async def test_a_list_that_fails_fails_each_of_its_callers() -> None:
    send = Sender()
    send.fail = ConnectionError("down")
    send.gate.set()
    batches = Batches(send, in_flight=1, max_items=8)
    calls = [asyncio.create_task(batches.submit("p", n)) for n in range(3)]
    results = await asyncio.gather(*calls, return_exceptions=True)
    assert all(isinstance(r, ConnectionError) for r in results)


async def test_a_caller_that_leaves_before_its_item_left_takes_it_out() -> None:
    send = Sender()
    batches = Batches(send, in_flight=1, max_items=8)
    first = asyncio.create_task(batches.submit("p", 1))
    await settle()
    gone = asyncio.create_task(batches.submit("p", 2))
    kept = asyncio.create_task(batches.submit("p", 3))
    await settle()
    gone.cancel()
    await settle()
    send.gate.set()
    assert (await first, await kept) == (10, 30)
    assert [items for _, items in send.lists] == [[1], [3]]


async def test_close_cancels_the_callers_still_waiting() -> None:
    send = Sender()
    batches = Batches(send, in_flight=1, max_items=8)
    calls = [asyncio.create_task(batches.submit("p", n)) for n in range(3)]
    await settle()
    await batches.close()
    results = await asyncio.gather(*calls, return_exceptions=True)
    assert all(isinstance(r, asyncio.CancelledError) for r in results)


def test_bounds_below_one_are_refused() -> None:
    send = Sender()
    with pytest.raises(ValueError, match="in_flight"):
        Batches(send, in_flight=0, max_items=8)
    with pytest.raises(ValueError, match="max_items"):
        Batches(send, in_flight=1, max_items=0)


async def test_inline_a_lone_item_is_sent_from_its_callers_task() -> None:
    send = Sender()
    batches = Batches(send, in_flight=1, max_items=8, inline=True)
    first = asyncio.create_task(batches.submit("p", 1))
    await settle()
    assert send.lists == [("p", [1])] and not batches._tasks  # no task of its own
    # Meanwhile the key is busy: the next ones wait, and leave together after it.
    rest = [asyncio.create_task(batches.submit("p", n)) for n in (2, 3, -4)]
    await settle()
    assert len(send.lists) == 1
    send.gate.set()
    assert await first == 10
    assert await asyncio.gather(*rest[:2]) == [20, 30]
    with pytest.raises(ValueError, match="-4"):
        await rest[2]
    assert send.lists == [("p", [1]), ("p", [2, 3, -4])]
    assert (batches.calls, batches.items) == (2, 4)
    assert batches._keys == {}  # an idle key is forgotten


async def test_inline_a_cancelled_caller_cancels_its_call_and_frees_the_key() -> None:
    send = Sender()
    batches = Batches(send, in_flight=1, max_items=8, inline=True)
    call = asyncio.create_task(batches.submit("p", 1))
    await settle()
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert send.out == 0 and batches._keys == {}
    send.gate.set()
    assert await batches.submit("p", 2) == 20  # inline again
