"""Acquires over one long-lived call per replica (``AcquireStream``).

A unary call costs both processes its own setup (a call object, its metadata, the
server's task for it); one request at a time that is most of a decision's round trip
beside the decision itself. ``AcquireStreams`` keeps one ``AcquireStream`` call open to
each replica it has sent to and writes each Acquire on it; the replica answers each one,
tagged with its ``request_id``, as the plain call would have been answered.

Guarantees:
- ``acquire`` answers what the plain ``Acquire`` call to that replica would answer: the
  response, or a refusal raised as the failed call it stands for
  (``fairshare.wire.errors.item_failure``), so callers retry and map it as they do a
  plain call's.
- A stream that ends or fails fails every Acquire waiting on it: with its status when
  that says why (``_KEPT``: the caller's own fault, or already ``UNAVAILABLE``), else
  ``UNAVAILABLE``, which the caller retries; the next Acquire opens a new stream.
- A stream takes new Acquires for ``RENEW_AFTER_S``; then the next one opens a new stream,
  and the old one is closed once the Acquires it was sent are answered (or given up).
- ``close`` cancels the Acquires still waiting, as closing a channel cancels its calls;
  an Acquire after it fails ``CANCELLED``.
- An Acquire not answered within its ``timeout_s`` fails ``DEADLINE_EXCEEDED`` and is
  forgotten; its answer, if it comes later, is dropped. The stream stays open.
- A stream the replica refuses (an older version without the method, or no room for one
  more stream) fails its Acquires ``Unstreamed``, undecided: ``fairshare.client.calls``
  then sends them, and the next ones for a while, as plain calls.

Not guaranteed: the order of answers (a borrower's answer does not wait for a durable
write, a within-share one does).
"""

from __future__ import annotations

import asyncio
import time
from typing import Final

import grpc
from grpc import aio

from fairshare.wire.errors import failed_call, item_failure
from fairshare.wire.metadata import Metadata
from fairshare.wire.pb.fairshare.v1 import allocator_pb2 as pb
from fairshare.wire.pb.fairshare.v1 import allocator_pb2_grpc as pb_grpc

ENDED: Final = "the replica ended the acquire stream"
RENEW_AFTER_S: Final = 5.0
"""Age after which a stream takes no new Acquires: the next opens a new one and the old
one ends once it has answered. A replica's connection age limit (``grpc`` in its config)
sends a GOAWAY and then, after a grace of 10 s by default, closes the connection under the
calls still on it: a stream renewed well within the grace moves to the new connection
(and is balanced again) without an Acquire cut under it."""


class Unstreamed(Exception):
    """The replica refused the stream itself: it has no such method (an older version,
    ``UNIMPLEMENTED``) or no room for one more stream (``RESOURCE_EXHAUSTED``, its limit
    on open streams). The Acquire was not decided: send it as a plain call."""


_REFUSED: Final = frozenset({grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.RESOURCE_EXHAUSTED})
"""Statuses of a whole stream that say it was refused (``Unstreamed``): requests refused
one by one come back as their own errors, never as the stream's status."""
_KEPT: Final = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNAUTHENTICATED,
    }
)
"""Statuses of a stream's failure that say why its Acquires failed; any other (the call
ended under them: the replica stopped, the connection broke, the core failed a write on a
call already over) stands for a stream the replica ended: ``UNAVAILABLE``, retried."""


def _stream_failure(error: BaseException, *, answered: bool = True) -> Exception:
    """What the Acquires waiting on a stream that failed with ``error`` fail with: the
    refusal of the whole stream ``Unstreamed``, a status of ``_KEPT`` itself, anything
    else ``UNAVAILABLE`` (its details name what it was).

    A stream that never ``answered`` and failed ``INTERNAL`` counts as refused too: when a
    write meets a call the replica has already refused, grpc.aio may replace the refusal's
    status with its own ``INTERNAL``; retried as ``UNAVAILABLE``, such a stream would be
    opened and refused again until the deadline, where plain calls go through."""
    failure: Exception
    if not isinstance(error, aio.AioRpcError):
        failure = failed_call(grpc.StatusCode.UNAVAILABLE, f"{ENDED} ({error!r})")
    elif error.code() in _REFUSED or (not answered and error.code() == grpc.StatusCode.INTERNAL):
        failure = Unstreamed(f"{error.code().name}: {error.details()}")
    elif error.code() in _KEPT:
        failure = error
    else:
        why = f"{error.code().name}: {error.details()}"
        failure = failed_call(grpc.StatusCode.UNAVAILABLE, f"{ENDED} ({why})")
    return failure


