"""The status report (server/status_report.py) of two replicas over a real etcd, and the
bound on how long the status page waits for the event loop.

Two nodes in this process share the session's etcd; their peer calls go straight to the
other node (what ``server.peers`` carries over gRPC), so the test sees what a non-owner's
page shows: the owner's figures, forwarded, not its own configuration.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from typing import Any

import pytest
from local_peers import LocalPeers

from fairshare import Class
from ha.api import NodeId, PoolName
from ha.node import Node
from ha.settings import PoolConfig, Timing
from ha.store.etcd import connect
from server.status_page import StatusPage
from server.status_report import status_report

pytestmark = [pytest.mark.timeout(30)]

POOLS = [
    PoolConfig("p-one", 6, {"a": 0.5, "b": 0.5}),
    PoolConfig("p-two", 4, {"a": 0.25, "b": 0.75}),
]
TIMING = Timing(snapshot_interval_s=0.5, rebalance_settle_s=1.0)
PLACED_WITHIN_S = 10.0


@pytest.mark.etcd
async def test_a_non_owner_shows_the_owners_live_figures(etcd_endpoints: list[str]) -> None:
    prefix = f"/status-{uuid.uuid4().hex[:8]}"
    peers = LocalPeers()
    nodes = []
    for i in range(2):
        store = await connect(etcd_endpoints, rpc_timeout_s=TIMING.rpc_timeout_s, seed=i)
        node = Node(
            node_id=NodeId(f"n{i}"),
            advertise=f"addr-{i}",
            pools=POOLS,
            timing=TIMING,
            store=store,
            peers=peers,  # type: ignore[arg-type]
            prefix=prefix,
            owns_store=True,
        )
        peers.nodes[node.address] = node
        nodes.append(node)
    try:
        await asyncio.gather(*(n.start() for n in nodes))
        start = time.monotonic()
        while not all(
            sum(n.ownership.deciding(PoolName(p.name)) is not None for n in nodes) == 1
            and all(n.view.route(p.name) is not None for n in nodes)
            for p in POOLS
        ):
            assert time.monotonic() - start < PLACED_WITHIN_S, "pools not owned in time"
            await asyncio.sleep(0.05)
        owner = next(n for n in nodes if n.ownership.deciding(PoolName("p-one")) is not None)
        other = next(n for n in nodes if n is not owner)
        # Through the non-owner: forwarded to the owner, which counts them. The first
        # within-share request ends and another comes: a keeps its 3 reserved slots.
        first = await other.acquire(pool="p-one", team="a", cls=Class.INTERACTIVE, est_tokens=0)
        for _ in range(3):
            await other.acquire(pool="p-one", team="a", cls=Class.INTERACTIVE, est_tokens=0)
        await other.release(first.grant_id, 0.0)  # no usage: the two tables stay equal
        await other.acquire(pool="p-one", team="a", cls=Class.INTERACTIVE, est_tokens=0)

        report = await status_report(other, POOLS)
        seen = {p["pool"]: p for p in report["pools"]}["p-one"]
        assert (seen["source"], seen["owned_here"], seen["owner"]) == (
            "owner",
            False,
            owner.node_id,
        )
        assert seen["snapshot_age_s"] is not None  # the owner's, forwarded
        teams = {t["team"]: t for t in seen["teams"]}
        a = teams["a"]
        assert (a["reserved"], a["within"], a["within_grants"], a["borrowing"]) == (3, 3, 3, 1)
        assert teams["b"]["within"] == 0
        assert seen["in_flight"] == 4 and seen["capacity"] == 6
        # The owner's own report has the same table.
        mine = {p["pool"]: p for p in (await status_report(owner, POOLS))["pools"]}["p-one"]
        assert mine["source"] == "local" and mine["teams"] == seen["teams"]
        # Replicas: this one first with its lease, each with the pools it owns.
        replicas = report["replicas"]
        assert [r["node"] for r in replicas] == [other.node_id, owner.node_id]
        assert replicas[0]["lease_left_s"] > 0 and replicas[1]["lease_left_s"] is None
        assert "p-one" in replicas[1]["pools"] and "p-one" not in replicas[0]["pools"]
        assert sorted(replicas[0]["pools"] + replicas[1]["pools"]) == ["p-one", "p-two"]
        json.dumps(report, allow_nan=False)  # what the page serves
    finally:
        await asyncio.gather(*(n.close() for n in nodes))


async def test_the_page_answers_503_within_its_bound_while_the_loop_is_blocked() -> None:
    loop = asyncio.get_running_loop()

    async def report() -> dict[str, Any]:
        return {"ok": True}

    page = StatusPage(loop, report, timeout_s=0.3, cache_s=0.0)
    answers: list[tuple[str, str, bytes]] = []
    asked = threading.Thread(target=lambda: answers.append(page.json()))
    asked.start()
    time.sleep(1.0)  # the loop is blocked: the report cannot run  # noqa: ASYNC251
    asked.join(timeout=5)
    status, kind, body = answers[0]
    assert status.startswith("503") and kind == "application/json"
    assert "did not answer within 0.3s" in json.loads(body)["error"]
    # Once the loop runs again, the report is served.
    status, _, body = await asyncio.to_thread(page.json)
    assert status.startswith("200") and json.loads(body) == {"ok": True}
