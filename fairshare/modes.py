"""What a pool does when no owner can decide for it, the same for replicas and clients.

A replica that cannot reach a pool's owner, and the client library when no replica answers
in time, both apply the pool's ``DegradedMode``; the priority of a degraded grant is
``fairshare.priority.degraded_priority``.
"""

from __future__ import annotations

from enum import Enum


class DegradedMode(Enum):
    """What a replica (or the client library) answers when no owner can be reached."""

    FAIL_OPEN = "fail_open"
    """Grant as a borrower at the lowest priority, marked degraded; adopted later."""
    FAIL_CLOSED = "fail_closed"
    """Refuse with UNAVAILABLE."""
