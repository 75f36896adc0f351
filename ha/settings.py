"""Settings of the replication layer: pools and timings, frozen and validated at load.

The server's configuration loader builds these from YAML and ``FAIRSHARE_*`` variables;
everything here is plain data with units in the field names.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType

from fairshare.modes import DegradedMode, WaitEnd
from fairshare.shares import ShareError, check_lend, check_shares


class ConfigError(ValueError):
    """A setting is missing, of the wrong type or breaks a rule; ``path`` names it."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.message = message


def _finite(path: str, value: float, *, minimum: float = 0.0, strict: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(path, f"must be a number, got {value!r}")
    if not math.isfinite(value):
        raise ConfigError(path, f"must be finite, got {value!r}")
    if value < minimum or (strict and value == minimum):
        sign = ">" if strict else ">="
        raise ConfigError(path, f"must be {sign} {minimum}, got {value!r}")


class UnknownTeams(Enum):
    """Whether a pool serves teams that are not in its ``shares``."""

    ALLOW = "allow"
    """Serve them with share 0 (they borrow at the lowest rank), up to ``max_teams``."""
    DENY = "deny"
    """Refuse them with INVALID_ARGUMENT naming the field ``team``."""


MAX_CAPACITY = 2**31 - 1
"""The largest capacity a pool can have: the wire carries it in 32 bits."""
DEFAULT_MAX_TEAMS = 1024
"""Default of ``PoolConfig.max_teams``."""
MAX_MAX_TEAMS = 4096
"""The largest ``max_teams`` accepted; it keeps a snapshot of a pool whose team names are
all 256 bytes long under etcd's 1.5 MiB request limit (the figures: docs/ha.md, "Cost per
call")."""
HOLDER_IN_FLIGHT_PER_CAPACITY = 16
"""Default ``max_in_flight_per_holder``: this many times the pool's live capacity ...
Twice the deepest queue the simulator's scenarios model through one gateway (a batch job
with 8 x C outstanding, ``fairshare.sim.scenarios``), so an honest gateway meets it only with a
queue of 16 service times at vLLM."""
MIN_HOLDER_IN_FLIGHT = 128
"""... and never fewer than this many grants (small pools)."""
IN_FLIGHT_PER_CAPACITY = 32
"""Default ``max_in_flight``: this many times the pool's live capacity (two gateways at
their default bound) ..."""
MIN_IN_FLIGHT = 256
"""... and never fewer than this many grants (small pools)."""
HELD_PER_CAPACITY = 4
"""Default ``max_held``: this many times the pool's live capacity ... A held borrower
waits for a slot, and the pool frees about C of them per service time, so the last of
4 x C held waits about four service times with nobody else ahead: a wait much longer than
that is better ended (``on_wait_end``) than queued."""
MIN_HELD = 64
"""... and never fewer than this many held requests (small pools: one burst of a few
clients)."""


@dataclass(frozen=True, slots=True)
class PoolConfig:
    """One pool as configured.

    Attributes:
        name: pool name, unique.
        capacity: sustainable concurrency C (requests in flight), an int >= 0.
        shares: team -> share of C, a valid shares map (``fairshare.check_shares``);
            scaled down if they sum above 1.
        half_life_s: usage half-life in seconds; 0 disables decay. Default one week.
        max_request_s: longest a request can stay in flight, seconds; bounds how long a
            failover's phantoms count. Default 600.
        degraded_mode: what to answer when no owner can be reached.
        max_charge_per_s: the most cost units one grant can consume per second of its
            life (e.g. the GPUs one request can occupy, for GPU-seconds). A release
            charges at most ``max_charge()`` = this x ``max_request_s``. Default 8.
        unknown_teams: whether teams missing from ``shares`` are served. Default allow.
        max_teams: most teams the pool keeps state for at once, configured ones
            included; a request that would add one more is refused with
            RESOURCE_EXHAUSTED once no idle team can be forgotten. Default 1024.
        max_in_flight: grants the owner counts in flight for the pool (issued or
            adopted, phantoms not included) past which a request that would borrow is
            refused with RESOURCE_EXHAUSTED (one within its team's share never is:
            ``ha.owned.bounds``). None (default): ``IN_FLIGHT_PER_CAPACITY`` x the live
            capacity, at least ``MIN_IN_FLIGHT``. Never below the live capacity
            (``in_flight_bounds``).
        max_in_flight_per_holder: the same, for the grants of one holder. None
            (default): ``HOLDER_IN_FLIGHT_PER_CAPACITY`` x the live capacity, at least
            ``MIN_HOLDER_IN_FLIGHT``.
        lend: team -> the fraction (0..1) of its idle reserved slots it lends to
            borrowers (docs/spec.md §17), a valid lend map (``fairshare.check_lend``);
            a team missing here lends 1.0. Default empty: every team lends everything.
        on_wait_end: what a borrower held back by the lending limit gets when its wait
            ends before a slot is lent to it. Default borrow.
        max_held: the most borrowers held back at once (``fairshare.holding``); one more
            gets ``on_wait_end`` at once. None (default): ``HELD_PER_CAPACITY`` x the
            live capacity, at least ``MIN_HELD``; 0 holds none.
    """

    name: str
    capacity: int
    shares: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    half_life_s: float = 7 * 24 * 3600.0
    max_request_s: float = 600.0
    degraded_mode: DegradedMode = DegradedMode.FAIL_OPEN
    max_charge_per_s: float = 8.0

    def max_charge(self) -> float:
        """The most one release may charge: what a grant could consume in its life."""
        return self.max_charge_per_s * self.max_request_s

    def lends_all(self) -> bool:
        """Whether no team keeps slots back (no ``lend`` below 1): then nobody is held."""
        return all(fraction >= 1.0 for fraction in self.lend.values())

    unknown_teams: UnknownTeams = UnknownTeams.ALLOW
    max_teams: int = DEFAULT_MAX_TEAMS
    max_in_flight: int | None = None
    max_in_flight_per_holder: int | None = None
    lend: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    on_wait_end: WaitEnd = WaitEnd.BORROW
    max_held: int | None = None

    def in_flight_bounds(self, capacity: int) -> tuple[int, int]:
        """(the pool's bound, one holder's bound) on grants in flight while the pool's
        live capacity is ``capacity``: the configured values, else the defaults, which
        follow the capacity (a SetCapacity moves them). The pool's bound is never below
        ``capacity``."""
        pool = self.max_in_flight
        if pool is None:
            pool = max(IN_FLIGHT_PER_CAPACITY * capacity, MIN_IN_FLIGHT)
        holder = self.max_in_flight_per_holder
        if holder is None:
            holder = max(HOLDER_IN_FLIGHT_PER_CAPACITY * capacity, MIN_HOLDER_IN_FLIGHT)
        return max(pool, capacity), holder

    def held_bound(self, capacity: int) -> int:
        """The most borrowers held back at once while the pool's live capacity is
        ``capacity``: ``max_held`` if set, else the default, which follows the capacity."""
        if self.max_held is not None:
            return self.max_held
        return max(HELD_PER_CAPACITY * capacity, MIN_HELD)

    def validate(self, path: str = "pool") -> None:
        """Raises ConfigError naming the offending field."""
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError(f"{path}.name", "must be a non-empty string")
        if isinstance(self.capacity, bool) or not isinstance(self.capacity, int):
            raise ConfigError(f"{path}.capacity", f"must be an int, got {self.capacity!r}")
        if not 0 <= self.capacity <= MAX_CAPACITY:
            raise ConfigError(
                f"{path}.capacity", f"must be in [0, {MAX_CAPACITY}], got {self.capacity}"
            )
        try:
            check_shares(self.shares)
        except ShareError as e:
            raise ConfigError(f"{path}.shares", str(e)) from e
        _finite(f"{path}.half_life_s", self.half_life_s)
        _finite(f"{path}.max_request_s", self.max_request_s, strict=True)
        _finite(f"{path}.max_charge_per_s", self.max_charge_per_s, strict=True)
        if not isinstance(self.degraded_mode, DegradedMode):
            raise ConfigError(f"{path}.degraded_mode", "must be fail_open or fail_closed")
        if not isinstance(self.unknown_teams, UnknownTeams):
            raise ConfigError(f"{path}.unknown_teams", "must be allow or deny")
        if isinstance(self.max_teams, bool) or not isinstance(self.max_teams, int):
            raise ConfigError(f"{path}.max_teams", f"must be an int, got {self.max_teams!r}")
        if not max(1, len(self.shares)) <= self.max_teams <= MAX_MAX_TEAMS:
            raise ConfigError(
                f"{path}.max_teams",
                f"must be in [max(1, number of teams in shares) = {max(1, len(self.shares))}, "
                f"{MAX_MAX_TEAMS}], got {self.max_teams}",
            )
        self._check_in_flight(path)
        self._check_lending(path)

    def _check_lending(self, path: str) -> None:
        """Raises ConfigError for a bad lend map, wait-end mode or ``max_held``."""
        try:
            check_lend(self.lend)
        except ShareError as e:
            raise ConfigError(f"{path}.lend", str(e)) from e
        if not isinstance(self.on_wait_end, WaitEnd):
            raise ConfigError(f"{path}.on_wait_end", "must be borrow or refuse")
        held = self.max_held
        if held is not None:
            if isinstance(held, bool) or not isinstance(held, int):
                raise ConfigError(f"{path}.max_held", f"must be an int, got {held!r}")
            if held < 0:
                raise ConfigError(f"{path}.max_held", f"must be >= 0, got {held}")

    def _check_in_flight(self, path: str) -> None:
        """Raises ConfigError when a bound on grants in flight is set and not an int of
        at least 1 (and, for the pool's, at least ``capacity``)."""
        for name in ("max_in_flight", "max_in_flight_per_holder"):
            bound = getattr(self, name)
            if bound is None:
                continue
            if isinstance(bound, bool) or not isinstance(bound, int):
                raise ConfigError(f"{path}.{name}", f"must be an int, got {bound!r}")
            if bound < 1:
                raise ConfigError(f"{path}.{name}", f"must be >= 1, got {bound}")
        if self.max_in_flight is not None and self.max_in_flight < self.capacity:
            raise ConfigError(
                f"{path}.max_in_flight",
                f"must be >= capacity ({self.capacity}), got {self.max_in_flight}: it would "
                "refuse requests the pool has room for",
            )


@dataclass(frozen=True, slots=True)
class Timing:
    """Timings of leases, fencing, persistence and forwarding, in seconds.

    The rules between them (checked by ``validate``) keep self-fencing safe: an owner
    stops deciding before its lease can expire, and a successor never starts while the
    old owner may still decide.
    """

    lease_ttl_s: float = 5.0
    """T: the TTL of each replica's etcd lease."""
    keepalive_interval_s: float = 0.5
    """How often the lease is renewed; at most T/3. An etcd stall up to
    ``T - fence_margin_s - keepalive_interval_s`` costs no pool (docs/ha.md, "Stall
    budget"), so the default equals ``rpc_timeout_s``."""
    rpc_timeout_s: float = 0.5
    """Deadline of one etcd or peer call."""
    fence_margin_s: float = 1.0
    """An owner decides only until t_sent + T - margin (t_sent: last acknowledged renewal)."""
    snapshot_interval_s: float = 1.0
    """How often an owner writes each pool's snapshot; at most T/2."""
    commit_window_s: float = 0.001
    """Group commit: least time between the starts of two durable writes; every request
    that arrives meanwhile shares the next one, and a request that finds no write started
    within the window is written at once. Larger windows mean fewer writes under load
    and more latency at low load (why 1 ms: docs/benchmarks.md, "Cost of the durable
    write")."""
    release_commit_s: float = 0.005
    """The group commit window of releases. A release is acknowledged once a durable
    write covers it, and no request waits on it: its write starts this long after the
    previous write started (at once if that is past; sooner when an Acquire or the
    periodic snapshot writes first), so under load releases add at most one write per
    window and mostly share the writes that within-share Acquires start."""
    campaign_delay_s: float = 0.5
    """How long a replica that is not a pool's preferred owner waits before campaigning."""
    rebalance_settle_s: float = 30.0
    """Hysteresis of rebalancing: a pool moves to its preferred replica (or back to the
    target of an operator's switchover) only once that replica has been a live member
    without a break for this long, as this owner saw it. A replica that keeps restarting
    therefore does not drag its pools back and forth. 0 moves them at once."""
    degraded_after_s: float = 0.2
    """How long to look for an owner before applying the pool's degraded mode."""
    forward_deadline_s: float = 2.0
    """Overall deadline of a forwarded call, retries (route refreshes) included."""
    release_memory_s: float = 3600.0
    """How long an owner remembers released grant ids, so a retried release is a no-op."""
    session_ttl_s: float = 30.0
    """How long a holder session lives without being renewed (``ha.owned.sessions``); its grants
    then stop counting. Clients renew every third of it, so a renewal sent at two thirds
    must reach the owner within the last third, through a forwarding replica at worst:
    at least 3 x ``forward_deadline_s``; and an owner finds lapses on its tick: at least
    3 x ``snapshot_interval_s``."""

    @property
    def close_bound_s(self) -> float:
        """The longest a node's ``close`` takes (final snapshots within the lease, the
        revoke within one RPC, cancelled tasks and the store within a second each)."""
        return self.lease_ttl_s + 2 * self.rpc_timeout_s + 2.0

    def validate(self, max_request_s: float = 0.0, path: str = "timing") -> None:
        """Raises ConfigError when a value or a rule between values is broken.

        Args:
            max_request_s: the largest ``max_request_s`` of the configured pools.
            path: prefix for error paths.
        """
        for name in Timing.__slots__:
            _finite(f"{path}.{name}", getattr(self, name))
        t = self.lease_ttl_s
        for name in ("commit_window_s", "release_commit_s"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{path}.{name}", f"must be >= 0, got {getattr(self, name):g}")
        if t <= 0:
            raise ConfigError(f"{path}.lease_ttl_s", "must be > 0")
        if self.keepalive_interval_s <= 0 or self.keepalive_interval_s > t / 3:
            raise ConfigError(
                f"{path}.keepalive_interval_s",
                f"must be in (0, lease_ttl_s/3 = {t / 3:g}], got {self.keepalive_interval_s:g}",
            )
        budget = self.keepalive_interval_s + 2 * self.rpc_timeout_s
        if budget >= t - self.fence_margin_s:
            raise ConfigError(
                f"{path}.rpc_timeout_s",
                "keepalive_interval_s + 2*rpc_timeout_s must be < lease_ttl_s - fence_margin_s "
                f"({budget:g} >= {t - self.fence_margin_s:g})",
            )
        if self.snapshot_interval_s <= 0 or self.snapshot_interval_s > t / 2:
            raise ConfigError(
                f"{path}.snapshot_interval_s",
                f"must be in (0, lease_ttl_s/2 = {t / 2:g}], got {self.snapshot_interval_s:g}",
            )
        least = 3 * max(self.forward_deadline_s, self.snapshot_interval_s)
        if self.session_ttl_s < least:
            raise ConfigError(
                f"{path}.session_ttl_s",
                "must be >= 3 x max(forward_deadline_s, snapshot_interval_s) "
                f"= {least:g}, got {self.session_ttl_s:g}",
            )
        if self.fence_margin_s <= 0 or self.fence_margin_s >= t:
            raise ConfigError(f"{path}.fence_margin_s", "must be in (0, lease_ttl_s)")
        if self.release_memory_s < max_request_s:
            raise ConfigError(
                f"{path}.release_memory_s",
                f"must be >= the longest max_request_s ({max_request_s:g})",
            )


__all__ = [
    "DEFAULT_MAX_TEAMS",
    "HELD_PER_CAPACITY",
    "HOLDER_IN_FLIGHT_PER_CAPACITY",
    "IN_FLIGHT_PER_CAPACITY",
    "MAX_CAPACITY",
    "MAX_MAX_TEAMS",
    "MIN_HELD",
    "MIN_HOLDER_IN_FLIGHT",
    "MIN_IN_FLIGHT",
    "ConfigError",
    "DegradedMode",
    "PoolConfig",
    "Timing",
    "UnknownTeams",
    "WaitEnd",
]
