"""The workload of the gRPC benchmarks: one pool, ten teams, and a gateway's raw calls.

One pool, C = 100, ten teams with share 0.1 each (reservation 10). ``Gateway.fill`` has
eight teams hold their whole reservation (80 grants, never released), so their requests
borrow; ``Gateway.request`` picks one of the two free teams with probability 0.2 (within
share) or a full team otherwise (borrowing), a random class, ``est_tokens`` 500 and a
request id unique per holder. Each call carries the gateway's holder session in its
metadata, as the client library sends it (``session=False``: none, as before sessions);
``Gateway.keep_alive`` renews it as the client library does while grants are live.
bench/grpc_service.py and bench/replicated.py both run it.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time

from grpc import aio

from bench._common import Samples
from bench.echo import ECHO_METHOD
from fairshare.sessions import new_session
from fairshare.wire.metadata import Metadata, session_entry
from fairshare.wire.pb.fairshare.v1 import allocator_pb2 as pb
from fairshare.wire.pb.fairshare.v1 import allocator_pb2_grpc as pb_grpc

POOL = "bench"
CAPACITY = 100
TEAMS = [f"team-{i}" for i in range(10)]
FREE_TEAMS = TEAMS[:2]
FULL_TEAMS = TEAMS[2:]
WITHIN_PROBABILITY = 0.2
RESERVATION = 10
CALL_TIMEOUT_S = 10.0


def bench_pool() -> dict[str, object]:
    return {
        "name": POOL,
        "capacity": CAPACITY,
        "shares": dict.fromkeys(TEAMS, 0.1),
        "half_life_s": 7 * 24 * 3600.0,
        "max_request_s": 3600.0,
        "degraded_mode": "fail_open",
    }


# -- the calls ---------------------------------------------------------------------------------


class Gateway:
    """Issues the workload's calls on one channel per server."""

    def __init__(
        self,
        echo: aio.Channel | None,
        allocator: aio.Channel,
        seed: int,
        name: str = "gw",
        *,
        session: bool = True,
    ) -> None:
        self.name = name  # the holder; request ids are unique per holder
        self.metadata: Metadata = (session_entry(new_session()),) if session else ()
        self.keepalives = 0
        self.echo = echo.unary_unary(ECHO_METHOD) if echo is not None else None
        self.stub = pb_grpc.AllocatorStub(allocator)
        self.random = random.Random(seed)
        self.seq = itertools.count()
        self.held: list[str] = []

    def request(self, team: str | None = None) -> pb.AcquireRequest:
        if team is None:
            within = self.random.random() < WITHIN_PROBABILITY
            team = self.random.choice(FREE_TEAMS if within else FULL_TEAMS)
        return pb.AcquireRequest(
            pool=POOL,
            team=team,
            service_class=self.random.choice((pb.INTERACTIVE, pb.BATCH)),
            est_tokens=500,
            holder=self.name,
            request_id=f"{self.name}-{next(self.seq)}",
        )

    async def echo_call(self, samples: Samples) -> None:
        assert self.echo is not None
        t0 = time.perf_counter()
        await self.echo(b"", timeout=CALL_TIMEOUT_S)
        samples.add("call", time.perf_counter() - t0)

    async def acquire(self, samples: Samples, team: str | None = None) -> pb.AcquireResponse:
        t0 = time.perf_counter()
        r: pb.AcquireResponse = await self.stub.Acquire(
            self.request(team), timeout=CALL_TIMEOUT_S, metadata=self.metadata
        )
        elapsed = time.perf_counter() - t0
        samples.add("acquire", elapsed)
        samples.add("borrow" if r.borrowing else "within", elapsed)
        if r.degraded or not r.granted:
            raise RuntimeError(f"unexpected answer {r}")
        return r

    async def release(self, samples: Samples, grant_id: str) -> None:
        t0 = time.perf_counter()
        consumed = self.random.uniform(0.1, 20.0)
        await self.stub.Release(
            pb.ReleaseRequest(grant_id=grant_id, consumed=consumed),
            timeout=CALL_TIMEOUT_S,
            metadata=self.metadata,
        )
        samples.add("release", time.perf_counter() - t0)

    async def pair(self, samples: Samples) -> None:
        t0 = time.perf_counter()
        r = await self.acquire(samples)
        await self.release(samples, r.grant_id)
        samples.add("pair", time.perf_counter() - t0)

    async def acquire_only(self, samples: Samples) -> None:
        r = await self.acquire(samples)
        self.held.append(r.grant_id)

    async def release_held(self) -> None:
        """Releases what ``acquire_only`` left (not timed), 64 at a time."""
        ignored = Samples()
        while self.held:
            batch, self.held = self.held[:64], self.held[64:]
            await asyncio.gather(*(self.release(ignored, g) for g in batch))

    async def keep_alive(self) -> None:
        """Renews the session every third of the TTL the owner answers with, until
        cancelled (nothing without a session)."""
        if not self.metadata:
            return
        while True:
            r: pb.KeepAliveResponse = await self.stub.KeepAlive(
                pb.KeepAliveRequest(pools=[POOL]), timeout=CALL_TIMEOUT_S, metadata=self.metadata
            )
            self.keepalives += 1
            await asyncio.sleep(r.ttl_s / 3)

    async def fill(self) -> None:
        """Holds the whole reservation of every full team (never released)."""
        ignored = Samples()
        for team in FULL_TEAMS:
            for _ in range(RESERVATION):
                await self.acquire(ignored, team)
