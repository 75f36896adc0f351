"""Calls of one kind coalesced into batched calls, per key, when many wait at once.

``Batches`` takes items one by one (``submit``) and hands them to a ``send`` function in
lists: at most ``in_flight`` lists of one key are being sent at once, and the items that
arrive meanwhile wait and leave together in the next list (at most ``max_items`` each).
A lone item therefore goes out at once, alone, as it would without batching; under load
one call carries many items, which is what saves a busy gateway its per-call cost. With
``inline``, an item that finds its key idle (nothing being sent, nothing waiting) is sent
from its caller's own task, counted as one list being sent: no task of its own, the cost
of a call without batching.

Guarantees:
- Each submitted item is sent at most once by this object, and its caller gets the
  result ``send`` returned in its place, or the exception ``send`` raised for its list.
- Items of one key leave in the order they were submitted.
- A caller that stops waiting (cancelled) before its item left takes the item out: it is
  not sent. Once sent, the item's result is dropped; an item sent inline is sent in its
  caller's task, so cancelling the caller cancels its call (its result is then unknown,
  as that of a call that timed out).

Non-guarantees: no deadline of its own (the caller bounds its wait); no retry (``send``
retries, or the caller does).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")

Send = Callable[[str, list[Item]], Awaitable[list[Result | BaseException]]]
"""Sends one list of items of a key; returns, in their order, each item's result or the
exception its caller gets (or raises one exception for the whole list)."""


@dataclass
class _Key(Generic[Item, Result]):
    waiting: list[tuple[Item, asyncio.Future[Result]]] = field(default_factory=list)
    sending: int = 0


class Batches(Generic[Item, Result]):
    """See the module doc."""

    def __init__(
        self, send: Send[Item, Result], *, in_flight: int, max_items: int, inline: bool = False
    ) -> None:
        """Args:
        send: sends one list of items of a key.
        in_flight: most lists of one key being sent at once (>= 1).
        max_items: most items in one list (>= 1).
        inline: send an item that finds its key idle from its caller's task.

        Raises:
            ValueError: a bound < 1.
        """
        if in_flight < 1 or max_items < 1:
            raise ValueError("in_flight and max_items must be >= 1")
        self._send = send
        self._in_flight = in_flight
        self._max_items = max_items
        self._inline = inline
        self._keys: dict[str, _Key[Item, Result]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.calls = 0
        """Lists sent so far (a counter, for tests and benchmarks)."""
        self.items = 0
        """Items sent so far."""

    async def submit(self, key: str, item: Item) -> Result:
        """Sends ``item`` with others of ``key`` and returns its result.

        Raises:
            BaseException: what ``send`` gave for the item, or raised for its list.
        """
        state = self._keys.get(key)
        if state is None:
            state = self._keys[key] = _Key()
        if self._inline and state.sending == 0 and not state.waiting:
            return await self._send_inline(key, state, item)
        future: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        state.waiting.append((item, future))
        if state.sending < self._in_flight:
            self._start(key, state)
        return await future

    async def _send_inline(self, key: str, state: _Key[Item, Result], item: Item) -> Result:
        """Sends ``item`` alone from the caller's task, counted as a list being sent; what
        arrived meanwhile is sent after it."""
        state.sending += 1
        self.calls += 1
        self.items += 1
        try:
            [result] = await self._send(key, [item])
        finally:
            state.sending -= 1
            if state.waiting and state.sending < self._in_flight:
                self._start(key, state)
            elif state.sending == 0 and not state.waiting and self._keys.get(key) is state:
                del self._keys[key]
        if isinstance(result, BaseException):
            raise result
        return result

    def _start(self, key: str, state: _Key[Item, Result]) -> None:
        state.sending += 1
        task = asyncio.get_running_loop().create_task(self._pump(key, state))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _pump(self, key: str, state: _Key[Item, Result]) -> None:
        """Sends what waits for ``key``, list after list, while anything does."""
        try:
            while True:
                batch = self._take(state)
                if not batch:
                    return
                await self._deliver(key, batch)
        finally:
            state.sending -= 1
            if state.sending == 0 and not state.waiting and self._keys.get(key) is state:
                del self._keys[key]

    def _take(self, state: _Key[Item, Result]) -> list[tuple[Item, asyncio.Future[Result]]]:
        """Up to ``max_items`` waiting items, in order, skipping those whose callers left."""
        batch: list[tuple[Item, asyncio.Future[Result]]] = []
        while state.waiting and len(batch) < self._max_items:
            room = self._max_items - len(batch)
            taken, state.waiting = state.waiting[:room], state.waiting[room:]
            batch.extend(entry for entry in taken if not entry[1].done())
        return batch

    async def _deliver(self, key: str, batch: list[tuple[Item, asyncio.Future[Result]]]) -> None:
        self.calls += 1
        self.items += len(batch)
        try:
            results = await self._send(key, [item for item, _ in batch])
        except asyncio.CancelledError:
            for _, future in batch:
                future.cancel()
            raise
        except Exception as e:  # each caller gets what its list got
            for _, future in batch:
                if not future.done():
                    future.set_exception(e)
            return
        if len(results) != len(batch):
            error = RuntimeError(f"{len(results)} results for {len(batch)} items")
            results = [error] * len(batch)
        for (_, future), result in zip(batch, results, strict=True):
            if future.done():
                continue
            if isinstance(result, BaseException):
                future.set_exception(result)
            else:
                future.set_result(result)

    async def close(self) -> None:
        """Stops sending: callers still waiting are cancelled."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for state in self._keys.values():
            for _, future in state.waiting:
                future.cancel()
        self._keys.clear()
