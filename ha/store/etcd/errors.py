"""What an etcd or gRPC failure means to the store's caller: the one translation table.

aetcd raises gRPC errors (its own ``ClientError`` wraps the ``grpc.aio.AioRpcError`` as
``__cause__``), which is why this package, and nothing else in ``ha``, imports grpc.

Guarantees: a failure is translated here and nowhere else. Connection refused, no leader,
deadline exceeded → ``StoreUnavailable`` that moves the store to the next endpoint;
NOSPACE ("database space exceeded") → ``StoreFull``; lease not found → ``LeaseNotFound``;
a request etcd calls malformed → ``ValueError`` (a bug in this package). An auth token etcd
no longer accepts (expired, or older than an auth change), or none sent ("user name is
empty"), is marked ``reauthenticate``: with a username set, the connection fetches a new
token and sends the call again; without one the call fails with the reason. A refused
password, a denied permission or a failed TLS handshake → ``StoreUnavailable`` whose
reason names the settings to check. Anything else aetcd or gRPC raises →
``StoreUnavailable`` on the same endpoint.

Non-guarantees: the words of etcd's message are kept for the log, not parsed, except
the NOSPACE one that ``ERRORS_BY_MESSAGE`` names.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

import aetcd
import grpc

from ha.store.contract import LeaseNotFound, StoreFull, StoreUnavailable

__all__ = [
    "ERRORS_BY_MESSAGE",
    "ERRORS_BY_STATUS",
    "ERRORS_BY_TYPE",
    "TRANSLATED",
    "UNKNOWN",
    "AccessRefused",
    "Translation",
    "details_of",
    "translate",
    "translate_reason",
]


class AccessRefused(StoreUnavailable):
    """etcd answered and refused this client's settings: the TLS handshake failed, the
    password or the user was refused, or a permission was denied. Unlike an unreachable
    etcd, waiting does not help: the settings (or etcd's) must change."""


@dataclass(frozen=True, slots=True)
class Translation:
    """What an etcd or gRPC failure means to the caller.

    Attributes:
        error: the project exception to raise.
        reason: the words put in front of etcd's message.
        failover: the endpoint itself failed, so the next call goes to the next one.
        reauthenticate: etcd refused the auth token, not the call: with a new token the
            call may be sent again (etcd checks the token before it applies anything).
            The connection acts on it only when a username is set
            (``Connection.reauthenticates``): otherwise there is no token to renew.
    """

    error: type[Exception]
    reason: str
    failover: bool = False
    reauthenticate: bool = False


ERRORS_BY_STATUS: Final[Mapping[grpc.StatusCode, Translation]] = {
    grpc.StatusCode.UNAVAILABLE: Translation(
        StoreUnavailable, "etcd is unreachable or has no leader", failover=True
    ),
    grpc.StatusCode.DEADLINE_EXCEEDED: Translation(
        StoreUnavailable, "etcd did not answer within the deadline", failover=True
    ),
    grpc.StatusCode.NOT_FOUND: Translation(LeaseNotFound, "lease not found"),
    grpc.StatusCode.CANCELLED: Translation(StoreUnavailable, "the etcd call was cancelled"),
    grpc.StatusCode.RESOURCE_EXHAUSTED: Translation(
        StoreUnavailable, "etcd is out of space or overloaded"
    ),
    grpc.StatusCode.INVALID_ARGUMENT: Translation(
        ValueError, "BUG: etcd refused a malformed request"
    ),
    grpc.StatusCode.PERMISSION_DENIED: Translation(
        AccessRefused,
        "etcd denied the call: the etcd user (etcd.username, or the client certificate's "
        "CN when no username is set) needs a role that grants read and write on the prefix",
    ),
}
"""gRPC status → project exception. etcd 3.4 uses NOT_FOUND only for leases."""

_NEW_TOKEN: Final = Translation(
    StoreUnavailable, "etcd refused the auth token", reauthenticate=True
)
_HANDSHAKE: Final = Translation(
    AccessRefused,
    "the TLS handshake with etcd failed (check etcd.ca_file against etcd's certificate, "
    "and etcd.cert_file/etcd.key_file if etcd requires client certificates)",
    failover=True,
)

ERRORS_BY_MESSAGE: Final[tuple[tuple[str, Translation], ...]] = (
    # etcd answers RESOURCE_EXHAUSTED both for NOSPACE and for "too many requests";
    # only the first is a refusal that lasts until an operator frees space.
    ("database space exceeded", Translation(StoreFull, "etcd is out of space (NOSPACE alarm)")),
    # etcd's simple tokens expire (--auth-token-ttl, 5 minutes by default, counted from
    # their last use on each member), and an auth change (user, role) retires every
    # token; clientv3 fetches a new token on these three answers, so does this store.
    ("invalid auth token", _NEW_TOKEN),
    ("revision of auth store is old", _NEW_TOKEN),
    (
        "user name is empty",
        Translation(
            AccessRefused,
            "etcd has auth enabled: set etcd.username and etcd.password_file, or a client "
            "certificate whose CN is an etcd user",
            reauthenticate=True,
        ),
    ),
    (
        "authentication failed",
        Translation(AccessRefused, "etcd refused etcd.username with etcd.password_file"),
    ),
    (
        "authentication is not enabled",
        Translation(AccessRefused, "etcd.username is set but etcd has auth disabled"),
    ),
    # gRPC's words when the TLS handshake fails: etcd wants a client certificate
    # (etcd.cert_file, etcd.key_file) it was not given or does not trust, or etcd's
    # certificate does not verify with etcd.ca_file or does not name the endpoint's host.
    ("Ssl handshake failed", _HANDSHAKE),
    ("TSI_DATA_CORRUPTED", _HANDSHAKE),
    ("Handshake read failed", _HANDSHAKE),
)
"""Failures told apart by etcd's message, checked before the status table."""

ERRORS_BY_TYPE: Final[tuple[tuple[type[BaseException], Translation], ...]] = (
    (TimeoutError, Translation(StoreUnavailable, "no answer within the deadline", True)),
    (aetcd.WatchTimeoutError, Translation(StoreUnavailable, "watch not created in time", True)),
    (aetcd.InvalidArgumentError, ERRORS_BY_STATUS[grpc.StatusCode.INVALID_ARGUMENT]),
    (aetcd.ClientError, Translation(StoreUnavailable, "etcd failed the call")),
    (grpc.RpcError, Translation(StoreUnavailable, "etcd failed the call")),
)
"""Failures that carry no gRPC status, first match wins."""

UNKNOWN: Final = Translation(StoreUnavailable, "etcd failed the call")
"""The translation of a failure none of the tables names."""

TRANSLATED: Final = (TimeoutError, aetcd.ClientError, grpc.RpcError)
"""The exceptions an etcd call may raise that ``translate`` knows; catch these, no more."""


def translate(e: BaseException) -> Translation | None:
    """The translation of a failure, or None when it is not an etcd failure."""
    status = _status_of(e)
    if status is not None:
        details = details_of(e)
        for words, translation in ERRORS_BY_MESSAGE:
            if words in details:
                return translation
    if status is not None and status in ERRORS_BY_STATUS:
        return ERRORS_BY_STATUS[status]
    for kind, translation in ERRORS_BY_TYPE:
        if isinstance(e, kind):
            return translation
    return None


def translate_reason(reason: str) -> Translation | None:
    """The translation of etcd's words alone (a watch's cancel reason), or None."""
    for words, translation in ERRORS_BY_MESSAGE:
        if words in reason:
            return translation
    return None


def details_of(e: BaseException) -> str:
    """etcd's own words for a failure (the gRPC details), else the exception's."""
    for candidate in (e, e.__cause__):
        if isinstance(candidate, grpc.aio.AioRpcError):
            return str(candidate.details())
    return str(e) or type(e).__name__


def _status_of(e: BaseException) -> grpc.StatusCode | None:
    # aetcd wraps the grpc.aio.AioRpcError (``raise ClientError(...) from error``).
    for candidate in (e, e.__cause__):
        if isinstance(candidate, grpc.aio.AioRpcError):
            code: grpc.StatusCode = candidate.code()
            return code
    return None
