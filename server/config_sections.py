"""The sections of the server's configuration beside the pools and the timings: ``etcd``,
``tls``, ``admin``, ``grants`` and ``grpc``; each one's frozen type and its reader.

A reader takes the section's mapping as ``server.config`` read it (unknown keys already
refused, environment and flags already merged in), checks each value
(``server.config_values``) and the rules inside the section, and returns the section's
type or raises ``ConfigError`` whose ``path`` names the key (``tls.key_file``).

Not here: the top-level settings, where a value comes from (file, environment, flags) and
which wins, and the rules between sections (``grants.key_file`` required with etcd
endpoints): ``server.config``. The pools are ``server.config_pools``'s, the timings
``ha.settings.Timing``'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from ha import ConfigError, is_tls
from server.config_values import read_number, read_opt_file, read_string, read_strings

DEFAULT_PREFIX: Final = "/fairshare"
DEFAULT_MAX_CONNECTION_AGE_S: Final = 300.0
DEFAULT_MAX_CONNECTION_AGE_GRACE_S: Final = 10.0


@dataclass(frozen=True, slots=True)
class EtcdConfig:
    """Where the replicated store lives.

    Attributes:
        endpoints: etcd endpoints, ``host:port`` or URLs; empty means embedded
            single-node mode (this node owns every pool, state in a local file).
            ``https://`` endpoints (all or none) are TLS and need ``ca_file``.
        prefix: key prefix of every key this service writes.
        ca_file: PEM bundle of the CA that signs etcd's server certificate.
        cert_file: PEM client certificate for etcd's ``--client-cert-auth``.
        key_file: its PEM private key; required with ``cert_file``.
        username: etcd user to authenticate as (etcd auth enabled).
        password_file: file holding that user's password (one line); required with
            ``username``. The password itself is never in the configuration.

    The files are checked when the server starts and followed while it runs: a rotated
    certificate or password reaches new etcd channels (``server.etcd_access``).
    """

    endpoints: tuple[str, ...] = ()
    prefix: str = DEFAULT_PREFIX
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    username: str | None = None
    password_file: str | None = None

    @property
    def embedded(self) -> bool:
        """True when no etcd endpoint is configured."""
        return not self.endpoints


@dataclass(frozen=True, slots=True)
class TlsConfig:
    """TLS on the gRPC port; all paths are PEM files.

    Attributes:
        cert_file: server certificate chain; None serves plaintext.
        key_file: server private key; required with ``cert_file``.
        client_ca_file: CA that signs client certificates; set means mutual TLS is
            required of every client.
        admin_identities: client-certificate subject CNs or SANs allowed to call the
            admin service (mutual TLS only).
        peer_identities: client-certificate CNs or SANs of the replicas themselves
            (mutual TLS only). Set, it binds holders to client certificates: any other
            caller may act only as a holder its certificate names (the CN or a SAN, alone
            or followed by ``/``), for Acquire, Release and Adopt.

    The files are followed while the server runs (``server.tls_reload``): a replaced
    certificate, key or CA is used for the next connections, with no restart.
    """

    cert_file: str | None = None
    key_file: str | None = None
    client_ca_file: str | None = None
    admin_identities: tuple[str, ...] = ()
    peer_identities: tuple[str, ...] = ()

    @property
    def enabled(self) -> bool:
        """True when the gRPC port serves TLS."""
        return self.cert_file is not None

    @property
    def mutual(self) -> bool:
        """True when clients must present a certificate signed by ``client_ca_file``."""
        return self.client_ca_file is not None


@dataclass(frozen=True, slots=True)
class AdminConfig:
    """Credentials of the admin service.

    Attributes:
        token_file: file holding the bearer token admin calls must present; None
            disables token authentication (then only mTLS identities are admitted, and
            with neither the admin service refuses every call).
    """

    token_file: str | None = None


@dataclass(frozen=True, slots=True)
class GrantsConfig:
    """How grant ids are signed (see docs/ha.md, "Grant ids").

    Attributes:
        key_file: file of grant keys, current first (a mounted Secret; followed for
            rotation). Required with etcd endpoints (every replica needs the same keys);
            in embedded mode None means a key generated in ``state_dir``.
    """

    key_file: str | None = None


@dataclass(frozen=True, slots=True)
class GrpcConfig:
    """Connection lifetime on the gRPC port.

    Gateways keep one HTTP/2 connection per channel, and a Service balances connections,
    not calls: after a rolling update every gateway stays on the replicas that were up
    while the others restarted. An age limit makes each client reconnect (and be balanced
    again) within about ``max_connection_age_s``.

    Attributes:
        max_connection_age_s: seconds after which the server asks a client to reconnect
            (an HTTP/2 GOAWAY; gRPC adds up to 10 % jitter so clients do not reconnect
            together). Calls in flight continue; new calls go on a new connection. Default
            300 (5 minutes): the imbalance a rollout leaves lasts at most that long, and a
            reconnect every few minutes costs nothing measurable.
        max_connection_age_grace_s: seconds the calls still running on an aged
            connection may take before it is closed under them; default 10, well above a
            forwarded call's deadline (``timing.forward_deadline_s``).

    Not guaranteed: a client that ignores GOAWAY keeps its calls until the grace ends.
    """

    max_connection_age_s: float = DEFAULT_MAX_CONNECTION_AGE_S
    max_connection_age_grace_s: float = DEFAULT_MAX_CONNECTION_AGE_GRACE_S

    def server_options(self) -> list[tuple[str, int]]:
        """The options of ``grpc.aio.server`` that carry these limits (milliseconds)."""
        return [
            ("grpc.max_connection_age_ms", round(self.max_connection_age_s * 1000)),
            ("grpc.max_connection_age_grace_ms", round(self.max_connection_age_grace_s * 1000)),
        ]


# -- readers ------------------------------------------------------------------------------


def read_etcd(raw: Mapping[str, object]) -> EtcdConfig:
    """The ``etcd`` section: endpoints all TLS or none, files and credentials in pairs."""
    username = raw.get("username")
    etcd = EtcdConfig(
        endpoints=read_strings("etcd.endpoints", raw.get("endpoints")),
        prefix=read_string("etcd.prefix", raw.get("prefix", DEFAULT_PREFIX)),
        ca_file=read_opt_file("etcd.ca_file", raw.get("ca_file")),
        cert_file=read_opt_file("etcd.cert_file", raw.get("cert_file")),
        key_file=read_opt_file("etcd.key_file", raw.get("key_file")),
        username=None if username in (None, "") else read_string("etcd.username", username),
        password_file=read_opt_file("etcd.password_file", raw.get("password_file")),
    )
    if not etcd.prefix.startswith("/"):
        raise ConfigError("etcd.prefix", f"must start with '/', got {etcd.prefix!r}")
    if (etcd.cert_file is None) != (etcd.key_file is None):
        missing = "etcd.key_file" if etcd.key_file is None else "etcd.cert_file"
        raise ConfigError(missing, "etcd.cert_file and etcd.key_file go together")
    if (etcd.username is None) != (etcd.password_file is None):
        missing = "etcd.password_file" if etcd.password_file is None else "etcd.username"
        raise ConfigError(missing, "etcd.username and etcd.password_file go together")
    secure = {is_tls(e) for e in etcd.endpoints}
    if len(secure) > 1:
        raise ConfigError("etcd.endpoints", "mixes https:// and plaintext endpoints")
    if secure == {True} and etcd.ca_file is None:
        raise ConfigError(
            "etcd.ca_file", "is required with https:// endpoints (the CA of etcd's certificate)"
        )
    for key, value in (("etcd.ca_file", etcd.ca_file), ("etcd.cert_file", etcd.cert_file)):
        if value is not None and secure != {True}:
            raise ConfigError(key, "needs https:// etcd endpoints")
    if etcd.username is not None and not etcd.endpoints:
        raise ConfigError("etcd.username", "needs etcd endpoints")
    return etcd


def read_tls(raw: Mapping[str, object]) -> TlsConfig:
    """The ``tls`` section: certificate and key in a pair, client CA and identities only
    on top of them."""
    tls = TlsConfig(
        cert_file=read_opt_file("tls.cert_file", raw.get("cert_file")),
        key_file=read_opt_file("tls.key_file", raw.get("key_file")),
        client_ca_file=read_opt_file("tls.client_ca_file", raw.get("client_ca_file")),
        admin_identities=read_strings("tls.admin_identities", raw.get("admin_identities")),
        peer_identities=read_strings("tls.peer_identities", raw.get("peer_identities")),
    )
    if (tls.cert_file is None) != (tls.key_file is None):
        missing = "tls.key_file" if tls.key_file is None else "tls.cert_file"
        raise ConfigError(missing, "tls.cert_file and tls.key_file go together")
    if tls.client_ca_file is not None and not tls.enabled:
        raise ConfigError("tls.client_ca_file", "mutual TLS needs tls.cert_file and tls.key_file")
    if tls.admin_identities and not tls.mutual:
        raise ConfigError("tls.admin_identities", "client identities need tls.client_ca_file")
    if tls.peer_identities and not tls.mutual:
        raise ConfigError("tls.peer_identities", "client identities need tls.client_ca_file")
    return tls


def read_admin(raw: Mapping[str, object]) -> AdminConfig:
    """The ``admin`` section."""
    return AdminConfig(token_file=read_opt_file("admin.token_file", raw.get("token_file")))


def read_grants(raw: Mapping[str, object]) -> GrantsConfig:
    """The ``grants`` section (whether it is required depends on ``etcd``: ``server.config``)."""
    return GrantsConfig(key_file=read_opt_file("grants.key_file", raw.get("key_file")))


def read_grpc(raw: Mapping[str, object]) -> GrpcConfig:
    """The ``grpc`` section: a connection age of at least a second, a grace >= 0."""
    age = read_number(
        "grpc.max_connection_age_s", raw.get("max_connection_age_s", DEFAULT_MAX_CONNECTION_AGE_S)
    )
    grace = read_number(
        "grpc.max_connection_age_grace_s",
        raw.get("max_connection_age_grace_s", DEFAULT_MAX_CONNECTION_AGE_GRACE_S),
    )
    # Below a second, clients would spend their time reconnecting.
    if age < 1.0:
        raise ConfigError("grpc.max_connection_age_s", f"must be at least 1, got {age:g}")
    if grace < 0.0:
        raise ConfigError("grpc.max_connection_age_grace_s", f"must not be negative, got {grace:g}")
    return GrpcConfig(max_connection_age_s=age, max_connection_age_grace_s=grace)
