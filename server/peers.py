"""``ha.api.Peers`` over gRPC: how a replica forwards calls to a pool's owner.

One cached ``grpc.aio`` channel per peer address. Every call carries the metadata
``fairshare-forwarded: 1`` so the receiver answers from its own state. Status codes are
mapped back to ``ha.api`` exceptions in one table (the inverse of
``server.servicer.ERROR_CODES``, helped by the ``fairshare-error`` trailing metadata the
servicer attaches): FAILED_PRECONDITION with owner metadata → WrongEpoch; UNAVAILABLE
and DEADLINE_EXCEEDED → PeerUnavailable (unless the peer said NoOwner); NOT_FOUND →
UnknownPool; INVALID_ARGUMENT → InvalidArgument; OUT_OF_RANGE → OutOfRange;
RESOURCE_EXHAUSTED naming a limit (``fairshare-limit``) → LimitExceeded, so a limit met on
the owner reaches the client instead of sending this replica into its degraded mode. Any
other failure of the peer is PeerUnavailable too: the caller cannot know what the peer did.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Final, TypeVar

import grpc
from grpc import aio

from fairshare import Class
from ha.api import (
    AdoptResult,
    AllocatorError,
    Decision,
    Epoch,
    HeldGrant,
    InvalidArgument,
    LimitExceeded,
    NodeId,
    NoOwner,
    OutOfRange,
    PeerUnavailable,
    PermissionDenied,
    PoolName,
    PoolView,
    StoreUnavailable,
    UnknownNode,
    UnknownPool,
    WrongEpoch,
)
from server.channels import open_channel
from server.convert import SERVICE_CLASS_PB, adopt_request, team_stat
from server.pb.fairshare.v1 import allocator_pb2 as pb
from server.pb.fairshare.v1 import allocator_pb2_grpc as pb_grpc
from server.servicer import (
    EPOCH_KEY,
    ERROR_KEY,
    FIELD_KEY,
    FORWARDED_KEY,
    LIMIT_KEY,
    OWNER_ADDRESS_KEY,
    OWNER_KEY,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")

FORWARDED_METADATA: Final = ((FORWARDED_KEY, "1"),)


def trailing(error: aio.AioRpcError) -> dict[str, str]:
    """The trailing metadata of a failed call as a dict (last value wins)."""
    metadata = error.trailing_metadata() or ()
    return {
        key: value.decode("utf-8", "replace") if isinstance(value, bytes) else value
        for key, value in metadata
    }


def to_allocator_error(
    error: aio.AioRpcError, *, address: str, pool: str = "", node: str = ""
) -> AllocatorError:
    """The ``ha.api`` exception a failed peer call stands for (the one mapping table)."""
    code = error.code()
    meta = trailing(error)
    kind = meta.get(ERROR_KEY, "")
    details = error.details() or ""
    if code == grpc.StatusCode.FAILED_PRECONDITION:
        if EPOCH_KEY in meta:
            try:
                epoch = Epoch(int(meta[EPOCH_KEY]))
            except ValueError:
                epoch = Epoch(0)
            return WrongEpoch(
                pool, NodeId(meta.get(OWNER_KEY, "")), meta.get(OWNER_ADDRESS_KEY, ""), epoch
            )
        if kind == UnknownNode.__name__:
            return UnknownNode(node)
    elif code == grpc.StatusCode.NOT_FOUND:
        return UnknownPool(pool)
    elif code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.OUT_OF_RANGE):
        field = meta.get(FIELD_KEY, "request")
        kind_of = OutOfRange if code == grpc.StatusCode.OUT_OF_RANGE else InvalidArgument
        return kind_of(field, details.removeprefix(f"{field}: "))
    elif code == grpc.StatusCode.RESOURCE_EXHAUSTED and LIMIT_KEY in meta:
        limit = meta[LIMIT_KEY]
        return LimitExceeded(limit, details.removeprefix(f"{limit}: "))
    elif code == grpc.StatusCode.PERMISSION_DENIED and kind == PermissionDenied.__name__:
        field = meta.get(FIELD_KEY, "request")
        return PermissionDenied(field, details.removeprefix(f"{field}: "))
    elif code == grpc.StatusCode.UNAVAILABLE:
        if kind == NoOwner.__name__:
            return NoOwner(pool)
        if kind == StoreUnavailable.__name__:
            return StoreUnavailable(details)
    return PeerUnavailable(address, f"{code.name}: {details}" if code else details)


class GrpcPeers:
    """Implements ``ha.api.Peers`` with cached ``grpc.aio`` channels."""

    def __init__(
        self,
        *,
        credentials: grpc.ChannelCredentials | None = None,
        admin_token: str | None = None,
        observe: Callable[[str, float], None] | None = None,
        options: Sequence[tuple[str, object]] = (),
    ) -> None:
        """Creates the transport; channels open lazily, one per address.

        Args:
            credentials: TLS credentials for peer channels; None uses plaintext.
            admin_token: bearer token sent with forwarded admin calls.
            observe: called with (method, seconds) after every forwarded call, for the
                forward latency histogram.
            options: extra channel options, over ``server.channels.CHANNEL_OPTIONS``
                (bounded reconnect backoff).
        """
        self._credentials = credentials
        self._admin_token = admin_token
        self._observe = observe
        self._options = list(options)
        self._channels: dict[str, aio.Channel] = {}

    def _channel(self, address: str) -> aio.Channel:
        channel = self._channels.get(address)
        if channel is None:
            channel = open_channel(address, self._credentials, self._options)
            self._channels[address] = channel
        return channel

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

    def _metadata(self, *, admin: bool = False) -> tuple[tuple[str, str], ...]:
        if admin and self._admin_token:
            return (*FORWARDED_METADATA, ("authorization", f"Bearer {self._admin_token}"))
        return FORWARDED_METADATA

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
        request = pb.AcquireRequest(
            pool=pool,
            team=team,
            service_class=SERVICE_CLASS_PB[cls],
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
        return Decision(
            granted=r.granted,
            grant_id=r.grant_id,
            priority=r.priority,
            borrowing=r.borrowing,
            saturated=r.saturated,
            degraded=r.degraded,
            owner=NodeId(r.owner),
            epoch=Epoch(r.epoch),
        )

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
        return AdoptResult(r.adopted, r.phantoms_dropped, NodeId(r.owner), Epoch(r.epoch))

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
        return PoolView(
            PoolName(r.pool),
            r.capacity,
            NodeId(r.owner),
            Epoch(r.epoch),
            [team_stat(t) for t in r.teams],
        )

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
