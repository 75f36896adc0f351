"""gRPC servicers over an ``ha.api.Allocator``: messages in, domain calls, messages out.

The servicers validate request fields (``INVALID_ARGUMENT`` naming the field), translate
messages to ``ha.api`` types and back, and map the allocator's exceptions to status codes
in one table, ``ERROR_CODES``. A mapped error also carries the trailing metadata
``fairshare-error`` (the exception's class name) and, for ``InvalidArgument`` (and its
``OutOfRange``), ``fairshare-field``; ``LimitExceeded`` adds ``fairshare-limit``;
``WrongEpoch`` adds ``fairshare-owner``, ``fairshare-owner-address`` and
``fairshare-epoch``. ``server.peers`` reads them to rebuild the same exceptions on the
forwarding replica, so an error crosses a forward unchanged.

A call from a forwarding peer carries the metadata ``fairshare-forwarded: 1``; it is
answered from this replica's own state (``forwarded=True``) and not counted again in
the decision metrics. An Acquire that names an epoch is answered from this replica's
own state too, whatever its metadata: it is decided at that epoch or refused.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Awaitable, Mapping, Sequence
from typing import Final, NoReturn, TypeVar

import grpc
from grpc import aio

from fairshare import Class
from fairshare.limits import (
    MAX_ADOPT_GRANTS,
    MAX_EST_TOKENS,
    MAX_GRANT_ID_BYTES,
    MAX_NAME_BYTES,
)
from ha.api import (
    ANY_EPOCH,
    AllocatorError,
    Epoch,
    GrantRef,
    HeldGrant,
    InvalidArgument,
    LimitExceeded,
    NoOwner,
    OutOfRange,
    PeerUnavailable,
    PermissionDenied,
    StoreUnavailable,
    UnknownNode,
    UnknownPool,
    WrongEpoch,
)
from ha.api import Allocator as AllocatorApi
from ha.settings import MAX_CAPACITY, DegradedMode, PoolConfig
from server.auth import AdminAuth, peer_identities
from server.convert import team_stat_pb
from server.metrics import Metrics, Outcome
from server.pb.fairshare.v1 import allocator_pb2 as pb
from server.pb.fairshare.v1 import allocator_pb2_grpc as pb_grpc

logger = logging.getLogger(__name__)

T = TypeVar("T")

FORWARDED_KEY: Final = "fairshare-forwarded"
ERROR_KEY: Final = "fairshare-error"
FIELD_KEY: Final = "fairshare-field"
OWNER_KEY: Final = "fairshare-owner"
OWNER_ADDRESS_KEY: Final = "fairshare-owner-address"
EPOCH_KEY: Final = "fairshare-epoch"
LIMIT_KEY: Final = "fairshare-limit"

ERROR_CODES: Final[Mapping[type[AllocatorError], grpc.StatusCode]] = {
    UnknownPool: grpc.StatusCode.NOT_FOUND,
    OutOfRange: grpc.StatusCode.OUT_OF_RANGE,
    InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    LimitExceeded: grpc.StatusCode.RESOURCE_EXHAUSTED,
    PermissionDenied: grpc.StatusCode.PERMISSION_DENIED,
    WrongEpoch: grpc.StatusCode.FAILED_PRECONDITION,
    UnknownNode: grpc.StatusCode.FAILED_PRECONDITION,
    NoOwner: grpc.StatusCode.UNAVAILABLE,
    StoreUnavailable: grpc.StatusCode.UNAVAILABLE,
    PeerUnavailable: grpc.StatusCode.UNAVAILABLE,
}
"""The one table from allocator errors to gRPC status codes."""

_DEGRADED_PB: Final = {
    DegradedMode.FAIL_OPEN: pb.FAIL_OPEN,
    DegradedMode.FAIL_CLOSED: pb.FAIL_CLOSED,
}


def status_code(error: AllocatorError) -> grpc.StatusCode:
    """The status code of an allocator error (its nearest class in ``ERROR_CODES``)."""
    for klass in type(error).__mro__:
        code = ERROR_CODES.get(klass)
        if code is not None:
            return code
    return grpc.StatusCode.INTERNAL


def error_metadata(error: AllocatorError) -> tuple[tuple[str, str], ...]:
    """The trailing metadata that lets a peer rebuild ``error`` (see module doc)."""
    metadata: list[tuple[str, str]] = [(ERROR_KEY, type(error).__name__)]
    if isinstance(error, InvalidArgument | PermissionDenied):
        metadata.append((FIELD_KEY, error.field))
    if isinstance(error, LimitExceeded):
        metadata.append((LIMIT_KEY, error.limit))
    if isinstance(error, WrongEpoch):
        metadata += [
            (OWNER_KEY, str(error.owner)),
            (OWNER_ADDRESS_KEY, error.address),
            (EPOCH_KEY, str(int(error.epoch))),
        ]
    return tuple(metadata)


async def _abort(context: aio.ServicerContext, error: AllocatorError) -> NoReturn:
    await context.abort(status_code(error), str(error), trailing_metadata=error_metadata(error))
    raise AssertionError("unreachable: abort raises")  # pragma: no cover


async def _guard(context: aio.ServicerContext, call: Awaitable[T]) -> T:
    """Awaits an allocator call, aborting the RPC with the mapped status on its errors."""
    try:
        return await call
    except AllocatorError as e:
        await _abort(context, e)


def _forwarded(context: aio.ServicerContext) -> bool:
    return any(
        key == FORWARDED_KEY and value == "1" for key, value in context.invocation_metadata() or ()
    )


def _check_name(
    field: str, value: str, *, empty: bool = False, limit: int = MAX_NAME_BYTES
) -> None:
    """Refuses an empty (unless allowed) or too long string field, before it is stored.

    The length is counted in UTF-8 bytes; a str has at least one byte per character, so
    a string with more characters than the limit is refused without encoding it.
    """
    if not value:
        if not empty:
            raise InvalidArgument(field, "must not be empty")
        return
    if len(value) > limit or len(value.encode("utf-8", "surrogatepass")) > limit:
        raise InvalidArgument(field, f"longer than {limit} bytes")


def _check_pool(pool: str) -> None:
    _check_name("pool", pool)


def _check_team(field: str, team: str) -> None:
    _check_name(field, team)


def _check_tokens(field: str, est_tokens: int) -> None:
    if est_tokens < 0:
        raise InvalidArgument(field, f"must be >= 0, got {est_tokens}")
    if est_tokens > MAX_EST_TOKENS:
        raise OutOfRange(field, f"must be <= {MAX_EST_TOKENS}, got {est_tokens}")


def _check_grant_id(field: str, grant_id: str) -> None:
    _check_name(field, grant_id, limit=MAX_GRANT_ID_BYTES)


def _service_class(value: int) -> Class:
    try:
        return Class(value)
    except ValueError:
        raise InvalidArgument("service_class", f"unknown service class {value}") from None


def _bound_to(holder: str, identities: Sequence[str]) -> bool:
    """True when a client certificate with ``identities`` may act as ``holder``: the
    holder is one of them, or starts with one followed by ``/``."""
    return bool(holder) and any(
        holder == name or holder.startswith(name + "/") for name in identities
    )


def _check_holder(field: str, holder: str, identities: Sequence[str] | None) -> None:
    if identities is not None and not _bound_to(holder, identities):
        names = ", ".join(identities) or "none"
        raise PermissionDenied(
            field, f"holder {holder[:64]!r} is not bound to the client identity ({names})"
        )


class AllocatorServicer(pb_grpc.AllocatorServicer):  # type: ignore[misc]
    """The ``fairshare.v1.Allocator`` service over an allocator.

    With ``peer_identities`` (mutual TLS), holders are bound to client certificates: a
    caller that is not a replica may acquire, release and re-report only as a holder named
    by its certificate (``_bound_to``), and its ``fairshare-forwarded`` mark is ignored.
    """

    def __init__(
        self,
        allocator: AllocatorApi,
        *,
        pools: Sequence[PoolConfig] = (),
        metrics: Metrics | None = None,
        peer_identities: Sequence[str] = (),
    ) -> None:
        """Creates the servicer.

        Args:
            allocator: the replica's allocator (``ha.node.Node`` or a test double).
            pools: the configured pools; ListPools reports their degraded modes.
            metrics: where decisions are counted; None counts nothing.
            peer_identities: client-certificate CNs/SANs of the replicas; empty: holders
                are not bound to identities.
        """
        self._allocator = allocator
        self._modes = {p.name: p.degraded_mode for p in pools}
        self._metrics = metrics
        self._peers = frozenset(peer_identities)

    def _caller(self, context: aio.ServicerContext) -> tuple[bool, list[str] | None]:
        """(forwarded, the identities a holder must be bound to; None: not checked)."""
        if not self._peers:
            return _forwarded(context), None
        identities = peer_identities(context)
        if self._peers.intersection(identities):
            return _forwarded(context), None  # a replica forwarding or re-reporting
        return False, identities

    async def _fail(self, context: aio.ServicerContext, error: AllocatorError) -> NoReturn:
        """Aborts with the mapped status, counting a limit met in the metrics."""
        if isinstance(error, LimitExceeded) and self._metrics is not None:
            self._metrics.count_limited(error.limit)
        await _abort(context, error)

    async def Acquire(  # noqa: N802 (gRPC method name)
        self, request: pb.AcquireRequest, context: aio.ServicerContext
    ) -> pb.AcquireResponse:
        """Decides one request (see the proto for the fields)."""
        started = time.perf_counter()
        forwarded, identities = self._caller(context)
        try:
            _check_name("holder", request.holder, empty=True)
            _check_holder("holder", request.holder, identities)
            _check_pool(request.pool)
            _check_team("team", request.team)
            _check_name("request_id", request.request_id, empty=True)
            klass = _service_class(request.service_class)
            _check_tokens("est_tokens", request.est_tokens)
            decision = await self._allocator.acquire(
                pool=request.pool,
                team=request.team,
                cls=klass,
                est_tokens=request.est_tokens,
                holder=request.holder,
                request_id=request.request_id,
                try_only=request.try_only,
                epoch=Epoch(request.epoch),
                # An Acquire naming an epoch must be decided at it, whoever sends it.
                forwarded=forwarded or request.epoch != ANY_EPOCH,
            )
        except AllocatorError as e:
            if isinstance(e, NoOwner) and self._metrics is not None and not forwarded:
                self._metrics.count(request.pool, request.team, Outcome.REFUSED, None)
            await self._fail(context, e)
        if self._metrics is not None and not forwarded:
            elapsed = time.perf_counter() - started
            self._metrics.count(request.pool, request.team, Outcome.of(decision), elapsed)
        return pb.AcquireResponse(
            granted=decision.granted,
            grant_id=decision.grant_id,
            priority=decision.priority,
            borrowing=decision.borrowing,
            saturated=decision.saturated,
            degraded=decision.degraded,
            owner=decision.owner,
            epoch=decision.epoch,
        )

    async def Release(  # noqa: N802 (gRPC method name)
        self, request: pb.ReleaseRequest, context: aio.ServicerContext
    ) -> pb.ReleaseResponse:
        """Ends a grant; non-finite or negative consumption counts as 0 (not an error)."""
        consumed = request.consumed if math.isfinite(request.consumed) else 0.0
        forwarded, identities = self._caller(context)
        try:
            _check_grant_id("grant_id", request.grant_id)
            if identities is not None:
                holder = GrantRef.decode(request.grant_id).holder
                _check_holder("grant_id", holder, identities)
            await self._allocator.release(request.grant_id, consumed, forwarded=forwarded)
        except AllocatorError as e:
            await self._fail(context, e)
        return pb.ReleaseResponse()

    async def Adopt(  # noqa: N802 (gRPC method name)
        self, request: pb.AdoptRequest, context: aio.ServicerContext
    ) -> pb.AdoptResponse:
        """Re-reports a holder's live grants to the pool's current owner."""
        forwarded, identities = self._caller(context)
        try:
            _check_name("holder", request.holder, empty=True)
            _check_holder("holder", request.holder, identities)
            _check_pool(request.pool)
            if len(request.grants) > MAX_ADOPT_GRANTS:
                raise LimitExceeded(
                    "max_adopt_grants",
                    f"{len(request.grants)} grants in one Adopt, at most {MAX_ADOPT_GRANTS}",
                )
            grants: list[HeldGrant] = []
            for i, held in enumerate(request.grants):
                _check_grant_id(f"grants[{i}].grant_id", held.grant_id)
                if identities is not None:
                    holder = GrantRef.decode(held.grant_id).holder
                    _check_holder(f"grants[{i}].grant_id", holder, identities)
                _check_team(f"grants[{i}].team", held.team)
                _check_tokens(f"grants[{i}].est_tokens", held.est_tokens)
                grants.append(
                    HeldGrant(
                        grant_id=held.grant_id,
                        team=held.team,
                        priority=held.priority,
                        borrowing=held.borrowing,
                        est_tokens=held.est_tokens,
                    )
                )
            result = await self._allocator.adopt(
                pool=request.pool,
                epoch=Epoch(request.epoch),
                holder=request.holder,
                grants=grants,
                complete=request.complete,
                forwarded=forwarded,
            )
        except AllocatorError as e:
            await self._fail(context, e)
        return pb.AdoptResponse(
            adopted=result.adopted,
            phantoms_dropped=result.phantoms_dropped,
            owner=result.owner,
            epoch=result.epoch,
        )

    async def Snapshot(  # noqa: N802 (gRPC method name)
        self, request: pb.SnapshotRequest, context: aio.ServicerContext
    ) -> pb.SnapshotResponse:
        """The pool's team table with its owner and epoch."""
        try:
            _check_pool(request.pool)
            view = await self._allocator.snapshot(request.pool, forwarded=_forwarded(context))
        except AllocatorError as e:
            await _abort(context, e)
        return pb.SnapshotResponse(
            pool=view.pool,
            capacity=view.capacity,
            owner=view.owner,
            epoch=view.epoch,
            teams=[team_stat_pb(stat) for stat in view.teams],
        )

    async def ListPools(  # noqa: N802 (gRPC method name)
        self, request: pb.ListPoolsRequest, context: aio.ServicerContext
    ) -> pb.ListPoolsResponse:
        """Every configured pool with its owner and degraded mode."""
        infos = await _guard(context, self._allocator.list_pools())
        return pb.ListPoolsResponse(
            pools=[
                pb.PoolInfo(
                    pool=info.pool,
                    capacity=info.capacity,
                    owner=info.owner,
                    owner_address=info.owner_address,
                    epoch=info.epoch,
                    degraded_mode=_DEGRADED_PB[self._modes.get(info.pool, DegradedMode.FAIL_OPEN)],
                )
                for info in infos
            ]
        )


