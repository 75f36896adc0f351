"""The one table of fairshare.wire.errors: every error crosses the wire as itself, both ways."""

from __future__ import annotations

import grpc
import pytest
from grpc import aio

from fairshare.errors import (
    AllocatorError,
    InvalidArgument,
    LimitExceeded,
    NoOwner,
    OutOfRange,
    PeerUnavailable,
    PermissionDenied,
    StoreFull,
    StoreUnavailable,
    UnknownNode,
    UnknownPool,
    WrongEpoch,
)
from fairshare.ids import Epoch, NodeId
from fairshare.wire.errors import (
    ERROR_CODES,
    TABLE,
    error_metadata,
    status_code,
    to_allocator_error,
)

POOL, NODE, ADDRESS = "gpu-a", "node-b", "10.0.0.9:50051"

ERRORS: list[AllocatorError] = [
    UnknownPool(POOL),
    InvalidArgument("team", "must not be empty"),
    OutOfRange("est_tokens", "must be <= 4294967296, got 5000000000"),
    LimitExceeded("max_teams", "the pool already has 1024 teams"),
    PermissionDenied("grant_id", "not genuine"),
    WrongEpoch(POOL, NodeId("node-c"), "10.0.0.3:50051", Epoch(7)),
    UnknownNode(NODE),
    NoOwner(POOL),
    StoreUnavailable("etcd did not answer"),
]


def answered(error: AllocatorError) -> aio.AioRpcError:
    """The failed call a client sees when a servicer aborts with ``error``."""
    return aio.AioRpcError(
        status_code(error),
        aio.Metadata(),
        aio.Metadata(*error_metadata(error)),
        str(error),
    )


def test_every_row_has_its_own_class() -> None:
    assert len({row.error for row in TABLE}) == len(TABLE) == len(ERROR_CODES)


@pytest.mark.parametrize("error", ERRORS, ids=lambda e: type(e).__name__)
def test_an_error_is_rebuilt_as_itself(error: AllocatorError) -> None:
    rebuilt = to_allocator_error(answered(error), address=ADDRESS, pool=POOL, node=NODE)
    assert type(rebuilt) is type(error)
    assert str(rebuilt) == str(error)
    assert vars(rebuilt) == vars(error)


def test_a_subclass_without_a_row_takes_its_parents_code() -> None:
    error = StoreFull("etcd: database space exceeded")
    assert status_code(error) == grpc.StatusCode.UNAVAILABLE
    assert dict(error_metadata(error)) == {"fairshare-error": "StoreFull"}
    rebuilt = to_allocator_error(answered(error), address=ADDRESS, pool=POOL)
    assert isinstance(rebuilt, PeerUnavailable) and rebuilt.address == ADDRESS


def test_an_error_outside_the_table_is_internal() -> None:
    assert status_code(AllocatorError("?")) == grpc.StatusCode.INTERNAL


@pytest.mark.parametrize(
    "code",
    [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.INTERNAL],
)
def test_a_failure_that_names_no_error_is_the_peer_unavailable(code: grpc.StatusCode) -> None:
    failed = aio.AioRpcError(code, aio.Metadata(), aio.Metadata(), "connection refused")
    rebuilt = to_allocator_error(failed, address=ADDRESS, pool=POOL)
    assert isinstance(rebuilt, PeerUnavailable)
    assert str(rebuilt) == f"peer {ADDRESS} unavailable: {code.name}: connection refused"
