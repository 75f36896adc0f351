"""The status page (server/status_page.py) of a real allocator, in a real browser.

One ``fairshare serve`` process (embedded, metrics on) gets acquires over gRPC; headless
Chromium (``harness.browser``) loads its page and reads the tables the page's script drew,
then sees them change after more acquires without a reload. The picture it takes is
``build/status-page.png`` (docs/images/status-page.png is a copy of one).

Like etcd, Chromium is a system package (``make chromium`` installs it): a machine
without it fails these tests with that command, since a suite that skipped them would
pass untested.
"""

from __future__ import annotations

import asyncio
import json
import pathlib
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from typing import Any

import pytest
from grpc import aio

from fairshare.wire.pb.fairshare.v1 import allocator_pb2 as pb
from fairshare.wire.pb.fairshare.v1 import allocator_pb2_grpc as pb_grpc
from harness.browser import Browser, Tab, find_chromium
from harness.net import LOOPBACK, free_port
from harness.process import ROOT
from harness.serve import Allocator, wait_serving

pytestmark = [pytest.mark.timeout(90)]

SCREENSHOT = ROOT / "build" / "status-page.png"
REFRESHED_WITHIN_S = 10.0
"""The page refreshes every 2 s from a report kept 1 s: a change shows within 3 s idle."""

CONFIG = """\
pools:
  - name: gpu-a
    capacity: 8
    shares: {alpha: 0.5, beta: 0.3, gamma: 0.2}
  - name: gpu-b
    capacity: 4
    shares: {research: 0.5, product: 0.5}
    degraded_mode: fail_closed
"""

# Rows of the page's team tables, pool -> team -> column -> the text shown.
READ_TABLES = """
(() => {
  const out = {};
  for (const section of document.querySelectorAll("section[data-pool]")) {
    const teams = out[section.dataset.pool] = {};
    for (const row of section.querySelectorAll("tr[data-team]")) {
      const cells = teams[row.dataset.team] = {};
      for (const cell of row.querySelectorAll("td[data-field]")) {
        cells[cell.dataset.field] = cell.textContent;
      }
      cells.bar = [...row.querySelectorAll(".track span")].map(s => s.className).join(" ");
    }
  }
  return out;
})()
"""


@pytest.fixture
async def allocator(tmp_path: pathlib.Path) -> AsyncIterator[tuple[Allocator, str]]:
    if find_chromium() is None:
        pytest.fail("no Chromium: install it with `make chromium` (Debian's package)")
    config = tmp_path / "pools.yaml"
    config.write_text(CONFIG, encoding="utf-8")
    metrics = f"{LOOPBACK}:{free_port()}"
    server = Allocator(tmp_path, config, node="allocator-0", metrics_listen=metrics)
    server.start()
    try:
        await wait_serving(server.address, process=server)
        yield server, f"http://{metrics}"
    finally:
        server.kill()


async def acquire(stub: pb_grpc.AllocatorStub, pool: str, team: str, n: int) -> list[str]:
    grants = []
    for _ in range(n):
        reply = await stub.Acquire(pb.AcquireRequest(pool=pool, team=team, holder="t"), timeout=5)
        grants.append(reply.grant_id)
    return grants


def get(url: str, method: str = "GET") -> tuple[int, str, bytes]:
    """(status, content type, body) of one request."""
    request = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(request, timeout=5) as reply:
            return reply.status, reply.headers["Content-Type"], reply.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers["Content-Type"], e.read()


async def fetch_json(url: str) -> dict[str, Any]:
    status, _, body = await asyncio.to_thread(get, url)
    assert status == 200, body
    result: dict[str, Any] = json.loads(body)
    return result


async def tables(tab: Tab) -> dict[str, dict[str, dict[str, str]]]:
    result: dict[str, dict[str, dict[str, str]]] = await tab.evaluate(READ_TABLES)
    return result


