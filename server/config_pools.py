"""The ``pools`` section of the configuration, read into ``ha.settings.PoolConfig``.

Every error names the pool's key path (``pools[1].shares.team-a``). What a valid shares
map is is decided by the core (``fairshare.check_shares``); what a valid pool is, by
``PoolConfig.validate``: this module only maps YAML onto them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Final

from fairshare import ShareError, check_lend, check_shares
from ha import ConfigError, DegradedMode, PoolConfig, UnknownTeams, WaitEnd
from server.config_values import read_choice, read_mapping, read_number, read_string

POOL_KEYS: Final = (
    "name",
    "capacity",
    "shares",
    "half_life_s",
    "max_request_s",
    "degraded_mode",
    "max_charge_per_s",
    "unknown_teams",
    "max_teams",
    "max_in_flight",
    "max_in_flight_per_holder",
    "lend",
    "on_wait_end",
    "max_held",
)


def parse_pools(value: object) -> tuple[PoolConfig, ...]:
    """Reads the ``pools`` list: every pool checked, in the order given.

    Raises:
        ConfigError: not a list of mappings, a key unknown or missing, a name repeated, or
            a value bad; ``path`` names it (``pools[1].shares.team-a``).
    """
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ConfigError("pools", f"must be a list of pools, got {value!r}")
    pools: list[PoolConfig] = []
    seen: dict[str, int] = {}
    for i, item in enumerate(value):
        path = f"pools[{i}]"
        spec = read_mapping(path, item, POOL_KEYS)
        for key in ("name", "capacity"):
            if key not in spec:
                raise ConfigError(f"{path}.{key}", "is required")
        name = read_string(f"{path}.name", spec["name"])
        if name in seen:
            raise ConfigError(f"{path}.name", f"duplicate pool name {name!r} (pools[{seen[name]}])")
        seen[name] = i
        capacity = spec["capacity"]
        if isinstance(capacity, bool) or not isinstance(capacity, int):
            raise ConfigError(f"{path}.capacity", f"must be an int, got {capacity!r}")
        shares = _team_map(f"{path}.shares", spec.get("shares"), check_shares, "share")
        lend = _team_map(f"{path}.lend", spec.get("lend"), check_lend, "fraction lent")
        defaults = {f.name: f.default for f in dataclasses.fields(PoolConfig)}
        pool = PoolConfig(
            name=name,
            capacity=capacity,
            shares=MappingProxyType(shares),
            half_life_s=read_number(
                f"{path}.half_life_s", spec.get("half_life_s", defaults["half_life_s"])
            ),
            max_request_s=read_number(
                f"{path}.max_request_s", spec.get("max_request_s", defaults["max_request_s"])
            ),
            degraded_mode=read_choice(
                f"{path}.degraded_mode",
                spec.get("degraded_mode", defaults["degraded_mode"].value),
                DegradedMode,
            ),
            max_charge_per_s=read_number(
                f"{path}.max_charge_per_s",
                spec.get("max_charge_per_s", defaults["max_charge_per_s"]),
            ),
            unknown_teams=read_choice(
                f"{path}.unknown_teams",
                spec.get("unknown_teams", defaults["unknown_teams"].value),
                UnknownTeams,
            ),
            max_teams=spec.get("max_teams", defaults["max_teams"]),  # type: ignore[arg-type]
            # Checked by validate; None (absent or null): the default, which follows C.
            max_in_flight=spec.get("max_in_flight"),  # type: ignore[arg-type]
            max_in_flight_per_holder=spec.get("max_in_flight_per_holder"),  # type: ignore[arg-type]
            lend=MappingProxyType(lend),
            on_wait_end=read_choice(
                f"{path}.on_wait_end",
                spec.get("on_wait_end", defaults["on_wait_end"].value),
                WaitEnd,
            ),
            max_held=spec.get("max_held"),  # type: ignore[arg-type]
        )
        pool.validate(path)
        pools.append(pool)
    return tuple(pools)


def _team_map(
    path: str, value: object, check: Callable[[Mapping[str, float]], dict[str, float]], what: str
) -> dict[str, float]:
    """Reads a mapping team -> number (absent or null: empty) through the core's check;
    an error names the entry (``pools[0].lend.team-a``)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(path, f"must be a mapping team -> {what}, got {value!r}")
    try:
        return check(value)
    except ShareError as e:
        raise ConfigError(f"{path}.{e.team}", e.reason) from None
