"""Priorities from a running allocator over gRPC, instead of an in-process pool.

``fairshare simulate --scenario NAME --out DIR --allocator HOST:PORT [--token-file F]``
runs the scenario's fairshare side against a running allocator through the gateway's
client library (``client.SyncAllocatorClient``, holder ``simulator``): every
request the simulated gateway sends is an ``Acquire`` on the allocator, and every request
that ends is a ``Release`` with its cost (the GPU-seconds of its run). The comparison run
(FCFS) stays in-process.

Constraints:

- **Time.** The allocator decays usage on wall time, the simulation runs on simulated
  time (a 30-minute scenario takes seconds): on the allocator, usage barely decays
  during a run, and the half-life is the one of its configuration, not the scenario's.
  Usage left by earlier runs or other gateways counts too. The figures of a run against
  a live allocator are therefore not comparable with the in-process ones; the report
  says so.
- **Configuration.** The allocator's pools come from its own configuration. The scenario
  maps onto the pool named like the scenario (``--pool`` to choose another), which must
  have the scenario's capacity and the same teams with the same shares (normalised). At
  start the simulator checks that with ``ListPools`` and ``Snapshot`` and refuses with a
  message naming what is missing and the YAML to configure.
- **Admin.** A scenario that changes the capacity mid-run (``elastic``) calls the admin
  ``SetCapacity`` with the bearer token of ``--token-file``; without it the scenario is
  refused before it starts. The capacity found at start is restored at the end.
- **In-process only.** The failover scenario crashes and rebuilds the owner itself: it is
  refused under ``--allocator``.
- Requests still in flight at the simulated horizon are released at no cost when the
  run ends, so the run leaves nothing in flight on the allocator. Plaintext gRPC only
  (no TLS options here).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import grpc

from fairshare.client import SyncAllocatorClient, SyncGrant
from fairshare.errors import AllocatorError
from fairshare.sim.allocators import PoolSpec, SetupError
from fairshare.sim.engine import Simulator
from fairshare.sim.model import Request
from fairshare.sim.scenarios.result import ScenarioResult
from fairshare.wire.channels import open_sync_channel
from fairshare.wire.credentials import read_token
from fairshare.wire.metadata import bearer
from fairshare.wire.pb.fairshare.v1 import allocator_pb2 as pb
from fairshare.wire.pb.fairshare.v1 import allocator_pb2_grpc as pb_grpc

logger = logging.getLogger(__name__)

HOLDER: Final = "simulator"
"""The gateway id the simulator acquires as."""
DEADLINE_S: Final = 2.0
"""How long an acquire may look for the allocator before its degraded mode applies."""
CALL_TIMEOUT_S: Final = 5.0
"""Deadline of the Snapshot and SetCapacity calls."""
_SHARE_TOLERANCE: Final = 1e-6

NOT_COMPARABLE: Final = (
    "**Priorities from a running allocator.** The fairshare run took its priorities from "
    "the allocator at `{target}` (pool `{pool}`, holder `{holder}`) over gRPC; the "
    "comparison run is in-process. These figures are not comparable with the in-process "
    "ones: the allocator decays usage on wall time with the half-life of its own "
    "configuration while the simulation runs on simulated time (the run took seconds, so "
    "usage barely decayed), usage it held before the run counts, and every decision "
    "includes a network round trip. {grants} grants acquired, {degraded} of them degraded "
    "(no owner answered within {deadline:g} s), {cut} released at no cost at the horizon."
)


def _teams(shares: Mapping[str, float]) -> dict[str, float]:
    """Teams with a positive share, shares normalised to sum to 1."""
    total = math.fsum(v for v in shares.values() if v > 0)
    return {t: v / total for t, v in shares.items() if v > 0} if total > 0 else {}


def _yaml(spec: PoolSpec, pool: str) -> str:
    text = f"  - name: {pool}\n    capacity: {spec.capacity}\n    shares: {_flow(spec.shares)}"
    if spec.lend:
        text += f"\n    lend: {_flow(spec.lend)}"
    return text


def _flow(values: Mapping[str, float]) -> str:
    """A team map as a YAML flow mapping."""
    return "{" + ", ".join(f"{team}: {value:g}" for team, value in values.items()) + "}"


@dataclass
class LiveStats:
    """What a run did on the allocator."""

    acquired: int = 0
    degraded: int = 0
    released: int = 0
    cut_at_horizon: int = 0
    usage_before: dict[str, float] = field(default_factory=dict)
    in_flight_before: int = 0


class GrpcAllocator:
    """The engine's ``Allocator`` over gRPC: one pool of a running allocator.

    ``admit`` is an ``Acquire`` (the grant is kept by request id), ``release`` a
    ``Release`` with the request's cost, ``set_capacity`` the admin ``SetCapacity``.
    Call ``check`` before the run and ``close`` after it.
    """

    def __init__(
        self,
        target: str,
        pool: str,
        *,
        holder: str = HOLDER,
        token: str | None = None,
        deadline_s: float = DEADLINE_S,
    ) -> None:
        """Connects lazily to ``target`` (``host:port``, plaintext)."""
        self.target = target
        self.pool = pool
        self.holder = holder
        self.deadline_s = deadline_s
        self.stats = LiveStats()
        self._token = token
        self._client = SyncAllocatorClient([target], holder=holder, deadline_s=deadline_s)
        self._channel = open_sync_channel(target)
        self._grants: dict[int, SyncGrant] = {}
        self._capacity_at_start: int | None = None
        self._resized = False
        self._closed = False

    # -- before the run -------------------------------------------------------------

    def check(self, spec: PoolSpec) -> None:
        """Checks that the allocator's pool matches the scenario's.

        Raises:
            SetupError: the allocator cannot be reached, has no such pool, or the pool's
                capacity or teams differ; the message names what is missing.
        """
        if spec.resizes and self._token is None:
            raise SetupError(
                f"scenario pool {spec.name!r} changes the capacity mid-run (admin "
                "SetCapacity): pass --token-file with the allocator's admin token"
            )
        where = f"allocator at {self.target}"
        fix = f"configure it with:\npools:\n{_yaml(spec, self.pool)}"
        try:
            pools = self._client.refresh_pools()
        except (grpc.RpcError, AllocatorError) as e:
            raise SetupError(f"cannot reach the {where}: {_describe(e)}") from e
        names = sorted(p.pool for p in pools)
        if self.pool not in names:
            raise SetupError(
                f"the {where} has no pool {self.pool!r} (it has: {', '.join(names) or 'none'}); "
                + fix
            )
        snapshot = self._snapshot()
        problems = []
        if snapshot.capacity != spec.capacity:
            problems.append(f"capacity is {snapshot.capacity}, the scenario needs {spec.capacity}")
        live = _teams({t.team: t.share for t in snapshot.teams})
        wanted = _teams(spec.shares)
        missing = sorted(set(wanted) - set(live))
        extra = sorted(set(live) - set(wanted))
        if missing:
            problems.append(f"missing team(s) {', '.join(missing)}")
        if extra:
            problems.append(f"team(s) {', '.join(extra)} not in the scenario")
        for team in sorted(set(wanted) & set(live)):
            if abs(wanted[team] - live[team]) > _SHARE_TOLERANCE:
                problems.append(
                    f"team {team} has {live[team]:.4g} of the shares, "
                    f"the scenario {wanted[team]:.4g}"
                )
        if problems:
            raise SetupError(f"pool {self.pool!r} on the {where}: {'; '.join(problems)}; " + fix)
        self._capacity_at_start = int(snapshot.capacity)
        self.stats.usage_before = {t.team: t.usage for t in snapshot.teams}
        self.stats.in_flight_before = sum(t.in_flight for t in snapshot.teams)

    def snapshot(self) -> Any:
        """The pool's ``SnapshotResponse`` as the allocator reports it now."""
        return self._snapshot()

    def _snapshot(self) -> Any:
        stub = pb_grpc.AllocatorStub(self._channel)
        try:
            return stub.Snapshot(pb.SnapshotRequest(pool=self.pool), timeout=CALL_TIMEOUT_S)
        except grpc.RpcError as e:
            raise SetupError(f"Snapshot of pool {self.pool!r}: {_describe(e)}") from e

    # -- the engine's Allocator protocol ---------------------------------------------

    def admit(self, req: Request) -> None:
        """Acquires the request's priority from the allocator."""
        grant = self._client.acquire(self.pool, req.team, req.cls, req.est_tokens)
        self._grants[req.rid] = grant
        self.stats.acquired += 1
        req.priority = grant.grant.priority
        req.borrowing = grant.grant.borrowing
        req.degraded = grant.grant.degraded
        if req.degraded:
            self.stats.degraded += 1

    def release(self, req: Request, cost: float) -> None:
        """Releases the request's grant, charging ``cost``."""
        grant = self._grants.pop(req.rid, None)
        if grant is not None:
            grant.release(cost)
            self.stats.released += 1

    def set_capacity(self, capacity: int) -> None:
        """Changes the pool's capacity on the allocator (admin ``SetCapacity``)."""
        if self._token is None:
            raise SetupError("set_capacity needs the admin token (--token-file)")
        self._set_capacity(capacity)
        self._resized = True

    def _set_capacity(self, capacity: int) -> None:
        assert self._token is not None
        try:
            pb_grpc.AdminStub(self._channel).SetCapacity(
                pb.SetCapacityRequest(pool=self.pool, capacity=capacity),
                timeout=CALL_TIMEOUT_S,
                metadata=(bearer(self._token),),
            )
        except grpc.RpcError as e:
            raise SetupError(
                f"SetCapacity({self.pool!r}, {capacity}) refused: {_describe(e)}"
            ) from e

    # -- after the run ----------------------------------------------------------------

    def close(self) -> None:
        """Releases the grants still in flight at no cost, restores the capacity, closes.

        Idempotent; the connection is closed even if a step fails.
        """
        if self._closed:
            return
        self._closed = True
        try:
            for rid in sorted(self._grants):
                self._grants.pop(rid).release(0.0)
                self.stats.cut_at_horizon += 1
            if self._resized and self._capacity_at_start is not None:
                self._set_capacity(self._capacity_at_start)
        finally:
            self._client.close()
            self._channel.close()


