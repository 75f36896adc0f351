"""The ``pools`` section of the configuration, read into ``ha.settings.PoolConfig``.

Every error names the pool's key path (``pools[1].shares.team-a``). What a valid shares
map is is decided by the core (``fairshare.check_shares``); what a valid pool is, by
``PoolConfig.validate``: this module only maps YAML onto them.
"""

from __future__ import annotations

import dataclasses
from types import MappingProxyType
from typing import Final

from fairshare import ShareError, check_shares
from ha import ConfigError, DegradedMode, PoolConfig, UnknownTeams
from server.config_values import read_mapping, read_number, read_string

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
        shares_raw = spec.get("shares")
        if shares_raw is None:
            shares_raw = {}
        if not isinstance(shares_raw, dict):
            raise ConfigError(
                f"{path}.shares", f"must be a mapping team -> share, got {shares_raw!r}"
            )
        try:
            shares = check_shares(shares_raw)
        except ShareError as e:
            raise ConfigError(f"{path}.shares.{e.team}", e.reason) from None
        defaults = {f.name: f.default for f in dataclasses.fields(PoolConfig)}
        mode_text = spec.get("degraded_mode", DegradedMode.FAIL_OPEN.value)
        try:
            mode = DegradedMode(mode_text)
        except ValueError:
            raise ConfigError(
                f"{path}.degraded_mode", f"must be fail_open or fail_closed, got {mode_text!r}"
            ) from None
        unknown_text = spec.get("unknown_teams", UnknownTeams.ALLOW.value)
        try:
            unknown = UnknownTeams(unknown_text)
        except ValueError:
            raise ConfigError(
                f"{path}.unknown_teams", f"must be allow or deny, got {unknown_text!r}"
            ) from None
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
            degraded_mode=mode,
            max_charge_per_s=read_number(
                f"{path}.max_charge_per_s",
                spec.get("max_charge_per_s", defaults["max_charge_per_s"]),
            ),
            unknown_teams=unknown,
            max_teams=spec.get("max_teams", defaults["max_teams"]),  # type: ignore[arg-type]
            # Checked by validate; None (absent or null): the default, which follows C.
            max_in_flight=spec.get("max_in_flight"),  # type: ignore[arg-type]
            max_in_flight_per_holder=spec.get("max_in_flight_per_holder"),  # type: ignore[arg-type]
        )
        pool.validate(path)
        pools.append(pool)
    return tuple(pools)