class _Stream:
    """One open ``AcquireStream`` call and the Acquires that wait on it."""

    def __init__(self, call: aio.StreamStreamCall) -> None:
        self.call = call
        self.waiting: dict[str, asyncio.Future[pb.AcquireOutcome]] = {}
        self.writing = asyncio.Lock()
        self.sending: set[asyncio.Task[None]] = set()  # writes under way
        self.reader = asyncio.get_running_loop().create_task(self._read())
        self.ended = False
        self.answered = False  # a reply was read: the replica took the stream
        self.retired = False  # renewed: takes no new Acquires
        self.opened = time.monotonic()

    async def _read(self) -> None:
        error: Exception = failed_call(grpc.StatusCode.UNAVAILABLE, ENDED)
        try:
            while True:
                reply = await self.call.read()
                if reply is aio.EOF:
                    break
                self.answered = True
                future = self.waiting.get(reply.request_id)
                if future is not None and not future.done():
                    future.set_result(reply.outcome)
        except asyncio.CancelledError:
            error = failed_call(grpc.StatusCode.CANCELLED, "the client closed the acquire stream")
            raise
        except Exception as e:  # the call failed, or anything else: the stream is given up
            error = _stream_failure(e, answered=self.answered)
        finally:
            self.ended = True
            self.call.cancel()  # no-op once the call has ended
            for future in self.waiting.values():
                if not future.done():
                    future.set_exception(error)

    def close(self, *, cancel: bool = False) -> None:
        """Cancels the call; every Acquire still waiting fails ``UNAVAILABLE``, or is
        cancelled (``cancel``: the client closes, as its plain calls are)."""
        if self.ended:
            return
        self.ended = True
        self.call.cancel()
        self.reader.cancel()
        for future in self.waiting.values():
            if future.done():
                continue
            if cancel:
                future.cancel()
            else:
                future.set_exception(failed_call(grpc.StatusCode.UNAVAILABLE, ENDED))


class AcquireStreams:
    """The open ``AcquireStream`` calls of one client, one per replica (see the module doc)."""

    def __init__(self, metadata: Metadata) -> None:
        """``metadata`` goes with every stream (the client's holder session)."""
        self._metadata = metadata
        self._streams: dict[str, _Stream] = {}
        self._retired: set[_Stream] = set()  # renewed, answering what they were sent
        self._closed = False

    async def acquire(
        self, target: str, stub: pb_grpc.AllocatorStub, request: pb.AcquireRequest, timeout_s: float
    ) -> pb.AcquireResponse:
        """``request`` decided by ``target`` (``stub`` calls it); ``request.request_id``
        must be set.

        Raises:
            aio.AioRpcError: the refusal, the stream's failure, or ``DEADLINE_EXCEEDED``.
            Unstreamed: the replica refused the stream itself; nothing was decided.
        """
        if self._closed:
            raise failed_call(grpc.StatusCode.CANCELLED, "the client is closed")
        stream = self._streams.get(target)
        if stream is None or stream.ended or time.monotonic() - stream.opened >= RENEW_AFTER_S:
            if stream is not None and not stream.ended:
                self._retire(stream)
            call = stub.AcquireStream(metadata=self._metadata)
            stream = self._streams[target] = _Stream(call)
        key = request.request_id
        loop = asyncio.get_running_loop()
        future: asyncio.Future[pb.AcquireOutcome] = loop.create_future()
        stream.waiting[key] = future
        # The write runs in a task of its own, which no caller cancels: grpc.aio cancels the
        # whole call when a write is cancelled half done, and every Acquire waiting on it.
        sending = loop.create_task(self._send(target, stream, request, future))
        stream.sending.add(sending)
        sending.add_done_callback(stream.sending.discard)
        try:
            async with asyncio.timeout(timeout_s):
                outcome = await future
        except TimeoutError:
            raise failed_call(
                grpc.StatusCode.DEADLINE_EXCEEDED, f"no answer within {timeout_s:g}s"
            ) from None
        finally:
            if stream.waiting.get(key) is future:
                del stream.waiting[key]
            if stream.retired and not stream.waiting:
                stream.close()  # answered all it was sent: a replica that hangs holds nothing
            if not future.done():
                future.cancel()
            elif not future.cancelled():
                future.exception()  # read: a failure raised by the write is the one reported
        if outcome.HasField("error"):
            raise item_failure(outcome.error)
        return outcome.response

    async def _send(
        self,
        target: str,
        stream: _Stream,
        request: pb.AcquireRequest,
        future: asyncio.Future[pb.AcquireOutcome],
    ) -> None:
        """Writes ``request`` on ``stream``, unless its caller gave up before its turn came
        (as a plain call cancelled before it is sent, it is never sent); a failed write
        fails ``future`` (never raises)."""
        try:
            async with stream.writing:
                if future.done():
                    return
                await stream.call.write(request)
        except Exception as e:
            if stream.call.done():
                # The call has ended: its reader fails ``future`` with the call's own
                # status (a stream refused whole says so there, not in the write's error).
                return
            # The call lives but took no write: this Acquire fails with the write's error,
            # the others waiting with the stream's end; a new one serves the next Acquire.
            if not future.done():
                future.set_exception(_stream_failure(e))
            self._drop(target, stream)

    def _retire(self, stream: _Stream) -> None:
        """Takes no new Acquires on ``stream``: it is closed once no Acquire waits on it
        (``acquire``: the last one answered or given up), at once when none does."""
        stream.retired = True
        if not stream.waiting:
            stream.close()
            return
        self._retired.add(stream)
        stream.reader.add_done_callback(lambda _: self._retired.discard(stream))

    def _drop(self, target: str, stream: _Stream) -> None:
        """Closes ``stream`` (its waiting Acquires fail) and forgets it."""
        if self._streams.get(target) is stream:
            del self._streams[target]
        stream.close()

    async def close(self) -> None:
        """Closes every stream: the Acquires waiting on them are cancelled, and a later
        ``acquire`` fails ``CANCELLED``."""
        self._closed = True
        streams = [*self._streams.values(), *self._retired]
        self._streams.clear()
        self._retired.clear()
        tasks: list[asyncio.Task[None]] = []
        for stream in streams:
            stream.close(cancel=True)
            tasks += [stream.reader, *stream.sending]
        for task in tasks:
            task.cancel()  # a write waiting on a cancelled call may never wake otherwise
        await asyncio.gather(*tasks, return_exceptions=True)
