"""Failover drills: a three-member etcd, three `fairshare serve` processes, gateways under load.

The harness keeps a ledger of every grant the simulated gateways obtain (through the
project's client library) and checks the invariants of docs/design.md §19 at every poll and at the
end:

1. one epoch decides at a time: no grant of epoch e is decided after the first grant of a
   later epoch was received (a grant's request must have been sent after that moment);
2. within-share grants in flight per team never exceed the team's reservation, counting
   every live grant of every epoch (the old owner's included);
3. every grant is released exactly once, and the usage the last owner holds matches the
   released consumption (decayed) within 1 %;
4. no replica logs a line containing ``BUG``.

It also measures, per drill, the longest gap with no non-degraded decision, the degraded
decisions, the time until phantoms reach 0 after the nemesis, and the ownership
transitions (epoch increments seen by the poller) from the nemesis on.

The replicas get all three etcd client endpoints, in member order (``EtcdCluster``).

Every loop here is bounded in count and time; every process is killed in ``close``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import os
import random
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import yaml
from grpc import aio

from fairshare import Class, apportion
from harness import serve
from harness.etcd_cluster import EtcdCluster
from harness.proxy import TcpProxy
from harness.serve import Allocator
from server.client import AllocatorClient, ClientGrant
from wire.channels import open_channel
from wire.pb.fairshare.v1 import allocator_pb2 as pb
from wire.pb.fairshare.v1 import allocator_pb2_grpc as pb_grpc

LEASE_TTL_S = 2.0
HALF_LIFE_S = 30 * 24 * 3600.0
MAX_REQUEST_S = 6.0
FENCE_MARGIN_S = 0.5
RPC_TIMEOUT_S = 0.25
STALL_BUDGET_S = LEASE_TTL_S - FENCE_MARGIN_S - RPC_TIMEOUT_S
"""The etcd stall an owner must survive with the same epoch (docs/ha.md)."""

WALL_OFFSET_ENV = "FAIRSHARE_TEST_WALL_OFFSET_FILE"
"""The replicas' test-only wall-clock hook: a file holding seconds added to wall time."""

POOLS: dict[str, dict[str, float]] = {
    "gpu-a": {"inst-a": 0.8125, "inst-b": 0.1875},
    "gpu-b": {"research": 0.5, "product": 0.25, "eval": 0.25},
}
CAPACITY = {"gpu-a": 10, "gpu-b": 8}
RESERVED = {p: apportion(CAPACITY[p], s.keys(), s) for p, s in POOLS.items()}


ADMIN_TOKEN = "drill-admin-token"
GRANT_KEY = "drill-grant-key-shared-by-every-replica"


def drill_config(token_file: Path, key_file: Path) -> dict[str, object]:
    """The replicas' YAML config: short timings, as docs/design.md §18 allows for tests."""
    return {
        "admin": {"token_file": str(token_file)},
        "grants": {"key_file": str(key_file)},
        "timing": {
            "lease_ttl_s": LEASE_TTL_S,
            "keepalive_interval_s": 0.5,
            "rpc_timeout_s": RPC_TIMEOUT_S,
            "fence_margin_s": FENCE_MARGIN_S,
            "snapshot_interval_s": 0.5,
            "commit_window_s": 0.001,
            "campaign_delay_s": 0.3,
            "degraded_after_s": 0.2,
            "forward_deadline_s": 1.0,
            "release_memory_s": 600.0,
        },
        "pools": [
            {
                "name": name,
                "capacity": CAPACITY[name],
                "shares": shares,
                "half_life_s": HALF_LIFE_S,
                "max_request_s": MAX_REQUEST_S,
                "degraded_mode": "fail_open",
            }
            for name, shares in POOLS.items()
        ],
    }


# -- processes -------------------------------------------------------------------------------


