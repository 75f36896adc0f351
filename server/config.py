"""The server's configuration: one YAML file, ``FAIRSHARE_*`` variables, command-line flags.

Precedence, lowest first: defaults < file < environment < command-line overrides. Every
value is checked when it loads; unknown keys and bad values are refused with
``ha.settings.ConfigError`` whose ``path`` names the key (``pools[1].shares.team-a``), so
an operator sees which line to fix before anything starts.

This module holds ``Config``, where each setting can come from and the rules between
sections; ``server.config_sections`` holds the types and readers of the sections beside
the pools (``etcd``, ``tls``, ``admin``, ``grants``, ``grpc``), ``server.config_pools``
reads the pools and ``server.config_values`` single values. Every name it imports from
them for its callers (``EtcdConfig``, ``GrpcConfig`` ...) stays importable from here.

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

from ha import ConfigError, NodeId, PoolConfig, Timing
from server.config_pools import parse_pools
from server.config_sections import (
    DEFAULT_MAX_CONNECTION_AGE_GRACE_S,
    DEFAULT_MAX_CONNECTION_AGE_S,
    DEFAULT_PREFIX,
    AdminConfig,
    EtcdConfig,
    GrantsConfig,
    GrpcConfig,
    TlsConfig,
    read_admin,
    read_etcd,
    read_grants,
    read_grpc,
    read_tls,
)
from server.config_values import check_address, read_mapping, read_number, read_string

__all__ = [
    "DEFAULT_MAX_CONNECTION_AGE_GRACE_S",
    "DEFAULT_MAX_CONNECTION_AGE_S",
    "DEFAULT_PREFIX",
    "AdminConfig",
    "Config",
    "ConfigError",
    "EtcdConfig",
    "GrantsConfig",
    "GrpcConfig",
    "TlsConfig",
    "check_address",
    "load_config",
]

ENV_PREFIX: Final = "FAIRSHARE_"
LOG_LEVELS: Final = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
DEFAULT_LISTEN: Final = "127.0.0.1:50051"
DEFAULT_METRICS_LISTEN: Final = "127.0.0.1:9090"
DEFAULT_LOG_LEVEL: Final = "INFO"


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

    etcd = read_etcd(read_mapping("etcd", top.get("etcd"), _SECTIONS["etcd"]))
    tls = read_tls(read_mapping("tls", top.get("tls"), _SECTIONS["tls"]))
    admin = read_admin(read_mapping("admin", top.get("admin"), _SECTIONS["admin"]))
    grants = read_grants(read_mapping("grants", top.get("grants"), _SECTIONS["grants"]))
    if grants.key_file is None and etcd.endpoints:
        raise ConfigError(
            "grants.key_file",
            "is required with etcd endpoints: every replica must sign and verify grant ids "
            "with the same keys (see docs/deploy.md)",
        )

    grpc = read_grpc(read_mapping("grpc", top.get("grpc"), _SECTIONS["grpc"]))

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
