"""``ha.api.Peers`` over gRPC: how a replica forwards calls to a pool's owner.

One cached ``grpc.aio`` channel per peer address (opened by ``fairshare.wire.channels``); with TLS
credentials that follow their files, the cache is replaced when they change. Every call carries the
metadata ``fairshare-forwarded: 1`` so the receiver answers from its own state, and a forwarded
Acquire, Adopt or KeepAlive its caller's holder session (``fairshare-session``, rebuilt from
``Session.text``): the owner sees the caller's session, never one of this replica's. A failed call
is turned back into the exception the owner raised by ``fairshare.wire.errors.to_allocator_error``
(the one table of ``fairshare.wire.errors``): a limit met on the owner, a wrong epoch or a
fail-closed pool reach the client as such instead of sending this replica into its degraded mode.
Any other failure of the peer is ``PeerUnavailable``: the caller cannot know what the peer did.
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
from fairshare.records import AdoptResult, Decision, HeldGrant, KeepAliveResult, PoolView
from fairshare.sessions import Session
from fairshare.wire.channels import open_channel
from fairshare.wire.convert import (
    acquire_request,
    adopt_request,
    adopt_result,
    decision,
    keep_alive_result,
    pool_view,
)
from fairshare.wire.errors import to_allocator_error
from fairshare.wire.metadata import FORWARDED, Metadata, bearer, session_entry
from fairshare.wire.pb.fairshare.v1 import allocator_pb2 as pb
from fairshare.wire.pb.fairshare.v1 import allocator_pb2_grpc as pb_grpc

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
            options: extra channel options, over ``fairshare.wire.channels.CHANNEL_OPTIONS``
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

    def _metadata(self, *, admin: bool = False, session: Session | None = None) -> Metadata:
        """The metadata of a forwarded call: the mark, the admin token of an admin call,
        the caller's session when the call carries one.

        Raises:
            ValueError: ``session`` has no text (it was not read from a call), so it
                cannot be sent on.
        """
        if admin and self._admin_token:
            return (*FORWARDED, bearer(self._admin_token))
        if session is None:
            return FORWARDED
        if not session.text:
            raise ValueError("a session not read from a call cannot be forwarded")
        return (*FORWARDED, session_entry(session.text))

    async def _forward(
        self,
        method: str,
        address: str,
        request: object,
        *,
        timeout: float,
        session: Session | None = None,
        pool: str = "",
    ) -> T:
        """``method`` of the Allocator service on ``address``, forwarded: with the mark
        and, when given, the caller's ``session``."""
        metadata = self._metadata(session=session)
        return await self._call(
            method,
            address,
            lambda ch: getattr(pb_grpc.AllocatorStub(ch), method)(
                request, timeout=timeout, metadata=metadata
            ),
            pool=pool,
        )

    async def acquire(  # noqa: PLR0913 (the call's fields, keyword-only)
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
        session: Session | None = None,
        wait_s: float = 0.0,
    ) -> Decision:
        """Acquire on the owner at ``address``, which must own ``pool`` at ``epoch``, in
        the caller's ``session``."""
        request = acquire_request(
            pool=pool,
            team=team,
            cls=cls,
            est_tokens=est_tokens,
            holder=holder,
            request_id=request_id,
            try_only=try_only,
            epoch=epoch,
            wait_s=wait_s,
        )
        r: pb.AcquireResponse = await self._forward(
            "Acquire", address, request, timeout=timeout, session=session, pool=pool
        )
        return decision(r)

    async def release(self, address: str, grant_id: str, consumed: float, timeout: float) -> None:
        """Release on the owner at ``address``."""
        request = pb.ReleaseRequest(grant_id=grant_id, consumed=consumed)
        await self._forward("Release", address, request, timeout=timeout)

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
        session: Session | None = None,
    ) -> AdoptResult:
        """Adopt on the owner at ``address``, in the caller's ``session``."""
        request = adopt_request(
            pool=pool, epoch=epoch, holder=holder, complete=complete, grants=grants
        )
        r: pb.AdoptResponse = await self._forward(
            "Adopt", address, request, timeout=timeout, session=session, pool=pool
        )
        return adopt_result(r)

    async def keep_alive(
        self, address: str, pools: Sequence[str], session: Session, timeout: float
    ) -> KeepAliveResult:
        """KeepAlive on the owner at ``address`` of ``pools``, for the caller's
        ``session``."""
        request = pb.KeepAliveRequest(pools=list(pools))
        r: pb.KeepAliveResponse = await self._forward(
            "KeepAlive", address, request, timeout=timeout, session=session
        )
        return keep_alive_result(r)

    async def snapshot(self, address: str, pool: str, timeout: float) -> PoolView:
        """Snapshot from the owner at ``address``."""
        request = pb.SnapshotRequest(pool=pool)
        r: pb.SnapshotResponse = await self._forward(
            "Snapshot", address, request, timeout=timeout, pool=pool
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
