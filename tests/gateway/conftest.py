"""The gateway end to end: a real allocator (embedded mode), stand-in vLLM servers, the
gateway, all real processes on loopback, and the real ``openai`` SDK as the client.

``start_stack`` starts them and waits until each serves; ``Stack`` gives the clients and
what each process saw: the stand-ins' records of what they received, the allocator's
grants in flight, the gateway's metrics.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import httpx2
from grpc import aio
from openai import AsyncOpenAI, DefaultAsyncHttpxClient

from fairshare.wire.pb.fairshare.v1 import allocator_pb2 as pb
from fairshare.wire.pb.fairshare.v1 import allocator_pb2_grpc as pb_grpc
from harness.gateway import Gateway, wait_gateway
from harness.serve import Allocator, wait_serving
from harness.standin import Standin, wait_standin

MODEL = "standin"
TEAM_HEADER = "x-fairshare-team"
CLASS_HEADER = "x-fairshare-class"


BOUNDS = ("max_in_flight", "max_in_flight_per_holder", "on_wait_end", "max_held")
"""Pool keys passed on as they are when a test gives them (and ``lend``, as JSON)."""


def pools_yaml(
    pools: Mapping[str, Mapping[str, object]], timing: Mapping[str, float] | None = None
) -> str:
    """An allocator configuration (embedded) with these pools: name -> {capacity, shares,
    degraded_mode, and any of ``BOUNDS``}, and these ``timing`` keys (its defaults
    otherwise)."""
    lines = ["metrics_listen: ''"]
    if timing:
        lines += ["timing:", *(f"  {key}: {value}" for key, value in timing.items())]
    lines += ["pools:"]
    for name, pool in pools.items():
        lines += [
            f"  - name: {name}",
            f"    capacity: {pool.get('capacity', 4)}",
            f"    shares: {json.dumps(pool.get('shares', {'team-a': 0.5, 'team-b': 0.5}))}",
            "    half_life_s: 3600",
            "    max_request_s: 60",
            f"    degraded_mode: {pool.get('degraded_mode', 'fail_open')}",
            *(f"    {key}: {pool[key]}" for key in BOUNDS if key in pool),
            *([f"    lend: {json.dumps(pool['lend'])}"] if "lend" in pool else []),
        ]
    return "\n".join(lines) + "\n"


@dataclass
class Stack:
    """The processes of one test."""

    workdir: Path
    allocator: Allocator
    standins: dict[str, Standin]
    gateway: Gateway
    _clients: list[AsyncOpenAI] = field(default_factory=list)

    def client(
        self, team: str | None = "team-a", *, key: str | None = None, **headers: str
    ) -> AsyncOpenAI:
        """An SDK client of the gateway for ``team`` (its header; None: no header) with the
        API key ``key``. Without a key its requests carry no ``Authorization`` header, as
        those of a proxy in front that sets the team header: the SDK insists on sending
        one, so a request hook takes it off."""
        default = dict(headers)
        if team is not None:
            default[TEAM_HEADER] = team
        hooks = {} if key is not None else {"request": [_without_credentials]}
        client = AsyncOpenAI(
            base_url=self.gateway.url + "/v1",
            api_key=key or "unused",
            default_headers=default,
            max_retries=0,
            timeout=30.0,
            http_client=DefaultAsyncHttpxClient(event_hooks=hooks),
        )
        self._clients.append(client)
        return client

    async def records(self, standin: str) -> list[dict[str, object]]:
        """What the stand-in received, in arrival order."""
        async with (
            aiohttp.ClientSession() as session,
            session.get(self.standins[standin].url + "/standin/requests") as r,
        ):
            return list(await r.json())

    async def forget(self) -> None:
        """Clears every stand-in's records."""
        async with aiohttp.ClientSession() as session:
            for standin in self.standins.values():
                async with session.delete(standin.url + "/standin/requests") as r:
                    r.raise_for_status()

    async def in_flight(self, pool: str) -> dict[str, int]:
        """The allocator's grants in flight of ``pool``, by team (phantoms left out)."""
        async with aio.insecure_channel(self.allocator.address) as channel:
            snapshot = await pb_grpc.AllocatorStub(channel).Snapshot(
                pb.SnapshotRequest(pool=pool), timeout=5
            )
        return {t.team: t.in_flight for t in snapshot.teams if t.in_flight}

    async def metric(self, name: str, **labels: str) -> float:
        """The value of one sample of the gateway's metrics (0 when absent); read without
        blocking the event loop."""
        pattern = re.compile(rf"^{re.escape(name)}(?:\{{(.*)\}})? (\S+)$", re.M)
        total = 0.0
        for found, value in pattern.findall(await self.gateway.metrics_text_async()):
            if all(f'{k}="{v}"' in found for k, v in labels.items()):
                total += float(value)
        return total

    async def close(self) -> None:
        for client in self._clients:
            await client.close()


