"""What an owner persists for its successor, and how a successor reads it.

A snapshot holds the wall time it was taken, the writer's epoch, the pool's capacity,
every team's decayed usage and in-flight count (grants and phantoms), and the in-flight
counts per holder (gateway), so that a holder's complete re-report can close its
phantoms early.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

logger = logging.getLogger(__name__)

_VERSION = 1


@dataclass(frozen=True, slots=True)
class PoolSnapshot:
    """One pool's persisted state.

    Attributes:
        pool: pool name.
        epoch: the epoch of the owner that wrote it.
        wall: wall-clock seconds when it was taken (usage is decayed to this time).
        capacity: the pool's C at that time (SetCapacity survives failover).
        usage: team -> decayed usage.
        in_flight: team -> requests in flight (grants and phantoms).
        holders: holder -> team -> requests in flight that holder can re-report.
    """

    pool: str
    epoch: int
    wall: float
    capacity: int
    usage: Mapping[str, float] = field(default_factory=dict)
    in_flight: Mapping[str, int] = field(default_factory=dict)
    holders: Mapping[str, Mapping[str, int]] = field(default_factory=dict)

    def encode(self) -> bytes:
        return json.dumps(
            {
                "version": _VERSION,
                "pool": self.pool,
                "epoch": self.epoch,
                "wall": self.wall,
                "capacity": self.capacity,
                "usage": dict(self.usage),
                "in_flight": dict(self.in_flight),
                "holders": {h: dict(t) for h, t in self.holders.items()},
            },
            separators=(",", ":"),
            sort_keys=True,
        ).encode()

    @classmethod
    def decode(cls, data: bytes) -> PoolSnapshot | None:
        """Parses a snapshot; None (and a log line) when it is unreadable."""
        try:
            doc = json.loads(data)
            if doc.get("version") != _VERSION:
                raise ValueError(f"unknown snapshot version {doc.get('version')!r}")
            usage = {str(t): float(u) for t, u in doc["usage"].items()}
            return cls(
                pool=str(doc["pool"]),
                epoch=int(doc["epoch"]),
                wall=float(doc["wall"]),
                capacity=int(doc["capacity"]),
                usage={t: u for t, u in usage.items() if math.isfinite(u) and u >= 0},
                in_flight={str(t): max(0, int(n)) for t, n in doc["in_flight"].items()},
                holders={
                    str(h): {str(t): max(0, int(n)) for t, n in teams.items()}
                    for h, teams in doc["holders"].items()
                },
            )
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            logger.error("ignoring an unreadable pool snapshot: %s", e)
            return None
