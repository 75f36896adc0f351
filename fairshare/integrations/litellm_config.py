"""The LiteLLM callback's settings (docs/litellm.md, "Configuration"): one YAML file, named
by the environment variable ``FAIRSHARE_LITELLM_CONFIG``, read once when LiteLLM's proxy
loads the callback and checked whole: an error names the key (``team.from[1]: ...``) and
the proxy does not start.

Guaranteed: a ``Settings`` holds only checked values (known keys, types, a team source
among ``TEAM_SOURCES``, a pool name for every model group listed). Not guaranteed: that
the pools exist at the allocator (an unknown pool is refused per request, 500).
"""

from __future__ import annotations

import math
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import yaml

from fairshare import Class
from fairshare.cost import COST_UNITS, CostSettings

CONFIG_ENV: Final = "FAIRSHARE_LITELLM_CONFIG"
"""The environment variable that names the settings file."""
TEAM_SOURCES: Final = ("team_alias", "team_id", "key_alias", "header", "metadata")
"""Where a request's team may come from: LiteLLM's key (its team's alias or id, the key's
alias), a request header, the request's ``metadata``."""
CLASSES: Final = {"interactive": Class.INTERACTIVE, "batch": Class.BATCH}


class ConfigError(ValueError):
    """The settings are wrong; the message names the key."""


@dataclass(frozen=True)
class AllocatorSettings:
    """How the callback reaches the allocator (``fairshare.client.AllocatorClient``).

    Attributes:
        endpoints: replica addresses ``host:port``.
        holder: this proxy's holder name (stable across restarts is best); default
            ``litellm-<hostname>``.
        deadline_s: how long an acquire may look for a replica before the pool's degraded
            mode applies.
    """

    endpoints: tuple[str, ...]
    holder: str
    deadline_s: float = 0.75


@dataclass(frozen=True)
class TeamSettings:
    """Where a request's team comes from.

    Attributes:
        sources: tried in order, the first that names a team wins (``TEAM_SOURCES``).
        header: the request header of the ``header`` source (lower case).
        metadata: the key of the request's ``metadata`` of the ``metadata`` source.
        default: the team of a request no source names; None refuses it (401).
    """

    sources: tuple[str, ...] = ("team_alias", "team_id", "key_alias")
    header: str = "x-fairshare-team"
    metadata: str = "fairshare_team"
    default: str | None = None


@dataclass(frozen=True)
class ClassSettings:
    """The request's service class: the request's ``metadata`` under ``metadata``, else the
    key's metadata under the same name, else ``default``."""

    metadata: str = "fairshare_class"
    default: Class = Class.INTERACTIVE


@dataclass(frozen=True)
class Settings:
    """The whole configuration (see the module doc).

    Attributes:
        pools: LiteLLM model group (the ``model_name`` of ``model_list``) -> pool.
        default_pool: the pool of a model group not in ``pools``; None passes its requests
            on undecided (no ``priority``).
        headers: add the ``x-fairshare-*`` headers to answers.
        borrow_wait_s: how long a request that would borrow past its pool's lending limit
            (``lend``) may be held at the allocator for a slot, as the gateway's
            ``limits.borrow_wait_s``; 0: never held, answered at once as a borrower (the
            pool's ``on_wait_end`` does not apply).
    """

    allocator: AllocatorSettings
    pools: Mapping[str, str] = field(default_factory=dict)
    default_pool: str | None = None
    team: TeamSettings = field(default_factory=TeamSettings)
    service_class: ClassSettings = field(default_factory=ClassSettings)
    cost: CostSettings = field(default_factory=CostSettings)
    headers: bool = True
    borrow_wait_s: float = 60.0

    def pool_of(self, model_group: str) -> str | None:
        """The pool of ``model_group``, or None (not decided)."""
        return self.pools.get(model_group, self.default_pool)


def _mapping(key: str, value: object, allowed: tuple[str, ...]) -> Mapping[str, object]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{key}: expected a mapping, got {type(value).__name__}")
    for name in value:
        if name not in allowed:
            raise ConfigError(f"{key}.{name}: unknown key (known: {', '.join(allowed)})")
    return value