class AdminServicer(pb_grpc.AdminServicer):  # type: ignore[misc]
    """The ``fairshare.v1.Admin`` service; every call is authorised by ``AdminAuth``."""

    def __init__(self, allocator: AllocatorApi, *, auth: AdminAuth) -> None:
        """Creates the servicer.

        Args:
            allocator: the replica's allocator.
            auth: decides who may call (bearer token or mTLS identity).
        """
        self._allocator = allocator
        self._auth = auth

    async def SetCapacity(  # noqa: N802 (gRPC method name)
        self, request: pb.SetCapacityRequest, context: aio.ServicerContext
    ) -> pb.SetCapacityResponse:
        """Changes a pool's capacity; answers the previous one."""
        await self._auth.check(context)
        try:
            _check_pool(request.pool)
            if request.capacity < 0:
                raise InvalidArgument("capacity", f"must be >= 0, got {request.capacity}")
            if request.capacity > MAX_CAPACITY:
                raise OutOfRange("capacity", f"must be <= {MAX_CAPACITY}, got {request.capacity}")
            previous = await self._allocator.set_capacity(
                request.pool, request.capacity, forwarded=_forwarded(context)
            )
        except AllocatorError as e:
            await _abort(context, e)
        return pb.SetCapacityResponse(previous=previous)

    async def Switchover(  # noqa: N802 (gRPC method name)
        self, request: pb.SwitchoverRequest, context: aio.ServicerContext
    ) -> pb.SwitchoverResponse:
        """Moves a pool to the named replica."""
        await self._auth.check(context)
        try:
            _check_pool(request.pool)
            _check_name("node", request.node)
            await self._allocator.switchover(
                request.pool, request.node, forwarded=_forwarded(context)
            )
        except AllocatorError as e:
            await _abort(context, e)
        logger.info("pool %s: switchover to %s requested", request.pool, request.node)
        return pb.SwitchoverResponse()
