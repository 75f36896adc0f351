"""fairshare: the pure decision core of the allocator.

A pool shared by several teams behaves like a reservation with borrowing: each team owns
``share x C`` of the pool's concurrency C, its requests inside that reservation run first
and are never evicted by others, and requests above it borrow idle capacity, ranked by
Slurm's Fair Tree level fairshare on decayed usage. No I/O happens here: the one module
of the package that looks at files, ``fairshare.filewatch``, is not part of the core (no
core module imports it) and is not imported here.
"""

from fairshare.apportion import apportion
from fairshare.grant import Grant
from fairshare.pool import Pool
from fairshare.priority import (
    BORROW_BASE,
    MAX_RANK,
    RANK_STEP,
    WITHIN_SHARE_BASE,
    Class,
    borrowing_priority,
    degraded_priority,
    within_share_priority,
)
from fairshare.shares import ShareError, check_lend, check_shares
from fairshare.team import TeamStat

__all__ = [
    "BORROW_BASE",
    "MAX_RANK",
    "RANK_STEP",
    "WITHIN_SHARE_BASE",
    "Class",
    "Grant",
    "Pool",
    "ShareError",
    "TeamStat",
    "apportion",
    "borrowing_priority",
    "check_lend",
    "check_shares",
    "degraded_priority",
    "within_share_priority",
]
