"""A holder's re-report (Adopt) as its pool's owner takes it: which grants of earlier
epochs count again, and which phantoms a complete inventory closes.

Guarantees:
- Every re-reported grant is checked before any is counted: of this pool, genuine
  (``ha.owned.genuine``), and an unsigned (client-made degraded) one only when it names the
  calling holder. One that fails refuses the whole call.
- Each grant counts again in the team, with the standing (``adopted_standing``) and in the
  session its id names, never those the holder claims; a grant of a session that is not
  open here (it lapsed) is not counted again. A grant the previous owner counted closes its
  own phantom; a grant nobody counted (see ``OwnedPool.release``) is simply counted; a
  grant already counted or settled is ignored.
- Borrowing grants (every unsigned one is) count only within the bounds on grants in
  flight (``ha.owned.bounds``, the pool's and the grant's holder's). Those left out are
  logged, and each keeps its phantom, if it has one, until it ends.
- A complete inventory speaks for the caller's own grants only. Presented with a session,
  it closes every phantom of that session it did not claim; without one, every phantom of
  the holder made without a session, if it carries a signed grant of that holder (an
  unsigned one proves nothing). Nobody closes another session's phantoms (two processes
  that share a holder name do not disturb each other), and an inventory that left grants
  out closes none (they stay until they expire: the cautious side).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from fairshare.sessions import Session
from ha.api import (
    DEGRADED_EPOCH,
    AdoptResult,
    GrantRef,
    HeldGrant,
    InvalidArgument,
    LimitExceeded,
    NodeId,
    PermissionDenied,
)
from ha.owned.bounds import beyond
from ha.owned.genuine import IdGuard
from ha.owned.held import holding_of
from ha.owned.snapshot import GrantKey
from ha.owned.tables import PoolTables, invalid_argument

logger = logging.getLogger(__name__)


class ReReports:
    """Takes re-reports into ``tables`` for the owner ``node`` (see module)."""

    def __init__(self, tables: PoolTables, ids: IdGuard, node: NodeId) -> None:
        self._tables = tables
        self._ids = ids
        self._node = node

    def adopt(
        self,
        *,
        holder: str,
        grants: Sequence[HeldGrant],
        complete: bool,
        session: Session | None = None,
    ) -> AdoptResult:
        """Counts ``holder``'s live grants of earlier epochs again (see module).

        Raises:
            PermissionDenied: a grant id is not genuine, or is unsigned and names
                another holder, or ``session`` is open with another secret or holder;
                nothing is counted then.
            InvalidArgument: a grant is of another pool.
        """
        t = self._tables
        refs = [GrantRef.decode(held.grant_id) for held in grants]
        proven = self._check_adopted(holder, refs)
        if session is not None:
            t.open_session(session, holder)
        t.touch()
        adopted = 0
        dropped = 0
        left_out = 0  # grants beyond the in-flight bounds
        full: LimitExceeded | None = None
        for held, ref in zip(grants, refs, strict=True):
            key = GrantKey(ref.epoch, ref.seq, ref.holder)
            if not self._counts_again(key, ref):
                continue
            recorded = t.phantoms.get(key)
            borrowing = adopted_standing(ref, None if recorded is None else recorded.borrowing)
            met = beyond(
                t.config,
                t.pool.capacity,
                t.held,
                holding_of(ref.holder, ref.session),
                within_share=not borrowing,
            )
            if met is not None:
                left_out, full = left_out + 1, met  # its phantom, if any, counts on
                continue
            # The id's team, never the one the holder claims: a grant signed for one team
            # re-reported as another would be counted and charged there.
            team = ref.team or held.team
            t.admit(team)
            try:
                grant = t.pool.adopt(team, held.priority, borrowing, held.est_tokens)
            except ValueError as e:
                raise invalid_argument(e, "grants.") from e
            phantom = t.phantoms.take(key)
            # It keeps the deadline its phantom had: re-counting does not extend a request.
            issued = t.now() if phantom is None else phantom.until - t.config.max_request_s
            kept = t.held.adopt(key, grant, issued, unsigned=not ref.mac, session=ref.session)
            t.changes.counted(key, kept.row)
            adopted += 1
            if phantom is not None and t.phantoms.drop(phantom):
                dropped += 1
        if full is not None:
            logger.warning(
                "pool %s at epoch %d: %d grants re-reported by holder %r are not counted "
                "again (%s); their phantoms count on until they end%s",
                t.name,
                t.epoch,
                left_out,
                holder,
                full,
                ", and so do the caller's unclaimed ones" if complete else "",
            )
        elif complete:
            # (With grants left out, the unclaimed phantoms cannot be told from theirs.)
            dropped += self._close_unclaimed(holder, session, proven)
        return AdoptResult(adopted, dropped, self._node, t.epoch)

    def _counts_again(self, key: GrantKey, ref: GrantRef) -> bool:
        """Whether a re-reported grant of an earlier epoch is counted again: not when it is
        counted already or was released, nor when its session lapsed; only when the
        previous owner counted it (a phantom) or no owner ever did (see
        ``OwnedPool.release``)."""
        t = self._tables
        if ref.epoch >= t.epoch or t.held.adopted(key) or t.earlier.is_settled(key):
            return False
        if ref.session and not t.sessions.live(ref.session):
            return False
        return key in t.phantoms or t.earlier.chargeable(key)

    def _check_adopted(self, holder: str, refs: Sequence[GrantRef]) -> bool:
        """Checks every re-reported grant before any is counted; returns whether one of
        them is a signed grant of ``holder`` (what lets a complete inventory close its
        phantoms).

        Raises:
            InvalidArgument: a grant is of another pool.
            PermissionDenied: a grant id is not genuine, or is unsigned and names another
                holder.
        """
        name = self._tables.name
        proven = False
        for i, ref in enumerate(refs):
            field = f"grants[{i}].grant_id"
            if ref.pool != name:
                raise InvalidArgument(field, f"grant of pool {ref.pool!r}, not {name!r}")
            self._ids.check(ref, field)
            if not ref.mac and ref.holder != holder:
                self._ids.refused()
                raise PermissionDenied(
                    field, f"an unsigned grant of holder {ref.holder!r} adopted by {holder!r}"
                )
            proven = proven or (bool(ref.mac) and ref.holder == holder)
        return proven

    def _close_unclaimed(self, holder: str, session: Session | None, proven: bool) -> int:
        """After a complete inventory: closes the phantoms it did not claim, those of
        ``session``, or without one those of ``holder`` made without a session if
        ``proven`` (it carried a signed grant of ``holder``; else they are left to expire);
        returns how many phantoms the pool dropped."""
        t = self._tables
        if session is not None:
            return t.uncount(*t.phantoms.close_session(session.id))
        if not proven:
            if t.phantoms.holds(holder):
                logger.warning(
                    "pool %s at epoch %d: a complete re-report for holder %r carries no "
                    "signed grant of it; its phantoms stay until they expire",
                    t.name,
                    t.epoch,
                    holder,
                )
            return 0
        # The holder does not hold these any more: their releases may still be on the way,
        # so they stay chargeable, but they no longer count in flight.
        return t.uncount(*t.phantoms.close(holder))


def adopted_standing(ref: GrantRef, recorded: bool | None) -> bool:
    """Whether a re-reported grant counts as a borrower (True) or within share.

    Never the holder's word, which could give its team more within-share grants than its
    reservation: the standing its signed id carries; for a degraded grant (epoch 0),
    borrowing, as every degraded grant is; else the standing the previous owner recorded
    (``recorded``, its phantom's); else, unknown (an id issued before ids carried it, not
    in the restored state), within share: the safe side, it can only make new requests of
    its team borrow.
    """
    if ref.borrowing is not None:
        return ref.borrowing
    if ref.epoch == DEGRADED_EPOCH:
        return True
    return bool(recorded)
