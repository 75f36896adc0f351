"""The persisted form of a pool's state: a checkpoint in parts, then records of changes.

An owner does not write its whole state at every group commit: that would cost a row per
request in flight at every decision. It writes, per commit, one *record* of what changed
since the previous write, and now and then a *checkpoint* of the whole state, in parts
(``ha.owned.poolstate`` says which keys hold them and in which order they are written).

- A record holds the commit's wall time, the pool's capacity and highest sequence number
  issued, the usage of every team charged or admitted since the previous write (its value
  at that wall time), the requests counted in flight since (``live`` rows, as in
  ``ha.owned.snapshot``), the requests no longer counted (``drop``), and the accounting entries
  added (``settled``, ``uncounted``).
- A checkpoint's head holds the scalars (writer's epoch, wall, capacity, issued, the
  capacity its configuration gives the pool) and the windows of uncounted grants; its
  parts hold the usage of every team, every request in flight and both accounting tables.

``replay`` turns a head, its parts and the records written after it back into the
``ha.owned.snapshot.PoolSnapshot`` the writer would have written whole at its last commit, so a
successor restores exactly as from a whole snapshot.

Guarantees:
- Every value ``encode_record`` returns, and every part of ``encode_checkpoint``, is at most
  ``PART_BYTES`` long, or ``encode_record`` returns None (write a checkpoint instead). A
  part holds at least one entry, so an entry longer than ``PART_BYTES`` (impossible with
  ``fairshare.limits``' bounds on names) would make a longer part.
- ``replay`` gives the same snapshot whatever the number of parts, and ignores records of
  an epoch other than the head's (a later owner always starts with a checkpoint).

Non-guarantees: replay keeps entries that the writer forgot by age (phantoms past their
end, settled entries past their horizon): a restore drops them by the same rules.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from ha.owned.snapshot import GrantKey, LiveGrant, PoolSnapshot, decode_live, decode_sessions

logger = logging.getLogger(__name__)

VERSION: Final = 4
_READABLE: Final = (3, VERSION)
"""Versions ``decode_head`` reads: 3 wrote live rows without a standing (read as unknown)."""
PART_BYTES: Final = 128 * 1024
"""The longest value written: a record or a checkpoint's part (etcd takes up to 1.5 MiB)."""


@dataclass(slots=True)
class Changes:
    """What changed in a pool's state since the previous write began (see module)."""

    live: dict[GrantKey, str | None] = field(default_factory=dict)
    """Grant -> its live row (counted) or None (no longer counted)."""
    teams: set[str] = field(default_factory=set)
    settled: dict[GrantKey, float] = field(default_factory=dict)
    uncounted: dict[GrantKey, float] = field(default_factory=dict)
    sessions: dict[str, tuple[str, str] | None] = field(default_factory=dict)
    """Session id -> (digest, holder) when opened, None when it lapsed."""

    def counted(self, key: GrantKey, row: str) -> None:
        """``key`` is counted in flight, as ``row`` (``ha.owned.snapshot.live_row``)."""
        self.live[key] = row

    def dropped(self, key: GrantKey) -> None:
        """``key`` is no longer counted in flight."""
        self.live[key] = None

    def team(self, name: str) -> None:
        """``name``'s usage changed, or the team was admitted."""
        self.teams.add(name)


LOG_FLOOR_BYTES: Final = 256 * 1024
LOG_RATIO: Final = 2
"""Records are written until they add up to ``LOG_RATIO`` times the last checkpoint's size
(at least ``LOG_FLOOR_BYTES``); the next write is a checkpoint. So a checkpoint costs at most
1 / ``LOG_RATIO`` of what the records cost, and a restore reads at most about
``LOG_RATIO + 1`` times the state's size."""


class Journal:
    """One owner's changes since its last write, and whether the next write is a record
    or a checkpoint (see ``LOG_RATIO``). The first write of an owner is a checkpoint."""

    def __init__(self, *, floor_bytes: int | None = None) -> None:
        self.changes = Changes()
        self._floor = LOG_FLOOR_BYTES if floor_bytes is None else floor_bytes
        self._since = 0  # bytes of records since the last checkpoint
        self._checkpoint = -1  # bytes of the last checkpoint; -1: none yet

    def take(self) -> Changes:
        """The changes so far; the next ones gather afresh."""
        changes, self.changes = self.changes, Changes()
        return changes

    @property
    def due(self) -> bool:
        """True when the next write must be a checkpoint."""
        return self._checkpoint < 0 or self._since > max(self._floor, LOG_RATIO * self._checkpoint)

    def recorded(self, size: int) -> None:
        self._since += size

    def checkpointed(self, size: int) -> None:
        self._since = 0
        self._checkpoint = size


