"""The gateway's configuration: one YAML file (docs/gateway.md, "Configuration").

``load`` reads and checks the whole file at start. Every error is a ``ConfigError`` whose
message names the key, as a dotted path (``models[1].upstreams[0]``), and says what is
wrong; ``fairshare gateway`` prints it and exits 2. Unknown keys are errors too, so a typo
is not silently ignored.

The keys of the issue (``listen``, ``metrics_listen``, ``allocator``, ``auth``, ``models``,
``cost``) are exactly as documented; ``limits``, ``health``, ``redecide``, ``headers`` and
``access_log`` are the gateway's own.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Final

import yaml

from fairshare.cost import COST_UNITS, CostSettings
from fairshare.gateway import config_values as checked
from fairshare.gateway.config_values import ConfigError, check_address

DEFAULT_LISTEN: Final = "0.0.0.0:8080"
DEFAULT_METRICS_LISTEN: Final = "0.0.0.0:9091"
ACCESS_LOG_FORMATS: Final = ("json", "logfmt")
ACCESS_LOG_LEVELS: Final = ("DEBUG", "INFO", "WARNING")
DEFAULT_ROUTING: Final = "fewest-ahead"
"""The router of a route whose configuration names none (docs/simulation.md)."""


@dataclass(frozen=True)
class Route:
    """One pool serving a model, and its vLLM servers (base URLs, no trailing ``/``)."""

    pool: str
    upstreams: tuple[str, ...]
    routing: str = DEFAULT_ROUTING
    """The router choosing among ``upstreams`` (a name of ``fairshare.routing.ROUTERS``)."""


@dataclass(frozen=True)
class Model:
    """A model clients name in the body's ``model``; ``fallback`` routes in order."""

    name: str
    primary: Route
    fallback: tuple[Route, ...] = ()


@dataclass(frozen=True)
class AllocatorSettings:
    """How to reach the allocator (``client.AllocatorClient``'s options)."""

    endpoints: tuple[str, ...]
    holder: str
    deadline_s: float = 0.75
    tls_ca_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None


Network = ipaddress.IPv4Network | ipaddress.IPv6Network
LOOPBACK_PEERS: Final[tuple[Network, ...]] = (
    ipaddress.ip_network("127.0.0.0/8"),
    ipaddress.ip_network("::1/128"),
)
"""Whose headers are trusted by default: this host's own connections."""


@dataclass(frozen=True)
class AuthSettings:
    """Where a request's team and class come from (``fairshare.gateway.identity``).

    Attributes:
        keys_file: the API keys (``fairshare.gateway.keys``).
        team_header: a header naming the team, set by a proxy in front.
        class_header: a header naming the class of a request identified by a header.
        fairness_id: whether the Gateway API Inference Extension's
            ``x-gateway-inference-fairness-id`` header names the team (off by default).
        trusted_peers: the networks whose connections may identify a request by a header
            (the TCP peer's address; loopback only by default).
    """

    keys_file: str | None = None
    team_header: str | None = None
    class_header: str | None = None
    fairness_id: bool = False
    trusted_peers: tuple[Network, ...] = LOOPBACK_PEERS

    @property
    def any_source(self) -> bool:
        """Whether anything identifies a request (else every request is refused)."""
        return self.keys_file is not None or self.team_header is not None or self.fairness_id


@dataclass(frozen=True)
class Limits:
    """Bounds of the gateway itself (docs/gateway.md, "Timeouts and connections").

    Attributes:
        max_body_bytes: largest request body accepted (413 beyond).
        upstream_connect_s: time to open a connection to an upstream (another upstream
            is tried beyond).
        upstream_first_byte_s: from sending a request upstream to the first bytes the
            client may see: the first chunk of a stream, the whole answer otherwise (504
            beyond).
        upstream_idle_s: longest wait for the next chunk of a stream under way (the
            stream ends with an error event beyond).
        max_connections: the upstream connection pool's size (all upstreams together).
        max_client_connections: most client connections open at once; one more is
            closed as soon as it is accepted.
        header_timeout_s: time a client connection has to send a whole request head
            (from its opening, or from the first byte of a later request); it is closed
            beyond, before anything of the request is read.
        shutdown_grace_s: after SIGTERM, how long requests in flight may still run.
        borrow_wait_s: how long a request that would borrow past its pool's lending
            limit (the pool's ``lend``) may wait at the allocator for a slot, sent as its
            Acquire's ``wait_s``; 0: never (it is answered at once). A pool whose teams
            all lend everything holds nobody, whatever this says.
        stored_responses: most ids of Responses answers remembered with the vLLM server
            that made them, for the retrieval, the cancel and ``previous_response_id`` of
            a stored response (``fairshare.gateway.stored``); the least recently used is
            forgotten first.

    A request's total time is not bounded: its grant lives as long as the gateway's
    holder session, which the client library renews.
    """

    max_body_bytes: int = 4 * 1024 * 1024
    upstream_connect_s: float = 5.0
    upstream_first_byte_s: float = 300.0
    upstream_idle_s: float = 60.0
    max_connections: int = 1000
    max_client_connections: int = 4096
    header_timeout_s: float = 10.0
    shutdown_grace_s: float = 30.0
    borrow_wait_s: float = 60.0
    stored_responses: int = 10_000


