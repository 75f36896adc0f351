"""What a pool does when it cannot decide at once, the same for replicas and clients.

A replica that cannot reach a pool's owner, and the client library when no replica answers
in time, both apply the pool's ``DegradedMode``; the priority of a degraded grant is
``fairshare.priority.degraded_priority``. A borrower held back by the lending limit
(``fairshare.holding``) whose wait ends gets the pool's ``WaitEnd``.
"""

from __future__ import annotations

from enum import Enum


class DegradedMode(Enum):
    """What a replica (or the client library) answers when no owner can be reached."""

    FAIL_OPEN = "fail_open"
    """Grant as a borrower at the lowest priority, marked degraded; adopted later."""
    FAIL_CLOSED = "fail_closed"
    """Refuse with UNAVAILABLE."""


class WaitEnd(Enum):
    """What a held borrower gets when its wait ends before a slot is lent to it."""

    BORROW = "borrow"
    """Grant it as a borrower anyway, as if it had not waited (vLLM queues it)."""
    REFUSE = "refuse"
    """Refuse it: the caller may retry later or elsewhere."""
