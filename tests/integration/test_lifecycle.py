"""Health during shutdown, reflection, configuration exits, the status CLI, and a fuzz."""

from __future__ import annotations

import asyncio
import io
import json
import math
import os
import pathlib
from collections import Counter

import grpc
import pytest
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fairshare.cli import main as cli
from fairshare.wire.pb.fairshare.v1 import allocator_pb2 as pb
from fairshare.wire.pb.fairshare.v1 import allocator_pb2_grpc as pb_grpc
from ha.api import GrantRef
from harness.serve import SERVE, run_serve
from server.app import ADMIN_SERVICE, ALLOCATOR_SERVICE, RunningServer, start_server
from server.config import Config

from .conftest import make_config
from .fakes import FakeAllocator

pytestmark = pytest.mark.timeout(30)


class SlowStop(FakeAllocator):
    """Blocks in stop_deciding until released, so a test can look at health meanwhile."""

    def __init__(self, config: Config) -> None:
        super().__init__(config.pools)
        self.stopping = asyncio.Event()
        self.proceed = asyncio.Event()

    async def stop_deciding(self) -> None:
        await super().stop_deciding()
        self.stopping.set()
        await asyncio.wait_for(self.proceed.wait(), 10)


async def test_health_goes_not_serving_before_the_node_stops(tmp_path: pathlib.Path) -> None:
    config = make_config(tmp_path)
    node = SlowStop(config)
    server = await start_server(config, node=node, serve_metrics=False)
    async with aio.insecure_channel(server.address) as ch:
        health = health_pb2_grpc.HealthStub(ch)
        for service in ("", ALLOCATOR_SERVICE, ADMIN_SERVICE):
            r = await health.Check(health_pb2.HealthCheckRequest(service=service), timeout=2)
            assert r.status == health_pb2.HealthCheckResponse.SERVING
        stopping = asyncio.create_task(server.shutdown(1.0))
        await asyncio.wait_for(node.stopping.wait(), 5)
        for service in ("", ALLOCATOR_SERVICE):
            r = await health.Check(health_pb2.HealthCheckRequest(service=service), timeout=2)
            assert r.status == health_pb2.HealthCheckResponse.NOT_SERVING
        node.proceed.set()
        await asyncio.wait_for(stopping, 10)
    assert node.calls == ["start", "stop_deciding", "close"]


async def test_reflection_lists_the_services(running: RunningServer) -> None:
    async with aio.insecure_channel(running.address) as ch:
        stub = reflection_pb2_grpc.ServerReflectionStub(ch)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        names: set[str] = set()
        async for response in stub.ServerReflectionInfo(iter([request]), timeout=5):
            names |= {s.name for s in response.list_services_response.service}
    assert {ALLOCATOR_SERVICE, ADMIN_SERVICE, "grpc.health.v1.Health"} <= names
    assert ALLOCATOR_SERVICE == "fairshare.v1.Allocator"


@pytest.mark.parametrize(
    ("yaml_text", "env", "key"),
    [
        pytest.param(
            "pools: [{name: a, capacity: 1, shares: {team-a: -1}}]\n",
            {},
            "pools[0].shares.team-a",
            id="file",
        ),
        pytest.param(
            "pools: [{name: a, capacity: 1}]\n",
            {"FAIRSHARE_LEASE_TTL_S": "x"},
            "timing.lease_ttl_s",
            id="env",
        ),
        pytest.param("pools: []\n", {}, "pools", id="no-pools"),
    ],
)
def test_config_errors_exit_2_naming_the_key(
    tmp_path: pathlib.Path, yaml_text: str, env: dict[str, str], key: str
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml_text)
    environ = {k: v for k, v in os.environ.items() if not k.startswith("FAIRSHARE_")} | env
    done = run_serve([*SERVE, "--config", str(path)], timeout_s=20, env=environ)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and key in lines[0], done.stderr


