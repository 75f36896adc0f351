"""A release as its pool's owner takes it: which grant it ends, what it charges, once.

Guarantees (``OwnedPool``'s, where they are stated in full):
- A release is counted once per grant id, whatever the epoch that issued it: a grant this
  owner holds ends; a grant the previous owner counted closes its phantom; a grant nobody
  counted (made after a crashed owner's last write, degraded, or ended unreleased) is
  charged once; one settled before charges nothing.
- Only genuine ids count (``ha.owned.genuine``), and a release charges at most the pool's
  ``max_charge()``; an unsigned id no owner counted charges nothing (counted in
  ``unproven_releases``).
"""

from __future__ import annotations

from ha.api import GrantRef, NodeId, WrongEpoch
from ha.owned.genuine import IdGuard
from ha.owned.snapshot import GrantKey
from ha.owned.tables import PoolTables


class Releases:
    """Takes releases into ``tables`` (see module)."""

    def __init__(self, tables: PoolTables, ids: IdGuard) -> None:
        self._tables = tables
        self._ids = ids

    def release(self, ref: GrantRef, consumed: float) -> None:
        """Ends a grant of this epoch or an earlier one; idempotent across owners.

        Raises:
            WrongEpoch: the grant is of a later epoch than this owner's (it is stale).
            PermissionDenied: the id is not genuine (see ``ha.owned.genuine``).
        """
        self._ids.check(ref, "grant_id")
        if ref.epoch > self._tables.epoch:
            raise WrongEpoch(self._tables.pool.name, NodeId(""), "", ref.epoch)
        key = GrantKey(ref.epoch, ref.seq, ref.holder)
        own = ref.epoch == self._tables.epoch
        held = self._tables.held.take_own(key) if own else self._tables.held.take_adopted(key)
        self._tables.touch()
        changes = self._tables.changes
        if held is not None:
            # A grant of a holder session may run past max_request_s: what it may have
            # consumed follows the time it was held.
            held_s = self._tables.now() - held.wall
            held.grant.release(self._ids.bounded(ref, consumed, held_s=held_s))
            changes.dropped(held.key)
            changes.team(held.team)
            if not own:
                self._tables.settle(key)
            return
        phantom = self._tables.phantoms.take(key)
        if phantom is not None:
            # The previous owner counted it: charge it and close its phantom.
            team = phantom.team
            self._tables.pool.charge(team, self._ids.bounded(ref, consumed))
            self._tables.phantoms.drop(phantom)
            changes.dropped(key)
            changes.team(team)
            self._tables.settle(key)
        elif self._tables.earlier.is_settled(key):
            pass  # settled before: its consumption is already in the usage
        elif self._tables.earlier.chargeable(key, signed=bool(ref.mac)):
            # No owner counts it (made after a crashed owner's last write, degraded, or
            # ended unreleased: its session lapsed, or it outlived max_request_s):
            # charge what it consumed, once.
            team = ref.team or "unknown"
            self._tables.admit(team)
            self._tables.pool.charge(team, self._ids.bounded(ref, consumed))
            changes.team(team)
            self._tables.settle(key)
        elif not ref.mac:
            # A client-made degraded id no owner counted proves nothing: anyone can make
            # one. Its holder re-reports it (Adopt) before releasing it.
            self._ids.counters.unproven_releases += 1
        # Otherwise it was settled before the snapshot this owner restored: its
        # consumption is already in the usage.
