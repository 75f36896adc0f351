"""The store's connection to etcd: one member at a time, the next one when it fails.

Guarantees:

- Every call carries etcd's require-leader metadata, so a member cut off from its quorum
  refuses it at once (and ends the watches open on it after three election timeouts
  without a leader) instead of holding it until a deadline.
- Every call has one deadline, enforced both as the gRPC deadline and around the awaited
  call (connection wait included).
- A connection error, a deadline or "no leader" moves the connection to the next endpoint
  for the calls that follow; the failed member's channel is closed one deadline later, so
  calls still running on it can finish. With one endpoint gRPC reconnects the same
  channel, its backoff bounded at 1 s, resolving the member's name again at most every
  second after a failure.
- Only idempotent calls are tried on the next endpoint within their deadline, and the
  write that may be sent twice (``repeat``) within its budget; every other call raises
  at once, whatever it may have done (``Connection.call``).
- A connection used before ``open_first`` (or after it failed) starts on the first
  endpoint, unchecked, and moves on from there as after any failure.
- ``close`` ends every call still open (watch streams included) and wakes every backoff.
- ``https://`` endpoints get TLS channels with the access's CA (and client certificate),
  ``http://`` ones plaintext; both kinds at once, or TLS settings with ``http://``
  endpoints, are refused when the connection is made. With a username, a call that etcd
  answers "invalid auth token" is sent once more with a new token, whatever the call:
  etcd checks the token before it applies anything (``ha.store.etcd.client``). Without one
  there is no token to renew: such an answer fails the call at once, and its reason
  names the settings to give (``reauthenticates``).

- With ``EtcdAccess.reload``, rotated certificates or password reach the calls that
  follow: the current endpoint gets a new client made with them, the old one is closed
  one deadline later (a watch open on it resumes on the new one).

Non-guarantees: a member that is
paused but keeps its TCP connection open is noticed only by a deadline or by gRPC
keepalive pings (every 10 s, the fastest etcd's default server policy accepts).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import urllib.parse
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from ha.store.contract import StoreUnavailable
from ha.store.etcd.client import EtcdAccess, EtcdClient
from ha.store.etcd.errors import (
    TRANSLATED,
    UNKNOWN,
    AccessRefused,
    Translation,
    details_of,
    translate,
)

__all__ = [
    "DEFAULT_PORT",
    "Connection",
    "EndpointClient",
    "check_access",
    "is_tls",
    "parse_endpoint",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_PORT: Final = 2379
_BACKOFF_MIN_S: Final = 0.05
_BACKOFF_MAX_S: Final = 1.0
_MIN_ATTEMPT_S: Final = 0.05
"""A budgeted write is not sent again with less time than this left."""
_KEEPALIVE_PING_MS: Final = 10_000
"""etcd refuses pings more often than every 5 s (``--grpc-keepalive-min-time``)."""
_MAX_MESSAGE_BYTES: Final = 32 * 1024 * 1024


def parse_endpoint(text: str) -> tuple[str, int]:
    """``host:port``, ``http://host:port``, ``https://host:port`` or ``[v6]:port`` →
    (gRPC host, port). Whether it is TLS is ``is_tls(text)``.

    Raises:
        ValueError: not an endpoint, or a scheme other than http or https.
    """
    raw = text.strip()
    scheme, sep, rest = raw.partition("://")
    if not sep:
        rest = raw
    elif scheme.lower() not in ("http", "https"):
        raise ValueError(f"etcd endpoint {text!r}: the scheme must be http:// or https://")
    parts = urllib.parse.urlsplit("//" + rest.rstrip("/"))
    try:
        port = parts.port or DEFAULT_PORT
    except ValueError as e:
        raise ValueError(f"etcd endpoint {text!r}: bad port") from e
    host = parts.hostname
    if not host or parts.path:
        raise ValueError(f"etcd endpoint {text!r}: expected host:port")
    return (f"[{host}]" if ":" in host else host), port


def is_tls(endpoint: str) -> bool:
    """True for an ``https://`` endpoint (a bare ``host:port`` is plaintext)."""
    return endpoint.strip().lower().startswith("https://")