class Replica(Allocator):
    """One ``fairshare serve`` process of the drill cluster, with the test-only wall-clock
    hook (``step_wall_clock``) and a count of its starts."""

    def __init__(self, *, node: str, workdir: Path, etcd: str, prefix: str, config: Path) -> None:
        self.wall_offset_file = workdir / f"wall-offset-{node}"
        super().__init__(
            workdir,
            config,
            node=node,
            etcd=etcd,
            prefix=prefix,
            env={**os.environ, WALL_OFFSET_ENV: str(self.wall_offset_file)},
        )
        self.starts = 0

    def step_wall_clock(self, offset_s: float) -> None:
        """Shifts the replica's wall clock by ``offset_s`` from the real one (the hook
        re-reads the file within a fraction of a second); the machine's clock is untouched."""
        tmp = self.wall_offset_file.with_suffix(".tmp")
        tmp.write_text(f"{offset_s!r}\n", encoding="ascii")
        tmp.replace(self.wall_offset_file)

    def start(self, *, empty_state: bool = False) -> None:
        if empty_state and self.state_dir.exists():
            for child in self.state_dir.iterdir():
                child.unlink()
        self.starts += 1
        super().start()


async def _lists_pools(channel: aio.Channel) -> bool:
    await pb_grpc.AllocatorStub(channel).ListPools(pb.ListPoolsRequest(), timeout=0.5)
    return True


async def wait_serving(
    address: str, timeout_s: float = 15.0, *, exits: Replica | None = None
) -> None:
    """Waits until the replica answers ListPools.

    Raises:
        ServerExited: ``exits`` (the replica's process) ended before it answered.
        TimeoutError: no answer within ``timeout_s``.
    """
    await serve.wait_serving(
        address,
        timeout_s=timeout_s,
        process=exits,
        probe=_lists_pools,
        connect=open_channel,
        interval_s=0.1,
    )


# -- the ledger ----------------------------------------------------------------------------


@dataclass
class GrantRecord:
    holder: str
    pool: str
    team: str
    grant_id: str
    epoch: int
    priority: int
    borrowing: bool
    degraded: bool
    sent_at: float
    issued_at: float
    released_at: float | None = None
    consumed: float = 0.0
    released_wall: float = 0.0
    abandoned: bool = False  # its gateway was killed while holding it
    release_lost: bool = False  # released, but its gateway died before sending it


@dataclass
class Ledger:
    grants: list[GrantRecord] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)

    def live_within(self) -> dict[tuple[str, str], int]:
        counts: dict[tuple[str, str], int] = {}
        for g in self.grants:
            if g.released_at is None and not g.borrowing and not g.degraded and not g.abandoned:
                key = (g.pool, g.team)
                counts[key] = counts.get(key, 0) + 1
        return counts

    def check_reservations(self) -> None:
        """Invariant 2 at this moment."""
        for (pool, team), n in self.live_within().items():
            if n > RESERVED[pool].get(team, 0):
                self.violations.append(
                    f"over-admission: {pool}/{team} has {n} within-share grants in flight, "
                    f"reservation {RESERVED[pool].get(team, 0)}"
                )

    def check_epochs(self) -> None:
        """Invariant 1 over the whole ledger."""
        for pool in POOLS:
            grants = [g for g in self.grants if g.pool == pool and g.epoch > 0]
            first: dict[int, float] = {}
            for g in grants:
                first[g.epoch] = min(first.get(g.epoch, math.inf), g.issued_at)
            for g in grants:
                for epoch, at in first.items():
                    if epoch > g.epoch and g.sent_at > at:
                        self.violations.append(
                            f"two epochs decided: {pool} grant of epoch {g.epoch} requested "
                            f"{g.sent_at - at:.3f}s after the first grant of epoch {epoch}"
                        )
                        break

    def check_released_once(self) -> None:
        ids = [g.grant_id for g in self.grants]
        if len(ids) != len(set(ids)):
            self.violations.append("a grant id was issued twice")
        for g in self.grants:
            if g.released_at is None and not g.abandoned:
                self.violations.append(f"grant {g.grant_id} was never released")

    def expected_usage(self, now_wall: float) -> dict[tuple[str, str], float]:
        lam = math.log(2) / HALF_LIFE_S
        usage: dict[tuple[str, str], float] = {}
        for g in self.grants:
            if g.released_at is not None and g.consumed > 0 and not g.release_lost:
                key = (g.pool, g.team)
                decayed = g.consumed * math.exp(-lam * max(0.0, now_wall - g.released_wall))
                usage[key] = usage.get(key, 0.0) + decayed
        return usage

    def unavailability(self, start: float, end: float) -> float:
        """The longest gap in [start, end] with no non-degraded decision in some pool."""
        worst = 0.0
        for pool in POOLS:
            times = sorted(
                g.issued_at
                for g in self.grants
                if g.pool == pool and not g.degraded and start <= g.issued_at <= end
            )
            edges = [start, *times, end]
            worst = max(worst, *(b - a for a, b in itertools.pairwise(edges)))
        return worst


