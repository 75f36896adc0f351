"""The gateway's configuration: one YAML file (docs/gateway.md, "Configuration").

``load`` reads and checks the whole file at start. Every error is a ``ConfigError`` whose
message names the key, as a dotted path (``models[1].upstreams[0]``), and says what is
wrong; ``fairshare gateway`` prints it and exits 2. Unknown keys are errors too, so a typo
is not silently ignored.

The keys of the issue (``listen``, ``metrics_listen``, ``allocator``, ``auth``, ``models``,
``cost``) are exactly as documented; ``limits``, ``health`` and ``redecide`` are the
gateway's own.
"""

from __future__ import annotations

import math
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Final
from urllib.parse import urlsplit

import yaml

from fairshare.routing import ROUTERS

DEFAULT_LISTEN: Final = "0.0.0.0:8080"
DEFAULT_METRICS_LISTEN: Final = "0.0.0.0:9091"
COST_UNITS: Final = ("tokens", "seconds")
MAX_PORT: Final = 65535
DEFAULT_ROUTING: Final = "fewest-ahead"
"""The router of a route whose configuration names none (docs/simulation.md)."""


class ConfigError(ValueError):
    """The file cannot be used; the message names the key."""


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


@dataclass(frozen=True)
class AuthSettings:
    """Where a request's team and class come from (``fairshare.gateway.identity``)."""

    keys_file: str | None = None
    team_header: str | None = None
    class_header: str | None = None


@dataclass(frozen=True)
class CostSettings:
    """What a release charges (``fairshare.gateway.cost``)."""

    unit: str = "tokens"
    prompt_weight: float = 1.0
    completion_weight: float = 1.0


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

    def model(self, name: str) -> Model | None:
        """The model named ``name``, or None."""
        return next((m for m in self.models if m.name == name), None)


# -- checked readers ------------------------------------------------------------------------


def _mapping(key: str, value: object, allowed: Sequence[str]) -> Mapping[str, object]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{key}: expected a mapping, got {type(value).__name__}")
    unknown = sorted(str(k) for k in value if k not in allowed)
    if unknown:
        where = f"{key}." if key else ""
        raise ConfigError(f"{where}{unknown[0]}: unknown key (known: {', '.join(allowed)})")
    return value


