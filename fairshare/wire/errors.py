"""The one table between the allocator's errors and gRPC status codes, both ways.

Each row of ``TABLE`` names an error class, the status code it is answered with, the
trailing metadata it carries beyond its class name (``fairshare.wire.metadata``) and how a caller
rebuilds it from a failed call. The servicer answers with ``abort``; a forwarding replica
(``server.peers``) and the client library turn a failed call back into the same error with
``to_allocator_error``, so an error crosses a forward unchanged.

Guarantees:
- An error is answered with the code of its nearest class in the table (``INTERNAL`` for
  none) and the trailing metadata ``fairshare-error: <its class name>``.
- ``to_allocator_error`` rebuilds ``UnknownPool``, ``InvalidArgument``, ``OutOfRange``,
  ``LimitExceeded`` (when the limit is named), ``PermissionDenied``, ``WrongEpoch`` (when
  the owner's epoch is named), ``UnknownNode``, ``NoOwner`` and ``StoreUnavailable`` (when
  the class is named). Any other failure is ``PeerUnavailable``: the caller cannot know
  what the peer did.

Non-guarantees: a subclass without its own row (``StoreFull``) is rebuilt as what its
code alone says, ``PeerUnavailable``; the pool and node of a rebuilt error are the ones
the caller asked about, not read from the answer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, NoReturn

import grpc
from grpc import aio

from fairshare.errors import (
    AllocatorError,
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
from fairshare.ids import NO_EPOCH, Epoch, NodeId
from fairshare.wire.metadata import (
    EPOCH_KEY,
    ERROR_KEY,
    FIELD_KEY,
    LIMIT_KEY,
    OWNER_ADDRESS_KEY,
    OWNER_KEY,
    Metadata,
    as_dict,
)
from fairshare.wire.pb.fairshare.v1 import allocator_pb2 as pb


@dataclass(frozen=True, slots=True)
class Answer:
    """A failed call as a caller sees it, with what the caller asked about."""

    code: grpc.StatusCode
    details: str
    metadata: Mapping[str, str]
    pool: str = ""
    node: str = ""

    @property
    def kind(self) -> str:
        """The error class the answer names ('' when it names none)."""
        return self.metadata.get(ERROR_KEY, "")

    def message(self, prefix: str) -> str:
        """The details without the ``<prefix>: `` the error's text starts with."""
        return self.details.removeprefix(f"{prefix}: ")


@dataclass(frozen=True, slots=True)
class Row:
    """One error class on the wire.

    Attributes:
        error: the class (its subclasses without a row of their own use this row).
        code: the status code it is answered with.
        metadata: the trailing metadata it carries besides ``fairshare-error``.
        rebuild: the error a failed call with ``code`` stands for, or None when this
            row does not apply to it (the next row with the code is tried).
    """

    error: type[AllocatorError]
    code: grpc.StatusCode
    metadata: Callable[[AllocatorError], Metadata]
    rebuild: Callable[[Answer], AllocatorError | None]


def _none(error: AllocatorError) -> Metadata:
    return ()


def _field(error: AllocatorError) -> Metadata:
    assert isinstance(error, InvalidArgument | PermissionDenied)
    return ((FIELD_KEY, error.field),)


def _limit(error: AllocatorError) -> Metadata:
    assert isinstance(error, LimitExceeded)
    return ((LIMIT_KEY, error.limit),)


def _owner(error: AllocatorError) -> Metadata:
    assert isinstance(error, WrongEpoch)
    return (
        (OWNER_KEY, str(error.owner)),
        (OWNER_ADDRESS_KEY, error.address),
        (EPOCH_KEY, str(int(error.epoch))),
    )


def _field_error(
    kind: type[InvalidArgument | PermissionDenied],
) -> Callable[[Answer], AllocatorError]:
    def rebuild(answer: Answer) -> AllocatorError:
        field = answer.metadata.get(FIELD_KEY, "request")
        return kind(field, answer.message(field))

    return rebuild


def _permission_denied(answer: Answer) -> AllocatorError | None:
    if answer.kind != PermissionDenied.__name__:
        return None
    return _field_error(PermissionDenied)(answer)


def _limit_exceeded(answer: Answer) -> AllocatorError | None:
    limit = answer.metadata.get(LIMIT_KEY)
    if limit is None:
        return None
    return LimitExceeded(limit, answer.message(limit))


def _wrong_epoch(answer: Answer) -> AllocatorError | None:
    if EPOCH_KEY not in answer.metadata:
        return None
    try:
        epoch = Epoch(int(answer.metadata[EPOCH_KEY]))
    except ValueError:
        epoch = NO_EPOCH
    owner = NodeId(answer.metadata.get(OWNER_KEY, ""))
    return WrongEpoch(answer.pool, owner, answer.metadata.get(OWNER_ADDRESS_KEY, ""), epoch)


def _named(
    kind: type[AllocatorError], make: Callable[[Answer], AllocatorError]
) -> Callable[[Answer], AllocatorError | None]:
    """Rebuilds ``kind`` only when the answer names it."""

    def rebuild(answer: Answer) -> AllocatorError | None:
        return make(answer) if answer.kind == kind.__name__ else None

    return rebuild


def _never(answer: Answer) -> AllocatorError | None:
    return None