class StateWriter(Protocol):
    """Where an owner writes its state (``ha.owned.poolstate.PoolLog`` in the store)."""

    async def append(self, record: bytes) -> None:
        """Writes one record; raises when it may not have been written."""
        ...

    async def checkpoint(self, checkpoint: Checkpoint) -> None:
        """Writes a checkpoint; raises when it may not have been written."""
        ...


class MemoryLog:
    """A ``StateWriter`` that keeps what a store would hold, for tests and benchmarks."""

    def __init__(self) -> None:
        self.head: dict[str, Any] | None = None
        self.parts: list[bytes] = []
        self.records: list[bytes] = []
        self.writes = 0

    async def append(self, record: bytes) -> None:
        self.records.append(record)
        self.writes += 1

    async def checkpoint(self, checkpoint: Checkpoint) -> None:
        self.head = dict(checkpoint.head)
        self.parts = list(checkpoint.parts)
        self.records = []
        self.writes += len(checkpoint.parts) + 1

    def snapshot(self, *, decay_rate: float = 0.0) -> PoolSnapshot | None:
        """The state a successor would restore now (None: nothing written yet)."""
        if self.head is None:
            return None
        return replay(self.head, self.parts, self.records, decay_rate=decay_rate)


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A whole state as written: the head's fields and the parts."""

    head: dict[str, Any]
    parts: list[bytes]

    @property
    def size(self) -> int:
        return sum(len(p) for p in self.parts)


def encode_record(
    *,
    epoch: int,
    wall: float,
    capacity: int,
    issued: int,
    usage: Mapping[str, float],
    changes: Changes,
) -> bytes | None:
    """One commit's record: ``usage`` holds the value of each team in ``changes.teams``
    at ``wall``. None when it would be longer than ``PART_BYTES``."""
    live = [row for row in changes.live.values() if row is not None]
    drop = [[k.epoch, k.seq, k.holder] for k, row in changes.live.items() if row is None]
    head = _dumps(
        {
            "epoch": epoch,
            "wall": wall,
            "capacity": capacity,
            "issued": issued,
            "usage": dict(usage),
            "drop": drop,
            "settled": _entries(changes.settled),
            "uncounted": _entries(changes.uncounted),
            "sessions": [[sid, *s] for sid, s in changes.sessions.items() if s is not None],
            "lapsed": [sid for sid, s in changes.sessions.items() if s is None],
        }
    )
    record = f'{head[:-1]},"live":[{",".join(live)}]}}'.encode()
    return record if len(record) <= PART_BYTES else None


def encode_checkpoint(state: PoolSnapshot, live_rows: Iterable[str]) -> Checkpoint:
    """The whole of ``state`` (its ``live`` given as encoded rows) as a head and parts."""
    head = {
        "version": VERSION,
        "pool": state.pool,
        "epoch": state.epoch,
        "wall": state.wall,
        "capacity": state.capacity,
        "configured": state.configured,
        "issued": state.issued,
        "unknown_after": {str(e): [s, w] for e, (s, w) in state.unknown_after.items()},
        "unknown_between": [list(r) for r in state.unknown_between],
    }
    packer = _Packer()
    for team, used in state.usage.items():
        packer.add("usage", _dumps([team, used]))
    for row in live_rows:
        packer.add("live", row)
    for name, table in (("settled", state.settled), ("uncounted", state.uncounted)):
        for key, wall in table.items():
            packer.add(name, _dumps([key.epoch, key.seq, key.holder, wall]))
    for sid, (digest, holder) in state.sessions.items():
        packer.add("sessions", _dumps([sid, digest, holder]))
    return Checkpoint(head, packer.parts())


def encode_head(checkpoint: Checkpoint, position: int) -> bytes:
    """The head of ``checkpoint`` written at ``position``, naming its part count."""
    return _dumps(dict(checkpoint.head, position=position, parts=len(checkpoint.parts))).encode()


def decode_head(value: bytes) -> dict[str, Any] | None:
    """A checkpoint head as written with its position and part count; None (logged) when
    unreadable or of another version."""
    try:
        head = json.loads(value)
        if not isinstance(head, dict) or head.get("version") not in _READABLE:
            raise ValueError(f"unknown state version {head.get('version')!r}")
        int(head["position"])
        int(head["parts"])
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        logger.error("ignoring an unreadable pool state head: %s", e)
        return None
    return head