def check_access(endpoints: Sequence[str], access: EtcdAccess) -> None:
    """Checks that the endpoints and the access agree on TLS.

    Raises:
        ValueError: ``https://`` and plaintext endpoints mixed, ``https://`` endpoints
            without a CA, or a CA with plaintext endpoints.
    """
    tls = {is_tls(e) for e in endpoints}
    if len(tls) > 1:
        raise ValueError("etcd endpoints mix https:// and plaintext; use one kind")
    if tls == {True} and not access.tls:
        raise ValueError("https:// etcd endpoints need the CA that signs etcd's certificate")
    if tls == {False} and access.tls:
        raise ValueError("TLS settings for etcd need https:// endpoints")


def _channel_options(rpc_timeout_s: float) -> dict[str, int]:
    return {
        # A restarted etcd is found again within a second (the default backoff grows
        # to two minutes, during which every call would fail at once).
        "grpc.initial_reconnect_backoff_ms": 100,
        "grpc.min_reconnect_backoff_ms": 1000,
        "grpc.max_reconnect_backoff_ms": 1000,
        # A member restarted on a new address behind its name (a pod's new IP) is
        # resolved again a second after a connection fails, not gRPC's 30 s.
        "grpc.dns_min_time_between_resolutions_ms": 1000,
        # Pings find a member that stopped answering on an open connection (paused,
        # partitioned) even when the only call is an idle watch.
        "grpc.keepalive_time_ms": _KEEPALIVE_PING_MS,
        "grpc.keepalive_timeout_ms": max(1000, math.ceil(rpc_timeout_s * 1000)),
        "grpc.http2.max_pings_without_data": 0,
        # Without this one, grpcio 1.85 waits a minute for an unanswered ping.
        "grpc.http2.ping_timeout_ms": max(1000, math.ceil(rpc_timeout_s * 1000)),
        "grpc.keepalive_permit_without_calls": 0,
        "grpc.max_receive_message_length": _MAX_MESSAGE_BYTES,
    }


@dataclass(frozen=True, slots=True)
class EndpointClient:
    """One endpoint's client; replaced as a whole on failover."""

    client: EtcdClient
    endpoint: str
    index: int