# -- gateways ---------------------------------------------------------------------------------


class Gateway:
    """A simulated gateway: workers that acquire, hold and release with consumption."""

    def __init__(
        self,
        name: str,
        targets: list[str],
        ledger: Ledger,
        *,
        workers: int,
        seed: int,
        holder: str | None = None,
        route_to_owner: bool = True,
        quiet: set[str] | None = None,
    ):
        self.name = name
        self.quiet: set[str] = set() if quiet is None else quiet  # pools to leave alone
        self.holder = holder or name
        self.client = AllocatorClient(
            targets,
            holder=self.holder,
            deadline_s=1.0,
            release_retry_s=0.2,
            route_to_owner=route_to_owner,
        )
        self.ledger = ledger
        self.workers = workers
        self.random = random.Random(seed)
        self.stop = asyncio.Event()
        self.dead = False
        self.tasks: list[asyncio.Task[None]] = []
        self.errors: list[str] = []

    def start(self) -> None:
        self.tasks = [
            asyncio.create_task(self._work(i), name=f"{self.name}-{i}") for i in range(self.workers)
        ]

    async def _work(self, index: int) -> None:
        for _ in range(100_000):  # bounded; the stop event ends it much sooner
            if self.stop.is_set():
                return
            open_pools = [p for p in POOLS if p not in self.quiet]
            if not open_pools:
                await asyncio.sleep(0.05)
                continue
            pool = self.random.choice(open_pools)
            team = self.random.choice(list(POOLS[pool]))
            cls = Class.BATCH if self.random.random() < 0.3 else Class.INTERACTIVE
            sent = time.monotonic()
            try:
                grant = await self.client.acquire(pool, team, cls, est_tokens=100)
            except Exception as e:
                self.errors.append(f"acquire: {e!r}")
                await asyncio.sleep(0.05)
                continue
            record = self._record(pool, team, grant, sent)
            hold = self.random.uniform(0.02, 0.4)
            try:
                await asyncio.sleep(hold)
            except asyncio.CancelledError:
                record.abandoned = True
                raise
            consumed = round(hold * 10, 3)
            record.released_at = time.monotonic()
            record.released_wall = time.time()
            record.consumed = consumed
            await grant.release(consumed)

    async def hold(self, pool: str, team: str) -> tuple[ClientGrant, GrantRecord]:
        """Acquires one interactive grant outside the workers and records it, held until
        ``release_held``."""
        sent = time.monotonic()
        grant = await self.client.acquire(pool, team, Class.INTERACTIVE, est_tokens=100)
        return grant, self._record(pool, team, grant, sent)

    def _record(self, pool: str, team: str, grant: ClientGrant, sent: float) -> GrantRecord:
        """Enters a grant just answered (``sent``: when its Acquire went out) in the ledger."""
        record = GrantRecord(
            self.holder,
            pool,
            team,
            grant.grant_id,
            grant.epoch,
            grant.priority,
            grant.borrowing,
            grant.degraded,
            sent,
            time.monotonic(),
        )
        self.ledger.grants.append(record)
        return record

    @staticmethod
    async def release_held(grant: ClientGrant, record: GrantRecord, consumed: float) -> None:
        record.released_at = time.monotonic()
        record.released_wall = time.time()
        record.consumed = consumed
        await grant.release(consumed)

    async def drain(self) -> None:
        """Stops acquiring, lets held grants finish, and flushes every release."""
        self.stop.set()
        await asyncio.wait_for(asyncio.gather(*self.tasks, return_exceptions=True), 10)
        await self.client.close(flush_timeout_s=10)

    async def kill(self) -> None:
        """The gateway dies: its held grants are never released."""
        self.dead = True
        self.stop.set()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        self.client._closed = True  # no flush: a dead process sends nothing
        unsent = set(self.client._pending)
        for record in self.ledger.grants:
            if record.holder == self.holder and record.grant_id in unsent:
                record.release_lost = True
        for task in [*self.client._tasks, self.client._watcher, self.client._flusher]:
            if task is not None:
                task.cancel()
        for channel in self.client._channels.values():
            await channel.close()


