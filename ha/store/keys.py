"""The layout of the store and the records kept in it.

```
<prefix>/members/<node>    {"address": ...}          on the node's lease
<prefix>/owners/<pool>     {"node": ..., "address": ...}  on the owner's lease;
                           its create_revision is the pool's epoch
<prefix>/handover/<pool>   {"node": ..., "wall": ..., "member": ..., "pinned": ...}
                           where the pool goes next: an operator's switchover
                           (pinned: holds while that node's member key of
                           create_revision "member" lives) or a rebalancing hint
<prefix>/pools/<q>/...     the pool's state: a checkpoint and records of changes
                           (ha.owned.poolstate names the keys, ha.owned.journal the values),
                           written fenced
<prefix>/state/<pool>      a whole snapshot of the earlier layout (ha.owned.snapshot), read
                           when no checkpoint exists
<prefix>/capacity/<pool>   {"capacity": ..., "epoch": ...}
                           the capacity the owner decides with, written fenced when
                           it changes (or differs): what every replica's ListPools
                           reports for a pool it does not own
```
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ha.api import Epoch, NodeId, PoolName


@dataclass(frozen=True, slots=True)
class Keys:
    """Key names under one prefix."""

    prefix: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "prefix", "/" + self.prefix.strip("/"))

    @property
    def members(self) -> str:
        return f"{self.prefix}/members/"

    @property
    def owners(self) -> str:
        return f"{self.prefix}/owners/"

    @property
    def handovers(self) -> str:
        return f"{self.prefix}/handover/"

    @property
    def states(self) -> str:
        return f"{self.prefix}/state/"

    @property
    def capacities(self) -> str:
        return f"{self.prefix}/capacity/"

    def member(self, node: str) -> str:
        return self.members + node

    def owner(self, pool: str) -> str:
        return self.owners + pool

    def handover(self, pool: str) -> str:
        return self.handovers + pool

    def state(self, pool: str) -> str:
        return self.states + pool

    def capacity(self, pool: str) -> str:
        return self.capacities + pool


@dataclass(frozen=True, slots=True)
class Route:
    """Where a pool is decided: its owner, the owner's address and epoch."""

    node: NodeId
    address: str
    epoch: Epoch


def encode_owner(node: str, address: str) -> bytes:
    return json.dumps({"node": node, "address": address}).encode()


def decode_owner(value: bytes, epoch: int) -> Route | None:
    """The route an owner key describes; None if the value is unreadable."""
    try:
        doc = json.loads(value)
        return Route(NodeId(str(doc["node"])), str(doc["address"]), Epoch(epoch))
    except (ValueError, KeyError, TypeError):
        return None


def encode_capacity(capacity: int, epoch: Epoch) -> bytes:
    return json.dumps({"capacity": capacity, "epoch": epoch}).encode()


def decode_capacity(value: bytes) -> int | None:
    """The capacity a capacity key holds; None if the value is unreadable."""
    try:
        capacity = json.loads(value)["capacity"]
    except (ValueError, KeyError, TypeError):
        return None
    return capacity if isinstance(capacity, int) and capacity >= 0 else None


def encode_member(address: str) -> bytes:
    return json.dumps({"address": address}).encode()


def decode_member(value: bytes) -> str:
    try:
        return str(json.loads(value)["address"])
    except (ValueError, KeyError, TypeError):
        return ""


@dataclass(frozen=True, slots=True)
class Handover:
    """Where a pool goes next, as recorded in ``handover/<pool>``.

    Attributes:
        node: the successor.
        wall: wall time of the record (a hint is fresh for a short while only).
        member: the create_revision of ``node``'s member key when an operator's
            switchover named it (0 for a rebalancing hint). The pin holds while that
            very key lives: if the node leaves the cluster, even to join again, its new
            member key has another revision and the pin is void for every replica.
        pinned: an operator's switchover, not a hint.
    """

    node: NodeId
    wall: float
    member: int = 0
    pinned: bool = False


def encode_handover(node: str, wall: float, *, member: int = 0, pinned: bool = False) -> bytes:
    return json.dumps({"node": node, "wall": wall, "member": member, "pinned": pinned}).encode()


def decode_handover(value: bytes) -> Handover | None:
    """The record a handover key holds; None if unreadable. Records of earlier versions
    (no "member"/"pinned") read as hints."""
    try:
        doc = json.loads(value)
        return Handover(
            NodeId(str(doc["node"])),
            float(doc["wall"]),
            int(doc.get("member", 0)),
            bool(doc.get("pinned", False)),
        )
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def pool_of(key: str, under: str) -> PoolName:
    """The pool (or node) name at the end of ``key``."""
    return PoolName(key[len(under) :])