def _string(key: str, value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{key}: expected a non-empty string, got {value!r}")
    return value.strip()


def _opt_string(key: str, value: object) -> str | None:
    return None if value is None or value == "" else _string(key, value)


def _strings(key: str, value: object) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{key}: expected a non-empty list of strings, got {value!r}")
    return tuple(_string(f"{key}[{i}]", v) for i, v in enumerate(value))


def _number(key: str, value: object, *, positive: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(f"{key}: expected a number, got {value!r}")
    if value < 0 or (positive and value == 0):
        raise ConfigError(f"{key}: must be {'> 0' if positive else '>= 0'}, got {value!r}")
    return float(value)


def _integer(key: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{key}: expected an integer >= 1, got {value!r}")
    return value


def check_address(key: str, value: object) -> str:
    """``host:port`` with a port in 1..65535."""
    text = _string(key, value)
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) <= MAX_PORT:
        raise ConfigError(f"{key}: expected host:port, got {text!r}")
    return text


def _upstream(key: str, value: object) -> str:
    url = _string(key, value).rstrip("/")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{key}: expected an http(s):// base URL, got {url!r}")
    if parts.path.endswith("/v1"):
        raise ConfigError(f"{key}: give the server's base URL without /v1, got {url!r}")
    return url


def _routing(key: str, value: object) -> str:
    if value not in ROUTERS:
        raise ConfigError(f"{key}: expected one of {', '.join(ROUTERS)}, got {value!r}")
    return str(value)


def _route(key: str, value: object, *, routing: str = DEFAULT_ROUTING) -> Route:
    """One route; ``routing`` is its router when ``value`` names none."""
    raw = _mapping(key, value, ("pool", "upstreams", "routing"))
    for name in ("pool", "upstreams"):
        if name not in raw:
            raise ConfigError(f"{key}.{name}: required")
    upstreams = _strings(f"{key}.upstreams", raw["upstreams"])
    return Route(
        pool=_string(f"{key}.pool", raw["pool"]),
        upstreams=tuple(_upstream(f"{key}.upstreams[{i}]", u) for i, u in enumerate(upstreams)),
        routing=_routing(f"{key}.routing", raw["routing"]) if "routing" in raw else routing,
    )


def _models(value: object) -> tuple[Model, ...]:
    if not isinstance(value, list) or not value:
        raise ConfigError(f"models: expected a non-empty list, got {value!r}")
    models: list[Model] = []
    for i, item in enumerate(value):
        key = f"models[{i}]"
        raw = _mapping(key, item, ("name", "pool", "upstreams", "routing", "fallback"))
        if "name" not in raw:
            raise ConfigError(f"{key}.name: required")
        name = _string(f"{key}.name", raw["name"])
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
    raw = _mapping("allocator", value, ("endpoints", "holder", "deadline_s", "tls"))
    if "endpoints" not in raw:
        raise ConfigError("allocator.endpoints: required")
    endpoints = _strings("allocator.endpoints", raw["endpoints"])
    for i, endpoint in enumerate(endpoints):
        check_address(f"allocator.endpoints[{i}]", endpoint)
    tls = _mapping("allocator.tls", raw.get("tls"), ("ca_file", "cert_file", "key_file"))
    cert = _opt_string("allocator.tls.cert_file", tls.get("cert_file"))
    key = _opt_string("allocator.tls.key_file", tls.get("key_file"))
    if (cert is None) != (key is None):
        raise ConfigError("allocator.tls.key_file: cert_file and key_file go together")
    holder = raw.get("holder")
    return AllocatorSettings(
        endpoints=endpoints,
        holder=socket.gethostname() if holder is None else _string("allocator.holder", holder),
        deadline_s=_number("allocator.deadline_s", raw.get("deadline_s", 0.75)),
        tls_ca_file=_opt_string("allocator.tls.ca_file", tls.get("ca_file")),
        tls_cert_file=cert,
        tls_key_file=key,
    )


def _auth(value: object) -> AuthSettings:
    raw = _mapping("auth", value, ("keys_file", "team_header", "class_header"))
    return AuthSettings(
        keys_file=_opt_string("auth.keys_file", raw.get("keys_file")),
        team_header=_header("auth.team_header", raw.get("team_header")),
        class_header=_header("auth.class_header", raw.get("class_header")),
    )


def _header(key: str, value: object) -> str | None:
    name = _opt_string(key, value)
    if name is not None and (not name.isascii() or any(c in name for c in " :\t")):
        raise ConfigError(f"{key}: not an HTTP header name: {name!r}")
    return None if name is None else name.lower()


def _cost(value: object) -> CostSettings:
    raw = _mapping("cost", value, ("unit", "prompt_weight", "completion_weight"))
    unit = raw.get("unit", "tokens")
    if unit not in COST_UNITS:
        raise ConfigError(f"cost.unit: expected one of {', '.join(COST_UNITS)}, got {unit!r}")
    return CostSettings(
        unit=str(unit),
        prompt_weight=_number("cost.prompt_weight", raw.get("prompt_weight", 1.0), positive=False),
        completion_weight=_number(
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
    raw = _mapping("limits", value, names)

    def number(name: str, *, positive: bool = True) -> float:
        return _number(f"limits.{name}", raw.get(name, getattr(d, name)), positive=positive)

    def integer(name: str) -> int:
        return _integer(f"limits.{name}", raw.get(name, getattr(d, name)))

    return Limits(
        max_body_bytes=integer("max_body_bytes"),
        upstream_connect_s=number("upstream_connect_s"),
        upstream_first_byte_s=number("upstream_first_byte_s"),
        upstream_idle_s=number("upstream_idle_s"),
        max_connections=integer("max_connections"),
        max_client_connections=integer("max_client_connections"),
        header_timeout_s=number("header_timeout_s"),
        shutdown_grace_s=number("shutdown_grace_s", positive=False),
    )


def _health(value: object) -> HealthSettings:
    d = HealthSettings()
    raw = _mapping("health", value, tuple(f.name for f in fields(HealthSettings)))
    return HealthSettings(
        interval_s=_number("health.interval_s", raw.get("interval_s", d.interval_s)),
        timeout_s=_number("health.timeout_s", raw.get("timeout_s", d.timeout_s)),
        unhealthy_after=_integer(
            "health.unhealthy_after", raw.get("unhealthy_after", d.unhealthy_after)
        ),
        eject_after=_integer("health.eject_after", raw.get("eject_after", d.eject_after)),
    )


def _redecide(value: object) -> RedecideSettings:
    raw = _mapping("redecide", value, ("enabled", "max_per_signal"))
    enabled = raw.get("enabled", True)
    if not isinstance(enabled, bool):
        raise ConfigError(f"redecide.enabled: expected true or false, got {enabled!r}")
    return RedecideSettings(
        enabled=enabled,
        max_per_signal=_integer("redecide.max_per_signal", raw.get("max_per_signal", 64)),
    )


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
)


def parse(data: object) -> GatewayConfig:
    """Checks a parsed YAML document.

    Raises:
        ConfigError: naming the first wrong key.
    """
    raw = _mapping("", data, TOP_KEYS)
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