async def test_status_cli_prints_the_table(running: RunningServer) -> None:
    async with aio.insecure_channel(running.address) as ch:
        await pb_grpc.AllocatorStub(ch).Acquire(pb.AcquireRequest(pool="gpu-a", team="inst-b"))

    def status(*extra: str) -> str:
        out = io.StringIO()
        assert cli.main(["status", "--target", running.address, *extra], out=out) == 0
        return out.getvalue()

    text = await asyncio.to_thread(status, "--pool", "gpu-a")
    lines = text.splitlines()
    assert lines[0] == "pool gpu-a  capacity 10  owner test-0  epoch 1"
    assert lines[1].split() == [
        "team", "share", "reserved", "within", "in", "flight", "borrowing", "phantoms",
        "usage", "level", "fairshare", "rank",
    ]  # fmt: skip
    assert lines[3].split() == ["inst-b", "0.1875", "2", "1/2", "1", "0", "0", "0", "inf", "0"]
    doc = json.loads(await asyncio.to_thread(status, "--json"))
    assert [p["pool"] for p in doc] == ["gpu-a", "gpu-b"]
    assert doc[0]["teams"][1]["in_flight"] == 1
    assert doc[0]["teams"][1]["within"] == 1
    assert doc[0]["teams"][1]["level_fairshare"] is None


requests = st.one_of(
    st.builds(
        lambda pool, team, cls, tokens, try_only: ("acquire", pool, team, cls, tokens, try_only),
        st.sampled_from(["gpu-a", "gpu-b", "", "nope"]),
        st.sampled_from(["inst-a", "inst-b", "research", "guest", ""]),
        st.integers(-1, 3),
        st.integers(-5, 10**6),
        st.booleans(),
    ),
    st.builds(
        lambda index, consumed: ("release", index, consumed),
        st.integers(0, 50),
        st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.just(1.0)),
    ),
    st.builds(
        lambda pool, c: ("capacity", pool, c),
        st.sampled_from(["gpu-a", "gpu-b"]),
        st.integers(-2, 20),
    ),
)


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(requests, max_size=60))
def test_random_requests_keep_the_pools_consistent(
    tmp_path_factory: pytest.TempPathFactory, ops: list[tuple[object, ...]]
) -> None:
    asyncio.run(_drive(tmp_path_factory.mktemp("fuzz"), ops))


async def _drive(tmp_path: pathlib.Path, ops: list[tuple[object, ...]]) -> None:
    config = make_config(tmp_path)
    fake = FakeAllocator(config.pools)
    server = await start_server(config, node=fake, serve_metrics=False)
    granted: list[str] = []
    codes = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND}
    try:
        async with aio.insecure_channel(server.address) as ch:
            stub = pb_grpc.AllocatorStub(ch)
            for op in ops:
                try:
                    if op[0] == "acquire":
                        _, pool, team, cls, tokens, try_only = op
                        r = await stub.Acquire(
                            pb.AcquireRequest(
                                pool=pool,
                                team=team,
                                service_class=cls,
                                est_tokens=tokens,
                                try_only=try_only,
                            ),
                            timeout=5,
                        )
                        if r.granted:
                            granted.append(r.grant_id)
                    elif op[0] == "release" and granted:
                        gid = granted[int(op[1]) % len(granted)]  # type: ignore[call-overload]
                        await stub.Release(
                            pb.ReleaseRequest(grant_id=gid, consumed=op[2]), timeout=5
                        )
                    elif op[0] == "capacity":
                        await fake.set_capacity(str(op[1]), max(int(op[2]), 0))  # type: ignore[call-overload]
                except aio.AioRpcError as e:
                    assert e.code() in codes, e
    finally:
        await server.shutdown(0)
    # Invariants: each unreleased grant is counted once; nothing negative or non-finite.
    live = Counter(str(GrantRef.decode(gid).pool) for gid in fake.grants)
    for name, pool in fake.pools.items():
        stats = pool.snapshot()
        assert sum(s.in_flight for s in stats) == live[name]
        for s in stats:
            assert s.in_flight >= s.borrowing >= 0 and s.in_flight_tokens >= 0
            assert 0 <= s.usage < math.inf
        assert sum(pool.reserved().values()) <= pool.capacity
