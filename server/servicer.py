"""gRPC servicers over an ``ha.api.Allocator``: messages in, domain calls, messages out.

The servicers validate request fields (``INVALID_ARGUMENT`` naming the field), translate
messages to the core's types and back with ``fairshare.wire.convert``, and answer the allocator's
exceptions with ``fairshare.wire.errors.abort``: the status code of the one table
(``fairshare.wire.errors.TABLE``) and the trailing metadata that lets ``server.peers`` and the
client library rebuild the same exception, so an error crosses a forward unchanged.

A call from a forwarding peer carries the metadata ``fairshare-forwarded: 1``; it is
answered from this replica's own state (``forwarded=True``) and not counted again in
the decision metrics. An Acquire that names an epoch is answered from this replica's
own state too, whatever its metadata: it is decided at that epoch or refused.

Acquire, AcquireMany, AcquireStream, Adopt and KeepAlive read the caller's holder
session from the metadata ``fairshare-session`` (``fairshare.sessions``; KeepAlive
requires it), once per call (a stream's for every request on it), and pass it to the
allocator: a malformed one is ``INVALID_ARGUMENT`` naming ``fairshare-session``. The other
calls ignore it. Its secret is never logged.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Final, NoReturn, TypeVar

from grpc import aio

from fairshare.errors import (
    AllocatorError,
    InvalidArgument,
    LimitExceeded,
    NoOwner,
    OutOfRange,
    PermissionDenied,
)
from fairshare.ids import ANY_EPOCH, Epoch, GrantRef
from fairshare.limits import (
    MAX_ADOPT_GRANTS,
    MAX_BATCH_ITEMS,
    MAX_EST_TOKENS,
    MAX_GRANT_ID_BYTES,
    MAX_NAME_BYTES,
    MAX_WAIT_S,
)
from fairshare.modes import DegradedMode
from fairshare.records import HeldGrant
from fairshare.sessions import Session
from fairshare.wire.convert import (
    adopt_result_pb,
    decision_pb,
    held_grant,
    keep_alive_result_pb,
    pool_info_pb,
    pool_view_pb,
    required_epoch,
    service_class,
)
from fairshare.wire.errors import abort, item_error
from fairshare.wire.metadata import SESSION_KEY, is_forwarded, read_call
from fairshare.wire.pb.fairshare.v1 import allocator_pb2 as pb
from fairshare.wire.pb.fairshare.v1 import allocator_pb2_grpc as pb_grpc
from ha import MAX_CAPACITY, PoolConfig
from ha import Allocator as AllocatorApi
from server.acquire_streams import AcquireStreams
from server.auth import AdminAuth, peer_identities
from server.intake import ACQUIRE_STREAM, DEFAULT_MAX_CALLS, Malformed
from server.metrics import Metrics, Outcome

logger = logging.getLogger(__name__)

T = TypeVar("T")

RefuseMalformed = Callable[[str, Malformed, aio.ServicerContext], Awaitable[NoReturn]]
"""Ends a call that sent a malformed message: (method, what was wrong, the call)."""
STREAM_IN_FLIGHT: Final = DEFAULT_MAX_CALLS
"""Requests of one ``AcquireStream`` decided at once, as many as one client's plain calls run
(``server.intake``); the next is read when one ends."""


async def _guard(context: aio.ServicerContext, call: Awaitable[T]) -> T:
    """Awaits an allocator call, aborting the RPC with the mapped status on its errors."""
    try:
        return await call
    except AllocatorError as e:
        await abort(context, e)


def _forwarded(context: aio.ServicerContext) -> bool:
    return is_forwarded(context.invocation_metadata())


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


def _check_wait(field: str, wait_s: float, *, try_only: bool) -> None:
    if not math.isfinite(wait_s) or wait_s < 0:
        raise InvalidArgument(field, f"must be a finite number >= 0, got {wait_s}")
    if wait_s > MAX_WAIT_S:
        raise OutOfRange(field, f"must be <= {MAX_WAIT_S:g}, got {wait_s:g}")
    if wait_s and try_only:
        raise InvalidArgument(field, "a try_only request is answered at once: give no wait")


def _check_grant_id(field: str, grant_id: str) -> None:
    _check_name(field, grant_id, limit=MAX_GRANT_ID_BYTES)


def _check_batch(field: str, items: int) -> None:
    if items > MAX_BATCH_ITEMS:
        raise LimitExceeded(
            "max_batch_items", f"{items} {field} in one call, at most {MAX_BATCH_ITEMS}"
        )


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
    Sessions come on top: the owner binds each session to the holder it was opened for.
    """

    def __init__(
        self,
        allocator: AllocatorApi,
        *,
        pools: Sequence[PoolConfig] = (),
        metrics: Metrics | None = None,
        peer_identities: Sequence[str] = (),
        refuse_malformed: RefuseMalformed | None = None,
    ) -> None:
        """Creates the servicer.

        Args:
            allocator: the replica's allocator (``ha.node.Node`` or a test double).
            pools: the configured pools; ListPools reports their degraded modes.
            metrics: where decisions are counted; None counts nothing.
            peer_identities: client-certificate CNs/SANs of the replicas; empty: holders
                are not bound to identities.
            refuse_malformed: ends a stream that sent a message that does not parse
                (``server.intake.Intake.refuse_malformed``, which counts and logs it);
                None ends it without either.
        """
        self._allocator = allocator
        self._refuse_malformed = refuse_malformed
        self._streams = AcquireStreams(STREAM_IN_FLIGHT)
        self._modes = {p.name: p.degraded_mode for p in pools}
        self._metrics = metrics
        self._peers = frozenset(peer_identities)

    def _caller(
        self, context: aio.ServicerContext, *, session: bool = False
    ) -> tuple[bool, list[str] | None, Session | None]:
        """What the call's metadata says, read once: (forwarded, the identities a holder
        must be bound to (None: not checked), the caller's session when ``session`` is
        asked for (None: it presents none, or it was not asked for)).

        Raises:
            InvalidArgument: the session is asked for and malformed.
        """
        forwarded, text = read_call(context.invocation_metadata())
        presented = Session.parse(text) if session and text is not None else None
        if not self._peers:
            return forwarded, None, presented
        identities = peer_identities(context)
        if self._peers.intersection(identities):
            return forwarded, None, presented  # a replica forwarding or re-reporting
        return False, identities, presented

    def _limited(self, error: AllocatorError) -> None:
        """Counts a limit met in the metrics."""
        if isinstance(error, LimitExceeded) and self._metrics is not None:
            self._metrics.count_limited(error.limit)

    async def _fail(self, context: aio.ServicerContext, error: AllocatorError) -> NoReturn:
        """Aborts with the mapped status, counting a limit met in the metrics."""
        self._limited(error)
        await abort(context, error)

    async def Acquire(  # noqa: N802 (gRPC method name)
        self, request: pb.AcquireRequest, context: aio.ServicerContext
    ) -> pb.AcquireResponse:
        """Decides one request (see the proto for the fields)."""
        try:
            forwarded, identities, session = self._caller(context, session=True)
            return await self._acquire(request, forwarded, identities, session)
        except AllocatorError as e:
            await self._fail(context, e)

    async def AcquireMany(  # noqa: N802 (gRPC method name)
        self, request: pb.AcquireManyRequest, context: aio.ServicerContext
    ) -> pb.AcquireManyResponse:
        """Decides each request as ``Acquire`` would, all at once; a request refused is
        answered with its error in its place, the others are decided all the same.

        Refused as a whole (INVALID_ARGUMENT, RESOURCE_EXHAUSTED) only when the batch
        itself is bad: more than ``MAX_BATCH_ITEMS`` requests, or a holder the caller may
        not act as, or a malformed session.
        """
        try:
            forwarded, identities, session = self._caller(context, session=True)
            _check_batch("requests", len(request.requests))
            _check_name("holder", request.holder, empty=True)
            _check_holder("holder", request.holder, identities)
        except AllocatorError as e:
            await self._fail(context, e)

        async def one(item: pb.AcquireRequest) -> pb.AcquireOutcome:
            if item.holder != request.holder:
                return self._refused(InvalidArgument("holder", "differs from the batch's holder"))
            return await self._outcome(item, forwarded, identities, session)

        outcomes = await asyncio.gather(*(one(item) for item in request.requests))
        return pb.AcquireManyResponse(outcomes=outcomes)

    async def AcquireStream(  # noqa: N802 (gRPC method name)
        self, requests: AsyncIterator[pb.AcquireRequest], context: aio.ServicerContext
    ) -> None:
        """Decides each request read from the stream as ``Acquire`` would, and writes its
        answer, tagged with its ``request_id`` (required), when its decision ends
        (``server.acquire_streams``).

        The call fails as a whole (INVALID_ARGUMENT) only for a malformed session or a
        malformed message; a request refused is answered with its error in its place.
        """
        try:
            caller = self._caller(context, session=True)
        except AllocatorError as e:
            await self._fail(context, e)

        async def decide(item: pb.AcquireRequest) -> pb.AcquireOutcome:
            if not item.request_id:
                return self._refused(InvalidArgument("request_id", "is required on a stream"))
            return await self._outcome(item, *caller)

        async def refuse(item: Malformed) -> NoReturn:
            if self._refuse_malformed is not None:
                await self._refuse_malformed(ACQUIRE_STREAM, item, context)
            await abort(context, InvalidArgument("request", "malformed message"))

        await self._streams.serve(context, decide, refuse)

    def end_streams(self) -> None:
        """Ends every open ``AcquireStream`` (the server is stopping): see
        ``server.acquire_streams.AcquireStreams.end``."""
        self._streams.end()

    async def _outcome(
        self,
        request: pb.AcquireRequest,
        forwarded: bool,
        identities: list[str] | None,
        session: Session | None,
    ) -> pb.AcquireOutcome:
        """One request of a batch or a stream decided: its answer, or its error in its place."""
        try:
            response = await self._acquire(request, forwarded, identities, session)
        except AllocatorError as e:
            return self._refused(e)
        return pb.AcquireOutcome(response=response)

    def _refused(self, error: AllocatorError) -> pb.AcquireOutcome:
        self._limited(error)
        return pb.AcquireOutcome(error=item_error(error))

    async def _acquire(
        self,
        request: pb.AcquireRequest,
        forwarded: bool,
        identities: list[str] | None,
        session: Session | None,
    ) -> pb.AcquireResponse:
        """Checks and decides one Acquire in ``session``, counting it in the metrics.

        Raises:
            AllocatorError: the request is refused (its field, its pool, no owner...).
        """
        started = time.perf_counter()
        try:
            _check_name("holder", request.holder, empty=True)
            _check_holder("holder", request.holder, identities)
            _check_pool(request.pool)
            _check_team("team", request.team)
            _check_name("request_id", request.request_id, empty=True)
            cls = service_class(request.service_class)
            _check_tokens("est_tokens", request.est_tokens)
            _check_wait("wait_s", request.wait_s, try_only=request.try_only)
            required = required_epoch(request)
            decision = await self._allocator.acquire(
                pool=request.pool,
                team=request.team,
                cls=cls,
                est_tokens=request.est_tokens,
                holder=request.holder,
                request_id=request.request_id,
                try_only=request.try_only,
                wait_s=request.wait_s,
                epoch=ANY_EPOCH if required is None else required,
                # An Acquire naming an epoch must be decided at it, whoever sends it.
                forwarded=forwarded or required is not None,
                session=session,
            )
        except NoOwner:
            if self._metrics is not None and not forwarded:
                self._metrics.count(request.pool, request.team, Outcome.REFUSED, None)
            raise
        if self._metrics is not None and not forwarded:
            elapsed = time.perf_counter() - started
            given = decision.priority if decision.granted else None
            # Counted at the loop's next turn: the answer does not wait for the metrics.
            outcome = Outcome.of(decision)
            count = self._metrics.count
            asyncio.get_running_loop().call_soon(
                count, request.pool, request.team, outcome, elapsed, given
            )
        return decision_pb(decision)

    async def Release(  # noqa: N802 (gRPC method name)
        self, request: pb.ReleaseRequest, context: aio.ServicerContext
    ) -> pb.ReleaseResponse:
        """Ends a grant; non-finite or negative consumption counts as 0 (not an error)."""
        forwarded, identities, _ = self._caller(context)
        try:
            await self._release(request, forwarded, identities)
        except AllocatorError as e:
            await self._fail(context, e)
        return pb.ReleaseResponse()

    async def ReleaseMany(  # noqa: N802 (gRPC method name)
        self, request: pb.ReleaseManyRequest, context: aio.ServicerContext
    ) -> pb.ReleaseManyResponse:
        """Ends each grant as ``Release`` would, all at once; a release refused is
        answered with its error in its place. Refused as a whole only for more than
        ``MAX_BATCH_ITEMS`` releases."""
        forwarded, identities, _ = self._caller(context)
        try:
            _check_batch("releases", len(request.releases))
            _check_name("holder", request.holder, empty=True)
        except AllocatorError as e:
            await self._fail(context, e)

        async def one(item: pb.ReleaseRequest) -> pb.ReleaseOutcome:
            try:
                await self._release(item, forwarded, identities)
            except AllocatorError as e:
                self._limited(e)
                return pb.ReleaseOutcome(error=item_error(e))
            return pb.ReleaseOutcome()

        outcomes = await asyncio.gather(*(one(item) for item in request.releases))
        return pb.ReleaseManyResponse(outcomes=outcomes)

    async def _release(
        self, request: pb.ReleaseRequest, forwarded: bool, identities: list[str] | None
    ) -> None:
        """Checks and ends one grant.

        Raises:
            AllocatorError: the release is refused (a bad id, its pool unknown...).
        """
        consumed = request.consumed if math.isfinite(request.consumed) else 0.0
        _check_grant_id("grant_id", request.grant_id)
        if identities is not None:
            holder = GrantRef.decode(request.grant_id).holder
            _check_holder("grant_id", holder, identities)
        await self._allocator.release(request.grant_id, consumed, forwarded=forwarded)

    async def Adopt(  # noqa: N802 (gRPC method name)
        self, request: pb.AdoptRequest, context: aio.ServicerContext
    ) -> pb.AdoptResponse:
        """Re-reports a holder's live grants to the pool's current owner, in the caller's
        session (a complete inventory closes only that session's phantoms)."""
        try:
            forwarded, identities, session = self._caller(context, session=True)
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
                grants.append(held_grant(held))
            result = await self._allocator.adopt(
                pool=request.pool,
                epoch=Epoch(request.epoch),
                holder=request.holder,
                grants=grants,
                complete=request.complete,
                forwarded=forwarded,
                session=session,
            )
        except AllocatorError as e:
            await self._fail(context, e)
        return adopt_result_pb(result)

    async def KeepAlive(  # noqa: N802 (gRPC method name)
        self, request: pb.KeepAliveRequest, context: aio.ServicerContext
    ) -> pb.KeepAliveResponse:
        """Renews the caller's session with the owner of each pool named.

        Refused as a whole: without a session (``INVALID_ARGUMENT``, field
        ``fairshare-session``), with more than ``MAX_BATCH_ITEMS`` pools
        (``RESOURCE_EXHAUSTED``), a bad or unknown pool name (``INVALID_ARGUMENT``,
        ``NOT_FOUND``), or another secret for a session an owner knows
        (``PERMISSION_DENIED``).
        """
        try:
            forwarded, _, session = self._caller(context, session=True)
            if session is None:
                raise InvalidArgument(SESSION_KEY, "KeepAlive needs the caller's session")
            _check_batch("pools", len(request.pools))
            for i, pool in enumerate(request.pools):
                _check_name(f"pools[{i}]", pool)
            result = await self._allocator.keep_alive(
                list(request.pools), session, forwarded=forwarded
            )
        except AllocatorError as e:
            await self._fail(context, e)
        return keep_alive_result_pb(result)

    async def Snapshot(  # noqa: N802 (gRPC method name)
        self, request: pb.SnapshotRequest, context: aio.ServicerContext
    ) -> pb.SnapshotResponse:
        """The pool's team table with its owner and epoch."""
        try:
            _check_pool(request.pool)
            view = await self._allocator.snapshot(request.pool, forwarded=_forwarded(context))
        except AllocatorError as e:
            await abort(context, e)
        return pool_view_pb(view)

    async def ListPools(  # noqa: N802 (gRPC method name)
        self, request: pb.ListPoolsRequest, context: aio.ServicerContext
    ) -> pb.ListPoolsResponse:
        """Every configured pool with its owner and degraded mode."""
        infos = await _guard(context, self._allocator.list_pools())
        return pb.ListPoolsResponse(
            pools=[
                pool_info_pb(info, self._modes.get(info.pool, DegradedMode.FAIL_OPEN))
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
            await abort(context, e)
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
            await abort(context, e)
        logger.info("pool %s: switchover to %s requested", request.pool, request.node)
        return pb.SwitchoverResponse()
