"""The client for synchronous code: an ``AllocatorClient`` on a private event loop thread."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Sequence
from typing import TypeVar

from fairshare import Class
from fairshare.client.allocator import AllocatorClient
from fairshare.client.grants import ClientGrant
from fairshare.wire.pb.fairshare.v1 import allocator_pb2 as pb

T = TypeVar("T")


class SyncGrant:
    """A ``ClientGrant`` for synchronous code."""

    def __init__(self, grant: ClientGrant, client: SyncAllocatorClient) -> None:
        self.grant = grant
        self._client = client

    def __getattr__(self, name: str) -> object:
        return getattr(self.grant, name)

    def release(self, consumed: float = 0.0) -> None:
        """Ends the grant (see ``ClientGrant.release``)."""
        self._client._run(self.grant.release(consumed))


class SyncAllocatorClient:
    """A blocking wrapper: runs an ``AllocatorClient`` on a private event loop thread."""

    def __init__(self, targets: Sequence[str], *, holder: str, deadline_s: float = 0.75) -> None:
        """Starts the loop thread; see ``AllocatorClient`` for the arguments."""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name=f"fairshare-client-{holder}", daemon=True
        )
        self._thread.start()
        self._client: AllocatorClient = self._run(
            self._make(targets, holder=holder, deadline_s=deadline_s)
        )

    @staticmethod
    async def _make(targets: Sequence[str], *, holder: str, deadline_s: float) -> AllocatorClient:
        # Created on the loop thread so its channels bind to that loop.
        return AllocatorClient(targets, holder=holder, deadline_s=deadline_s)

    def _run(self, coro: Coroutine[object, object, T], timeout: float = 30.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def __enter__(self) -> SyncAllocatorClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def refresh_pools(self) -> list[pb.PoolInfo]:
        """See ``AllocatorClient.refresh_pools``."""
        return self._run(self._client.refresh_pools())

    def acquire(
        self, pool: str, team: str, service_class: Class = Class.INTERACTIVE, est_tokens: int = 0
    ) -> SyncGrant:
        """See ``AllocatorClient.acquire``."""
        return SyncGrant(
            self._run(self._client.acquire(pool, team, service_class, est_tokens)), self
        )

    def close(self) -> None:
        """Flushes releases, closes the client and stops the loop thread."""
        if not self._loop.is_running():
            return
        try:
            self._run(self._client.close())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
            self._loop.close()
