"""What an owner persists for its successor, and how a successor reads it.

An owner writes it as records of changes and checkpoints (``ha.owned.journal``), which a
successor replays into a ``PoolSnapshot``; ``PoolSnapshot.encode`` and ``decode`` are its
whole form, the one the earlier layout stored (``ha.owned.poolstate``), which a restore
still reads.

A snapshot says, as of its wall time: the pool's capacity, every team's decayed usage, and
*which* requests are in flight, by grant identity (epoch, sequence, holder) with their team.
Identities, rather than counts, let a successor settle every later release exactly once:

- a grant in ``live`` was counted: the successor holds a phantom for it, and its release
  is charged once and closes exactly that phantom;
- a grant of an epoch listed in ``unknown_after`` with a sequence number above the one given
  there, or of an epoch in an ``unknown_between`` range (owners whose snapshots nobody
  read), was never counted by any owner (so is a borrowing grant made after the last
  write of a crashed owner, and a degraded grant of epoch 0): its release is charged, once;
- ``uncounted`` lists other grants known not to be counted (a phantom closed by its holder's
  complete re-report while the release was on its way): their release is charged, once;
- ``settled`` lists the grants of those windows (and of ``uncounted``) already released or
  re-counted, so a retried release is not charged twice;
- any other grant of an earlier epoch was settled before the snapshot: its release is
  already in ``usage`` and charges nothing more.

Windows and settled entries older than the pool's ``max_request_s`` are dropped, since no
request lives that long.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple

logger = logging.getLogger(__name__)

_COMPACT: Final = json.JSONEncoder(separators=(",", ":"))
_string: Final = json.encoder.encode_basestring_ascii
"""Encodes as ``json.dumps(value, separators=(",", ":"))`` does, without making an encoder
per call (a live row is encoded on every grant)."""

_VERSION = 3
_READABLE: Final = (2, _VERSION)
"""Versions ``decode`` reads: 2 wrote live rows without a standing (read as unknown)."""


class GrantKey(NamedTuple):
    """A grant's identity across owners: degraded grants (epoch 0) are only unique per
    holder, so the holder is part of it."""

    epoch: int
    seq: int
    holder: str


class LiveGrant(NamedTuple):
    """A request counted in flight when the snapshot was taken, the wall time after which
    it cannot be running any more (issued or re-counted + ``max_request_s``), and its
    standing: borrowing, within share, or None when unknown (a phantom filled in for an
    unreadable state, or a row written before rows carried it). A successor counts it as
    a phantom of that standing; unknown counts as within share (``Pool.add_phantoms``)."""

    key: GrantKey
    team: str
    until: float
    borrowing: bool | None = None
    session: str = ""
    """The holder session it was made in (``ha.owned.sessions``); empty when none."""


@dataclass(frozen=True, slots=True)
class PoolSnapshot:
    """One pool's persisted state.

    Attributes:
        pool: pool name.
        epoch: the epoch of the owner that wrote it.
        wall: wall-clock seconds when it was taken (usage is decayed to this time).
        capacity: the pool's C at that time (SetCapacity survives failover).
        usage: team -> decayed usage.
        issued: the highest sequence number the writer had issued.
        live: every request counted in flight (grants, re-counted grants, phantoms).
        unknown_after: epoch -> (sequence, wall since when the window is open): grants of
            that epoch above that sequence were never counted.
        unknown_between: (lo, hi, since): no snapshot of the epochs strictly between lo
            and hi was ever read, so none of their grants was counted.
        uncounted: grants not counted whose release must still be charged, with wall time.
        settled: grants of unknown windows already settled, with the wall time.
        configured: the capacity the writer's configuration gave the pool; a successor
            configured otherwise takes its own (a changed configuration is the new intent,
            SetCapacity an override until then). None in snapshots written before it was
            kept: the stored capacity stands.
        sessions: session id -> (digest of its secret, holder): the holder sessions open
            at the writer (``ha.owned.sessions``).
    """

    pool: str
    epoch: int
    wall: float
    capacity: int
    usage: Mapping[str, float] = field(default_factory=dict)
    issued: int = 0
    live: Sequence[LiveGrant] = ()
    unknown_after: Mapping[int, tuple[int, float]] = field(default_factory=dict)
    unknown_between: Sequence[tuple[int, int, float]] = ()
    uncounted: Mapping[GrantKey, float] = field(default_factory=dict)
    settled: Mapping[GrantKey, float] = field(default_factory=dict)
    configured: int | None = None
    sessions: Mapping[str, tuple[str, str]] = field(default_factory=dict)

    def in_flight(self) -> dict[str, int]:
        """Team -> requests in flight."""
        counts: dict[str, int] = {}
        for grant in self.live:
            counts[grant.team] = counts.get(grant.team, 0) + 1
        return counts

    def encode(self, *, live_rows: Iterable[str] | None = None) -> bytes:
        """The snapshot whole, as the earlier layout stored it (what ``decode`` reads).

        Args:
            live_rows: ``live_row`` of each request in flight, in place of ``live``.
        """
        rows = (live_row(g) for g in self.live) if live_rows is None else live_rows
        head = json.dumps(
            {
                "version": _VERSION,
                "pool": self.pool,
                "epoch": self.epoch,
                "wall": self.wall,
                "capacity": self.capacity,
                "usage": dict(self.usage),
                "issued": self.issued,
                "unknown_after": {str(e): [s, w] for e, (s, w) in self.unknown_after.items()},
                "unknown_between": [list(r) for r in self.unknown_between],
                "uncounted": [[k.epoch, k.seq, k.holder, w] for k, w in self.uncounted.items()],
                "settled": [[k.epoch, k.seq, k.holder, w] for k, w in self.settled.items()],
                "configured": self.configured,
                "sessions": [[sid, d, h] for sid, (d, h) in self.sessions.items()],
            },
            separators=(",", ":"),
        )
        return f'{head[:-1]},"live":[{",".join(rows)}]}}'.encode()

    @classmethod
    def decode(cls, data: bytes) -> PoolSnapshot | None:
        """Parses a snapshot; None (and a log line) when it is unreadable."""
        try:
            doc = json.loads(data)
            if doc.get("version") not in _READABLE:
                raise ValueError(f"unknown snapshot version {doc.get('version')!r}")
            usage = {str(t): float(u) for t, u in doc["usage"].items()}
            return cls(
                pool=str(doc["pool"]),
                epoch=int(doc["epoch"]),
                wall=float(doc["wall"]),
                capacity=int(doc["capacity"]),
                usage={t: u for t, u in usage.items() if math.isfinite(u) and u >= 0},
                issued=int(doc["issued"]),
                live=[decode_live(row) for row in doc["live"]],
                unknown_after={
                    int(e): (int(s), float(w)) for e, (s, w) in doc["unknown_after"].items()
                },
                unknown_between=[
                    (int(lo), int(hi), float(w)) for lo, hi, w in doc["unknown_between"]
                ],
                uncounted=_keys(doc["uncounted"]),
                settled=_keys(doc["settled"]),
                configured=None if doc.get("configured") is None else int(doc["configured"]),
                sessions=decode_sessions(doc.get("sessions", ())),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            logger.error("ignoring an unreadable pool snapshot: %s", e)
            return None


def live_row(grant: LiveGrant) -> str:
    """One entry of a ``live`` list (a checkpoint's, a record's, ``PoolSnapshot.encode``'s):
    ``[epoch, seq, holder, team, until]``, then the standing (1 borrowing, 0 within share)
    when known, then the session when there is one (after a null standing if unknown)."""
    k = grant.key
    until = float(grant.until)
    standing = "" if grant.borrowing is None else (",1" if grant.borrowing else ",0")
    if grant.session:
        standing = f"{standing or ',null'},{_string(grant.session)}"
    if not math.isfinite(until):
        row = [k.epoch, k.seq, k.holder, grant.team, until]
        return f"{_COMPACT.encode(row)[:-1]}{standing}]"
    # What the encoder writes, put together by hand: this runs on every grant.
    return f"[{k.epoch:d},{k.seq:d},{_string(k.holder)},{_string(grant.team)},{until!r}{standing}]"


_ROW_FIELDS: Final = 5
"""A live row's entries before its standing (epoch, seq, holder, team, until)."""


def decode_live(row: Sequence[Any]) -> LiveGrant:
    """A ``live_row`` as read back (five entries: standing unknown; seven: with the
    session, the standing possibly null).

    Raises:
        ValueError, TypeError: not a live row.
    """
    if not _ROW_FIELDS <= len(row) <= _ROW_FIELDS + 2:
        raise ValueError(f"a live row has 5 to 7 entries, not {len(row)}")
    e, s, h, t, u = row[:_ROW_FIELDS]
    extra = row[_ROW_FIELDS:]
    borrowing = None if not extra or extra[0] is None else _standing(extra[0])
    session = str(extra[1]) if len(extra) > 1 else ""
    return LiveGrant(GrantKey(int(e), int(s), str(h)), str(t), float(u), borrowing, session)


def decode_sessions(rows: Iterable[Sequence[Any]]) -> dict[str, tuple[str, str]]:
    """Session rows ``[id, digest, holder]`` as read back."""
    return {str(sid): (str(digest), str(holder)) for sid, digest, holder in rows}


def _standing(value: object) -> bool:
    if value not in (0, 1) or isinstance(value, float):
        raise ValueError(f"a live row's standing is 0 or 1, not {value!r}")
    return bool(value)


def _keys(rows: list[list[Any]]) -> dict[GrantKey, float]:
    """Grant keys with their wall times, as ``encode`` writes them."""
    return {GrantKey(int(e), int(s), str(h)): float(w) for e, s, h, w in rows}
