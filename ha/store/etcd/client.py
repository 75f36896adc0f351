"""The aetcd client this store uses: aetcd's calls over a channel built here, TLS included.

aetcd 1.0.0's ``Client.connect`` opens only plaintext channels and authenticates once.
``EtcdClient`` keeps aetcd's calls and replaces ``connect``: it opens a TLS channel
(``grpc.aio.secure_channel``) when the endpoint is ``https://``, sends etcd's
require-leader metadata with every call, and with a username fetches an auth token that
``reauthenticate`` replaces when etcd no longer accepts it.

Guarantees:

- A channel is plaintext only for ``http://`` endpoints and TLS only for ``https://``
  ones: ``EtcdAccess`` is checked against the endpoints before any channel is opened.
- With a username, every call carries the token of the last successful authentication;
  ``reauthenticate`` fetches a new one once however many calls saw the old one fail.

Non-guarantees: a client keeps the certificates, key and password it was made with (a
rotated file reaches new clients through ``EtcdAccess.reload``). aetcd's own ``Watcher``
is not created (the store opens its own watch streams).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

import aetcd
import grpc
from aetcd import rpc

__all__ = ["REQUIRE_LEADER", "EtcdAccess", "EtcdClient"]

REQUIRE_LEADER: Final[tuple[tuple[str, str], ...]] = (("hasleader", "true"),)
"""etcd's require-leader metadata (clientv3 ``WithRequireLeader``): a member without a
leader refuses the call at once, and cancels an open watch with "no leader" once it has
had none for three election timeouts, instead of keeping it open and silent."""


@dataclass(frozen=True, slots=True)
class EtcdAccess:
    """How the store proves who it is to etcd, and how it checks etcd; all PEM bytes.

    Attributes:
        ca_pem: the CA bundle that verifies etcd's server certificate; set means TLS
            (``https://`` endpoints), None means plaintext (``http://``).
        cert_pem: the client certificate chain, for etcd's ``--client-cert-auth``.
        key_pem: the client certificate's private key; given with ``cert_pem``.
        username: the etcd user to authenticate as; None sends no token.
        password: that user's password; given with ``username``.
        reload: None (the access never changes), or a function that returns the access
            in force: the same object until the files behind it change, then a new one
            (with the same ``reload``), which the connection uses for its new channels.
    """

    ca_pem: bytes | None = None
    cert_pem: bytes | None = field(default=None, repr=False)
    key_pem: bytes | None = field(default=None, repr=False)
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    reload: Callable[[], EtcdAccess] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if (self.cert_pem is None) != (self.key_pem is None):
            raise ValueError("a client certificate and its key go together")
        if self.cert_pem is not None and self.ca_pem is None:
            raise ValueError("a client certificate needs TLS: give the CA as well")
        if (self.username is None) != (self.password is None):
            raise ValueError("an etcd username and its password go together")

    @property
    def tls(self) -> bool:
        """True when the channel is TLS."""
        return self.ca_pem is not None


class EtcdClient(aetcd.Client):  # type: ignore[misc]  # aetcd is untyped
    """aetcd's client over a channel this class opens (see the module docstring)."""

    def __init__(
        self, *, host: str, port: int, timeout: float, options: dict[str, Any], access: EtcdAccess
    ) -> None:
        super().__init__(host=host, port=port, timeout=timeout, options=options)
        self._access = access
        self._token: tuple[tuple[str, str], ...] = ()
        self._lock = asyncio.Lock()
        self.metadata = REQUIRE_LEADER

    async def connect(self) -> None:
        """Opens the channel (no round trip) and, with a username, authenticates.

        Raises:
            grpc.aio.AioRpcError: authentication failed (wrong password, no leader...).
        """
        if self._connected.is_set():
            return
        async with self._lock:
            if self._connected.is_set():
                return
            if self.channel is None:
                self._open_channel()
            if self._access.username is not None:
                await self._authenticate()
            self.metadata = REQUIRE_LEADER + self._token
            self._connected.set()

    async def reauthenticate(self, stale: Any) -> None:
        """Replaces the token that a call sent as ``stale`` metadata and etcd refused
        (expired, or issued before an auth change); nothing if another call already did.

        Raises:
            grpc.aio.AioRpcError: authentication failed.
        """
        if self._access.username is None:
            return
        async with self._lock:
            if self.metadata != stale or self.channel is None:
                return
            await self._authenticate()
            self.metadata = REQUIRE_LEADER + self._token

    def _open_channel(self) -> None:
        target = f"{self._host}:{self._port}"
        options = list(self._options.items())
        access = self._access
        if access.tls:
            credentials = grpc.ssl_channel_credentials(
                root_certificates=access.ca_pem,
                private_key=access.key_pem,
                certificate_chain=access.cert_pem,
            )
            self.channel = grpc.aio.secure_channel(target, credentials, options=options)
        else:
            self.channel = grpc.aio.insecure_channel(target, options=options)
        self.auth_stub = rpc.AuthStub(self.channel)
        self.kvstub = rpc.KVStub(self.channel)
        self.clusterstub = rpc.ClusterStub(self.channel)
        self.leasestub = rpc.LeaseStub(self.channel)
        self.maintenancestub = rpc.MaintenanceStub(self.channel)

    async def _authenticate(self) -> None:
        request = rpc.AuthenticateRequest(
            name=self._access.username, password=self._access.password
        )
        reply = await self.auth_stub.Authenticate(
            request, timeout=self._timeout, metadata=REQUIRE_LEADER
        )
        self._token = (("token", str(reply.token)),)