_CODE = grpc.StatusCode

TABLE: Final[Sequence[Row]] = (
    Row(UnknownPool, _CODE.NOT_FOUND, _none, lambda a: UnknownPool(a.pool)),
    Row(OutOfRange, _CODE.OUT_OF_RANGE, _field, _field_error(OutOfRange)),
    Row(InvalidArgument, _CODE.INVALID_ARGUMENT, _field, _field_error(InvalidArgument)),
    Row(LimitExceeded, _CODE.RESOURCE_EXHAUSTED, _limit, _limit_exceeded),
    Row(PermissionDenied, _CODE.PERMISSION_DENIED, _field, _permission_denied),
    Row(WrongEpoch, _CODE.FAILED_PRECONDITION, _owner, _wrong_epoch),
    Row(
        UnknownNode,
        _CODE.FAILED_PRECONDITION,
        _none,
        _named(UnknownNode, lambda a: UnknownNode(a.node)),
    ),
    Row(NoOwner, _CODE.UNAVAILABLE, _none, _named(NoOwner, lambda a: NoOwner(a.pool))),
    Row(
        StoreUnavailable,
        _CODE.UNAVAILABLE,
        _none,
        _named(StoreUnavailable, lambda a: StoreUnavailable(a.details)),
    ),
    # A peer that says its own peer did not answer is, to its caller, a peer that failed.
    Row(PeerUnavailable, _CODE.UNAVAILABLE, _none, _never),
)
"""The one table of the allocator's errors on the wire (see the module doc)."""

ERROR_CODES: Final[Mapping[type[AllocatorError], grpc.StatusCode]] = {
    row.error: row.code for row in TABLE
}
"""Each error class of ``TABLE`` with its status code."""

_ROWS: Final[Mapping[type[AllocatorError], Row]] = {row.error: row for row in TABLE}


def _row(error: AllocatorError) -> Row | None:
    """The row of the error's nearest class in ``TABLE``."""
    for klass in type(error).__mro__:
        row = _ROWS.get(klass)
        if row is not None:
            return row
    return None


def status_code(error: AllocatorError) -> grpc.StatusCode:
    """The status code of an allocator error (its nearest class in ``TABLE``)."""
    row = _row(error)
    return row.code if row is not None else grpc.StatusCode.INTERNAL


def error_metadata(error: AllocatorError) -> Metadata:
    """The trailing metadata that lets a caller rebuild ``error`` (see module doc)."""
    row = _row(error)
    extra = row.metadata(error) if row is not None else ()
    return ((ERROR_KEY, type(error).__name__), *extra)


async def abort(context: aio.ServicerContext, error: AllocatorError) -> NoReturn:
    """Ends the call being served with ``error``'s status, message and metadata."""
    await context.abort(status_code(error), str(error), trailing_metadata=error_metadata(error))
    raise AssertionError("unreachable: abort raises")  # pragma: no cover


def item_error(error: AllocatorError) -> pb.ItemError:
    """One refused item of a batched call: what ``abort`` would have answered it with."""
    return pb.ItemError(
        code=status_code(error).value[0],
        message=str(error),
        metadata=dict(error_metadata(error)),
    )


_BY_NUMBER: Final[Mapping[int, grpc.StatusCode]] = {code.value[0]: code for code in grpc.StatusCode}


def failed_call(code: grpc.StatusCode, details: str) -> aio.AioRpcError:
    """A failure the client library states itself, as the failed call it stands for (no
    metadata): a deadline it ran out of, a stream that ended, a client that is closed."""
    return aio.AioRpcError(code, aio.Metadata(), aio.Metadata(), details)


def item_failure(item: pb.ItemError) -> aio.AioRpcError:
    """A refused item of a batched call as the failed call it stands for, so that every
    caller handles it as it handles a refused unbatched call (``to_allocator_error``,
    ``RETRYABLE``). An unknown code counts as ``UNKNOWN``."""
    code = _BY_NUMBER.get(item.code, grpc.StatusCode.UNKNOWN)
    trailing_metadata = aio.Metadata(*sorted(item.metadata.items()))
    return aio.AioRpcError(code, aio.Metadata(), trailing_metadata, item.message)


def trailing(error: aio.AioRpcError) -> dict[str, str]:
    """The trailing metadata of a failed call as a dict (last value wins)."""
    return as_dict(error.trailing_metadata())


def to_allocator_error(
    error: aio.AioRpcError, *, address: str, pool: str = "", node: str = ""
) -> AllocatorError:
    """The allocator error a failed call to ``address`` stands for (see the module doc).

    Args:
        error: the failed call.
        address: whom it was sent to (named by a ``PeerUnavailable``).
        pool, node: what it asked about (named by the rebuilt error).
    """
    code = error.code()
    answer = Answer(code, error.details() or "", trailing(error), pool, node)
    for row in TABLE:
        if row.code == code:
            rebuilt = row.rebuild(answer)
            if rebuilt is not None:
                return rebuilt
    details = answer.details
    return PeerUnavailable(address, f"{code.name}: {details}" if code else details)


__all__ = [
    "ERROR_CODES",
    "TABLE",
    "Answer",
    "Row",
    "abort",
    "error_metadata",
    "item_error",
    "item_failure",
    "status_code",
    "to_allocator_error",
    "trailing",
]
