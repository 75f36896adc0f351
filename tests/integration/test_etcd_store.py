"""The etcd store when its etcd goes away: restarted, stopped, paused, stalled under a
node that owns a pool.

Each test has a private etcd member (``etcd_disposable``) and one ``EtcdStore`` that
lives through the disruption: nothing is recreated by the test.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import time
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import pytest

from fairshare import Class
from fairshare.errors import AllocatorError
from ha.api import AdoptResult, Decision, NodeId, PeerUnavailable, PoolStatus, PoolView
from ha.node import Node
from ha.settings import PoolConfig, Timing
from ha.store.contract import EventKind, StoreFull, StoreUnavailable, WatchEvent
from ha.store.etcd import EtcdStore, connect
from harness.etcd import EtcdProcess, find_etcd, find_etcdctl
from harness.etcd_cluster import EtcdCluster
from harness.net import free_port

pytestmark = [pytest.mark.etcd, pytest.mark.timeout(45)]

RPC_TIMEOUT_S = 1.0
PREFIX = "/fairshare-it/"
T = TypeVar("T")


@pytest.fixture
async def store(etcd_disposable: EtcdProcess) -> AsyncIterator[EtcdStore]:
    s = await connect(etcd_disposable.endpoints, rpc_timeout_s=RPC_TIMEOUT_S)
    try:
        yield s
    finally:
        await s.close()


async def until_available(op: Callable[[], Awaitable[T]], *, within_s: float = 10.0) -> T:
    """``op()`` retried on StoreUnavailable until it answers, with the last error on failure."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            return await op()
        except StoreUnavailable as e:
            if time.monotonic() > deadline:
                raise AssertionError(f"store still unavailable after {within_s} s: {e}") from e
            await asyncio.sleep(0.1)


async def timed_failure(op: Callable[[], Awaitable[object]]) -> float:
    """Seconds until ``op()`` raised StoreUnavailable."""
    start = time.monotonic()
    with pytest.raises(StoreUnavailable):
        await op()
    return time.monotonic() - start


async def test_a_watch_resumes_after_etcd_restarts(
    etcd_disposable: EtcdProcess, store: EtcdStore, caplog: pytest.LogCaptureFixture
) -> None:
    before = await store.put(PREFIX + "a", b"1")
    events = store.watch_prefix(PREFIX, start_revision=before - 1)
    try:
        first = await asyncio.wait_for(anext(events), 5)
        assert (first.kind, first.key) == (EventKind.PUT, PREFIX + "a")
        waiting = asyncio.ensure_future(anext(events))

        await asyncio.to_thread(etcd_disposable.restart)

        written = await until_available(lambda: store.put(PREFIX + "b", b"2"))
        # Resumed either by a replay from the last delivered revision (what etcd allows
        # unless it compacted) or by a RESET listing; either way "b" must show up.
        event: WatchEvent = await asyncio.wait_for(waiting, 10)
        if event.kind is EventKind.RESET and PREFIX + "b" not in [k.key for k in event.snapshot]:
            event = await asyncio.wait_for(anext(events), 10)
        if event.kind is not EventKind.RESET:
            assert (event.kind, event.key, event.revision) == (EventKind.PUT, PREFIX + "b", written)
        assert "lost its stream" in caplog.text
        kv = await store.get(PREFIX + "b")
        assert kv is not None and kv.value == b"2"
    finally:
        await events.aclose()  # type: ignore[attr-defined]


async def test_a_call_while_etcd_is_stopped_fails_within_the_deadline(
    etcd_disposable: EtcdProcess, store: EtcdStore
) -> None:
    lease = await store.grant_lease(5)
    await asyncio.to_thread(etcd_disposable.stop)

    assert await timed_failure(lambda: store.get(PREFIX + "a")) < RPC_TIMEOUT_S + 0.5
    assert await timed_failure(lambda: store.keepalive(lease)) < RPC_TIMEOUT_S + 0.5
    assert (
        await timed_failure(lambda: store.create(PREFIX + "owner", b"x", lease=lease))
        < RPC_TIMEOUT_S + 0.5
    )

    await asyncio.to_thread(etcd_disposable.start)
    assert await until_available(lambda: store.keepalive(lease)) >= 5
    created = await store.create(PREFIX + "owner", b"x", lease=lease)
    assert created is not None
    await store.revoke(lease)