def _describe(error: BaseException) -> str:
    """A gRPC error as ``CODE: details`` (any other error as its text)."""
    code, details = getattr(error, "code", None), getattr(error, "details", None)
    if callable(code) and callable(details):
        return f"{code().name}: {details()}"
    return str(error)


class RemoteSession:
    """The allocator factory of ``--allocator``: one ``GrpcAllocator`` per fairshare run.

    Use as a context manager around one scenario; it closes every allocator it made.
    """

    def __init__(
        self,
        target: str,
        *,
        pool: str | None = None,
        token_file: str | None = None,
        holder: str = HOLDER,
    ) -> None:
        """Reads the admin token (if any); connects only when a run starts.

        Raises:
            SetupError: the token file cannot be read or is empty.
        """
        self.target = target
        self.pool = pool
        self.holder = holder
        try:
            self._token = read_token(token_file) if token_file else None
        except (OSError, ValueError) as e:
            raise SetupError(f"--token-file: {e}") from e
        self.made: list[GrpcAllocator] = []

    def __enter__(self) -> RemoteSession:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        try:
            self.close()
        except SetupError:
            if exc_type is None:
                raise
            logger.exception("closing the allocators after a failed run")

    def __call__(self, spec: PoolSpec, sim: Simulator) -> GrpcAllocator:
        """Builds and checks the allocator of one fairshare run (an ``AllocatorFactory``)."""
        alloc = GrpcAllocator(
            self.target, self.pool or spec.name, holder=self.holder, token=self._token
        )
        self.made.append(alloc)  # closed by ``close`` even if the check fails
        alloc.check(spec)
        return alloc

    def close(self) -> None:
        """Closes every allocator made (releasing what is still in flight)."""
        errors = []
        for alloc in self.made:
            try:
                alloc.close()
            except (SetupError, AllocatorError, grpc.RpcError) as e:
                errors.append(str(e))
        if errors:
            raise SetupError("; ".join(errors))

    def annotate(self, result: ScenarioResult) -> None:
        """Marks ``result`` as decided by the running allocator (title, text, figures)."""
        stats = [a.stats for a in self.made]
        first = self.made[0] if self.made else None
        acquired = sum(s.acquired for s in stats)
        degraded = sum(s.degraded for s in stats)
        cut = sum(s.cut_at_horizon for s in stats)
        result.title = f"{result.title} — priorities from a running allocator"
        note = NOT_COMPARABLE.format(
            target=self.target,
            pool=first.pool if first is not None else self.pool,
            holder=self.holder,
            grants=acquired,
            degraded=degraded,
            deadline=DEADLINE_S,
            cut=cut,
        )
        before = sum(s.in_flight_before for s in stats)
        if before:
            note += f" {before} grants of other holders were in flight when the run started."
        result.description = f"{result.description}\n\n{note}"
        result.figures["live_grants"] = acquired
        result.figures["live_degraded"] = degraded
        result.figures["live_released_at_horizon"] = cut
        if stats:
            for team, usage in stats[0].usage_before.items():
                result.figures[f"live_usage_before_{team}"] = usage
