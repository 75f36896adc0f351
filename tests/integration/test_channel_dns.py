"""A replica restarted on a new address behind the same name is found again within about a
second: the channels' DNS re-resolution and reconnect limits (``fairshare.wire.channels``).

Real ``fairshare serve`` processes on loopback. The name ``replica.test`` is resolved by a
DNS server the test runs (``harness.dns``): the client's target is
``dns://<that server>/replica.test:<port>``, the form of target that tells gRPC's resolver
which DNS server to ask. The first process serves on ``127.0.0.1``, is stopped, and the
same replica (same node id and state) starts on ``127.0.0.2`` while the name moves there,
as a restarted pod gets a new IP behind its DNS name.

What this proves: a channel opened by the project (the client library's) resolves the
name again about ``DNS_REFRESH_MS`` after its connection fails, and reconnects within its
bounded backoff, so a client's acquire reaches the replica at its new address within a
few seconds of it serving, where gRPC's defaults would take 30 s (one re-resolution per
30 s). What it cannot prove: how fast a cluster's DNS publishes the new address (its
records' TTL and caches), and the peers' channels are checked only as far as they are
opened by the same function (tests/unit/test_channels.py checks every channel's origin).
"""

from __future__ import annotations

import asyncio
import pathlib
import time
from collections.abc import AsyncIterator

import pytest

from fairshare.client import AllocatorClient
from fairshare.wire.channels import DNS_REFRESH_MS, MAX_RECONNECT_BACKOFF_MS
from harness.dns import DnsServer
from harness.net import free_port
from harness.serve import Allocator, wait_serving

from .conftest import POOLS_YAML

pytestmark = pytest.mark.timeout(90)

NAME = "replica.test"
FOUND_WITHIN_S = 5.0
"""The re-resolution (``DNS_REFRESH_MS``, 1 s) plus the longest reconnect wait
(``MAX_RECONNECT_BACKOFF_MS``, 1 s) plus a connection attempt, with room for a loaded
machine; gRPC's default (one resolution per 30 s) is far outside it."""


@pytest.fixture
async def dns() -> AsyncIterator[tuple[DnsServer, int]]:
    server = DnsServer(records={NAME: "127.0.0.1"})
    port = await server.start()
    try:
        yield server, port
    finally:
        server.close()


async def test_a_replica_back_on_a_new_address_behind_its_name_is_reached_within_seconds(
    tmp_path: pathlib.Path, dns: tuple[DnsServer, int]
) -> None:
    assert DNS_REFRESH_MS / 1000 + MAX_RECONNECT_BACKOFF_MS / 1000 < FOUND_WITHIN_S
    resolver, dns_port = dns
    config = tmp_path / "pools.yaml"
    config.write_text(f"log_level: INFO\n{POOLS_YAML}", encoding="utf-8")
    port = free_port()
    first = Allocator(tmp_path, config, address=f"127.0.0.1:{port}")
    moved = Allocator(tmp_path, config, address=f"127.0.0.2:{port}")
    client = AllocatorClient(
        [f"dns://127.0.0.1:{dns_port}/{NAME}:{port}"],
        holder="gw",
        deadline_s=0.3,
        route_to_owner=False,  # only the name: not the address the replica advertises
    )
    try:
        first.start()
        await wait_serving(first.address, process=first)
        grant = await client.acquire("gpu-a", "inst-a")
        assert not grant.degraded
        await grant.release(1.0)

        first.stop()
        # The client keeps calling while the replica is away: its channel fails to
        # connect, backs off, and asks for the name again.
        away = await client.acquire("gpu-a", "inst-a")
        assert away.degraded
        await away.release(0.0)
        resolver.records[NAME] = "127.0.0.2"
        moved.start()
        await wait_serving(moved.address, process=moved)
        serving = time.monotonic()
        last = None
        while time.monotonic() - serving < 3 * FOUND_WITHIN_S:
            last = await client.acquire("gpu-a", "inst-a")
            await last.release(0.0)
            if not last.degraded:
                break
            await asyncio.sleep(0.05)
        found = time.monotonic() - serving
        asked = [round(q.at - serving, 2) for q in resolver.queries if q.qtype == 1]
        assert last is not None and not last.degraded, (
            f"not reached {found:.1f}s after it served at its new address; A queries at "
            f"{asked} s (relative)\n{moved.log_tail()}"
        )
        assert found < FOUND_WITHIN_S, f"reached after {found:.2f}s; A queries at {asked}"
        print(f"\nreached at its new address {found:.2f}s after it served; A queries at {asked}")
    finally:
        await client.close(flush_timeout_s=1.0)
        first.stop()
        moved.stop()