async def test_a_paused_etcd_fails_calls_at_the_deadline_and_serves_again_when_resumed(
    etcd_disposable: EtcdProcess, store: EtcdStore
) -> None:
    lease = await store.grant_lease(5)
    etcd_disposable.pause()
    try:
        assert list(store.endpoints) == [etcd_disposable.endpoint], store.endpoints
        took = await timed_failure(lambda: store.get(PREFIX + "a"))
        assert RPC_TIMEOUT_S - 0.1 < took < RPC_TIMEOUT_S + 0.5
        # A transaction without an answer has an unknown outcome: StoreUnavailable, and
        # the caller must read again rather than retry.
        took = await timed_failure(lambda: store.create(PREFIX + "owner", b"x", lease=lease))
        assert took < RPC_TIMEOUT_S + 0.5
    finally:
        etcd_disposable.resume()

    assert await until_available(lambda: store.keepalive(lease), within_s=5) >= 5
    owner = await store.get(PREFIX + "owner")  # created or not: either is a valid outcome
    if owner is None:
        owner = await store.create(PREFIX + "owner", b"x", lease=lease)
    assert owner is not None and owner.value == b"x"
    await store.revoke(lease)
    assert await store.get(PREFIX + "owner") is None


async def test_connect_fails_over_to_the_next_endpoint(etcd_disposable: EtcdProcess) -> None:
    dead = f"127.0.0.1:{free_port()}"
    store = await connect([dead, etcd_disposable.client_url], rpc_timeout_s=RPC_TIMEOUT_S)
    try:
        rev = await store.put(PREFIX + "x", b"1")
        listing, at = await store.get_prefix(PREFIX)
        assert [kv.key for kv in listing] == [PREFIX + "x"] and at == rev
    finally:
        await store.close()
    with pytest.raises(StoreUnavailable, match=dead):
        await connect([dead], rpc_timeout_s=RPC_TIMEOUT_S)


# -- a node through an etcd stall ---------------------------------------------------------

POOL = "gpu-a"
STALL_TIMING = Timing()  # T = 5 s, margin 1 s, RPC timeout 0.5 s, keepalive every 0.5 s


class NoPeers:
    """The peer transport of a lone replica: there is nobody to forward to."""

    async def acquire(self, address: str, **_: object) -> Decision:
        raise PeerUnavailable(address)

    async def release(self, address: str, grant_id: str, consumed: float, timeout: float) -> None:
        raise PeerUnavailable(address)

    async def adopt(self, address: str, **_: object) -> AdoptResult:
        raise PeerUnavailable(address)

    async def snapshot(self, address: str, pool: str, timeout: float) -> PoolView:
        raise PeerUnavailable(address)

    async def set_capacity(self, address: str, pool: str, capacity: int, timeout: float) -> int:
        raise PeerUnavailable(address)

    async def switchover(self, address: str, pool: str, node: str, timeout: float) -> None:
        raise PeerUnavailable(address)

    async def close(self) -> None:
        pass


def _pool_status(node: Node) -> PoolStatus:
    return next(s for s in node.status() if s.pool == POOL)


async def _lone(endpoints: list[str], name: str) -> Node:
    """One replica alone on ``endpoints`` with ``POOL`` (C = 8, two teams of 4); not started."""
    store = await connect(endpoints, rpc_timeout_s=STALL_TIMING.rpc_timeout_s)
    return Node(
        node_id=NodeId(f"{name}-0"),
        advertise="127.0.0.1:1",
        pools=[PoolConfig(POOL, 8, {"a": 0.5, "b": 0.5})],
        timing=STALL_TIMING,
        store=store,
        peers=NoPeers(),  # type: ignore[arg-type]
        prefix=f"/fairshare-{name}",
        owns_store=True,
    )


@pytest.fixture
async def lone_node(etcd_disposable: EtcdProcess) -> AsyncIterator[Node]:
    """One replica on the private etcd, owning ``POOL``."""
    node = await _lone(etcd_disposable.endpoints, "stall")
    await node.start()
    try:
        deadline = time.monotonic() + 10
        while not _pool_status(node).owned:
            assert time.monotonic() < deadline, f"never owned {POOL}: {_pool_status(node)}"
            await asyncio.sleep(0.05)
        yield node
    finally:
        await node.close()


