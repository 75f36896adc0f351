"""The server's configuration: one YAML file, ``FAIRSHARE_*`` variables, command-line flags.

Precedence, lowest first: defaults < file < environment < command-line overrides. Every
value is checked when it loads; unknown keys and bad values are refused with
``ha.settings.ConfigError`` whose ``path`` names the key (``pools[1].shares.team-a``), so
an operator sees which line to fix before anything starts.

This module holds the settings' types, where each can come from and the rules between
them; ``server.config_values`` reads single values and ``server.config_pools`` the pools.

Unknown ``FAIRSHARE_*`` environment variables are ignored, not refused: Kubernetes injects
``<SERVICE>_PORT_...`` variables for every service, and a Service named ``fairshare`` would
otherwise stop every replica from starting.
"""

from __future__ import annotations

import os
import pathlib
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Final

import yaml

from ha import ConfigError, NodeId, PoolConfig, Timing, is_tls
from server.config_pools import parse_pools
from server.config_values import (
    check_address,
    read_mapping,
    read_number,
    read_opt_file,
    read_string,
    read_strings,
)

__all__ = [
    "AdminConfig",
    "Config",
    "ConfigError",
    "EtcdConfig",
    "GrpcConfig",
    "TlsConfig",
    "check_address",
    "load_config",
]

ENV_PREFIX: Final = "FAIRSHARE_"
LOG_LEVELS: Final = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
DEFAULT_LISTEN: Final = "127.0.0.1:50051"
DEFAULT_METRICS_LISTEN: Final = "127.0.0.1:9090"
DEFAULT_PREFIX: Final = "/fairshare"
DEFAULT_LOG_LEVEL: Final = "INFO"
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


@dataclass(frozen=True, slots=True)
class Config:
    """Everything ``fairshare serve`` needs.

    Attributes:
        node_id: this replica's id (the pod name); default the host name.
        listen: gRPC address ``host:port``; default ``127.0.0.1:50051``.
        advertise: address other replicas and clients reach this one at; default
            ``listen``.
        metrics_listen: Prometheus ``host:port``; empty string disables metrics.
        state_dir: directory of the local state file (embedded mode).
        etcd: the replicated store; no endpoints means embedded mode.
        timing: leases, fencing, persistence and forwarding timings.
        tls: TLS on the gRPC port.
        admin: admin-service credentials.
        grants: grant-id signing keys.
        grpc: connection lifetime on the gRPC port.
        log_level: one of DEBUG, INFO, WARNING, ERROR, CRITICAL.
        pools: the pools, names unique.
    """

    node_id: NodeId
    listen: str = DEFAULT_LISTEN
    advertise: str = DEFAULT_LISTEN
    metrics_listen: str = DEFAULT_METRICS_LISTEN
    state_dir: pathlib.Path = field(default_factory=lambda: pathlib.Path("state"))
    etcd: EtcdConfig = field(default_factory=EtcdConfig)
    timing: Timing = field(default_factory=Timing)
    tls: TlsConfig = field(default_factory=TlsConfig)
    admin: AdminConfig = field(default_factory=AdminConfig)
    grants: GrantsConfig = field(default_factory=GrantsConfig)
    grpc: GrpcConfig = field(default_factory=GrpcConfig)
    log_level: str = DEFAULT_LOG_LEVEL
    pools: tuple[PoolConfig, ...] = ()

    def pool(self, name: str) -> PoolConfig | None:
        """The configured pool of that name, or None."""
        return next((p for p in self.pools if p.name == name), None)


# -- where each setting can come from -----------------------------------------------------


class _Kind(Enum):
    STR = "str"
    OPT_STR = "optional str"
    FLOAT = "float"
    LIST = "list"


