"""TLS material that follows its files: a rotated certificate is used without a restart.

cert-manager renews certificates into a Secret, and Kubernetes replaces the mounted files
in place (one atomic swap of the directory they are in). As the admin token does
(``server.auth``), the TLS material is read again when its files change: a change is a
new (inode, size, change time) of any of them, which no copy of an old file can fake
(``fairshare.filewatch`` follows them).

``Reloading`` is one value built from files (credentials, etcd's access), built again
when they change. The gRPC port asks it before every new connection's handshake
(``server_credentials``); the peer channels and the etcd client ask it before a call, at
most once per ``CHECK_EVERY_S``, and open new channels after a change.

Guarantees:
- A new connection to the gRPC port is handshaken with the files as they are then.
- A change reaches peer and etcd calls within ``CHECK_EVERY_S``: new channels carry it.
- A replacement that cannot be read, is not PEM, or whose key does not match its
  certificate leaves the previous material in force and is logged (once per change); a
  later fix is picked up the same way.

Non-guarantees: a connection already open keeps the certificate of its handshake (TLS
looks at certificates only then); a file replaced with identical bytes counts as a change
(the material is rebuilt, to no effect).
"""

from __future__ import annotations

import logging
import ssl
import time
from collections.abc import Callable, Sequence
from typing import Final, TypeVar

import grpc

from fairshare.filewatch import Followed
from ha import ConfigError
from server.config import Config
from server.tls_files import check_ca_bundle, check_cert_chain

__all__ = ["CHECK_EVERY_S", "Reloading", "peer_credentials", "server_credentials"]

logger = logging.getLogger(__name__)

CHECK_EVERY_S: Final = 1.0
"""How often a caller's files are looked at, at most (one ``stat`` per file)."""

T = TypeVar("T")


class Reloading(Followed[T]):
    """A value built from files, built again when they change (see module).

    Calling it returns the value in force: the same object until a rebuild succeeds. A
    file that disappears counts as a change (the rebuild fails, and says so).

    Args:
        paths: the files the value is built from.
        build: builds the value; raises ``ConfigError``, ``OSError``, ``ValueError`` or
            ``ssl.SSLError`` when the files are not usable.
        what: names the value in the log.
        check_every_s: the files are looked at no more often than this (0: every call).
        clock: monotonic seconds.

    Raises:
        ConfigError, OSError, ValueError, ssl.SSLError: the first build failed (at start).
    """

    def __init__(
        self,
        paths: Sequence[str],
        build: Callable[[], T],
        *,
        what: str,
        check_every_s: float = CHECK_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._what = what
        self._files = ", ".join(paths)
        super().__init__(
            paths,
            build,
            keep_on=(ConfigError, OSError, ValueError, ssl.SSLError),
            recheck_s=check_every_s,
            absent_is_change=True,
            on_read=self._rebuilt,
            on_kept=self._kept,
            clock=clock,
        )

    def _rebuilt(self, previous: T, value: T) -> None:
        logger.info("%s re-read from %s", self._what, self._files)

    def _kept(self, error: Exception) -> None:
        logger.warning("keeping the previous %s: its files changed but %s", self._what, error)


def _read(path: str | None) -> bytes | None:
    if path is None:
        return None
    with open(path, "rb") as f:
        return f.read()


def server_credentials(config: Config) -> grpc.ServerCredentials | None:
    """TLS credentials of the gRPC port that follow the files, or None for plaintext.

    Raises:
        ConfigError: a file is unreadable, not PEM, or the key does not match.
    """
    tls = config.tls
    cert_file, key_file = tls.cert_file, tls.key_file
    if cert_file is None or key_file is None:
        return None
    client_ca = tls.client_ca_file

    def build() -> grpc.ServerCertificateConfiguration:
        check_cert_chain("tls.cert_file", cert_file, key_file, ssl.PROTOCOL_TLS_SERVER)
        if client_ca is not None:
            check_ca_bundle("tls.client_ca_file", client_ca)
        return grpc.ssl_server_certificate_configuration(
            [(_read(key_file), _read(cert_file))], root_certificates=_read(client_ca)
        )

    paths = [p for p in (cert_file, key_file, client_ca) if p is not None]
    current = Reloading(paths, build, what="TLS certificate of the gRPC port", check_every_s=0)
    served = current()

    def fetch() -> grpc.ServerCertificateConfiguration | None:
        # gRPC asks before every handshake; None keeps what it has.
        nonlocal served
        latest = current()
        if latest is served:
            return None
        served = latest
        return latest

    return grpc.dynamic_ssl_server_credentials(
        served, fetch, require_client_authentication=tls.mutual
    )


def peer_credentials(config: Config) -> Callable[[], grpc.ChannelCredentials] | None:
    """The credentials for calls to other replicas (our own certificate as the client
    certificate), following the files; None without TLS.

    Raises:
        ConfigError: a file is unreadable, not PEM, or the key does not match.
    """
    tls = config.tls
    cert_file, key_file = tls.cert_file, tls.key_file
    if not tls.enabled or cert_file is None or key_file is None:
        return None
    ca = tls.client_ca_file

    def build() -> grpc.ChannelCredentials:
        check_cert_chain("tls.cert_file", cert_file, key_file, ssl.PROTOCOL_TLS_CLIENT)
        if ca is not None:
            check_ca_bundle("tls.client_ca_file", ca)
        return grpc.ssl_channel_credentials(
            root_certificates=_read(ca),
            private_key=_read(key_file),
            certificate_chain=_read(cert_file),
        )

    paths = [p for p in (cert_file, key_file, ca) if p is not None]
    return Reloading(paths, build, what="TLS certificate of the peer channels")