@dataclass(frozen=True)
class HealthSettings:
    """Upstream health (``fairshare.gateway.health``).

    Attributes:
        interval_s: between two probes of an upstream's ``/health``.
        timeout_s: a probe not answered 200 within it failed.
        unhealthy_after: consecutive failed probes that eject an upstream.
        eject_after: consecutive failed requests (connection errors, 5xx) that eject it.

    An ejected upstream gets no request until a probe succeeds.
    """

    interval_s: float = 5.0
    timeout_s: float = 2.0
    unhealthy_after: int = 2
    eject_after: int = 5


@dataclass(frozen=True)
class RedecideSettings:
    """Fail-open requests sent again once an owner answers (``fairshare.gateway.redecide``).

    Attributes:
        enabled: on by default.
        max_per_signal: most requests re-decided per owner answer (the rest at the next).
    """

    enabled: bool = True
    max_per_signal: int = 64


@dataclass(frozen=True)
class HeaderSettings:
    """Headers the gateway never passes on (``fairshare.gateway.headers``).

    Attributes:
        deny: names (lower case) passed neither to the upstream nor back to the client,
            beyond the hop-by-hop headers and the client's credentials.
    """

    deny: tuple[str, ...] = ()


@dataclass(frozen=True)
class AccessLogSettings:
    """The access log (``fairshare.gateway.accesslog``).

    Attributes:
        enabled: one line per request; on by default.
        format: ``json`` (one object a line) or ``logfmt`` (``key=value``).
        level: the level of the lines on the logger ``fairshare.gateway.access``.
    """

    enabled: bool = True
    format: str = "json"
    level: str = "INFO"


@dataclass(frozen=True)
class GatewayConfig:
    """The whole configuration, checked."""

    allocator: AllocatorSettings
    models: tuple[Model, ...]
    listen: str = DEFAULT_LISTEN
    metrics_listen: str = DEFAULT_METRICS_LISTEN
    auth: AuthSettings = field(default_factory=AuthSettings)
    cost: CostSettings = field(default_factory=CostSettings)
    limits: Limits = field(default_factory=Limits)
    health: HealthSettings = field(default_factory=HealthSettings)
    redecide: RedecideSettings = field(default_factory=RedecideSettings)
    headers: HeaderSettings = field(default_factory=HeaderSettings)
    access_log: AccessLogSettings = field(default_factory=AccessLogSettings)

    def model(self, name: str) -> Model | None:
        """The model named ``name``, or None."""
        return next((m for m in self.models if m.name == name), None)


def _route(key: str, value: object, *, routing: str = DEFAULT_ROUTING) -> Route:
    """One route; ``routing`` is its router when ``value`` names none."""
    raw = checked.mapping(key, value, ("pool", "upstreams", "routing"))
    for name in ("pool", "upstreams"):
        if name not in raw:
            raise ConfigError(f"{key}.{name}: required")
    upstreams = checked.strings(f"{key}.upstreams", raw["upstreams"])
    return Route(
        pool=checked.string(f"{key}.pool", raw["pool"]),
        upstreams=tuple(
            checked.upstream_url(f"{key}.upstreams[{i}]", u) for i, u in enumerate(upstreams)
        ),
        routing=checked.routing(f"{key}.routing", raw["routing"]) if "routing" in raw else routing,
    )


def _models(value: object) -> tuple[Model, ...]:
    if not isinstance(value, list) or not value:
        raise ConfigError(f"models: expected a non-empty list, got {value!r}")
    models: list[Model] = []
    for i, item in enumerate(value):
        key = f"models[{i}]"
        raw = checked.mapping(key, item, ("name", "pool", "upstreams", "routing", "fallback"))
        if "name" not in raw:
            raise ConfigError(f"{key}.name: required")
        name = checked.string(f"{key}.name", raw["name"])
        if any(m.name == name for m in models):
            raise ConfigError(f"{key}.name: {name!r} is listed twice")
        primary = _route(key, {k: raw[k] for k in ("pool", "upstreams", "routing") if k in raw})
        fallback_raw = raw.get("fallback") or []
        if not isinstance(fallback_raw, list):
            raise ConfigError(f"{key}.fallback: expected a list, got {fallback_raw!r}")
        fallback = tuple(
            _route(f"{key}.fallback[{j}]", f, routing=primary.routing)
            for j, f in enumerate(fallback_raw)
        )
        pools = [primary.pool, *(f.pool for f in fallback)]
        if len(set(pools)) != len(pools):
            raise ConfigError(f"{key}.fallback: a pool is listed twice: {pools}")
        models.append(Model(name=name, primary=primary, fallback=fallback))
    return tuple(models)