@dataclass
class _Load:
    """Within-share Acquire/Release through the node, counted by the epoch that decided."""

    node: Node
    epochs: list[int] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    stop: bool = False

    async def worker(self) -> None:
        for _ in range(10_000):  # bounded; the test stops it long before
            if self.stop:
                return
            try:
                async with asyncio.timeout(10):
                    decision = await self.node.acquire(
                        pool=POOL, team="a", cls=Class.INTERACTIVE, est_tokens=0
                    )
                    await asyncio.sleep(0.01)
                    await self.node.release(decision.grant_id, 1.0)
            except Exception as e:  # counted: the test asserts there are none
                self.failures.append(repr(e))
                await asyncio.sleep(0.05)
                continue
            if decision.degraded or decision.borrowing:
                self.failures.append(f"not a within-share owner decision: {decision}")
            self.epochs.append(int(decision.epoch))


async def _stall(
    etcd: EtcdProcess, node: Node, seconds: float, *, before_renewal: bool = False
) -> tuple[_Load, list[PoolStatus], int]:
    """Runs three within-share workers, pauses etcd for ``seconds``, and returns the load,
    the pool's status as seen every 50 ms from the pause until 1.5 s after it, and how
    many grants were counted when etcd resumed.

    ``before_renewal`` starts the pause just before the lease's next renewal is sent, the
    worst moment: the fencing deadline is then nearest."""
    load = _Load(node)
    workers = [asyncio.create_task(load.worker()) for _ in range(3)]
    seen: list[PoolStatus] = []
    try:
        await asyncio.sleep(0.5)
        if before_renewal:
            renewals = node._lease.renewals
            for _ in range(200):  # bounded: a renewal comes every keepalive_interval_s
                if node._lease.renewals != renewals:
                    break
                await asyncio.sleep(0.005)
            await asyncio.sleep(STALL_TIMING.keepalive_interval_s - 0.05)
        etcd.pause()
        try:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                seen.append(_pool_status(node))
                await asyncio.sleep(0.05)
        finally:
            etcd.resume()
        resumed_at = len(load.epochs)
        end = time.monotonic() + 1.5
        while time.monotonic() < end:
            seen.append(_pool_status(node))
            await asyncio.sleep(0.05)
    finally:
        load.stop = True
        await asyncio.gather(*workers)
    return load, seen, resumed_at


