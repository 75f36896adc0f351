"""How the client reaches a replica: its channels, its retries over replicas, its batches.

``Calls`` is the client's transport, one per ``AllocatorClient``; the client's other parts
call replicas through its ``call`` (typed ``Call``). A call goes to the pool's owner first
when its address is known (``route_to_owner``; the client tells it each address ListPools
names, ``learn_owner``), then to the targets in turn from the one that answered last,
retrying ``UNAVAILABLE`` and deadline expiries (``RETRYABLE``) within the caller's deadline;
one attempt takes at most a third of it, so a replica that hangs leaves time to try another.

Acquires and releases of one pool go through ``fairshare.client.batches`` (``acquire``,
``release``): while ``calls_in_flight`` calls of a kind are out for the pool, the ones that
arrive meanwhile leave together in one ``AcquireMany`` or ``ReleaseMany`` call, each item
answered as it would be alone (a refused item comes back as the failed call it stands for,
``fairshare.wire.errors.item_failure``). A lone call goes out at once as the plain call; a
lone Acquire from its caller's own task (``Batches``' ``inline``), as a message on the
``AcquireStream`` the client keeps open to that replica (``fairshare.client.streams``),
unless the owner may hold it (``wait_s``: a plain call, with a time of its own). A batched
method a replica lacks (an older version, ``UNIMPLEMENTED``) is set aside for
``UNBATCHED_FOR_S``: its items go as plain calls side by side. A replica that refuses the
stream (an older version, or no room for one more stream) gets plain Acquires for as long,
the refused one at once within its attempt's time; the other replicas keep their streams.

Every call carries the metadata ``Calls`` is made with: the client's holder session
(``fairshare.client.sessions``).

Non-guarantees: a call that is not retryable fails at once, with the server's status; the
caller maps it (``fairshare.wire.errors.to_allocator_error``).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import random
import time
from collections.abc import Sequence
from typing import Any, Final, Protocol, TypeVar

import grpc
from grpc import aio
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_delay,
    wait_random_exponential,
)

from fairshare.client.batches import Batches
from fairshare.client.streams import AcquireStreams, Unstreamed
from fairshare.limits import MAX_BATCH_ITEMS
from fairshare.wire.channels import open_channel
from fairshare.wire.errors import failed_call, item_failure
from fairshare.wire.metadata import Metadata
from fairshare.wire.pb.fairshare.v1 import allocator_pb2 as pb
from fairshare.wire.pb.fairshare.v1 import allocator_pb2_grpc as pb_grpc

logger = logging.getLogger(__name__)

T = TypeVar("T")

RETRYABLE: Final = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
"""The status codes a call is retried on (on the next target, within its deadline)."""


UNBATCHED_FOR_S: Final = 60.0
"""How long the client sends plain calls after a replica answered a batched one
``UNIMPLEMENTED`` (it runs a version without them), or refused a stream, before it tries
again."""


class Call(Protocol):
    """How the parts of a client call a replica: ``Calls.call``'s signature."""

    async def __call__(
        self, method: str, request: object, *, deadline_s: float, pool: str = ""
    ) -> T: ...


def retryable(error: BaseException) -> bool:
    """True for a failed call worth trying again elsewhere (see ``RETRYABLE``)."""
    return isinstance(error, aio.AioRpcError) and error.code() in RETRYABLE


class _SetAside:
    """What replicas refused lately (a method, a replica's stream), each set aside for
    ``UNBATCHED_FOR_S`` after its last refusal; the first refusal of a while is logged."""

    def __init__(self, message: str) -> None:
        """``message``: the log line, formatted with (what, why, the seconds)."""
        self._message = message
        self._until: dict[str, float] = {}  # bounded: one key per method or target

    def __contains__(self, what: str) -> bool:
        return time.monotonic() < self._until.get(what, -math.inf)

    def add(self, what: str, why: str) -> None:
        if what not in self:
            logger.info(self._message, what, why, UNBATCHED_FOR_S)
        self._until[what] = time.monotonic() + UNBATCHED_FOR_S