def _allocator(value: object) -> AllocatorSettings:
    raw = checked.mapping("allocator", value, ("endpoints", "holder", "deadline_s", "tls"))
    if "endpoints" not in raw:
        raise ConfigError("allocator.endpoints: required")
    endpoints = checked.strings("allocator.endpoints", raw["endpoints"])
    for i, endpoint in enumerate(endpoints):
        check_address(f"allocator.endpoints[{i}]", endpoint)
    tls = checked.mapping("allocator.tls", raw.get("tls"), ("ca_file", "cert_file", "key_file"))
    cert = checked.opt_string("allocator.tls.cert_file", tls.get("cert_file"))
    key = checked.opt_string("allocator.tls.key_file", tls.get("key_file"))
    if (cert is None) != (key is None):
        raise ConfigError("allocator.tls.key_file: cert_file and key_file go together")
    holder = raw.get("holder")
    return AllocatorSettings(
        endpoints=endpoints,
        holder=socket.gethostname()
        if holder is None
        else checked.string("allocator.holder", holder),
        deadline_s=checked.number("allocator.deadline_s", raw.get("deadline_s", 0.75)),
        tls_ca_file=checked.opt_string("allocator.tls.ca_file", tls.get("ca_file")),
        tls_cert_file=cert,
        tls_key_file=key,
    )


AUTH_KEYS: Final = ("keys_file", "team_header", "class_header", "fairness_id", "trusted_peers")


def _auth(value: object) -> AuthSettings:
    raw = checked.mapping("auth", value, AUTH_KEYS)
    fairness_id = raw.get("fairness_id", False)
    if not isinstance(fairness_id, bool):
        raise ConfigError(f"auth.fairness_id: expected true or false, got {fairness_id!r}")
    return AuthSettings(
        keys_file=checked.opt_string("auth.keys_file", raw.get("keys_file")),
        team_header=_header("auth.team_header", raw.get("team_header")),
        class_header=_header("auth.class_header", raw.get("class_header")),
        fairness_id=fairness_id,
        trusted_peers=(
            _networks("auth.trusted_peers", raw["trusted_peers"])
            if "trusted_peers" in raw
            else LOOPBACK_PEERS
        ),
    )


def _networks(key: str, value: object) -> tuple[Network, ...]:
    """A list of addresses or networks (``10.0.0.0/8``, ``fd00::/8``, ``192.0.2.7``); an
    empty list trusts no one."""
    if not isinstance(value, list):
        raise ConfigError(f"{key}: expected a list of addresses or networks, got {value!r}")
    networks: list[Network] = []
    for i, item in enumerate(value):
        text = checked.string(f"{key}[{i}]", item)
        try:
            networks.append(ipaddress.ip_network(text))
        except ValueError as e:
            raise ConfigError(f"{key}[{i}]: expected an address or network: {e}") from None
    return tuple(networks)


def _header(key: str, value: object) -> str | None:
    name = checked.opt_string(key, value)
    if name is not None and (not name.isascii() or any(c in name for c in " :\t")):
        raise ConfigError(f"{key}: not an HTTP header name: {name!r}")
    return None if name is None else name.lower()


def _cost(value: object) -> CostSettings:
    raw = checked.mapping("cost", value, ("unit", "prompt_weight", "completion_weight"))
    unit = raw.get("unit", "tokens")
    if unit not in COST_UNITS:
        raise ConfigError(f"cost.unit: expected one of {', '.join(COST_UNITS)}, got {unit!r}")
    return CostSettings(
        unit=str(unit),
        prompt_weight=checked.number(
            "cost.prompt_weight", raw.get("prompt_weight", 1.0), positive=False
        ),
        completion_weight=checked.number(
            "cost.completion_weight", raw.get("completion_weight", 1.0), positive=False
        ),
    )


RENAMED: Final = {
    "limits.upstream_timeout_s": "limits.upstream_first_byte_s and limits.upstream_idle_s"
}
"""Keys of earlier versions, and what replaced them (the error names both)."""


