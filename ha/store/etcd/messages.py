"""Conversions between etcd's protobuf messages and the store's values, in one place.

aetcd's generated messages are untyped (``Any`` here); everything that reads or builds one
for the store is below, so the rest of the package handles ``KeyValue`` and ``WatchEvent``.
Keys are UTF-8 text on the store's side and bytes on etcd's.
"""

from __future__ import annotations

from typing import Any

from aetcd import rpc, utils

from ha.store.contract import EventKind, KeyValue, LeaseId, WatchEvent

__all__ = [
    "compare_create",
    "compare_exists",
    "delete_range_op",
    "event_of",
    "key_value",
    "prefix_range",
    "put_op",
]


def prefix_range(prefix: str) -> tuple[bytes, bytes]:
    """The etcd key range ``[start, end)`` holding every key that starts with ``prefix``."""
    if not prefix:
        return b"\0", b"\0"  # etcd's spelling of "every key"
    start = prefix.encode()
    return start, utils.prefix_range_end(start)


def key_value(raw: Any) -> KeyValue:
    """An etcd ``mvccpb.KeyValue`` as the store's ``KeyValue``."""
    return KeyValue(
        bytes(raw.key).decode(),
        bytes(raw.value),
        int(raw.create_revision),
        int(raw.mod_revision),
        LeaseId(int(raw.lease)),
    )


def event_of(raw: Any) -> WatchEvent:
    """An etcd watch ``Event`` as the store's ``WatchEvent`` (PUT or DELETE)."""
    key = bytes(raw.kv.key).decode()
    revision = int(raw.kv.mod_revision)
    if raw.type == rpc.Event.DELETE:
        return WatchEvent(EventKind.DELETE, key, None, revision)
    return WatchEvent(EventKind.PUT, key, key_value(raw.kv), revision)


def compare_create(key: bytes, revision: int) -> Any:
    """A transaction compare: ``key``'s create_revision is ``revision``."""
    return rpc.Compare(
        key=key,
        target=rpc.Compare.CREATE,
        result=rpc.Compare.EQUAL,
        create_revision=revision,
    )


def compare_exists(key: bytes) -> Any:
    """A transaction compare: ``key`` exists."""
    # create_revision == r alone also holds for an absent key when r == 0.
    return rpc.Compare(key=key, target=rpc.Compare.VERSION, result=rpc.Compare.GREATER, version=0)


def put_op(key: bytes, value: bytes, lease: LeaseId) -> Any:
    """A transaction operation that puts ``value`` at ``key`` under ``lease``."""
    return rpc.RequestOp(request_put=rpc.PutRequest(key=key, value=value, lease=int(lease)))


def delete_range_op(start: bytes, end: bytes) -> Any:
    """A transaction operation that deletes every key in ``[start, end)``."""
    return rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=start, range_end=end))
