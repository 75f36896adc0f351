"""An ``ha.owned.pool.OwnedPool`` as the owner-level tests make it: fenced for ever, commits
without a window, on a fake clock and an in-memory log."""

from __future__ import annotations

from ha.api import Epoch, NodeId
from ha.clock import FakeClock
from ha.owned.journal import StateWriter
from ha.owned.pool import OwnedPool
from ha.settings import PoolConfig


def owned_pool(
    config: PoolConfig,
    epoch: int,
    clock: FakeClock,
    log: StateWriter,
    *,
    session_ttl_s: float = 30.0,
) -> OwnedPool:
    """The owner of ``config``'s pool at ``epoch`` (node ``n<epoch>``), writing to ``log``."""
    return OwnedPool(
        config=config,
        epoch=Epoch(epoch),
        node=NodeId(f"n{epoch}"),
        clock=clock,
        fenced=lambda: True,
        log=log,
        commit_window_s=0.0,
        release_commit_s=0.0,
        release_memory_s=600.0,
        session_ttl_s=session_ttl_s,
    )