class Calls:
    """The client's calls to replicas (see the module doc)."""

    def __init__(
        self,
        targets: Sequence[str],
        *,
        holder: str,
        deadline_s: float,
        credentials: grpc.ChannelCredentials | None,
        metadata: Metadata,
        route_to_owner: bool,
        calls_in_flight: int,
    ) -> None:
        """Channels connect lazily; see ``AllocatorClient`` for the arguments (``metadata``
        goes with every call; batched calls get ``deadline_s``)."""
        self._holder = holder
        self._deadline_s = deadline_s
        self._targets = list(targets)
        self._credentials = credentials
        self._metadata = metadata
        self._channels: dict[str, aio.Channel] = {}
        self._stubs: dict[str, pb_grpc.AllocatorStub] = {}
        # Gateways start on different replicas so that one hung replica stalls few.
        self._preferred = random.randrange(len(self._targets))
        self._route_to_owner = route_to_owner
        self._owners: dict[str, str] = {}  # pool -> its owner's address, when known
        self._unbatched = _SetAside("a replica does not know %s (%s): plain calls for %gs")
        self._unstreamed = _SetAside("%s refused an AcquireStream (%s): plain Acquires for %gs")
        self._streams = AcquireStreams(metadata)
        self._closed = False
        # A lone Acquire goes from its caller's task (a cancelled caller's acquire is
        # settled by the client's backlog); a lone Release from a task of its own.
        self._acquires = Batches(
            self._acquire_many, in_flight=calls_in_flight, max_items=MAX_BATCH_ITEMS, inline=True
        )
        self._releases = Batches(
            self._release_many, in_flight=calls_in_flight, max_items=MAX_BATCH_ITEMS
        )

    async def close(self) -> None:
        """Cancels the calls that wait in a batch and closes the channels; a call made
        afterwards (a retry that was waiting) fails ``CANCELLED`` and opens none."""
        self._closed = True
        await self._acquires.close()
        await self._releases.close()
        await self._streams.close()
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()
        self._stubs.clear()

    def learn_owner(self, pool: str, address: str) -> None:
        """Notes the address of ``pool``'s owner ('': not known)."""
        if address:
            self._owners[pool] = address
        else:
            self._owners.pop(pool, None)

    async def acquire(self, request: pb.AcquireRequest) -> pb.AcquireResponse:
        """One Acquire, batched with others of its pool (no deadline of its own)."""
        return await self._acquires.submit(request.pool, request)

    async def release(self, pool: str, request: pb.ReleaseRequest) -> pb.ReleaseResponse:
        """One Release of ``pool``, batched with others of the pool."""
        return await self._releases.submit(pool, request)

    def _stub(self, target: str) -> pb_grpc.AllocatorStub:
        """The stub of ``target``'s channel, both made once (a stub builds a callable per
        method: made per call, it cost a gateway a few percent of its CPU)."""
        stub = self._stubs.get(target)
        if stub is None:
            if self._closed:
                raise failed_call(grpc.StatusCode.CANCELLED, "the client is closed")
            channel = self._channels.get(target)
            if channel is None:
                # Bounded reconnect backoff: a replica restarted on its address is reached
                # again within about a second (see fairshare.wire.channels).
                channel = open_channel(target, self._credentials)
                self._channels[target] = channel
            stub = self._stubs[target] = pb_grpc.AllocatorStub(channel)
        return stub

    async def call(
        self,
        method: str,
        request: object,
        *,
        deadline_s: float,
        pool: str = "",
        held_until: float | None = None,
    ) -> T:
        """Calls ``method`` on the pool's owner first (when known), then on the targets in
        turn, until one answers or the deadline passes.

        ``held_until`` (monotonic): the request is an Acquire its owner may hold until
        then; each attempt sends the wait left as its ``wait_s`` and may last that much
        longer than an attempt otherwise does. The retries still end ``deadline_s`` after
        the call started: one that was held past it and then failed is not retried here.

        Raises:
            aio.AioRpcError: the last error (retryable ones only after the deadline).
        """
        start = time.monotonic()
        attempt = itertools.count()
        owner = self._owners.get(pool) if self._route_to_owner and pool else None

        async def one() -> T:
            """One attempt: at the owner first, then the targets in turn."""
            number = next(attempt)
            held = 0.0
            if held_until is not None:
                held = max(held_until - time.monotonic(), 0.0)
                request.wait_s = held  # type: ignore[attr-defined]
            left = max(deadline_s - (time.monotonic() - start), 0.001)
            # One attempt may take a third of the deadline: a replica that hangs (paused,
            # partitioned) must leave time to try another one.
            if len(self._targets) > 1 or owner is not None:
                left = min(left, max(deadline_s / 3, 0.05))
            if owner is not None and number == 0:
                try:
                    return await self._attempt(owner, method, request, left, held)  # type: ignore[no-any-return]
                except aio.AioRpcError as e:
                    if e.code() in RETRYABLE and self._owners.get(pool) == owner:
                        del self._owners[pool]  # learnt again at the next epoch
                    raise
            index = self._preferred + number - (1 if owner is not None else 0)
            target = self._targets[index % len(self._targets)]
            response: T = await self._attempt(target, method, request, left, held)
            self._preferred = index % len(self._targets)
            return response

        # The first attempt outside the retrying machinery: almost every call ends there,
        # and the machinery cost a gateway a fifth of a millisecond per call.
        try:
            return await one()
        except Exception as e:
            if not retryable(e) or time.monotonic() - start >= deadline_s:
                raise
        # The pause the retrying machinery would have made after a first failure.
        await asyncio.sleep(random.uniform(0, deadline_s / 20))

        def log_retry(state: RetryCallState) -> None:
            logger.debug("%s: attempt %d failed; retrying", method, state.attempt_number + 1)

        async for trying in AsyncRetrying(
            stop=stop_after_delay(max(deadline_s - (time.monotonic() - start), 0.0)),
            wait=wait_random_exponential(multiplier=deadline_s / 20, max=deadline_s / 4),
            retry=retry_if_exception(retryable),
            before_sleep=log_retry,
            reraise=True,
        ):
            with trying:
                return await one()
        raise AssertionError("unreachable: tenacity reraises")  # pragma: no cover

    async def _attempt(
        self, target: str, method: str, request: object, left: float, held: float
    ) -> Any:
        """One attempt at ``target``, given ``left`` seconds, plus ``held`` for an Acquire
        its owner may hold."""
        if method == "Acquire" and not held and target not in self._unstreamed:
            sent = time.monotonic()
            try:
                return await self._streams.acquire(target, self._stub(target), request, left)  # type: ignore[arg-type]
            except Unstreamed as e:
                self._unstreamed.add(target, str(e))
                left = max(left - (time.monotonic() - sent), 0.001)  # the attempt's time
        return await getattr(self._stub(target), method)(
            request, timeout=left + held, metadata=self._metadata
        )

    # -- batched calls -------------------------------------------------------------------------

    async def _acquire_many(
        self, pool: str, requests: list[pb.AcquireRequest]
    ) -> list[pb.AcquireResponse | BaseException]:
        """Sends one list of ``pool``'s Acquires: one alone as Acquire, else as AcquireMany."""
        if len(requests) == 1:
            return await self._each("Acquire", requests, pool)
        batch = pb.AcquireManyRequest(holder=self._holder, requests=requests)
        answer = await self._batched("AcquireMany", batch, len(requests), pool)
        if answer is None:
            return await self._each("Acquire", requests, pool)
        return [
            item_failure(o.error) if o.HasField("error") else o.response for o in answer.outcomes
        ]

    async def _release_many(
        self, pool: str, releases: list[pb.ReleaseRequest]
    ) -> list[pb.ReleaseResponse | BaseException]:
        """Sends one list of ``pool``'s Releases: one alone as Release, else as ReleaseMany."""
        batch = pb.ReleaseManyRequest(holder=self._holder, releases=releases)
        answer = await self._batched("ReleaseMany", batch, len(releases), pool)
        if answer is None:
            return await self._each("Release", releases, pool)
        done = pb.ReleaseResponse()
        return [item_failure(o.error) if o.HasField("error") else done for o in answer.outcomes]

    async def _batched(self, method: str, batch: Any, items: int, pool: str) -> Any | None:
        """The answer to ``batch`` sent as ``method``; None when its items should go as
        plain calls instead: a lone item, or a replica without ``method`` (recently)."""
        if items == 1 or method in self._unbatched:
            return None
        try:
            return await self.call(method, batch, deadline_s=self._deadline_s, pool=pool)
        except aio.AioRpcError as e:
            if e.code() is not grpc.StatusCode.UNIMPLEMENTED:
                raise
        self._unbatched.add(method, "UNIMPLEMENTED: an older version")
        return None

    async def _each(self, method: str, requests: Sequence[object], pool: str) -> list[Any]:
        """``method`` called once per request, side by side; each result or error in its
        place."""
        if len(requests) == 1:  # most calls: awaited here, without a task of their own
            try:
                return [
                    await self.call(method, requests[0], deadline_s=self._deadline_s, pool=pool)
                ]
            except Exception as e:
                return [e]
        calls = [
            self.call(method, r, deadline_s=self._deadline_s, pool=pool)  # type: ignore[var-annotated]
            for r in requests
        ]
        return list(await asyncio.gather(*calls, return_exceptions=True))