def _limits(value: object) -> Limits:
    d = Limits()
    names = tuple(f.name for f in fields(Limits))
    if isinstance(value, Mapping):
        for name in value:
            if f"limits.{name}" in RENAMED:
                raise ConfigError(f"limits.{name}: replaced by {RENAMED[f'limits.{name}']}")
    raw = checked.mapping("limits", value, names)

    def seconds(name: str, *, positive: bool = True) -> float:
        return checked.number(f"limits.{name}", raw.get(name, getattr(d, name)), positive=positive)

    def count(name: str) -> int:
        return checked.integer(f"limits.{name}", raw.get(name, getattr(d, name)))

    return Limits(
        max_body_bytes=count("max_body_bytes"),
        upstream_connect_s=seconds("upstream_connect_s"),
        upstream_first_byte_s=seconds("upstream_first_byte_s"),
        upstream_idle_s=seconds("upstream_idle_s"),
        max_connections=count("max_connections"),
        max_client_connections=count("max_client_connections"),
        header_timeout_s=seconds("header_timeout_s"),
        shutdown_grace_s=seconds("shutdown_grace_s", positive=False),
        borrow_wait_s=seconds("borrow_wait_s", positive=False),
        stored_responses=count("stored_responses"),
    )


def _health(value: object) -> HealthSettings:
    d = HealthSettings()
    raw = checked.mapping("health", value, tuple(f.name for f in fields(HealthSettings)))
    return HealthSettings(
        interval_s=checked.number("health.interval_s", raw.get("interval_s", d.interval_s)),
        timeout_s=checked.number("health.timeout_s", raw.get("timeout_s", d.timeout_s)),
        unhealthy_after=checked.integer(
            "health.unhealthy_after", raw.get("unhealthy_after", d.unhealthy_after)
        ),
        eject_after=checked.integer("health.eject_after", raw.get("eject_after", d.eject_after)),
    )


def _redecide(value: object) -> RedecideSettings:
    raw = checked.mapping("redecide", value, ("enabled", "max_per_signal"))
    enabled = raw.get("enabled", True)
    if not isinstance(enabled, bool):
        raise ConfigError(f"redecide.enabled: expected true or false, got {enabled!r}")
    return RedecideSettings(
        enabled=enabled,
        max_per_signal=checked.integer("redecide.max_per_signal", raw.get("max_per_signal", 64)),
    )


def _headers(value: object) -> HeaderSettings:
    raw = checked.mapping("headers", value, ("deny",))
    deny = raw.get("deny") or []
    if not isinstance(deny, list):
        raise ConfigError(f"headers.deny: expected a list of header names, got {deny!r}")
    keys = (f"headers.deny[{i}]" for i in range(len(deny)))
    names = (_header(key, checked.string(key, name)) for key, name in zip(keys, deny, strict=True))
    return HeaderSettings(deny=tuple(name for name in names if name is not None))


def _access_log(value: object) -> AccessLogSettings:
    raw = checked.mapping("access_log", value, ("enabled", "format", "level"))
    d = AccessLogSettings()
    enabled = raw.get("enabled", d.enabled)
    if not isinstance(enabled, bool):
        raise ConfigError(f"access_log.enabled: expected true or false, got {enabled!r}")
    form = raw.get("format", d.format)
    if form not in ACCESS_LOG_FORMATS:
        raise ConfigError(
            f"access_log.format: expected one of {', '.join(ACCESS_LOG_FORMATS)}, got {form!r}"
        )
    level = raw.get("level", d.level)
    if not isinstance(level, str) or level.upper() not in ACCESS_LOG_LEVELS:
        raise ConfigError(
            f"access_log.level: expected one of {', '.join(ACCESS_LOG_LEVELS)}, got {level!r}"
        )
    return AccessLogSettings(enabled=enabled, format=str(form), level=level.upper())


TOP_KEYS: Final = (
    "listen",
    "metrics_listen",
    "allocator",
    "auth",
    "models",
    "cost",
    "limits",
    "health",
    "redecide",
    "headers",
    "access_log",
)


def parse(data: object) -> GatewayConfig:
    """Checks a parsed YAML document.

    Raises:
        ConfigError: naming the first wrong key.
    """
    raw = checked.mapping("", data, TOP_KEYS)
    for name in ("allocator", "models"):
        if name not in raw:
            raise ConfigError(f"{name}: required")
    metrics = raw.get("metrics_listen", DEFAULT_METRICS_LISTEN)
    return GatewayConfig(
        listen=check_address("listen", raw.get("listen", DEFAULT_LISTEN)),
        metrics_listen="" if metrics in ("", None) else check_address("metrics_listen", metrics),
        allocator=_allocator(raw["allocator"]),
        auth=_auth(raw.get("auth")),
        models=_models(raw["models"]),
        cost=_cost(raw.get("cost")),
        limits=_limits(raw.get("limits")),
        health=_health(raw.get("health")),
        redecide=_redecide(raw.get("redecide")),
        headers=_headers(raw.get("headers")),
        access_log=_access_log(raw.get("access_log")),
    )


def load(path: str | Path) -> GatewayConfig:
    """Reads and checks the file at ``path``.

    Raises:
        ConfigError: the file cannot be read, is not YAML, or a key is wrong.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"cannot read {path}: {e.strerror or e}") from e
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from e
    return parse(data)
