"""The vLLM priorities the allocator hands out, and the service classes added to them.

vLLM schedules the lowest ``priority`` value first and, under memory pressure, preempts
the running request with the highest. The scheme has three kinds of answer:

- within share: ``WITHIN_SHARE_BASE + class`` (0 or 1), below every borrower;
- borrowing: ``BORROW_BASE + RANK_STEP * min(rank, MAX_RANK) + class``, where rank 0 is
  the least served team, so the most over-served borrower is preempted first;
- degraded (no owner could decide): the lowest borrower's priority, so a request admitted
  blind never displaces anyone's reservation.

This module is the one place these numbers are computed; the pool, the replicas, the client
library and the simulator all call it.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Final

WITHIN_SHARE_BASE: Final = 0
"""Priority of a request inside its team's reservation, plus its class."""
BORROW_BASE: Final = 10
"""Priority of a borrower of rank 0, plus its class."""
RANK_STEP: Final = 10
"""Priority distance between borrowers of successive fairshare ranks."""
MAX_RANK: Final = 9
"""Ranks above this share its priority, so priorities stay small."""


class Class(IntEnum):
    """Service class of a request; it is added to the priority of its standing."""

    INTERACTIVE = 0
    """Latency sensitive."""
    BATCH = 1
    """Throughput oriented; yields to interactive work of the same standing."""


def within_share_priority(service_class: Class) -> int:
    """The priority of a request inside its team's reservation."""
    return WITHIN_SHARE_BASE + int(service_class)


def borrowing_priority(rank: int, service_class: Class) -> int:
    """The priority of a borrower whose team has dense rank ``rank`` (0 = least served)."""
    return BORROW_BASE + RANK_STEP * min(rank, MAX_RANK) + int(service_class)


def degraded_priority(service_class: Class) -> int:
    """The priority of a request no owner decided: the lowest borrower's."""
    return borrowing_priority(MAX_RANK, service_class)
