"""What teams send: arrival processes and request shapes.

Every source draws from its own ``random.Random``, seeded from the scenario's seed and
the source's position, so two runs of a scenario (fairshare and FCFS, or with and
without a failover) see the same open-loop arrivals and the same request sizes.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from fairshare import Class
from fairshare.sim.engine import Simulator
from fairshare.sim.model import Request


@dataclass(frozen=True, slots=True)
class Tokens:
    """A log-normal token count with the given mean, clipped to ``[lo, hi]``.

    Attributes:
        mean: mean number of tokens before clipping.
        sigma: shape of the log-normal (0 gives a fixed count).
        lo: fewest tokens.
        hi: most tokens.
    """

    mean: float
    sigma: float = 0.5
    lo: int = 1
    hi: int = 8192

    def sample(self, rng: random.Random) -> int:
        """One draw."""
        if self.sigma <= 0:
            value = self.mean
        else:
            mu = math.log(self.mean) - self.sigma**2 / 2
            value = rng.lognormvariate(mu, self.sigma)
        return max(self.lo, min(self.hi, round(value)))


@dataclass(frozen=True, slots=True)
class Shape:
    """The kind of request a source sends."""

    cls: Class
    prompt: Tokens
    output: Tokens


INTERACTIVE = Shape(Class.INTERACTIVE, Tokens(600, 0.6, 16, 4096), Tokens(200, 0.5, 8, 1024))
"""Chat-like requests: medium prompts, short answers."""
BATCH = Shape(Class.BATCH, Tokens(1200, 0.5, 16, 4096), Tokens(300, 0.6, 8, 1024))
"""Offline jobs: longer prompts and answers, throughput oriented."""
LONG = Shape(Class.BATCH, Tokens(2400, 0.5, 64, 8192), Tokens(900, 0.5, 64, 2048))
"""Long-context jobs: long prompts and long answers, the KV cache's heaviest users (about
206 blocks of 16 tokens at their end, against 72 per unit of C in the scenarios)."""


@dataclass(frozen=True, slots=True)
class Mix:
    """Several shapes, one drawn at random for each request with the given weights."""

    shapes: tuple[tuple[Shape, float], ...]
    """(shape, weight) pairs; the weights need not sum to 1."""

    def draw(self, rng: random.Random) -> Shape:
        """The shape of the next request."""
        shapes = [shape for shape, _ in self.shapes]
        return rng.choices(shapes, weights=[weight for _, weight in self.shapes])[0]


class Source(Protocol):
    """A team's stream of requests."""

    @property
    def team(self) -> str:
        """Who sends."""

    def start(self, sim: Simulator, rng: random.Random) -> None:
        """Schedules the source's first arrivals on ``sim``."""


def _send(
    sim: Simulator,
    team: str,
    shape: Shape | Mix,
    rng: random.Random,
    on_done: Callable[[Request], None] | None = None,
) -> None:
    if isinstance(shape, Mix):
        shape = shape.draw(rng)
    prompt = shape.prompt.sample(rng)
    output = shape.output.sample(rng)
    sim.send(team, shape.cls, prompt, output, on_done=on_done)


@dataclass(frozen=True, slots=True)
class Poisson:
    """Independent arrivals at ``rate_per_s`` between ``start_s`` and ``stop_s``."""

    team: str
    rate_per_s: float
    shape: Shape | Mix = INTERACTIVE
    start_s: float = 0.0
    stop_s: float = math.inf

    def start(self, sim: Simulator, rng: random.Random) -> None:
        def arrive() -> None:
            if sim.now >= self.stop_s:
                return
            _send(sim, self.team, self.shape, rng)
            sim.at(sim.now + rng.expovariate(self.rate_per_s), arrive)

        sim.at(self.start_s + rng.expovariate(self.rate_per_s), arrive)


@dataclass(frozen=True, slots=True)
class Bursts:
    """``size`` requests at once, bursts ``every_s`` apart on average (Poisson bursts)."""

    team: str
    every_s: float
    size: int
    shape: Shape | Mix = INTERACTIVE
    start_s: float = 0.0
    stop_s: float = math.inf

    def start(self, sim: Simulator, rng: random.Random) -> None:
        def burst() -> None:
            if sim.now >= self.stop_s:
                return
            for _ in range(self.size):
                _send(sim, self.team, self.shape, rng)
            sim.at(sim.now + rng.expovariate(1.0 / self.every_s), burst)

        sim.at(self.start_s + rng.expovariate(1.0 / self.every_s), burst)


@dataclass(frozen=True, slots=True)
class Flood:
    """A job with ``outstanding`` workers: each sends its next request when one ends.

    A closed loop, as a batch client with a concurrency limit behaves: it keeps
    ``outstanding`` requests in vLLM's queue from ``start_s`` to ``stop_s``.
    """

    team: str
    outstanding: int
    shape: Shape | Mix = BATCH
    start_s: float = 0.0
    stop_s: float = math.inf

    def start(self, sim: Simulator, rng: random.Random) -> None:
        def next_one(_: Request | None = None) -> None:
            if sim.now < self.stop_s:
                _send(sim, self.team, self.shape, rng, next_one)

        def begin() -> None:
            for _ in range(self.outstanding):
                next_one()

        sim.at(self.start_s, begin)


def start_all(sim: Simulator, sources: list[Source], seed: int) -> None:
    """Starts every source with its own generator, derived from ``seed`` and its index."""
    for i, source in enumerate(sources):
        source.start(sim, random.Random(f"{seed}:{i}:{source.team}"))