class Connection:
    """The endpoints, the client of the current one, and the calls made through it.

    Create it, then ``open_first``; every call goes through ``call`` (or, for a watch
    stream, through ``current`` with the stream registered by ``track``).
    """

    def __init__(
        self,
        endpoints: Sequence[str],
        *,
        rpc_timeout_s: float,
        access: EtcdAccess | None = None,
    ) -> None:
        """Checks the endpoints (in the order they will be tried); connects to none yet.
        ``access``: TLS and auth settings (None: plaintext, no auth).

        Raises:
            ValueError: no endpoints, a malformed one, endpoints that do not agree with
                ``access`` (``check_access``), or a non-positive timeout.
        """
        if not endpoints:
            raise ValueError("no etcd endpoints given")
        if not rpc_timeout_s > 0:
            raise ValueError(f"rpc_timeout_s must be positive, got {rpc_timeout_s}")
        self.endpoints: tuple[str, ...] = tuple(endpoints)
        self._addresses = [parse_endpoint(e) for e in self.endpoints]
        self._access = access or EtcdAccess()
        check_access(self.endpoints, self._access)
        self.rpc_timeout_s = rpc_timeout_s
        self._current: EndpointClient | None = None
        self._closed = False
        self._closed_event = asyncio.Event()
        self._retiring: set[asyncio.Task[None]] = set()
        self._streams: set[Any] = set()

    @property
    def closed(self) -> bool:
        return self._closed

    def reauthenticates(self, translation: Translation | None) -> bool:
        """True when a failure so translated is answered by fetching a new auth token
        and sending the call again: etcd refused the token, and a username is set.

        Without a username the store sends no token, so there is none to renew ("user
        name is empty" from an etcd with auth on means settings are missing): the call
        fails with the translation's reason, and nothing claims a token was refused.
        """
        return (
            translation is not None
            and translation.reauthenticate
            and self._access.username is not None
        )

    async def open_first(self) -> None:
        """Settles on the first endpoint, in order, that answers a linearizable read.

        Raises:
            AccessRefused: no endpoint answered, and one refused the TLS handshake, the
                password or a permission (each one's error is in the message).
            StoreUnavailable: no endpoint answered (each one's error is in the message).
        """
        failures: list[str] = []
        refused = False
        for index in range(len(self.endpoints)):
            opened = self._open(index)
            try:
                async with asyncio.timeout(self.rpc_timeout_s):
                    await opened.client.get(b"/")
            except asyncio.CancelledError:
                await _close_client(opened)
                raise
            except TRANSLATED as e:
                translation = translate(e) or UNKNOWN
                reason = translation.reason
                refused = refused or issubclass(translation.error, AccessRefused)
                failures.append(f"{opened.endpoint}: {reason}: {details_of(e)}")
                await _close_client(opened)
                continue
            self._current = opened
            logger.info("connected to etcd at %s", opened.endpoint)
            return
        error = AccessRefused if refused else StoreUnavailable
        raise error("no etcd endpoint answered: " + "; ".join(failures))

    def current(self) -> EndpointClient:
        """The client calls go to now. Never opened (``open_first`` not called, or it
        failed): the first endpoint, unchecked; its failures move on as any others.

        Raises:
            StoreUnavailable: the connection is closed.
        """
        if self._closed:
            raise StoreUnavailable("the etcd store is closed")
        if self._access.reload is not None:
            self._follow(self._access.reload())
        if self._current is None:
            self._current = self._open(0)
        return self._current

    def _follow(self, access: EtcdAccess) -> None:
        """Takes the access in force: when it changed (rotated files), the calls that
        follow go to a new client of the same endpoint, made with it."""
        if access is self._access:
            return
        check_access(self.endpoints, access)
        self._access = access
        old = self._current
        if old is None:
            return
        self._current = self._open(old.index)
        logger.info("etcd TLS material or password changed: new calls open a new channel")
        self._retire(old)

    async def call(
        self,
        what: str,
        op: Callable[[Any, float], Awaitable[T]],
        *,
        idempotent: bool = False,
        budget_s: float | None = None,
        repeat: bool = False,
    ) -> T:
        """Runs one etcd call, translating its failure. ``op(client, seconds)`` sends it
        with that gRPC deadline.

        The call has one deadline, ``budget_s`` (default ``rpc_timeout_s``). An
        idempotent call (a read, a keepalive, a revoke) that fails because its endpoint
        failed is tried on the next endpoint within it; any other call raises at once,
        whatever it may have done.

        A ``repeat`` call (a write that may be sent twice: the same value under the same
        fence) is sent again after every failure of its endpoint until the budget is
        spent, pausing 50 ms to 1 s between attempts. With several endpoints
        one attempt takes at most half of what is left (never less than
        ``rpc_timeout_s``), so a member that stopped answering is left while there is
        time to try another.

        Raises:
            StoreUnavailable, StoreFull, LeaseNotFound, ValueError: as ``ha.store.etcd.errors``
                translates the last attempt's failure.
        """
        loop = asyncio.get_running_loop()
        total = self.rpc_timeout_s if budget_s is None else budget_s
        deadline = loop.time() + total
        attempt = 0
        new_token = False
        while True:
            attempt += 1
            used = self.current()
            left = deadline - loop.time()
            cap = left
            if repeat and len(self.endpoints) > 1:
                cap = min(left, max(self.rpc_timeout_s, left / 2))
            sent = None
            try:
                async with asyncio.timeout(cap):
                    await used.client.connect()
                    sent = used.client.metadata
                    return await op(used.client, cap)
            except TRANSLATED as e:
                translation = translate(e)
                if self.reauthenticates(translation) and not new_token:
                    # Refused before it was applied: once more, with a new token.
                    new_token = True
                    await self.reauthenticate(used, sent, what, deadline - loop.time())
                    attempt -= 1
                    continue
                failover = translation is not None and translation.failover
                left = deadline - loop.time()
                if repeat:
                    again = failover and left > _MIN_ATTEMPT_S
                else:
                    again = idempotent and failover and attempt < len(self.endpoints) and left > 0
                if not again:
                    raise self.failed(used, e, what) from e
                logger.info(
                    "%s at %s failed (%s); attempt %d, %.2fs left",
                    what,
                    used.endpoint,
                    details_of(e),
                    attempt,
                    left,
                )
                self.failed(used, e, what)
            if repeat:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(max(0.0, deadline - loop.time() - _MIN_ATTEMPT_S)):
                        await self.backoff(attempt)

    def failed(self, used: EndpointClient, e: BaseException, what: str = "watch") -> Exception:
        """The project exception for ``e``; moves to the next endpoint if ``used`` failed."""
        translation = translate(e) or UNKNOWN
        if translation.failover:
            self._failover(used)
        return translation.error(
            f"{what} at {used.endpoint}: {translation.reason}: {details_of(e)}"
        )

    async def reauthenticate(
        self, used: EndpointClient, stale: Any, what: str, timeout_s: float
    ) -> None:
        """Replaces the auth token etcd refused when it was sent as ``stale`` metadata
        (once, however many calls saw it refused), within ``timeout_s``.

        Raises:
            StoreUnavailable: etcd refused the password, or did not answer.
        """
        logger.info("etcd at %s refused the auth token; authenticating again", used.endpoint)
        try:
            async with asyncio.timeout(max(timeout_s, 0.0)):
                await used.client.reauthenticate(stale)
        except TRANSLATED as e:
            raise self.failed(used, e, f"{what} (authenticating again)") from e

    def track(self, stream: Any) -> None:
        """Registers a call that outlives one request (a watch stream) for ``close``."""
        self._streams.add(stream)

    def untrack(self, stream: Any) -> None:
        self._streams.discard(stream)

    async def backoff(self, attempt: int) -> None:
        """Sleeps 50 ms doubling to 1 s with jitter, or until the connection closes."""
        delay = min(_BACKOFF_MAX_S, _BACKOFF_MIN_S * 2 ** min(attempt - 1, 10))
        delay *= random.uniform(0.5, 1.0)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(delay):
                await self._closed_event.wait()

    async def close(self) -> None:
        """Cancels the tracked streams, closes every channel; later calls raise."""
        if self._closed:
            return
        self._closed = True
        self._closed_event.set()
        for stream in list(self._streams):
            stream.cancel()
        for task in list(self._retiring):
            task.cancel()
        await asyncio.gather(*self._retiring, return_exceptions=True)
        if self._current is not None:
            await _close_client(self._current)
            self._current = None

    def _open(self, index: int) -> EndpointClient:
        host, port = self._addresses[index]
        client = EtcdClient(
            host=host,
            port=port,
            timeout=self.rpc_timeout_s,
            options=_channel_options(self.rpc_timeout_s),
            access=self._access,
        )
        return EndpointClient(client, self.endpoints[index], index)

    def _failover(self, failed: EndpointClient) -> None:
        if len(self.endpoints) == 1 or self._closed or self._current is not failed:
            return
        self._current = self._open((failed.index + 1) % len(self.endpoints))
        logger.warning(
            "etcd endpoint %s failed; the next calls go to %s",
            failed.endpoint,
            self._current.endpoint,
        )
        self._retire(failed)

    def _retire(self, old: EndpointClient) -> None:
        # Calls still running on the old channel get their own deadline to finish.
        task = asyncio.create_task(
            _close_client(old, after_s=self.rpc_timeout_s), name=f"retire {old.endpoint}"
        )
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)


async def _close_client(closing: EndpointClient, *, after_s: float = 0.0) -> None:
    if after_s > 0:
        await asyncio.sleep(after_s)
    try:
        await closing.client.close()
    except TRANSLATED as e:
        logger.debug("closing the etcd client of %s: %s", closing.endpoint, e)