async def _without_credentials(request: httpx2.Request) -> None:
    del request.headers["authorization"]


async def eventually(check: Callable[[], object], *, timeout_s: float = 15.0) -> None:
    """Polls ``check`` (sync, or returning an awaitable) until it is truthy."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


def keyed_auth(workdir: Path, keys: Mapping[str, Mapping[str, str]]) -> dict[str, object]:
    """The ``auth`` of a gateway with these API keys (key -> {team, class}) in a keys file
    in ``workdir``, and the team and class headers."""
    path = workdir / "keys.yaml"
    path.write_text(json.dumps({"keys": keys}))
    return {"keys_file": str(path), "team_header": TEAM_HEADER, "class_header": CLASS_HEADER}


def model_on_a(s: dict[str, Standin]) -> list[dict[str, object]]:
    """The models of a stack of one stand-in ``a``: ``MODEL``, on pool gpu-a."""
    return [{"name": MODEL, "pool": "gpu-a", "upstreams": [s["a"].url]}]


def gateway_config(
    allocator: Allocator,
    models: Sequence[Mapping[str, object]],
    **more: object,
) -> dict[str, object]:
    """The gateway's configuration: the team from a header, these models."""
    return {
        "allocator": {"endpoints": [allocator.address], "holder": "gw-test", "deadline_s": 0.5},
        "auth": {"team_header": TEAM_HEADER, "class_header": CLASS_HEADER},
        "models": list(models),
        **more,
    }


@asynccontextmanager
async def start_stack(
    workdir: Path,
    *,
    pools: Mapping[str, Mapping[str, object]],
    standins: Mapping[str, Mapping[str, object]],
    models: Callable[[dict[str, Standin]], Sequence[Mapping[str, object]]],
    timing: Mapping[str, float] | None = None,
    ready_path: str = "/readyz",
    **gateway_settings: object,
) -> AsyncIterator[Stack]:
    """Starts an allocator with ``pools`` (and ``timing``), the stand-ins (name ->
    ``Standin`` options), and a gateway whose models ``models`` makes from the stand-ins,
    waited for at ``ready_path`` (``/healthz`` where a model has no healthy upstream on
    purpose); stops them all at the end."""
    config = workdir / "pools.yaml"
    config.write_text(pools_yaml(pools, timing))
    allocator = Allocator(workdir, config)
    running: dict[str, Standin] = {}
    gateway: Gateway | None = None
    stack: Stack | None = None
    try:
        allocator.start()
        for name, options in standins.items():
            standin_dir = workdir / f"standin-{name}"
            standin_dir.mkdir()
            running[name] = Standin(standin_dir, **options)  # type: ignore[arg-type]
            running[name].start()
        await wait_serving(allocator.address, process=allocator)
        for standin in running.values():
            await wait_standin(standin.url)
        gateway = Gateway(workdir, gateway_config(allocator, models(running), **gateway_settings))
        gateway.start()
        await wait_gateway(gateway, path=ready_path)
        stack = Stack(workdir, allocator, running, gateway)
        yield stack
    finally:
        if stack is not None:
            await stack.close()
        if gateway is not None:
            gateway.stop(timeout_s=15)
        for standin in running.values():
            standin.stop()
        allocator.stop()
