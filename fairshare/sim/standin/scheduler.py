"""The stand-in's scheduler: a running limit and a queue ordered as vLLM orders its own.

``Scheduler.admit`` returns once the request may run; ``Scheduler.release`` gives its slot
back. Under ``priority`` the waiting requests are ordered by (priority, arrival), lower
first, as vLLM's ``--scheduling-policy priority``; under ``fcfs`` by arrival alone.

Guarantees: at most ``max_running`` requests hold a slot; a waiter that is cancelled (its
client went away) leaves the queue and never takes a slot, and if it was handed a slot in
the same instant, the slot is given back; no request that has a slot is ever preempted.
Not guaranteed: fairness between equal keys beyond arrival order (there is none to give).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from typing import Literal

Policy = Literal["priority", "fcfs"]
POLICIES: tuple[Policy, ...] = ("priority", "fcfs")


class Scheduler:
    """A running limit with an ordered waiting queue (one event loop, no threads)."""

    def __init__(self, max_running: int, policy: Policy) -> None:
        if max_running < 1:
            raise ValueError("max_running must be at least 1")
        self.max_running = max_running
        self.policy = policy
        self.running = 0
        self._arrivals = itertools.count()
        self._waiting: list[tuple[int, int, asyncio.Future[None]]] = []

    @property
    def waiting(self) -> int:
        """How many waiters are queued (cancelled ones are counted until they are popped)."""
        return sum(1 for _, _, fut in self._waiting if not fut.done())

    async def admit(self, priority: int) -> None:
        """Waits until this request holds a slot; the caller must ``release`` it after."""
        if self.running < self.max_running and not self._waiting:
            self.running += 1
            return
        rank = priority if self.policy == "priority" else 0
        slot: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiting, (rank, next(self._arrivals), slot))
        try:
            await slot
        except asyncio.CancelledError:
            if slot.done() and not slot.cancelled():
                self.release()  # handed a slot as the client went: give it back
            raise

    def release(self) -> None:
        """Gives one slot back and starts the waiters at the head while slots are free."""
        self.running -= 1
        self._dispatch()

    def _dispatch(self) -> None:
        # Each entry is popped once: the loop ends when the heap is empty or slots are full.
        while self.running < self.max_running and self._waiting:
            _, _, slot = heapq.heappop(self._waiting)
            if slot.done():
                continue  # its client went away while it waited
            self.running += 1
            slot.set_result(None)
