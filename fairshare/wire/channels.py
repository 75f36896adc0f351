"""The one place where gRPC channels to replicas are opened: the client library's, the
replicas' own forwarding channels, the ``fairshare`` command's and the simulator's.

gRPC's defaults are wrong for a failover path: a channel whose connection failed waits 1 s
before it tries again, and that wait grows to 120 s, so a replica restarted on the same
address would be answered "unavailable" for up to two minutes although it is serving.

Guarantees:
- Every channel opened here retries a failed connection after tens of milliseconds, the
  wait growing (x1.6, with jitter) to at most ``MAX_RECONNECT_BACKOFF_MS``: a replica back
  on its address is connected to again within about a second, however long it was away.
- A connection attempt is given ``CONNECT_TIMEOUT_MS`` before it counts as failed.
- Host names are resolved again at most every ``DNS_REFRESH_MS`` after a failure (gRPC's
  default is 30 s), so a replica that moved to a new address behind the same name (a
  restarted pod's new IP) is found again about a second after its name resolves to it.
- No shipped module opens a gRPC channel to a replica any other way (a test checks the
  source); channels to etcd state the same limits in ``ha.store.etcd.connection``.

Non-guarantees: a call made while the channel waits between two attempts still fails at
once with ``UNAVAILABLE`` (callers retry within their own deadline). How soon a name
resolves to a new address is the DNS server's matter (cluster DNS caches records for
their TTL); re-resolution happens after a connection fails, not on a timer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import grpc
from grpc import aio

INITIAL_RECONNECT_BACKOFF_MS: Final = 20
MAX_RECONNECT_BACKOFF_MS: Final = 1000
CONNECT_TIMEOUT_MS: Final = 1000
DNS_REFRESH_MS: Final = 1000

CHANNEL_OPTIONS: Final[tuple[tuple[str, int], ...]] = (
    ("grpc.initial_reconnect_backoff_ms", INITIAL_RECONNECT_BACKOFF_MS),
    ("grpc.max_reconnect_backoff_ms", MAX_RECONNECT_BACKOFF_MS),
    # gRPC names the connect timeout "min reconnect backoff".
    ("grpc.min_reconnect_backoff_ms", CONNECT_TIMEOUT_MS),
    ("grpc.dns_min_time_between_resolutions_ms", DNS_REFRESH_MS),
)
"""The options of every channel to a replica."""


def open_channel(
    target: str,
    credentials: grpc.ChannelCredentials | None = None,
    options: Sequence[tuple[str, object]] = (),
) -> aio.Channel:
    """An ``aio`` channel to ``target`` with ``CHANNEL_OPTIONS``; ``options`` override them.

    Args:
        target: ``host:port`` of a replica.
        credentials: TLS credentials; None uses plaintext.
        options: extra channel options (a key given here replaces the default's).
    """
    extra = dict(options)
    merged = [(k, v) for k, v in CHANNEL_OPTIONS if k not in extra] + list(extra.items())
    if credentials is not None:
        return aio.secure_channel(target, credentials, options=merged)
    return aio.insecure_channel(target, options=merged)


def open_sync_channel(
    target: str, credentials: grpc.ChannelCredentials | None = None
) -> grpc.Channel:
    """A blocking (not ``aio``) channel to ``target`` with ``CHANNEL_OPTIONS``, for
    callers without an event loop (the simulator's remote driver)."""
    options = list(CHANNEL_OPTIONS)
    if credentials is not None:
        return grpc.secure_channel(target, credentials, options=options)
    return grpc.insecure_channel(target, options=options)


__all__ = ["CHANNEL_OPTIONS", "open_channel", "open_sync_channel"]
