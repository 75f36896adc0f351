"""Failover drills: a three-member etcd, three `fairshare serve` processes, gateways under load.

``DrillCluster`` starts the etcd members, the replicas (drill_replica.py) and the simulated
gateways (drill_gateway.py), polls the replicas while a nemesis acts, and at the end
checks the ledger's invariants (drill_ledger.py, docs/design.md §19) and that no replica
logged a line containing ``BUG``.

It also measures, per drill, the longest gap with no non-degraded decision, the degraded
decisions, the time until phantoms reach 0 after the nemesis, and the ownership
transitions (epoch increments seen by the poller) from the nemesis on.

The replicas get all three etcd client endpoints, in member order (``EtcdCluster``).

Every loop here is bounded in count and time; every process is killed in ``close``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import yaml
from drill_config import (
    ADMIN_TOKEN,
    GRANT_KEY,
    LEASE_TTL_S,
    MAX_REQUEST_S,
    POOLS,
    drill_config,
)
from drill_gateway import Gateway
from drill_ledger import DrillResult, Ledger
from drill_replica import Replica, wait_serving
from grpc import aio

from fairshare.wire.channels import open_channel
from fairshare.wire.pb.fairshare.v1 import allocator_pb2 as pb
from fairshare.wire.pb.fairshare.v1 import allocator_pb2_grpc as pb_grpc
from harness.etcd_cluster import EtcdCluster
from harness.net import listens
from harness.proxy import TcpProxy
from harness.serve import ServerExited

PORT_TRIES = 3
"""Starts of one replica at most, each on a new port, when it loses the race for its port."""
LOST_PORT = "cannot listen on"
"""What a replica that could not bind its port says as it exits (``server.app._bind``)."""
NOTABLE_MARKS = (" WARNING ", " ERROR ", " CRITICAL ", "ha.cluster.")
"""What ``notable_logs`` keeps: warnings and worse, and the cluster's ownership lines."""
NOTABLE_LINES = 60


class DrillCluster:
    """A three-member etcd, three replicas, and gateways; the nemeses act on them."""

    def __init__(
        self,
        name: str,
        *,
        replicas: int = 3,
        gateways: int = 3,
        workers: int = 6,
        max_request_s: float = MAX_REQUEST_S,
    ):
        self.name = name
        self.max_request_s = max_request_s
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
            yaml.safe_dump(drill_config(token_file, key_file, max_request_s=max_request_s)),
            encoding="utf-8",
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

    def _started(self, index: int) -> Replica:
        """Replica ``index`` started on a port of its own."""
        replica = Replica(
            node=f"allocator-{index}",
            workdir=self.workdir,
            etcd=self.etcd.endpoint,
            prefix=self.prefix,
            config=self.config_path,
        )
        replica.start()
        return replica

    async def _serving(self, index: int) -> None:
        """Waits until replica ``index`` serves, started again on another port when it lost
        the race for its own: ``free_port`` is no reservation, and a server of the suite's
        other process may bind the same number first. The replica then exits ("cannot
        listen on"), and until it has, the port answers for the other server."""
        for _ in range(PORT_TRIES - 1):
            replica = self.replicas[index]
            try:
                await wait_serving(replica.address, exits=replica)
            except ServerExited:
                if LOST_PORT not in replica.log_tail():
                    raise
            else:
                assert replica.proc is not None
                if listens(replica.proc.pid, replica.port):
                    return
                replica.stop()
            self.replicas[index] = self._started(index)
        await wait_serving(self.replicas[index].address, exits=self.replicas[index])

    @property
    def targets(self) -> list[str]:
        return [r.address for r in self.replicas]

    async def start(self) -> None:
        self.etcd.start()
        self.replicas = [self._started(i) for i in range(self.replica_count)]
        await asyncio.gather(*(self._serving(i) for i in range(self.replica_count)))
        await self.wait_owned()
        await self.wait_agreed()
        for _ in range(self.gateway_count):
            self.add_gateway()
        self.poll_task = asyncio.create_task(self._poll(), name="drill-poller")

    def add_gateway(
        self,
        *,
        holder: str | None = None,
        relayed: bool = False,
        assignments: list[tuple[str, str]] | None = None,
        hold_s: Callable[[random.Random], float] | None = None,
    ) -> Gateway:
        """Starts one more simulated gateway (a new holder unless ``holder`` is given).

        ``assignments``: worker i keeps to ``assignments[i]`` (pool, team), one worker
        each; without it the gateway has ``workers`` workers choosing at random.
        ``hold_s``: how long each request runs (default: 0.02 to 0.4 s).

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
            workers=self.workers if assignments is None else len(assignments),
            seed=i,
            holder=holder,
            route_to_owner=not relayed,
            quiet=self.quiet,
            assignments=assignments,
            hold_s=hold_s,
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
        """Ownership transitions between ``start`` and ``end``: the new epochs the poller
        saw, per pool, above the highest it saw up to ``start``.

        An epoch is an etcd revision, so two epochs' difference counts every write to etcd
        in between, not owners: each new epoch value counts once. A pool first seen after
        ``start`` counts from the first epoch seen.
        """
        last = self.epoch_at(start)
        count = 0
        for at, epochs in self.epoch_samples:
            if at <= start:
                continue
            if at > end:
                break
            for pool, epoch in epochs.items():
                if pool not in last:
                    last[pool] = epoch
                elif epoch > last[pool]:
                    last[pool] = epoch
                    count += 1
        return count

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
        deadline = time.monotonic() + self.max_request_s + 4 * LEASE_TTL_S
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

    def notable_logs(self, per_replica: int = NOTABLE_LINES) -> str:
        """Each replica's warnings, errors and ownership changes over the whole drill
        (the last ``per_replica`` of them): what explains a failed drill's transitions
        or unavailability, which the end of a log (``logs``) may not reach back to."""
        parts = []
        for replica in self.replicas:
            lines = [
                line
                for line in replica.log_text().splitlines()
                if any(mark in line for mark in NOTABLE_MARKS)
            ]
            parts.append(f"--- {replica.node}\n" + "\n".join(lines[-per_replica:]))
        return "\n".join(parts)
