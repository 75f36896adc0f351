"""Where a pool's state lives in the store, and the order its writes take.

Keys (``<q>`` is the pool's name percent-encoded, so no name is a prefix of another's
keys; positions are zero-padded so that key order is position order):

```
<prefix>/pools/<q>/head                 the current checkpoint's head (ha.owned.journal)
<prefix>/pools/<q>/part/<P>/<i>         part i of the checkpoint at position P
<prefix>/pools/<q>/log/<P>              the record at position P
<prefix>/state/<pool>                   a whole snapshot as written before this layout
```

Every write is one fenced commit (``Store.commit_fenced``, fenced on the owner key's
create_revision, the epoch) of at most ``ha.owned.journal.PART_BYTES`` plus a key:

- a record: one put at the next position;
- a checkpoint at position P: one put per part, each its own commit, then one commit that
  puts the head (naming P and the part count) and deletes every record and every part
  below P (and the snapshot of the earlier layout), in ranges.

So the store always holds a complete state: until the head's commit, the previous head
and its records (the new parts are not read); from it, the new checkpoint. A crash
between any two writes leaves either the state before a commit or after it, and restore
(``load``) reads it in one range read.

Guarantees:
- Positions only grow, across owners: a new owner starts above every position it finds
  (including parts a crashed owner left without a head), and its first write is a
  checkpoint.
- No commit writes more than ``PART_BYTES`` of values plus one key, whatever the state's
  size, and none holds more than four operations.

Non-guarantees: parts and records below the head's position may linger until the next
checkpoint's commit deletes them (``load`` ignores them).
"""

from __future__ import annotations

import logging
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

from ha.api import Epoch, NodeId, PoolName, WrongEpoch
from ha.owned.journal import Checkpoint, decode_head, encode_head, replay
from ha.owned.snapshot import PoolSnapshot
from ha.store.contract import DeleteRange, KeyValue, Put, Store, Write, bounded
from ha.store.keys import Keys

logger = logging.getLogger(__name__)

_DIGITS: Final = 16
"""Zero-padded digits of a position (etcd revisions fit in 64 bits; 10^16 writes is ample)."""


@dataclass(frozen=True, slots=True)
class Loaded:
    """What ``load`` found.

    Attributes:
        snapshot: the state to restore; None when none was ever written or it is
            unreadable (``unreadable`` tells which).
        unreadable: something was written but cannot be read (restore fails safe).
        position: the highest position found (0: none): the next owner writes above it.
    """

    snapshot: PoolSnapshot | None
    unreadable: bool
    position: int


class PoolKeys:
    """The keys of one pool's state (see module)."""

    def __init__(self, keys: Keys, pool: str) -> None:
        self.root = f"{keys.prefix}/pools/{urllib.parse.quote(pool, safe='')}/"
        self.head = self.root + "head"
        self.parts = self.root + "part/"
        self.log = self.root + "log/"
        self.legacy = keys.state(pool)

    def part(self, position: int, index: int) -> str:
        return f"{self.parts}{position:0{_DIGITS}d}/{index:06d}"

    def record(self, position: int) -> str:
        return f"{self.log}{position:0{_DIGITS}d}"

    def below(self, under: str, position: int) -> DeleteRange:
        """Every key of ``under`` (parts or records) at a position below ``position``."""
        return DeleteRange(under, f"{under}{position:0{_DIGITS}d}")


