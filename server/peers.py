"""``ha.api.Peers`` over gRPC: how a replica forwards calls to a pool's owner.

One cached ``grpc.aio`` channel per peer address (opened by ``wire.channels``); with TLS
credentials that follow their files, the cache is replaced when they change. Every call
carries the metadata ``fairshare-forwarded: 1`` so the receiver answers from its own state.
A failed call is turned back into the exception the owner raised by
``wire.errors.to_allocator_error`` (the one table of ``wire.errors``): a limit met on the
owner, a wrong epoch or a fail-closed pool reach the client as such instead of sending this
replica into its degraded mode. Any other failure of the peer is ``PeerUnavailable``: the
caller cannot know what the peer did.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

import grpc
from grpc import aio

from fairshare import Class
from fairshare.ids import Epoch
from fairshare.records import AdoptResult, Decision, HeldGrant, PoolView
from wire.channels import open_channel
from wire.convert import (
    acquire_request,
    adopt_request,
    adopt_result,
    decision,
    pool_view,
)
from wire.errors import to_allocator_error
from wire.metadata import FORWARDED, Metadata, bearer
from wire.pb.fairshare.v1 import allocator_pb2 as pb
from wire.pb.fairshare.v1 import allocator_pb2_grpc as pb_grpc

logger = logging.getLogger(__name__)

T = TypeVar("T")

RETIRE_GRACE_S = 5.0
"""How long calls in flight on a peer channel may finish once new credentials replace it."""


class GrpcPeers:
    """Implements ``ha.api.Peers`` with cached ``grpc.aio`` channels."""

    def __init__(
        self,
        *,
        credentials: grpc.ChannelCredentials | Callable[[], grpc.ChannelCredentials] | None = None,
        admin_token: str | None = None,
        observe: Callable[[str, float], None] | None = None,
        options: Sequence[tuple[str, object]] = (),
    ) -> None:
        """Creates the transport; channels open lazily, one per address.

        Args:
            credentials: TLS credentials for peer channels, or a function that returns
                the ones in force (``server.tls_reload``: a new object after the files
                changed, when the cached channels are replaced); None uses plaintext.
            admin_token: bearer token sent with forwarded admin calls.
            observe: called with (method, seconds) after every forwarded call, for the
                forward latency histogram.
            options: extra channel options, over ``wire.channels.CHANNEL_OPTIONS``
                (bounded reconnect backoff).
        """
        self._source = credentials if callable(credentials) else None
        self._credentials = credentials() if callable(credentials) else credentials
        self._admin_token = admin_token
        self._observe = observe
        self._options = list(options)
        self._channels: dict[str, aio.Channel] = {}
        self._retiring: set[asyncio.Task[None]] = set()

    def _channel(self, address: str) -> aio.Channel:
        if self._source is not None:
            credentials = self._source()
            if credentials is not self._credentials:
                self._credentials = credentials
                self._retire_channels()
        channel = self._channels.get(address)
        if channel is None:
            channel = open_channel(address, self._credentials, self._options)
            self._channels[address] = channel
        return channel

    def _retire_channels(self) -> None:
        """New credentials: later calls open new channels; the calls in flight on the old
        ones have ``RETIRE_GRACE_S`` to finish."""
        channels, self._channels = self._channels, {}
        if channels:
            logger.info("peer TLS material changed: reopening %d peer channels", len(channels))
        for channel in channels.values():
            task = asyncio.create_task(channel.close(RETIRE_GRACE_S), name="retire-peer-channel")
            self._retiring.add(task)
            task.add_done_callback(self._retiring.discard)

    async def _call(
        self,
        method: str,
        address: str,
        call: Callable[[aio.Channel], aio.UnaryUnaryCall],
        *,
        pool: str = "",
        node: str = "",
    ) -> T:
        started = time.perf_counter()
        try:
            response: T = await call(self._channel(address))
        except aio.AioRpcError as e:
            raise to_allocator_error(e, address=address, pool=pool, node=node) from e
        finally:
            if self._observe is not None:
                self._observe(method, time.perf_counter() - started)
        return response

    def _metadata(self, *, admin: bool = False) -> Metadata:
        if admin and self._admin_token:
            return (*FORWARDED, bearer(self._admin_token))
        return FORWARDED

    async def acquire(
        self,
        address: str,
        *,
        pool: str,
        team: str,
        cls: Class,
        est_tokens: int,
        holder: str,
        request_id: str,
        try_only: bool,
        epoch: Epoch,
        timeout: float,
    ) -> Decision:
        """Acquire on the owner at ``address``, which must own ``pool`` at ``epoch``."""
        request = acquire_request(
            pool=pool,
            team=team,
            cls=cls,
            est_tokens=est_tokens,
            holder=holder,
            request_id=request_id,
            try_only=try_only,
            epoch=epoch,
        )
        r: pb.AcquireResponse = await self._call(
            "Acquire",
            address,
            lambda ch: pb_grpc.AllocatorStub(ch).Acquire(
                request, timeout=timeout, metadata=self._metadata()
            ),
            pool=pool,
        )
        return decision(r)

    async def release(self, address: str, grant_id: str, consumed: float, timeout: float) -> None:
        """Release on the owner at ``address``."""
        request = pb.ReleaseRequest(grant_id=grant_id, consumed=consumed)
        await self._call(
            "Release",
            address,
            lambda ch: pb_grpc.AllocatorStub(ch).Release(
                request, timeout=timeout, metadata=self._metadata()
            ),
        )

    async def adopt(
        self,
        address: str,
        *,
        pool: str,
        epoch: Epoch,
        holder: str,
        grants: Sequence[HeldGrant],
        complete: bool,
        timeout: float,
    ) -> AdoptResult:
        """Adopt on the owner at ``address``."""
        request = adopt_request(
            pool=pool, epoch=epoch, holder=holder, complete=complete, grants=grants
        )
        r: pb.AdoptResponse = await self._call(
            "Adopt",
            address,
            lambda ch: pb_grpc.AllocatorStub(ch).Adopt(
                request, timeout=timeout, metadata=self._metadata()
            ),
            pool=pool,
        )
        return adopt_result(r)

    async def snapshot(self, address: str, pool: str, timeout: float) -> PoolView:
        """Snapshot from the owner at ``address``."""
        request = pb.SnapshotRequest(pool=pool)
        r: pb.SnapshotResponse = await self._call(
            "Snapshot",
            address,
            lambda ch: pb_grpc.AllocatorStub(ch).Snapshot(
                request, timeout=timeout, metadata=self._metadata()
            ),
            pool=pool,
        )
        return pool_view(r)

    async def set_capacity(self, address: str, pool: str, capacity: int, timeout: float) -> int:
        """SetCapacity on the owner at ``address``; returns the previous C."""
        request = pb.SetCapacityRequest(pool=pool, capacity=capacity)
        r: pb.SetCapacityResponse = await self._call(
            "SetCapacity",
            address,
            lambda ch: pb_grpc.AdminStub(ch).SetCapacity(
                request, timeout=timeout, metadata=self._metadata(admin=True)
            ),
            pool=pool,
        )
        return int(r.previous)

    async def switchover(self, address: str, pool: str, node: str, timeout: float) -> None:
        """Switchover on the owner at ``address``."""
        request = pb.SwitchoverRequest(pool=pool, node=node)
        await self._call(
            "Switchover",
            address,
            lambda ch: pb_grpc.AdminStub(ch).Switchover(
                request, timeout=timeout, metadata=self._metadata(admin=True)
            ),
            pool=pool,
            node=node,
        )

    async def close(self) -> None:
        """Closes every channel."""
        channels, self._channels = self._channels, {}
        for channel in channels.values():
            await channel.close()
        for task in list(self._retiring):
            task.cancel()
        await asyncio.gather(*self._retiring, return_exceptions=True)