# Every scalar setting by dotted path, with the type its text form parses to.
_SCALARS: dict[str, _Kind] = {
    "node_id": _Kind.STR,
    "listen": _Kind.STR,
    "advertise": _Kind.STR,
    "metrics_listen": _Kind.STR,
    "state_dir": _Kind.STR,
    "log_level": _Kind.STR,
    "etcd.endpoints": _Kind.LIST,
    "etcd.prefix": _Kind.STR,
    "etcd.ca_file": _Kind.OPT_STR,
    "etcd.cert_file": _Kind.OPT_STR,
    "etcd.key_file": _Kind.OPT_STR,
    "etcd.username": _Kind.OPT_STR,
    "etcd.password_file": _Kind.OPT_STR,
    "tls.cert_file": _Kind.OPT_STR,
    "tls.key_file": _Kind.OPT_STR,
    "tls.client_ca_file": _Kind.OPT_STR,
    "tls.admin_identities": _Kind.LIST,
    "tls.peer_identities": _Kind.LIST,
    "admin.token_file": _Kind.OPT_STR,
    "grants.key_file": _Kind.OPT_STR,
    "grpc.max_connection_age_s": _Kind.FLOAT,
    "grpc.max_connection_age_grace_s": _Kind.FLOAT,
    **{f"timing.{name}": _Kind.FLOAT for name in Timing.__slots__},
}


def _env_name(path: str) -> str:
    """``etcd.endpoints`` -> FAIRSHARE_ETCD_ENDPOINTS; timings drop their section."""
    if path.startswith("timing."):
        path = path.removeprefix("timing.")
    return ENV_PREFIX + path.replace(".", "_").upper()


_ENV: dict[str, str] = {_env_name(path): path for path in _SCALARS}
_SECTIONS: dict[str, tuple[str, ...]] = {
    "etcd": (
        "endpoints",
        "prefix",
        "ca_file",
        "cert_file",
        "key_file",
        "username",
        "password_file",
    ),
    "timing": tuple(Timing.__slots__),
    "tls": ("cert_file", "key_file", "client_ca_file", "admin_identities", "peer_identities"),
    "admin": ("token_file",),
    "grants": ("key_file",),
    "grpc": ("max_connection_age_s", "max_connection_age_grace_s"),
}
_TOP = (
    "node_id",
    "listen",
    "advertise",
    "metrics_listen",
    "state_dir",
    "log_level",
    "pools",
    *_SECTIONS,
)


def _parse_text(path: str, text: str, source: str) -> object:
    """A setting given as text (environment or flag) in the type its path needs."""
    kind = _SCALARS[path]
    if kind is _Kind.LIST:
        return [item.strip() for item in text.split(",") if item.strip()]
    if kind is _Kind.FLOAT:
        try:
            return float(text)
        except ValueError:
            raise ConfigError(path, f"must be a number, got {text!r} from {source}") from None
    if kind is _Kind.OPT_STR and not text:
        return None
    return text


# -- loading ------------------------------------------------------------------------------


def load_config(
    path: str | os.PathLike[str] | None,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, object] | None = None,
) -> Config:
    """Loads, merges and validates the configuration.

    Args:
        path: the YAML file; None uses defaults (and the environment) only.
        environ: the environment to read ``FAIRSHARE_*`` from; default ``os.environ``.
        overrides: command-line values by dotted path (``listen``, ``etcd.endpoints``,
            ``timing.lease_ttl_s`` ...); None values are skipped. Strings are parsed like
            environment values (a comma-separated list for ``etcd.endpoints``).

    Returns:
        The frozen configuration.

    Raises:
        ConfigError: the file cannot be read or parsed, a key is unknown, or a value is
            bad; ``path`` names the key.
    """
    doc = _read_file(path) if path is not None else {}
    raw: dict[str, object] = dict(doc)
    sources: dict[str, str] = {}
    env = os.environ if environ is None else environ
    for name in sorted(env):
        target = _ENV.get(name)
        if target is not None:
            _put(raw, target, _parse_text(target, env[name], name))
            sources[target] = name
    for target, given in (overrides or {}).items():
        if given is None:
            continue
        if target not in _SCALARS:
            raise ConfigError(target, "unknown setting")
        value = given
        if isinstance(given, str | os.PathLike):
            value = _parse_text(target, os.fspath(given), "the command line")
        _put(raw, target, value)
        sources[target] = "the command line"
    try:
        return _build(raw)
    except ConfigError as e:
        source = sources.get(e.path)
        if source is None:
            raise
        raise ConfigError(e.path, f"{e.message} (from {source})") from e