async def load(
    store: Store, keys: Keys, pool: str, *, decay_rate: float, timeout_s: float
) -> Loaded:
    """Reads a pool's state (see module): one range read, and one read of the earlier
    layout's key.

    Raises:
        StoreUnavailable: the store did not answer within ``timeout_s`` (each read).
    """
    names = PoolKeys(keys, pool)
    found, _ = await bounded(store.get_prefix(names.root), timeout_s)
    legacy = await bounded(store.get(names.legacy), timeout_s)
    head_kv: KeyValue | None = None
    parts: dict[int, dict[int, bytes]] = {}
    records: dict[int, bytes] = {}
    top = 0
    for kv in found:
        rest = kv.key[len(names.root) :]
        try:
            if rest == "head":
                head_kv = kv
            elif rest.startswith("part/"):
                at, index = rest[len("part/") :].split("/")
                parts.setdefault(int(at), {})[int(index)] = kv.value
                top = max(top, int(at))
            elif rest.startswith("log/"):
                at = rest[len("log/") :]
                records[int(at)] = kv.value
                top = max(top, int(at))
        except ValueError:
            logger.warning("pool %s: ignoring a stray state key %r", pool, kv.key)
    # The earlier layout's key survives a checkpoint only if a replica of an earlier
    # version wrote it since (a rolling update moved the pool to one): then it is newer
    # than anything under the root. Without a head it is all there is.
    if legacy is not None and (
        head_kv is None or legacy.mod_revision > max(kv.mod_revision for kv in found)
    ):
        snapshot = PoolSnapshot.decode(legacy.value)
        return Loaded(snapshot, snapshot is None, top)
    if head_kv is None:
        if records:
            # Records are written only after a head: someone deleted it.
            logger.error("pool %s: state records without a checkpoint head", pool)
            return Loaded(None, True, top)
        # Parts alone are a first checkpoint cut by a crash: as good as nothing written.
        return Loaded(None, False, top)
    head = decode_head(head_kv.value)
    if head is None:
        return Loaded(None, True, top)
    position, count = int(head["position"]), int(head["parts"])
    top = max(top, position)
    mine = parts.get(position, {})
    if sorted(mine) != list(range(count)):
        logger.error(
            "pool %s: the checkpoint at position %d has parts %s of %d",
            pool,
            position,
            sorted(mine),
            count,
        )
        return Loaded(None, True, top)
    after = [records[p] for p in sorted(records) if p > position]
    snapshot = replay(head, [mine[i] for i in range(count)], after, decay_rate=decay_rate)
    return Loaded(snapshot, snapshot is None, top)


class PoolLog:
    """Writes one owner's state of one pool at ``epoch``, fenced (see module).

    Writes must not overlap (``ha.owned.commit.GroupCommitter`` runs them one at a time). A
    write that fails leaves the pool lost to this owner: nothing more is written.
    """

    def __init__(
        self,
        store: Store,
        keys: Keys,
        pool: PoolName,
        epoch: Epoch,
        *,
        budget_s: Callable[[], float],
        position: int = 0,
    ) -> None:
        """Args:
        budget_s: how long one commit may take, asked before each (the time this owner
            may still decide).
        position: the highest position in the store (``Loaded.position``); or call
            ``resume`` before the first write.
        """
        self._store = store
        self._keys = keys
        self._names = PoolKeys(keys, pool)
        self._pool = pool
        self._epoch = epoch
        self._position = position
        self._budget_s = budget_s

    def resume(self, position: int) -> None:
        """Writes from above ``position`` (the highest one ``load`` found)."""
        self._position = max(self._position, position)

    async def append(self, record: bytes) -> None:
        """Writes one record at the next position.

        Raises:
            WrongEpoch: the fence did not hold (another owner).
            StoreUnavailable: no answer within the budget.
        """
        self._position += 1
        await self._commit([Put(self._names.record(self._position), record)])

    async def checkpoint(self, checkpoint: Checkpoint) -> None:
        """Writes a checkpoint at the next position: its parts, then its head with the
        deletes of everything it replaces.

        Raises:
            WrongEpoch: the fence did not hold (another owner).
            StoreUnavailable: no answer within the budget.
        """
        self._position += 1
        position = self._position
        for index, part in enumerate(checkpoint.parts):
            await self._commit([Put(self._names.part(position, index), part)])
        names = self._names
        await self._commit(
            [
                Put(names.head, encode_head(checkpoint, position)),
                names.below(names.log, position),
                names.below(names.parts, position),
                DeleteRange(names.legacy, names.legacy + "\0"),
            ]
        )

    async def _commit(self, writes: Sequence[Write]) -> None:
        budget = self._budget_s()
        ok = await bounded(
            self._store.commit_fenced(
                writes,
                fence_key=self._keys.owner(self._pool),
                fence_revision=self._epoch,
                timeout_s=budget,
            ),
            budget,
        )
        if not ok:
            raise WrongEpoch(self._pool, NodeId(""), "", self._epoch)
