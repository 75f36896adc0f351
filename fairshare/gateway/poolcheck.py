"""The configuration's pools checked against the allocator's, at start and after.

A model whose pool the allocator does not have would answer every request with an error,
and a retryable one at that: the mistake must stop the gateway where it is made. At start
``fairshare gateway`` reads the allocator's pools (ListPools) and exits 2 naming each
configuration key whose pool is not among them (``models[1].pool``,
``models[0].fallback[0].pool``). When the allocator does not answer at start, the gateway
serves not ready and checks at the first answer, exiting 2 then if a pool is unknown.
Every later answer (``/readyz`` reads ListPools) is checked again: a pool the allocator no
longer has makes the gateway not ready, naming the key, and its requests are answered 500
without ``Retry-After`` (``fairshare.gateway.proxy``).

Not guaranteed: that a pool listed at one answer is still there at the next request.
"""

from __future__ import annotations

from collections.abc import Iterable

from fairshare.gateway.config import GatewayConfig


def unknown_pools(config: GatewayConfig, pools: Iterable[str]) -> list[str]:
    """A message per configuration key naming a pool not in ``pools`` (the allocator's)."""
    known = set(pools)
    listing = ", ".join(sorted(known)) or "none"
    problems: list[str] = []
    for i, model in enumerate(config.models):
        keys = [(f"models[{i}].pool", model.primary.pool)]
        keys += [(f"models[{i}].fallback[{j}].pool", r.pool) for j, r in enumerate(model.fallback)]
        problems += [
            f"{key}: {pool!r} is not a pool of the allocator (its pools: {listing})"
            for key, pool in keys
            if pool not in known
        ]
    return problems


class PoolCheck:
    """What the allocator's answers said of the configuration's pools."""

    def __init__(self, config: GatewayConfig) -> None:
        self._config = config
        self.checked = False
        """An answer of the allocator was checked (since start)."""
        self.problems: list[str] = []
        """What the last answer said is wrong ([] when nothing)."""

    def observe(self, pools: Iterable[str]) -> list[str]:
        """Checks one answer (the pool names of a ListPools); returns its problems."""
        self.problems = unknown_pools(self._config, pools)
        self.checked = True
        return self.problems
