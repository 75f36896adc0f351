"""Which upstream (vLLM instance) of a pool a gateway sends a request to.

vLLM applies priorities per instance: a request waits in the heap of the instance it was
sent to, even while another instance has a free slot, and a waiting request never preempts
a running one. Routing therefore decides how much of a pool's reservation a team really
gets. The routers here decide from plain numbers only, so the simulator (``sim``) and a
gateway can use the same code:

- ``Outstanding``: what one gateway knows, the requests it sent to each upstream and that
  have not ended, counted by the vLLM priority they were sent with. The allocator could
  keep the same tally over every gateway (a global view) if gateways told it the upstream.
- ``Router``: ``choose(priority, outstanding, exclude)`` -> the upstream's index, or None
  when every upstream is excluded (a gateway excludes those that refused a connection).
- ``ROUTERS`` and ``make_router``: the routers by name: ``round-robin``, ``random``,
  ``least-outstanding`` and ``fewest-ahead`` (reservation-aware: the upstream where the
  fewest requests sent with a priority at most this one's are outstanding, so a
  within-share request goes where the fewest within-share requests could start before it;
  ties go to the upstream with the fewest outstanding requests, then at random).

A gateway keeps one ``Outstanding`` and one router per route (give each replica its own
``start`` and seed): ``choose`` with the priority the allocator granted, ``sent`` when the
request goes upstream, ``ended`` when it ends, whatever the way (``fairshare.gateway.upstreams``
does so; the simulation's ``multi-instance`` scenario compares the routers).

Guarantees: deterministic for a given ``random.Random``; no I/O, no clock; O(U) per choice
for U upstreams (``fewest-ahead``: O(U x P) for P distinct priorities outstanding).
Not guaranteed: thread safety (one event loop per router and tally, or a lock).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Final, Protocol


class Outstanding:
    """Requests sent to each upstream and not ended, counted by priority.

    ``sent`` and ``ended`` must pair up (the same upstream and priority); ``ended`` of a
    request never sent raises ``ValueError``.
    """

    def __init__(self, upstreams: int) -> None:
        if upstreams < 1:
            raise ValueError(f"a pool needs at least one upstream, got {upstreams}")
        self._by_priority: list[dict[int, int]] = [{} for _ in range(upstreams)]
        self._totals = [0] * upstreams

    @property
    def upstreams(self) -> int:
        """How many upstreams the pool has."""
        return len(self._totals)

    def sent(self, upstream: int, priority: int) -> None:
        """A request with ``priority`` was sent to ``upstream``."""
        counts = self._by_priority[upstream]
        counts[priority] = counts.get(priority, 0) + 1
        self._totals[upstream] += 1

    def ended(self, upstream: int, priority: int) -> None:
        """A request sent to ``upstream`` with ``priority`` ended (or was aborted)."""
        counts = self._by_priority[upstream]
        left = counts.get(priority, 0) - 1
        if left < 0:
            raise ValueError(f"no request of priority {priority} outstanding on {upstream}")
        if left:
            counts[priority] = left
        else:
            del counts[priority]
        self._totals[upstream] -= 1

    def total(self, upstream: int) -> int:
        """Requests outstanding on ``upstream``."""
        return self._totals[upstream]

    def at_most(self, upstream: int, priority: int) -> int:
        """Requests outstanding on ``upstream`` sent with a priority <= ``priority``.

        vLLM starts these before a request of ``priority`` that arrives now (those already
        running hold their slot; those waiting are ahead of it in the heap).
        """
        return sum(n for p, n in self._by_priority[upstream].items() if p <= priority)


NONE: Final[frozenset[int]] = frozenset()
"""No upstream excluded."""


class Router(Protocol):
    """Chooses the upstream of one request."""

    def choose(
        self, priority: int, outstanding: Outstanding, exclude: frozenset[int] = NONE
    ) -> int | None:
        """The upstream's index for a request the allocator gave ``priority``.

        Upstreams in ``exclude`` are never chosen; None when that leaves none.
        """


def _candidates(outstanding: Outstanding, exclude: frozenset[int]) -> list[int]:
    return [i for i in range(outstanding.upstreams) if i not in exclude]


def _fewest(
    candidates: Sequence[int], keys: Sequence[tuple[int, ...]], rng: random.Random
) -> int | None:
    """The candidate with the smallest key; ties broken at random; None if none."""
    if not candidates:
        return None
    best = min(keys)
    ties = [c for c, key in zip(candidates, keys, strict=True) if key == best]
    return ties[0] if len(ties) == 1 else rng.choice(ties)


class RoundRobin:
    """Upstreams in turn, from ``start`` (give each gateway its own start)."""

    def __init__(self, start: int = 0) -> None:
        self._next = start

    def choose(
        self, priority: int, outstanding: Outstanding, exclude: frozenset[int] = NONE
    ) -> int | None:
        n = outstanding.upstreams
        for step in range(n):
            upstream = (self._next + step) % n
            if upstream not in exclude:
                self._next = upstream + 1
                return upstream
        return None


class Uniform:
    """An upstream drawn uniformly at random."""

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng

    def choose(
        self, priority: int, outstanding: Outstanding, exclude: frozenset[int] = NONE
    ) -> int | None:
        candidates = _candidates(outstanding, exclude)
        return self._rng.choice(candidates) if candidates else None


class LeastOutstanding:
    """The upstream with the fewest outstanding requests (ties at random)."""

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng

    def choose(
        self, priority: int, outstanding: Outstanding, exclude: frozenset[int] = NONE
    ) -> int | None:
        candidates = _candidates(outstanding, exclude)
        keys = [(outstanding.total(i),) for i in candidates]
        return _fewest(candidates, keys, self._rng)


class FewestAhead:
    """Reservation-aware: the upstream where the fewest requests would start first.

    A request of priority p waits behind the outstanding requests of priority <= p (vLLM's
    heap admits them first; the running ones hold their slots) and jumps ahead of the rest.
    It goes where those are fewest; ties (for instance every upstream full of borrowers,
    none ahead of a within-share request) go to the fewest outstanding requests, where a
    slot frees soonest, then at random so that gateways do not pick alike.
    """

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng

    def choose(
        self, priority: int, outstanding: Outstanding, exclude: frozenset[int] = NONE
    ) -> int | None:
        candidates = _candidates(outstanding, exclude)
        keys = [(outstanding.at_most(i, priority), outstanding.total(i)) for i in candidates]
        return _fewest(candidates, keys, self._rng)


ROUTERS: Final = ("round-robin", "random", "least-outstanding", "fewest-ahead")
"""The routers' names, as a gateway's ``routing:`` setting would spell them."""

_BUILDERS: Final[dict[str, Callable[[random.Random, int], Router]]] = {
    "round-robin": lambda rng, start: RoundRobin(start),
    "random": lambda rng, start: Uniform(rng),
    "least-outstanding": lambda rng, start: LeastOutstanding(rng),
    "fewest-ahead": lambda rng, start: FewestAhead(rng),
}


def make_router(name: str, *, rng: random.Random, start: int = 0) -> Router:
    """The router called ``name`` (one of ``ROUTERS``).

    Args:
        name: the router's name.
        rng: its source of randomness (tie-breaks, ``random``).
        start: the first upstream of ``round-robin``.

    Raises:
        ValueError: an unknown name.
    """
    try:
        build = _BUILDERS[name]
    except KeyError:
        raise ValueError(f"unknown router {name!r}; known: {', '.join(ROUTERS)}") from None
    return build(rng, start)