async def test_the_page_shows_each_team_live_and_refreshes_by_itself(
    allocator: tuple[Allocator, str],
) -> None:
    server, base = allocator
    async with aio.insecure_channel(server.address) as channel:
        stub = pb_grpc.AllocatorStub(channel)
        # alpha: its 4 reserved slots and one borrower, and one of its within-share
        # requests ends and is replaced: it keeps its 4 slots (the replacement does not
        # borrow). beta: 1 of 2; gamma: used and gone.
        first, *_ = await acquire(stub, "gpu-a", "alpha", 5)
        await stub.Release(pb.ReleaseRequest(grant_id=first, consumed=0.0), timeout=5)
        await acquire(stub, "gpu-a", "alpha", 1)
        await acquire(stub, "gpu-a", "beta", 1)
        (used,) = await acquire(stub, "gpu-a", "gamma", 1)
        await stub.Release(pb.ReleaseRequest(grant_id=used, consumed=100.0), timeout=5)
        await acquire(stub, "gpu-b", "research", 1)

        async with Browser() as browser:
            tab = await browser.new_tab(1280, 900)
            await tab.goto(base + "/")
            await tab.wait_for("document.querySelectorAll('tr[data-team]').length === 5")
            shown = await tables(tab)
            alpha, beta, gamma = (shown["gpu-a"][t] for t in ("alpha", "beta", "gamma"))
            # Within share: the within-share count of the reservation.
            assert (alpha["reserved"], alpha["within"], alpha["borrowing"]) == ("4", "4/4", "1")
            assert (beta["reserved"], beta["within"], beta["borrowing"]) == ("2", "1/2", "0")
            assert (gamma["reserved"], gamma["within"], gamma["borrowing"]) == ("2", "0/2", "0")
            assert gamma["usage"] == "100" and alpha["usage"] == "0"
            # Teams without usage have an infinite level fairshare and rank first.
            assert alpha["level_fairshare"] == beta["level_fairshare"] == "\u221e"
            assert (alpha["rank"], gamma["rank"]) == ("0", "1")
            assert (alpha["borrow_priority"], gamma["borrow_priority"]) == ("10", "20")
            assert alpha["bar"] == "within borrow reserved"
            assert beta["share"] == "0.3" and alpha["phantoms"] == "0"
            # The page says the same as the JSON it reads.
            report = await fetch_json(base + "/api/status.json")
            pool = next(p for p in report["pools"] if p["pool"] == "gpu-a")
            assert (pool["capacity"], pool["in_flight"], pool["source"]) == (8, 6, "local")
            assert pool["owned_here"] and pool["owner"] == "allocator-0"
            row = next(t for t in pool["teams"] if t["team"] == "alpha")
            assert (row["within"], row["within_grants"], row["borrowing"]) == (4, 4, 1)
            # And so do the metrics on the same port.
            _, _, metrics = await asyncio.to_thread(get, base + "/metrics")
            assert b'fairshare_within{pool="gpu-a",team="alpha"} 4.0' in metrics
            assert shown["gpu-b"]["research"]["within"] == "1/2"
            title = await tab.evaluate(
                'document.querySelector(\'section[data-pool="gpu-a"] tr[data-team=alpha]'
                " .track').title"
            )
            assert title.startswith("4 reserved, within-share count 4, in flight 4 within")
            replicas = await tab.evaluate(
                "[...document.querySelectorAll('#replicas tr[data-node]')]"
                ".map(r => [...r.cells].map(c => c.textContent))"
            )
            assert [row[0] for row in replicas] == ["allocator-0"]
            assert replicas[0][3] == "gpu-a, gpu-b"

            # More work: the open page shows it by itself, without a reload.
            await tab.evaluate("window.notReloaded = true")
            before = int(await tab.evaluate("document.body.dataset.refreshes"))
            await acquire(stub, "gpu-a", "beta", 2)
            await tab.wait_for(
                "(() => { const r = document.querySelector("
                '\'section[data-pool="gpu-a"] tr[data-team="beta"]\');'
                " return r && r.querySelector('[data-field=within]').textContent === '2/2'"
                " && r.querySelector('[data-field=borrowing]').textContent === '1'; })()",
                timeout_s=REFRESHED_WITHIN_S,
            )
            assert await tab.evaluate("window.notReloaded") is True
            assert int(await tab.evaluate("document.body.dataset.refreshes")) > before
            await acquire(stub, "gpu-b", "research", 2)
            await acquire(stub, "gpu-b", "product", 1)
            await tab.wait_for(
                'document.querySelector(\'section[data-pool="gpu-b"] tr[data-team="product"]'
                " [data-field=within]').textContent === '1/2'",
                timeout_s=REFRESHED_WITHIN_S,
            )
            await tab.resize(1280, 400)  # the picture is as tall as the page, no taller
            await tab.screenshot(SCREENSHOT)
    assert SCREENSHOT.read_bytes().startswith(b"\x89PNG")


async def test_team_names_are_shown_as_text_and_the_answers_are_get_only(
    allocator: tuple[Allocator, str],
) -> None:
    server, base = allocator
    hostile = '<img src=x onerror="document.title=1">'
    async with aio.insecure_channel(server.address) as channel:
        await acquire(pb_grpc.AllocatorStub(channel), "gpu-b", hostile, 1)
    async with Browser() as browser:
        tab = await browser.new_tab()
        await tab.goto(base + "/")
        await tab.wait_for("document.querySelectorAll('tr[data-team]').length === 6")
        assert hostile in (await tables(tab))["gpu-b"]
        assert await tab.evaluate("document.querySelectorAll('td img').length") == 0
        assert await tab.evaluate("document.title") == "fairshare status"
    status, kind, page = await asyncio.to_thread(get, base + "/")
    assert status == 200 and kind.startswith("text/html")
    assert b"http://" not in page and b"https://" not in page, "the page loads nothing"
    assert (await asyncio.to_thread(get, base + "/api/status.json", "POST"))[0] == 405
    status, _, metrics = await asyncio.to_thread(get, base + "/metrics")
    assert status == 200 and b"fairshare_in_flight" in metrics
