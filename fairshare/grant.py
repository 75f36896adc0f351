"""The decision for one request, and what its release charges.

A grant issued by a ``Pool`` is counted in that pool until released; a remote grant
(decided by the replica that owns the pool) is counted nowhere here and reports its
release through a callback. Either way only the first ``release`` counts.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fairshare.pool import Pool
    from fairshare.team import TeamState


def consumption(consumed: float) -> float:
    """Consumption as charged: negative, NaN, infinite or non-numeric values count as 0."""
    try:
        value = float(consumed)
    except (TypeError, ValueError):
        return 0.0
    if not math.isfinite(value) or value < 0.0:
        return 0.0
    return value


class Grant:
    """The decision for one request.

    ``release`` must be called once when the request finishes, successfully or not. It is
    idempotent (only the first call counts) and thread-safe.
    """

    __slots__ = (
        "_borrowing",
        "_est_tokens",
        "_lock",
        "_on_release",
        "_pool",
        "_priority",
        "_released",
        "_saturated",
        "_state",
        "_team",
    )

    def __init__(
        self,
        *,
        team: str,
        priority: int,
        borrowing: bool,
        saturated: bool,
        est_tokens: int = 0,
        pool: Pool | None = None,
        state: TeamState | None = None,
        on_release: Callable[[float], None] | None = None,
    ) -> None:
        self._team = team
        self._priority = priority
        self._borrowing = borrowing
        self._saturated = saturated
        self._est_tokens = est_tokens
        self._pool = pool
        self._state = state
        self._on_release = on_release
        self._released = False
        # Pool grants are guarded by their pool's lock; remote ones need their own.
        self._lock = threading.Lock() if pool is None else None

    def __repr__(self) -> str:
        return (
            f"Grant(team={self._team!r}, priority={self._priority}, "
            f"borrowing={self._borrowing}, saturated={self._saturated}, "
            f"est_tokens={self._est_tokens}, released={self._released})"
        )

    @classmethod
    def remote(
        cls,
        team: str,
        priority: int,
        borrowing: bool,
        saturated: bool,
        release: Callable[[float], None],
    ) -> Grant:
        """Builds a grant decided elsewhere, by the replica that owns the pool.

        Its ``release`` calls ``release`` once, with the sanitised consumption; the grant
        is counted in no local pool.
        """
        return cls(
            team=team,
            priority=priority,
            borrowing=borrowing,
            saturated=saturated,
            on_release=release,
        )

    @property
    def team(self) -> str:
        """The team the request belongs to."""
        return self._team

    @property
    def priority(self) -> int:
        """The vLLM priority to send the request with (lower runs earlier)."""
        return self._priority

    @property
    def borrowing(self) -> bool:
        """True when the request is above its team's reservation."""
        return self._borrowing

    @property
    def saturated(self) -> bool:
        """True when the pool already had C or more in flight when the request arrived."""
        return self._saturated

    @property
    def est_tokens(self) -> int:
        """The request's estimated tokens, counted in flight until release."""
        return self._est_tokens

    @property
    def released(self) -> bool:
        """Whether ``release`` has been called."""
        return self._released

    def release(self, consumed: float = 0.0) -> None:
        """Ends the request and charges ``consumed`` (cost units) to the team's usage.

        Negative, NaN and infinite consumption counts as 0. Only the first call counts.
        """
        amount = consumption(consumed)
        if self._pool is not None:
            self._pool._release(self, amount)
            return
        assert self._lock is not None
        with self._lock:
            if self._released:
                return
            self._released = True
        if self._on_release is not None:
            self._on_release(amount)
