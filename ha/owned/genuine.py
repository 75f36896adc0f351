"""Grant ids an owner may count, and charges it may take from them.

Guarantees:
- Only genuine ids pass ``IdGuard.check``: signed with a MAC the cluster's grant keys
  verify, or unsigned of ``DEGRADED_EPOCH`` (a client's degraded grant, bounded where it
  is adopted). Every refusal is counted in ``IdCounters.ids_refused``.
- ``IdGuard.bounded`` clamps a release's consumption to ``config.max_charge()``
  (``max_charge_per_s`` x ``max_request_s``), or to ``max_charge_per_s`` x the time the
  grant was held when that is longer (a holder session's grant may outlive
  ``max_request_s``); each clamp is counted, and logged at most once per
  ``_CLAMP_LOG_EVERY_S`` per pool.
- A replica's degraded grant id (``degraded_grant_id``) is signed: genuine for any owner.
"""

from __future__ import annotations

import logging
import math
import secrets
from dataclasses import dataclass

from ha.api import DEGRADED_EPOCH, Epoch, GrantRef, PermissionDenied, PoolName
from ha.clock import Clock
from ha.grantkeys import GrantKeys

logger = logging.getLogger(__name__)

_CLAMP_LOG_EVERY_S = 10.0
"""Clamped charges are logged at most this often per pool."""


@dataclass(slots=True)
class IdCounters:
    """What a node counts of a pool's grant ids across its epochs (for metrics)."""

    charges_clamped: int = 0
    """Releases that claimed more than ``max_charge()`` and were charged that."""
    ids_refused: int = 0
    """Releases and adopted grants refused as not genuine (``PermissionDenied``)."""
    unproven_releases: int = 0
    """Releases of unsigned (client-made) degraded ids no owner counted: not charged."""


class IdGuard:
    """Checks the grant ids an owner of ``pool`` at ``epoch`` is given (see module)."""

    def __init__(
        self,
        *,
        pool: PoolName,
        epoch: Epoch,
        keys: GrantKeys,
        counters: IdCounters,
        max_charge: float,
        clock: Clock,
        max_charge_per_s: float = 0.0,
    ) -> None:
        self._pool = pool
        self._epoch = epoch
        self._keys = keys
        self.counters = counters
        self._max_charge = max_charge
        self._per_s = max_charge_per_s
        self._clock = clock
        self._clamp_logged = -math.inf

    def check(self, ref: GrantRef, field: str) -> None:
        """Raises PermissionDenied naming ``field`` unless ``ref`` is a genuine id."""
        if ref.mac:
            if self._keys.verify(ref):
                return
            reason = "its MAC does not verify under the cluster's grant keys"
        elif ref.epoch == DEGRADED_EPOCH:
            return
        else:
            reason = f"an unsigned id of epoch {ref.epoch} (only degraded ids may be unsigned)"
        self.refused()
        raise PermissionDenied(field, f"not a genuine grant id: {reason}")

    def refused(self) -> None:
        """Counts an id refused as not genuine elsewhere (another holder's unsigned id)."""
        self.counters.ids_refused += 1

    def bounded(self, ref: GrantRef, consumed: float, *, held_s: float = 0.0) -> float:
        """``consumed`` clamped to what a grant can consume in its life, ``held_s`` when
        the owner knows it held the grant that long (logged, counted)."""
        limit = max(self._max_charge, self._per_s * held_s)
        if not consumed > limit:  # also NaN: the pool counts it as 0
            return consumed
        self.counters.charges_clamped += 1
        now = self._clock.monotonic()
        if now >= self._clamp_logged + _CLAMP_LOG_EVERY_S:
            self._clamp_logged = now
            logger.warning(
                "pool %s at epoch %d: release of grant %d.%d of holder %r claimed %g, more "
                "than a grant can consume (max_charge_per_s x max_request_s = %g); charged "
                "%g (%d clamped so far)",
                self._pool,
                self._epoch,
                ref.epoch,
                ref.seq,
                ref.holder[:64],
                consumed,
                limit,
                limit,
                self.counters.charges_clamped,
            )
        return limit


def degraded_grant_id(pool: str, team: str, holder: str, keys: GrantKeys) -> str:
    """A replica's grant id for a degraded decision: ``DEGRADED_EPOCH``, a random
    sequence number, signed (unlike a client's degraded ids, it is genuine for any
    owner)."""
    ref = GrantRef(PoolName(pool), DEGRADED_EPOCH, secrets.randbits(62), team, holder)
    return keys.sign(ref)