# -- the cluster ------------------------------------------------------------------------------


@dataclass
class DrillResult:
    name: str
    unavailability_s: float
    degraded: int
    phantoms_zero_s: float | None
    over_admissions: int
    usage_error: float
    grants: int
    violations: list[str]
    transitions: int = 0

    def row(self) -> str:
        phantoms = "n/a" if self.phantoms_zero_s is None else f"{self.phantoms_zero_s:.2f}"
        return (
            f"| {self.name} | {self.grants} | {self.unavailability_s:.2f} | {self.degraded} | "
            f"{phantoms} | {self.transitions} | {self.over_admissions} | "
            f"{self.usage_error * 100:.2f} % | "
            f"{'none' if not self.violations else len(self.violations)} |"
        )


REPORT_HEADER = (
    "| drill | grants | unavailability (s) | degraded | phantoms to 0 (s) | transitions "
    "| over-admissions | usage error | violations |\n|---|---|---|---|---|---|---|---|---|"
)


class DrillCluster:
    """A three-member etcd, three replicas, and gateways; the nemeses act on them."""

    def __init__(self, name: str, *, replicas: int = 3, gateways: int = 3, workers: int = 6):
        self.name = name
        self.workdir = Path(tempfile.mkdtemp(prefix=f"fairshare-drill-{name}-"))
        # The members' data goes where EtcdCluster puts it by itself (RAM when the machine
        # has it) and is deleted with it: three members' WAL files are 60 to 370 MB a drill.
        self.etcd = EtcdCluster(name="drill-etcd")
        self.prefix = f"/drill-{name}-{os.getpid()}"
        self.config_path = self.workdir / "pools.yaml"
        token_file = self.workdir / "admin-token"
        token_file.write_text(ADMIN_TOKEN, encoding="utf-8")
        key_file = self.workdir / "grant-keys"
        key_file.write_text(GRANT_KEY + "\n", encoding="utf-8")
        self.config_path.write_text(
            yaml.safe_dump(drill_config(token_file, key_file)), encoding="utf-8"
        )
        self.replica_count = replicas
        self.replicas: list[Replica] = []
        self.ledger = Ledger()
        self.gateways: list[Gateway] = []
        self.gateway_count = gateways
        self.workers = workers
        self.phantom_samples: list[tuple[float, int]] = []
        self.epoch_samples: list[tuple[float, dict[str, int]]] = []
        self.poll_task: asyncio.Task[None] | None = None
        self.relays: list[TcpProxy] = []
        self.quiet: set[str] = set()  # pools no gateway worker acquires in, for a check

    @property
    def targets(self) -> list[str]:
        return [r.address for r in self.replicas]

    async def start(self) -> None:
        self.etcd.start()
        for i in range(self.replica_count):
            replica = Replica(
                node=f"allocator-{i}",
                workdir=self.workdir,
                etcd=self.etcd.endpoint,
                prefix=self.prefix,
                config=self.config_path,
            )
            replica.start()
            self.replicas.append(replica)
        await asyncio.gather(*(wait_serving(r.address) for r in self.replicas))
        await self.wait_owned()
        await self.wait_agreed()
        for _ in range(self.gateway_count):
            self.add_gateway()
        self.poll_task = asyncio.create_task(self._poll(), name="drill-poller")

    def add_gateway(self, *, holder: str | None = None, relayed: bool = False) -> Gateway:
        """Starts one more simulated gateway (a new holder unless ``holder`` is given).

        ``relayed``: it reaches the replicas only through ``relay_targets`` (relays that a
        nemesis can cut), and sends each call to its target rather than to the owner's
        advertised address, which would bypass the relays.
        """
        i = len(self.gateways)
        targets = self.relay_targets() if relayed else self.targets
        gw = Gateway(
            f"gw-{i}",
            targets,
            self.ledger,
            workers=self.workers,
            seed=i,
            holder=holder,
            route_to_owner=not relayed,
            quiet=self.quiet,
        )
        gw.start()
        self.gateways.append(gw)
        return gw

    def relay_targets(self) -> list[str]:
        """One TCP relay per replica (created once), for gateways a nemesis partitions."""
        if not self.relays:
            self.relays = [TcpProxy(r.address, name=f"relay-{r.node}") for r in self.replicas]
        return [relay.address for relay in self.relays]

    def cut_relays(self) -> None:
        """Partitions the relayed gateways from every replica (both directions)."""
        for relay in self.relays:
            relay.cut()

    def heal_relays(self) -> None:
        for relay in self.relays:
            relay.heal()

    def epoch_at(self, t: float) -> dict[str, int]:
        """The highest epoch of each pool the poller saw up to ``t``."""
        seen: dict[str, int] = {}
        for at, epochs in self.epoch_samples:
            if at > t and seen:
                break
            for pool, epoch in epochs.items():
                seen[pool] = max(seen.get(pool, 0), epoch)
        return seen

    def transitions(self, start: float, end: float) -> int:
        """Ownership transitions (epoch increments) between ``start`` and ``end``."""
        before, after = self.epoch_at(start), self.epoch_at(end)
        return sum(max(0, after.get(p, 0) - before.get(p, after.get(p, 0))) for p in POOLS)

    def live_gateway(self) -> Gateway:
        return next(g for g in self.gateways if not g.dead)

    def window(self, name: str, at: float, end: float, until: float) -> DrillResult:
        """One event's row in a longer run: what happened between ``at`` and ``until``."""
        zero = next(
            (t - end for t, n in self.phantom_samples if end <= t <= until and n == 0), None
        )
        return DrillResult(
            name=name,
            unavailability_s=self.ledger.unavailability(at, until),
            degraded=sum(1 for g in self.ledger.grants if g.degraded and at <= g.issued_at < until),
            phantoms_zero_s=None if zero is None else max(0.0, zero),
            over_admissions=sum(
                1 for v in self.ledger.violations if v.startswith("over-admission")
            ),
            usage_error=0.0,
            grants=sum(1 for g in self.ledger.grants if at <= g.issued_at < until),
            violations=[],
            transitions=self.transitions(at, until),
        )

    async def owners(self) -> dict[str, tuple[str, int]]:
        """pool -> (owner node, epoch) as the first answering replica sees it."""
        for replica in self.replicas:
            if not replica.alive:
                continue
            try:
                async with open_channel(replica.address) as channel:
                    stub = pb_grpc.AllocatorStub(channel)
                    r = await stub.ListPools(pb.ListPoolsRequest(), timeout=0.5)
                    return {p.pool: (p.owner, p.epoch) for p in r.pools}
            except aio.AioRpcError:
                continue
        return {}

    async def wait_owned(
        self, timeout_s: float = 15.0, *, exclude: str | frozenset[str] = ""
    ) -> float:
        """Waits until every pool has an owner (not ``exclude``, one node or a set of them);
        returns the time taken."""
        excluded = {exclude} if isinstance(exclude, str) else set(exclude)
        start = time.monotonic()
        while time.monotonic() - start < timeout_s:
            owners = await self.owners()
            if len(owners) == len(POOLS) and all(
                node and node not in excluded for node, _ in owners.values()
            ):
                return time.monotonic() - start
            await asyncio.sleep(0.05)
        raise AssertionError(f"pools without owner after {timeout_s}s: {await self.owners()}")

    async def wait_agreed(self, timeout_s: float = 15.0) -> float:
        """Waits until every live replica names the same owner and epoch for every pool;
        returns the time taken.

        ``wait_owned`` asks one replica; the others learn of an owner through their own
        watch, a moment later. A test that asks every replica for a decision needs them all
        to know the owner, or a replica still waiting to learn it answers degraded.
        """
        start = time.monotonic()
        views: list[dict[str, tuple[str, int]]] = []
        while time.monotonic() - start < timeout_s:
            views = [await self._owners_seen_by(r) for r in self.replicas if r.alive]
            if views and all(len(v) == len(POOLS) and v == views[0] for v in views):
                return time.monotonic() - start
            await asyncio.sleep(0.05)
        raise AssertionError(f"replicas disagree on owners after {timeout_s}s: {views}")

    async def _owners_seen_by(self, replica: Replica) -> dict[str, tuple[str, int]]:
        try:
            async with open_channel(replica.address) as channel:
                stub = pb_grpc.AllocatorStub(channel)
                r = await stub.ListPools(pb.ListPoolsRequest(), timeout=0.5)
        except aio.AioRpcError:
            return {}
        return {p.pool: (p.owner, p.epoch) for p in r.pools if p.owner}

    async def switchover(self, pool: str, node: str) -> None:
        """Admin Switchover through any live replica."""
        replica = next(r for r in self.replicas if r.alive)
        async with open_channel(replica.address) as channel:
            stub = pb_grpc.AdminStub(channel)
            await stub.Switchover(
                pb.SwitchoverRequest(pool=pool, node=node),
                metadata=(("authorization", f"Bearer {ADMIN_TOKEN}"),),
                timeout=5.0,
            )

    def replica(self, node: str) -> Replica:
        return next(r for r in self.replicas if r.node == node)

    async def phantoms(self) -> int | None:
        total = 0
        for pool in POOLS:
            stats = await self.snapshot(pool)
            if stats is None:
                return None
            total += sum(t.phantoms for t in stats.teams)
        return total

    async def snapshot(self, pool: str) -> pb.SnapshotResponse | None:
        for replica in self.replicas:
            if not replica.alive:
                continue
            try:
                async with open_channel(replica.address) as channel:
                    stub = pb_grpc.AllocatorStub(channel)
                    return await stub.Snapshot(pb.SnapshotRequest(pool=pool), timeout=1.0)
            except aio.AioRpcError:
                continue
        return None

    async def _poll(self) -> None:
        for _ in range(100_000):
            self.ledger.check_reservations()
            with contextlib.suppress(Exception):
                owners = await self.owners()
                if owners:
                    epochs = {pool: epoch for pool, (_, epoch) in owners.items()}
                    self.epoch_samples.append((time.monotonic(), epochs))
            with contextlib.suppress(Exception):
                n = await self.phantoms()
                if n is not None:
                    self.phantom_samples.append((time.monotonic(), n))
            await asyncio.sleep(0.1)

    async def finish(self, *, nemesis_at: float, nemesis_end: float) -> DrillResult:
        """Drains the gateways and checks everything; returns the drill's row."""
        for gw in self.gateways:
            if not gw.dead:
                await gw.drain()
        # Phantoms must reach 0 (re-reports, or expiry for an abandoned gateway).
        deadline = time.monotonic() + MAX_REQUEST_S + 4 * LEASE_TTL_S
        phantoms_zero: float | None = None
        while time.monotonic() < deadline:
            n = await self.phantoms()
            if n == 0:
                phantoms_zero = self._first_zero_after(nemesis_end)
                break
            await asyncio.sleep(0.2)
        if self.poll_task is not None:
            self.poll_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.poll_task
        self.ledger.check_reservations()
        self.ledger.check_epochs()
        self.ledger.check_released_once()
        usage_error = await self._usage_error()
        violations = list(self.ledger.violations)
        if phantoms_zero is None:
            violations.append("phantoms never reached 0")
        if usage_error > 0.01:
            violations.append(f"usage differs from released consumption by {usage_error:.2%}")
        for replica in self.replicas:
            for line in replica.log_text().splitlines():
                if "BUG" in line:
                    violations.append(f"{replica.node} logged: {line[:300]}")
        end = max((g.issued_at for g in self.ledger.grants), default=nemesis_end)
        owners = await self.owners()
        self.epoch_samples.append((time.monotonic(), {p: e for p, (_, e) in owners.items()}))
        return DrillResult(
            name=self.name,
            unavailability_s=self.ledger.unavailability(nemesis_at, max(end, nemesis_end)),
            degraded=sum(1 for g in self.ledger.grants if g.degraded),
            phantoms_zero_s=phantoms_zero,
            over_admissions=sum(1 for v in violations if v.startswith("over-admission")),
            usage_error=usage_error,
            grants=len(self.ledger.grants),
            violations=violations,
            transitions=self.transitions(nemesis_at, time.monotonic()),
        )

    def _first_zero_after(self, t: float) -> float:
        for at, n in self.phantom_samples:
            if at >= t and n == 0:
                return max(0.0, at - t)
        return max(0.0, time.monotonic() - t)

    async def _usage_error(self) -> float:
        """Relative difference between the owners' usage and the released consumption."""
        await asyncio.sleep(1.0)  # the last releases reach a snapshot-free owner state
        expected = self.ledger.expected_usage(time.time())
        actual: dict[tuple[str, str], float] = {}
        for pool in POOLS:
            stats = await self.snapshot(pool)
            assert stats is not None, f"no replica answers Snapshot({pool})"
            for t in stats.teams:
                actual[(pool, t.team)] = t.usage
        total = sum(expected.values())
        diff = sum(abs(actual.get(k, 0.0) - v) for k, v in expected.items())
        return diff / total if total > 0 else 0.0

    async def close(self) -> None:
        for gw in self.gateways:
            if not gw.dead:
                with contextlib.suppress(Exception):
                    await gw.kill()
        for relay in self.relays:
            with contextlib.suppress(Exception):
                relay.close()
        for replica in self.replicas:
            replica.kill()
        self.etcd.close()
        # Logs are read (cluster.logs()) before close; nothing of a drill outlives it.
        shutil.rmtree(self.workdir, ignore_errors=True)

    def logs(self) -> str:
        return "\n".join(f"--- {r.node}\n{r.log_text()[-3000:]}" for r in self.replicas)


def iter_rows(results: list[DrillResult]) -> Iterator[str]:
    yield REPORT_HEADER
    for r in results:
        yield r.row()


def write_report(results: list[DrillResult], path: Path) -> str:
    text = "# Failover drills\n\n" + "\n".join(iter_rows(results)) + "\n"
    for r in results:
        for v in r.violations:
            text += f"\n- {r.name}: {v}"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n", encoding="utf-8")
    return text


__all__ = [
    "DrillCluster",
    "DrillResult",
    "Gateway",
    "GrantRecord",
    "Replica",
    "grpc",
    "write_report",
]