def _string(key: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{key}: expected a non-empty string, got {value!r}")
    return value


def _number(key: str, value: object, *, positive: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(f"{key}: expected a number, got {value!r}")
    if value < 0 or (positive and value == 0):
        raise ConfigError(f"{key}: expected a number {'> 0' if positive else '>= 0'}, got {value}")
    return float(value)


def _class(key: str, value: object) -> Class:
    if not isinstance(value, str) or value.strip().lower() not in CLASSES:
        raise ConfigError(f"{key}: expected one of {', '.join(CLASSES)}, got {value!r}")
    return CLASSES[value.strip().lower()]


def _allocator(value: object) -> AllocatorSettings:
    raw = _mapping("allocator", value, ("endpoints", "holder", "deadline_s"))
    endpoints = raw.get("endpoints")
    if not isinstance(endpoints, list) or not endpoints:
        raise ConfigError("allocator.endpoints: required, a list of host:port")
    for i, endpoint in enumerate(endpoints):
        text = _string(f"allocator.endpoints[{i}]", endpoint)
        host, sep, port = text.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ConfigError(f"allocator.endpoints[{i}]: expected host:port, got {text!r}")
    holder = raw.get("holder", f"litellm-{socket.gethostname()}")
    return AllocatorSettings(
        endpoints=tuple(endpoints),
        holder=_string("allocator.holder", holder),
        deadline_s=_number("allocator.deadline_s", raw.get("deadline_s", 0.75), positive=True),
    )


def _team(value: object) -> TeamSettings:
    raw = _mapping("team", value, ("from", "header", "metadata", "default"))
    given = raw.get("from", list(TeamSettings.sources))
    if not isinstance(given, list) or not given:
        raise ConfigError(f"team.from: expected a non-empty list of {', '.join(TEAM_SOURCES)}")
    for i, source in enumerate(given):
        if source not in TEAM_SOURCES:
            raise ConfigError(
                f"team.from[{i}]: expected one of {', '.join(TEAM_SOURCES)}, got {source!r}"
            )
    default = raw.get("default")
    return TeamSettings(
        sources=tuple(given),
        header=_string("team.header", raw.get("header", TeamSettings.header)).lower(),
        metadata=_string("team.metadata", raw.get("metadata", TeamSettings.metadata)),
        default=None if default is None else _string("team.default", default),
    )


def _service_class(value: object) -> ClassSettings:
    raw = _mapping("class", value, ("metadata", "default"))
    return ClassSettings(
        metadata=_string("class.metadata", raw.get("metadata", ClassSettings.metadata)),
        default=_class("class.default", raw.get("default", "interactive")),
    )


def _cost(value: object) -> CostSettings:
    raw = _mapping("cost", value, ("unit", "prompt_weight", "completion_weight"))
    unit = raw.get("unit", "tokens")
    if unit not in COST_UNITS:
        raise ConfigError(f"cost.unit: expected one of {', '.join(COST_UNITS)}, got {unit!r}")
    weights = {
        name: _number(f"cost.{name}", raw.get(name, 1.0), positive=False)
        for name in ("prompt_weight", "completion_weight")
    }
    return CostSettings(unit=str(unit), **weights)


def _pools(value: object) -> dict[str, str]:
    raw = _mapping("pools", value, tuple(value) if isinstance(value, Mapping) else ())
    return {_string("pools", group): _string(f"pools.{group}", pool) for group, pool in raw.items()}


TOP_KEYS: Final = (
    "allocator", "pools", "default_pool", "team", "class", "cost", "headers",
    "borrow_wait_s",
)  # fmt: skip


def parse(document: object) -> Settings:
    """The settings of a decoded YAML document.

    Raises:
        ConfigError: a key is unknown, missing or wrong (the message names it).
    """
    raw = _mapping("(top)", document, TOP_KEYS)
    if "allocator" not in raw:
        raise ConfigError("allocator: required (allocator.endpoints at least)")
    default_pool = raw.get("default_pool")
    headers = raw.get("headers", True)
    if not isinstance(headers, bool):
        raise ConfigError(f"headers: expected true or false, got {headers!r}")
    return Settings(
        allocator=_allocator(raw["allocator"]),
        pools=_pools(raw.get("pools")),
        default_pool=None if default_pool is None else _string("default_pool", default_pool),
        team=_team(raw.get("team")),
        service_class=_service_class(raw.get("class")),
        cost=_cost(raw.get("cost")),
        headers=headers,
        borrow_wait_s=_number("borrow_wait_s", raw.get("borrow_wait_s", 60.0), positive=False),
    )


def load(environ: Mapping[str, str] = os.environ) -> Settings:
    """The settings of the file ``FAIRSHARE_LITELLM_CONFIG`` names.

    Raises:
        ConfigError: no such variable, an unreadable file, not YAML, or wrong settings.
    """
    path = environ.get(CONFIG_ENV)
    if not path:
        raise ConfigError(f"{CONFIG_ENV}: not set; it names the callback's YAML settings file")
    try:
        document = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(f"{CONFIG_ENV}={path}: cannot be read as YAML: {e}") from e
    try:
        return parse(document)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from e