def _read_file(path: str | os.PathLike[str]) -> Mapping[str, object]:
    try:
        with open(path, encoding="utf-8") as f:
            doc = yaml.safe_load(f)
    except OSError as e:
        raise ConfigError("config", f"cannot read {os.fspath(path)}: {e.strerror}") from e
    except UnicodeDecodeError as e:
        raise ConfigError(
            "config", f"{os.fspath(path)} is not UTF-8 text (byte offset {e.start})"
        ) from e
    except yaml.YAMLError as e:
        raise ConfigError("config", f"{os.fspath(path)} is not valid YAML: {e}") from e
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise ConfigError("config", f"{os.fspath(path)} must hold a mapping at the top level")
    return doc


def _put(raw: dict[str, object], path: str, value: object) -> None:
    section, _, key = path.partition(".")
    if not key:
        raw[section] = value
        return
    current = raw.get(section)
    if current is None:
        current = {}
    if not isinstance(current, dict):
        raise ConfigError(section, f"must be a mapping, got {current!r}")
    merged = dict(current)
    merged[key] = value
    raw[section] = merged


def _etcd(raw: Mapping[str, object]) -> EtcdConfig:
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


def _grpc(raw: Mapping[str, object]) -> GrpcConfig:
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


def _build(raw: Mapping[str, object]) -> Config:
    top = read_mapping("", raw, _TOP)
    node_id = read_string("node_id", top.get("node_id", socket.gethostname()))
    listen = check_address("listen", top.get("listen", DEFAULT_LISTEN))
    advertise = check_address("advertise", top.get("advertise", listen))
    metrics = read_string(
        "metrics_listen", top.get("metrics_listen", DEFAULT_METRICS_LISTEN), empty=True
    )
    if metrics:
        check_address("metrics_listen", metrics)
    state_dir = pathlib.Path(read_string("state_dir", top.get("state_dir", "state")))
    level = read_string("log_level", top.get("log_level", DEFAULT_LOG_LEVEL)).upper()
    if level not in LOG_LEVELS:
        raise ConfigError("log_level", f"must be one of {', '.join(LOG_LEVELS)}, got {level!r}")

    etcd = _etcd(read_mapping("etcd", top.get("etcd"), _SECTIONS["etcd"]))

    tls_raw = read_mapping("tls", top.get("tls"), _SECTIONS["tls"])
    tls = TlsConfig(
        cert_file=read_opt_file("tls.cert_file", tls_raw.get("cert_file")),
        key_file=read_opt_file("tls.key_file", tls_raw.get("key_file")),
        client_ca_file=read_opt_file("tls.client_ca_file", tls_raw.get("client_ca_file")),
        admin_identities=read_strings("tls.admin_identities", tls_raw.get("admin_identities")),
        peer_identities=read_strings("tls.peer_identities", tls_raw.get("peer_identities")),
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

    admin_raw = read_mapping("admin", top.get("admin"), _SECTIONS["admin"])
    admin = AdminConfig(token_file=read_opt_file("admin.token_file", admin_raw.get("token_file")))

    grants_raw = read_mapping("grants", top.get("grants"), _SECTIONS["grants"])
    grants = GrantsConfig(key_file=read_opt_file("grants.key_file", grants_raw.get("key_file")))
    if grants.key_file is None and etcd.endpoints:
        raise ConfigError(
            "grants.key_file",
            "is required with etcd endpoints: every replica must sign and verify grant ids "
            "with the same keys (see docs/deploy.md)",
        )

    grpc = _grpc(read_mapping("grpc", top.get("grpc"), _SECTIONS["grpc"]))

    pools = parse_pools(top.get("pools"))
    timing_raw = read_mapping("timing", top.get("timing"), _SECTIONS["timing"])
    timing = Timing(**{k: read_number(f"timing.{k}", v) for k, v in timing_raw.items()})
    timing.validate(max((p.max_request_s for p in pools), default=0.0), "timing")

    return Config(
        node_id=NodeId(node_id),
        listen=listen,
        advertise=advertise,
        metrics_listen=metrics,
        state_dir=state_dir,
        etcd=etcd,
        timing=timing,
        tls=tls,
        admin=admin,
        grants=grants,
        grpc=grpc,
        log_level=level,
        pools=pools,
    )