async def test_an_etcd_stall_within_the_fencing_budget_keeps_the_pool_and_its_epoch(
    etcd_disposable: EtcdProcess, lone_node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    first = _pool_status(lone_node)
    load, seen, resumed_at = await _stall(etcd_disposable, lone_node, 1.5)

    last = _pool_status(lone_node)
    assert (last.owned, last.owner, last.epoch) == (True, first.owner, first.epoch)
    assert last.transitions == first.transitions, "the pool changed hands during the stall"
    lost = [s for s in seen if not s.owned or s.epoch != first.epoch]
    assert not lost, f"pool not owned at its epoch at some point: {lost[0]}"
    assert not load.failures, load.failures[:3]
    assert set(load.epochs) == {first.epoch}
    assert len(load.epochs) > resumed_at, "no grant after etcd resumed"
    assert "lost pool" not in caplog.text


async def test_a_stall_of_the_whole_budget_at_the_worst_moment_keeps_the_pool(
    etcd_disposable: EtcdProcess, lone_node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    """The budget is T - margin - rpc_timeout (3.5 s with the defaults): a stall just
    shorter than it, begun right before a renewal, costs no pool."""
    first = _pool_status(lone_node)
    budget = STALL_TIMING.lease_ttl_s - STALL_TIMING.fence_margin_s - STALL_TIMING.rpc_timeout_s
    _, seen, _ = await _stall(etcd_disposable, lone_node, budget - 0.25, before_renewal=True)

    last = _pool_status(lone_node)
    lost = [s for s in seen if not s.owned or s.epoch != first.epoch]
    assert not lost, f"pool not owned at its epoch at some point: {lost[0]}"
    assert (last.owned, last.epoch, last.transitions) == (True, first.epoch, first.transitions)
    assert "lost pool" not in caplog.text


async def test_an_etcd_stall_beyond_the_fencing_deadline_stops_the_owner_deciding(
    etcd_disposable: EtcdProcess, lone_node: Node
) -> None:
    first = _pool_status(lone_node)
    limit = STALL_TIMING.lease_ttl_s - STALL_TIMING.fence_margin_s
    _, seen, _ = await _stall(etcd_disposable, lone_node, limit + 0.5)

    # Fail-safe: once the fencing deadline passed, the old epoch decided no more.
    assert any(not s.owned for s in seen), "still deciding after the fencing deadline"
    deadline = time.monotonic() + 10
    while True:
        now = _pool_status(lone_node)
        if now.owned:
            break
        assert time.monotonic() < deadline, f"pool not owned again: {now}"
        await asyncio.sleep(0.05)
    assert now.epoch > first.epoch and now.transitions > first.transitions


# -- a watch on a member cut off from its peers -------------------------------------------


@pytest.fixture
def etcd_cluster() -> Iterator[EtcdCluster]:
    """Three private etcd members, each peer URL behind a proxy the test can cut."""
    cluster = EtcdCluster(name="watch-partition")
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.close()


async def test_a_watch_on_a_member_cut_off_from_its_peers_moves_to_a_member_with_a_leader(
    etcd_cluster: EtcdCluster, caplog: pytest.LogCaptureFixture
) -> None:
    store = await connect(etcd_cluster.endpoints, rpc_timeout_s=RPC_TIMEOUT_S, seed=7)
    healthy: EtcdStore | None = None
    # The store starts on the first endpoint of its shuffled order: that member is cut.
    cut = next(m for m in etcd_cluster.members if m.endpoint == store.endpoints[0])
    other = next(m for m in etcd_cluster.members if m is not cut)
    before = await store.put(PREFIX + "a", b"1")
    events = store.watch_prefix(PREFIX, start_revision=before)
    waiting = asyncio.ensure_future(anext(events))
    try:
        await asyncio.sleep(0.3)  # the watch is open on ``cut``
        assert not waiting.done()
        await asyncio.to_thread(etcd_cluster.isolate, cut.name)
        cut_at = time.monotonic()

        # When the cut member led, the other two elect a leader first.
        healthy = await until_available(
            lambda: connect([other.endpoint], rpc_timeout_s=RPC_TIMEOUT_S)
        )
        written = await until_available(lambda: healthy.put(PREFIX + "b", b"2"))

        # etcd cancels a require-leader watch after three election timeouts (1 s each
        # here) without a leader; the store then resumes on another member.
        event: WatchEvent = await asyncio.wait_for(waiting, 10)
        if event.kind is EventKind.RESET:
            assert PREFIX + "b" in [kv.key for kv in event.snapshot]
        else:
            assert (event.kind, event.key, event.revision) == (EventKind.PUT, PREFIX + "b", written)
        took = time.monotonic() - cut_at
        assert "no leader" in caplog.text, caplog.text[-2000:]
        assert store.endpoints.index(store._connection.current().endpoint) != 0
        assert took < 8, f"the watch moved {took:.1f}s after the partition"
    finally:
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        await events.aclose()  # type: ignore[attr-defined]
        await store.close()
        if healthy is not None:
            await healthy.close()


async def test_replicas_spread_over_the_endpoints_in_an_order_fixed_by_their_seed(
    etcd_endpoints: list[str],
) -> None:
    endpoints = [*etcd_endpoints, f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]
    orders = set()
    for seed in ("node-0", "node-1", "node-2", "node-3", "node-0"):
        store = await connect(endpoints, rpc_timeout_s=RPC_TIMEOUT_S, seed=seed)
        try:
            assert sorted(store.endpoints) == sorted(endpoints)
            again = await connect(endpoints, rpc_timeout_s=RPC_TIMEOUT_S, seed=seed)
            assert again.endpoints == store.endpoints
            await again.close()
            orders.add(store.endpoints)
        finally:
            await store.close()
    assert len(orders) > 1, "every seed gave the same order"


# -- an etcd out of space -------------------------------------------------------------------

QUOTA_BYTES = 1024 * 1024


@pytest.fixture
def tiny_etcd(tmp_path: Path) -> Iterator[str]:
    """A private etcd member whose backend quota is 1 MiB; yields its endpoint."""
    client, peer = free_port(), free_port()
    client_url, peer_url = f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
    # fmt: off
    args = [
        find_etcd(), "--name", "tiny", "--data-dir", str(tmp_path / "tiny.etcd"),
        "--listen-client-urls", client_url, "--advertise-client-urls", client_url,
        "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
        "--initial-cluster", f"tiny={peer_url}", "--quota-backend-bytes", str(QUOTA_BYTES),
        "--logger", "zap", "--log-level", "error",
    ]
    # fmt: on
    env = {k: v for k, v in os.environ.items() if not k.startswith("ETCD")}
    proc = subprocess.Popen(
        args,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            assert proc.poll() is None, f"etcd exited with {proc.returncode}"
            try:
                with urllib.request.urlopen(f"{client_url}/health", timeout=1) as resp:
                    if json.loads(resp.read()).get("health") == "true":
                        break
            except (OSError, ValueError):
                pass
            assert time.monotonic() < deadline, "etcd with a tiny quota did not start"
            time.sleep(0.05)
        yield f"127.0.0.1:{client}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


async def test_an_etcd_out_of_space_refuses_writes_with_store_full(tiny_etcd: str) -> None:
    store = await connect([tiny_etcd], rpc_timeout_s=RPC_TIMEOUT_S)
    try:
        lease = await store.grant_lease(30)
        owner = await store.create(PREFIX + "owner", b"n0", lease=lease)
        assert owner is not None
        blob = bytes(range(256)) * 512  # 128 KiB; every revision is kept (no compaction)
        for i in range(200):
            try:
                await store.put(f"{PREFIX}fill/{i % 4}", blob)
            except StoreFull as e:
                assert "space" in str(e)
                break
        else:
            raise AssertionError(f"etcd took 200 puts of 128 KiB with a {QUOTA_BYTES} quota")

        with pytest.raises(StoreFull):
            await store.put(PREFIX + "small", b"x")
        with pytest.raises(StoreFull):
            await store.put_fenced(
                PREFIX + "state",
                b"s",
                fence_key=owner.key,
                fence_revision=owner.create_revision,
                timeout_s=2.0,
            )
        with pytest.raises(StoreFull):
            await store.create(PREFIX + "other-owner", b"n1", lease=lease)
        # Reads still answer: a full store refuses writes only.
        assert (await store.get(owner.key)) is not None
    finally:
        await store.close()


def _etcdctl(endpoint: str, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ETCD")}
    env["ETCDCTL_API"] = "3"
    done = subprocess.run(
        [find_etcdctl(), "--endpoints", endpoint, *args],
        capture_output=True,
        text=True,
        timeout=20,
        env=env,
        check=True,
    )
    return done.stdout


async def test_an_etcd_out_of_space_marks_the_pool_full_and_it_recovers_without_a_restart(
    tiny_etcd: str, caplog: pytest.LogCaptureFixture
) -> None:
    """etcd's NOSPACE alarm reaches the node as StoreFull: the pool is marked full (what
    health and the metric report), logged as such, and clears once an operator has made
    room (compact, defragment, disarm the alarm), with the same node running."""
    node = await _lone([tiny_etcd], "full")
    filler = await connect([tiny_etcd], rpc_timeout_s=STALL_TIMING.rpc_timeout_s)
    await node.start()
    try:

        async def until(check: Callable[[], bool], what: str, within_s: float = 15) -> None:
            deadline = time.monotonic() + within_s
            while not check():
                assert time.monotonic() < deadline, f"{what}: {_pool_status(node)}"
                await asyncio.sleep(0.05)

        await until(lambda: _pool_status(node).owned, "never owned")
        blob = bytes(range(256)) * 512  # 128 KiB a revision, none compacted
        for i in range(200):
            try:
                await filler.put(f"/fill/{i % 4}", blob)
            except StoreFull:
                break
        else:
            raise AssertionError("etcd never raised its NOSPACE alarm")

        # An idle pool writes nothing, so a decision must write: the durable write of a
        # within-share grant is refused, the pool is lost and cannot be campaigned for again.
        with contextlib.suppress(AllocatorError):
            await node.acquire(pool=POOL, team="a", cls=Class.INTERACTIVE, est_tokens=0)
        await until(lambda: _pool_status(node).store_full, "never marked full")
        assert "the store is full and refuses writes" in caplog.text

        # An operator makes room: deletes what filled it, compacts to the latest revision,
        # defragments and disarms the alarm.
        _etcdctl(tiny_etcd, "del", "--prefix", "/fill/")
        revision = json.loads(_etcdctl(tiny_etcd, "endpoint", "status", "-w", "json"))[0]["Status"][
            "header"
        ]["revision"]
        _etcdctl(tiny_etcd, "compact", str(revision))
        _etcdctl(tiny_etcd, "defrag")
        _etcdctl(tiny_etcd, "alarm", "disarm")

        await until(
            lambda: _pool_status(node).owned and not _pool_status(node).store_full,
            "did not recover",
            within_s=30,
        )
        decision = await node.acquire(pool=POOL, team="a", cls=Class.INTERACTIVE, est_tokens=0)
        assert decision.granted and not decision.degraded and not decision.borrowing
    finally:
        await filler.close()
        await node.close()
