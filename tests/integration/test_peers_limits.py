"""A limit met on the owner crosses a forward unchanged, instead of looking like a dead
peer (which would send the forwarding replica into its degraded mode, past the limit)."""

from __future__ import annotations

import pytest

from fairshare import Class
from ha.api import Epoch, LimitExceeded, OutOfRange, PoolView
from server.app import RunningServer
from server.peers import GrpcPeers

from .fakes import FakeAllocator

pytestmark = pytest.mark.timeout(20)


async def test_limit_exceeded_and_out_of_range_cross_a_forward(
    running: RunningServer, fake: FakeAllocator, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def full(**kwargs: object) -> None:
        raise LimitExceeded("max_teams", "pool gpu-a already keeps 1024 teams")

    async def out_of_range(pool: str, *, forwarded: bool = False) -> PoolView:
        raise OutOfRange("est_tokens", "must be <= 4294967296")

    monkeypatch.setattr(fake, "acquire", full)
    monkeypatch.setattr(fake, "snapshot", out_of_range)
    peers = GrpcPeers()
    try:
        with pytest.raises(LimitExceeded) as limit:
            await peers.acquire(
                running.address,
                pool="gpu-a",
                team="new",
                cls=Class.INTERACTIVE,
                est_tokens=0,
                holder="",
                request_id="",
                try_only=False,
                epoch=Epoch(1),
                timeout=2,
            )
        assert limit.value.limit == "max_teams"
        assert "1024 teams" in str(limit.value)
        with pytest.raises(OutOfRange) as bad:
            await peers.snapshot(running.address, "gpu-a", timeout=2)
        assert bad.value.field == "est_tokens"
    finally:
        await peers.close()
