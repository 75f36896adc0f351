"""The open ``AcquireStream`` calls of a server: how each is served, and how they end.

A gateway keeps one ``AcquireStream`` open to a replica and writes each of its lone
Acquires on it (``fairshare.client.streams``): a message on an open call costs both
processes less than a call of its own. ``AcquireStreams.serve`` reads a stream's requests,
decides each in a task of its own and writes each answer, tagged with the request's id,
when its decision ends.

Guarantees:
- A stream has at most ``in_flight`` requests being decided at once; the next message is
  read when one ends, so a client that writes faster waits (flow control), as its plain
  calls would wait their turn (``server.intake``).
- Answers are written one at a time, each whole. A decision that raises what no refusal
  stands for (a bug) is logged and answered ``UNKNOWN``, as a plain call would be.
- ``end`` (the server stops) makes every stream read no more: each answers what it is
  deciding and returns, its client sees it end; a stream opened afterwards ends at once.
- A client that goes away cancels the stream and the decisions it was waiting for, as a
  cancelled plain call is cancelled.

Not guaranteed: answers in the order of the requests.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Final, NoReturn

import grpc
from grpc import aio

from fairshare.wire.pb.fairshare.v1 import allocator_pb2 as pb
from server.intake import Malformed

logger = logging.getLogger(__name__)

UNEXPECTED: Final = pb.ItemError(
    code=grpc.StatusCode.UNKNOWN.value[0], message="the replica failed to decide the request"
)
"""The answer to a request whose decision raised what no refusal stands for."""

Decide = Callable[[pb.AcquireRequest], Awaitable[pb.AcquireOutcome]]
"""Decides one request of a stream: its answer, or its error in its place."""
Refuse = Callable[[Malformed], Awaitable[NoReturn]]
"""Ends the stream for a message that does not parse."""


class AcquireStreams:
    """See the module doc."""

    def __init__(self, in_flight: int) -> None:
        if in_flight < 1:
            raise ValueError("in_flight must be >= 1")
        self._in_flight = in_flight
        self._reading: set[asyncio.Task[Any]] = set()  # handlers waiting for a message
        self._ending = False

    def end(self) -> None:
        """Ends every open stream, and every stream opened from now on (see the module doc)."""
        self._ending = True
        for handler in list(self._reading):
            handler.cancel()

    async def serve(self, context: aio.ServicerContext, decide: Decide, refuse: Refuse) -> None:
        """Serves one stream until its client closes its side or ``end`` is called."""
        handler = asyncio.current_task()
        assert handler is not None
        room = asyncio.Semaphore(self._in_flight)
        writing = asyncio.Lock()
        deciding: set[asyncio.Task[None]] = set()

        async def answer(item: pb.AcquireRequest) -> None:
            try:
                try:
                    outcome = await decide(item)
                except Exception:  # a bug: answered as a plain call's would be (UNKNOWN)
                    logger.exception("deciding a request of an acquire stream failed")
                    outcome = pb.AcquireOutcome(error=UNEXPECTED)
                reply = pb.AcquireReply(request_id=item.request_id, outcome=outcome)
                async with writing:
                    await context.write(reply)
            except Exception as e:  # the stream is gone: nobody to answer
                logger.debug("an acquire stream's answer was not written: %r", e)
            finally:
                room.release()

        try:
            while True:
                await room.acquire()
                if self._ending:
                    break
                self._reading.add(handler)
                try:
                    item = await context.read()
                except asyncio.CancelledError:
                    if not self._ending:
                        raise
                    handler.uncancel()  # ``end``: this stream reads no more
                    break
                finally:
                    self._reading.discard(handler)
                if item is aio.EOF:
                    break
                if isinstance(item, Malformed):
                    await refuse(item)
                task = asyncio.create_task(answer(item))
                deciding.add(task)
                task.add_done_callback(deciding.discard)
            # The client closed its side, or the server stops: what was asked is answered.
            if deciding:
                await asyncio.gather(*deciding)
        finally:
            for task in deciding:
                task.cancel()