def replay(
    head: Mapping[str, Any],
    parts: Sequence[bytes],
    records: Sequence[bytes],
    *,
    decay_rate: float,
) -> PoolSnapshot | None:
    """The snapshot a head, its parts (in order) and the records after it (in order) stand
    for; usage decayed with ``decay_rate`` to the last wall time. None (logged) when any of
    them is unreadable."""
    try:
        return _replay(head, parts, records, decay_rate)
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        logger.error("ignoring an unreadable pool state: %s", e)
        return None


def _replay(
    head: Mapping[str, Any],
    parts: Sequence[bytes],
    records: Sequence[bytes],
    decay_rate: float,
) -> PoolSnapshot:
    epoch = int(head["epoch"])
    wall = float(head["wall"])
    capacity = int(head["capacity"])
    issued = int(head["issued"])
    usage: dict[str, tuple[float, float]] = {}  # team -> (usage, at wall)
    live: dict[GrantKey, LiveGrant] = {}
    settled: dict[GrantKey, float] = {}
    uncounted: dict[GrantKey, float] = {}
    sessions: dict[str, tuple[str, str]] = {}
    for raw in parts:
        part = json.loads(raw)
        for team, used in part.get("usage", ()):
            usage[str(team)] = (float(used), wall)
        _add_live(live, part.get("live", ()))
        _add_entries(settled, part.get("settled", ()))
        _add_entries(uncounted, part.get("uncounted", ()))
        sessions.update(decode_sessions(part.get("sessions", ())))
    for raw in records:
        record = json.loads(raw)
        if int(record["epoch"]) != epoch:
            logger.warning(
                "ignoring a state record of epoch %s after a checkpoint of %d",
                record["epoch"],
                epoch,
            )
            continue
        wall = float(record["wall"])
        capacity = int(record["capacity"])
        issued = int(record["issued"])
        for team, used in record["usage"].items():
            usage[str(team)] = (float(used), wall)
        _add_live(live, record["live"])
        for e, s, h in record["drop"]:
            live.pop(GrantKey(int(e), int(s), str(h)), None)
        _add_entries(settled, record["settled"])
        _add_entries(uncounted, record["uncounted"])
        sessions.update(decode_sessions(record.get("sessions", ())))
        for sid in record.get("lapsed", ()):
            sessions.pop(str(sid), None)
    return PoolSnapshot(
        pool=str(head["pool"]),
        epoch=epoch,
        wall=wall,
        capacity=capacity,
        usage={
            team: value * math.exp(-decay_rate * max(0.0, wall - at))
            for team, (value, at) in usage.items()
            if math.isfinite(value) and value >= 0
        },
        issued=issued,
        live=list(live.values()),
        unknown_after={int(e): (int(s), float(w)) for e, (s, w) in head["unknown_after"].items()},
        unknown_between=[(int(lo), int(hi), float(w)) for lo, hi, w in head["unknown_between"]],
        uncounted=uncounted,
        settled=settled,
        # Fixed for an epoch (its writer's configuration), so in its checkpoint only.
        configured=None if head.get("configured") is None else int(head["configured"]),
        sessions=sessions,
    )


def _add_live(live: dict[GrantKey, LiveGrant], rows: Iterable[list[Any]]) -> None:
    for row in rows:
        grant = decode_live(row)
        live[grant.key] = grant


def _add_entries(table: dict[GrantKey, float], rows: Iterable[list[Any]]) -> None:
    for e, s, h, w in rows:
        table[GrantKey(int(e), int(s), str(h))] = float(w)


def _entries(table: Mapping[GrantKey, float]) -> list[list[Any]]:
    return [[k.epoch, k.seq, k.holder, w] for k, w in table.items()]


def _dumps(value: object) -> str:
    return json.dumps(value, separators=(",", ":"))


class _Packer:
    """Packs encoded entries, by section, into parts of at most ``PART_BYTES``."""

    _OVERHEAD = 16  # a section's name, quotes, brackets and separators

    def __init__(self) -> None:
        self._done: list[bytes] = []
        self._sections: dict[str, list[str]] = {}
        self._size = 2

    def add(self, section: str, entry: str) -> None:
        # Entries are ASCII-escaped JSON (json.dumps' default), so characters are bytes.
        cost = len(entry) + 1 + (0 if section in self._sections else self._OVERHEAD)
        if self._sections and self._size + cost > PART_BYTES:
            self._flush()
            cost = len(entry) + 1 + self._OVERHEAD
        self._sections.setdefault(section, []).append(entry)
        self._size += cost

    def parts(self) -> list[bytes]:
        if self._sections or not self._done:
            self._flush()
        return self._done

    def _flush(self) -> None:
        body = ",".join(f'"{name}":[{",".join(rows)}]' for name, rows in self._sections.items())
        self._done.append(f"{{{body}}}".encode())
        self._sections = {}
        self._size = 2
