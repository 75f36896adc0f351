"""``make demo``: an allocator, two stand-in vLLM servers, the gateway and three teams'
load, with each team's standing, priorities and waits printed live.

``python -m harness.demo [--seconds N]`` from the repository root. Everything runs on
loopback in this machine's processes and is stopped at the end (or on Ctrl-C):

- an allocator (``fairshare serve``, embedded, with its status page) with one pool
  ``demo`` of C = 8 shared by teams ``a`` (0.5, a reservation of 4), ``b`` (0.3) and ``c``
  (0.2), whose 4 other slots are apportioned between them;
- two stand-in vLLM servers (``fairshare.sim.standin``) of 4 running requests each (so 8 in all, the
  pool's C), scheduling by vLLM's (priority, arrival);
- the gateway (``fairshare gateway``) in front of both, the team taken from the
  ``x-fairshare-team`` header;
- the load, streaming chat completions of 1 to 3 s each (10 to 30 tokens at 10 tokens/s)
  through the gateway: team ``a`` floods (12 requests always in flight, each replaced as
  it ends), ``b`` keeps 2 in flight and ``c`` 1, each within its reservation.

Every second it prints, per team, what the allocator counts now (its status report, the
one the status page shows): requests in flight, the within-share count of the
reservation and the borrowers; then, of the requests that ended in the last five seconds,
how many the gateway answered within share and how many borrowing
(``x-fairshare-standing``), the priorities it put on them (``x-fairshare-priority``) and
their median wait for a first token. At the end, how often each team held
min(reservation, in flight) within share. What to see: ``a``, three times over its
reservation, keeps its 4 reserved slots within share (``4/4``) however its requests come
and go, and only its other 8 borrow, at worse priorities, waiting longest; ``b`` and ``c``
stay within their share at priority 0 and wait at most for one running request to end
(vLLM, like the stand-in, never preempts a running request to start a waiting one).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from harness.http import wait_http
from harness.net import LOOPBACK, free_port
from harness.process import ServerProcess
from harness.serve import Allocator, wait_serving
from harness.standin import Standin, wait_standin

POOL = "demo"
MODEL = "demo-model"
SHARES = {"a": 0.5, "b": 0.3, "c": 0.2}
IN_FLIGHT = {"a": 12, "b": 2, "c": 1}
RUNNING_PER_STANDIN = 4
TOKENS = (10, 30)
"""Each request streams a number of tokens drawn from this range, so that requests do not
all end together."""
TOKENS_PER_S = 10.0
TEAM_HEADER = "x-fairshare-team"
Json = dict[str, Any]


WINDOW_S = 5.0
"""The report counts the requests that ended within this many seconds."""
WARM_UP_S = 3.0
"""The summary counts the samples taken after this many seconds of load."""


@dataclass(frozen=True)
class Ended:
    """One request that ended: when, how it was placed, and how long it waited."""

    at: float
    within: bool
    priority: int | None
    waited: float | None


@dataclass
class TeamView:
    """What one team saw: requests in flight now, and those that ended lately; and the
    samples of the allocator's count: (within-share count, its target min(reservation,
    in flight)) each second after the warm-up."""

    in_flight: int = 0
    ended: deque[Ended] = field(default_factory=deque)
    errors: deque[float] = field(default_factory=deque)
    held: list[tuple[int, int]] = field(default_factory=list)

    def forget_before(self, horizon: float) -> None:
        while self.ended and self.ended[0].at < horizon:
            self.ended.popleft()
        while self.errors and self.errors[0] < horizon:
            self.errors.popleft()


async def one_request(
    session: aiohttp.ClientSession, url: str, team: str, view: TeamView, tokens: int
) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"a question from team {team}"}],
        "max_tokens": tokens,
        "stream": True,
    }
    view.in_flight += 1
    t0 = time.monotonic()
    try:
        async with session.post(url, json=body, headers={TEAM_HEADER: team}) as reply:
            if reply.status != 200:  # noqa: PLR2004 (HTTP OK)
                view.errors.append(time.monotonic())
                await reply.read()
                await asyncio.sleep(0.5)
                return
            priority = reply.headers.get("x-fairshare-priority")
            within = reply.headers.get("x-fairshare-standing") == "within"
            waited = None
            async for line in reply.content:
                if waited is None and line.startswith(b"data:"):
                    waited = time.monotonic() - t0
            view.ended.append(
                Ended(
                    time.monotonic(),
                    within,
                    None if priority is None else int(priority),
                    waited,
                )
            )
    except (aiohttp.ClientError, OSError):
        view.errors.append(time.monotonic())
        await asyncio.sleep(0.5)
    finally:
        view.in_flight -= 1


async def team_load(
    session: aiohttp.ClientSession, url: str, team: str, view: TeamView, until: float
) -> None:
    draw = random.Random(team)

    async def worker() -> None:
        while time.monotonic() < until:
            await one_request(session, url, team, view, draw.randint(*TOKENS))

    await asyncio.gather(*(worker() for _ in range(IN_FLIGHT[team])))


async def allocator_teams(session: aiohttp.ClientSession, url: str) -> dict[str, Json]:
    """The pool's team rows of the allocator's status report (``/api/status.json``): team
    -> its row (``reserved``, ``within``, ``in_flight``, ``borrowing``...); empty when the
    report cannot be read."""
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=2)) as reply:
            report = await reply.json()
    except (aiohttp.ClientError, OSError, TimeoutError, ValueError):
        return {}
    pools = [p for p in report.get("pools", ()) if p.get("pool") == POOL]
    return {t["team"]: t for t in pools[0]["teams"]} if pools else {}


def report(views: dict[str, TeamView], teams: dict[str, Json], elapsed: float) -> str:
    """One second's table: the allocator's count now, and the requests that ended lately."""
    lines = [
        f"--- {elapsed:5.1f} s " + "-" * 72,
        f"{'':12}  {'at the allocator now':^26}    {f'ended in the last {WINDOW_S:g} s':^24}",
        f"{'team':<5}  {'share':>5}  {'in flight':>9}  {'within':>7}  {'borrow':>6}    "
        f"{'within':>6}  {'borrow':>6}  {'wait p50':>8}  priorities",
    ]
    horizon = time.monotonic() - WINDOW_S
    for team, view in views.items():
        view.forget_before(horizon)
        row = teams.get(team)
        if row is None:
            now = f"{'-':>9}  {'-':>7}  {'-':>6}"
        else:
            count = "-" if row["within"] is None else row["within"]
            held = f"{count}/{row['reserved']}"
            now = f"{row['in_flight']:>9}  {held:>7}  {row['borrowing']:>6}"
        waits = [e.waited for e in view.ended if e.waited is not None]
        wait = f"{statistics.median(waits):6.2f} s" if waits else f"{'-':>8}"
        seen = Counter(e.priority for e in view.ended if e.priority is not None)
        priorities = " ".join(f"{p}×{n}" for p, n in sorted(seen.items())) or "-"
        within = sum(1 for e in view.ended if e.within)
        borrowing = len(view.ended) - within
        errors = f"  ({len(view.errors)} errors)" if view.errors else ""
        lines.append(
            f"{team:<5}  {SHARES[team]:>5.1f}  {now}    {within:>6}  {borrowing:>6}  {wait}  "
            f"{priorities}{errors}"
        )
    return "\n".join(lines)


def sample(views: dict[str, TeamView], teams: dict[str, Json]) -> None:
    """Keeps each team's within-share count and its target, min(reservation, in flight)."""
    for team, view in views.items():
        row = teams.get(team)
        if row is not None and row["within"] is not None:
            view.held.append((row["within"], min(row["reserved"], row["in_flight"])))


def summary(views: dict[str, TeamView], teams: dict[str, Json]) -> str:
    """How often each team held min(reservation, in flight) within share after warm-up."""
    lines = [f"=== within share held, sampled each second from {WARM_UP_S:g} s on"]
    for team, view in views.items():
        reserved = teams[team]["reserved"] if team in teams else "?"
        kept = sum(1 for within, target in view.held if within >= target)
        counts = Counter(within for within, _ in view.held)
        seen = ", ".join(f"{n}×{c}" for n, c in sorted(counts.items())) or "-"
        lines.append(
            f"team {team} (reservation {reserved}, {IN_FLIGHT[team]} in flight): held "
            f"min(reservation, in flight) in {kept} of {len(view.held)} samples "
            f"(within-share counts seen: {seen})"
        )
    return "\n".join(lines)


async def run(seconds: float) -> int:
    work = Path(tempfile.mkdtemp(prefix="fairshare-demo-"))
    pool = {"name": POOL, "capacity": 2 * RUNNING_PER_STANDIN, "shares": SHARES}
    config = work / "pools.yaml"
    config.write_text(
        yaml.safe_dump({"log_level": "WARNING", "pools": [pool]}, sort_keys=False),
        encoding="utf-8",
    )
    status_address = f"{LOOPBACK}:{free_port()}"
    allocator = Allocator(work, config, metrics_listen=status_address)
    standins = [
        Standin(
            work,
            models=(MODEL,),
            max_running=RUNNING_PER_STANDIN,
            tokens_per_s=TOKENS_PER_S,
            name=f"vllm-{i}",
        )
        for i in range(2)
    ]
    gateway_address = f"{LOOPBACK}:{free_port()}"
    gateway_config = work / "gateway.yaml"
    gateway_config.write_text(
        yaml.safe_dump(
            {
                "listen": gateway_address,
                "metrics_listen": "",
                "allocator": {"endpoints": [allocator.address], "holder": "demo-gateway"},
                "auth": {"team_header": TEAM_HEADER},
                "models": [
                    {
                        "name": MODEL,
                        "pool": POOL,
                        "upstreams": [f"http://{s.address}" for s in standins],
                    }
                ],
            },
            sort_keys=False,
        ),
        encoding="utf-8",
    )
    gateway = ServerProcess(
        [sys.executable, "-m", "fairshare.cli", "gateway", "--config", str(gateway_config)],
        address=gateway_address,
        log=work / "gateway.log",
    )
    processes = [allocator, *standins, gateway]
    try:
        allocator.start()
        for s in standins:
            s.start()
        await wait_serving(allocator.address, process=allocator)
        for s in standins:
            await wait_standin(s.url, process=s)
        gateway.start()
        await wait_http(f"http://{gateway_address}/readyz", process=gateway)
        print(
            f"allocator {allocator.address}, stand-ins {standins[0].address} and "
            f"{standins[1].address} ({RUNNING_PER_STANDIN} running each), gateway http://{gateway_address}\n"
            f"status page http://{status_address}/ (what the allocator counts, live)\n"
            f"pool {POOL}: C = {2 * RUNNING_PER_STANDIN}, shares {SHARES}; in flight per "
            f"team {IN_FLIGHT}; each request streams {TOKENS[0]} to {TOKENS[1]} tokens at "
            f"{TOKENS_PER_S:g}/s\n",
            flush=True,
        )
        url = f"http://{gateway_address}/v1/chat/completions"
        views = {team: TeamView() for team in SHARES}
        start = time.monotonic()
        until = start + seconds
        timeout = aiohttp.ClientTimeout(total=60)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            load = asyncio.gather(
                *(team_load(session, url, team, views[team], until) for team in SHARES)
            )
            status = f"http://{status_address}/api/status.json"
            teams: dict[str, Json] = {}
            while time.monotonic() < until:
                await asyncio.sleep(1.0)
                teams = await allocator_teams(session, status)
                elapsed = time.monotonic() - start
                if elapsed >= WARM_UP_S:
                    sample(views, teams)
                print(report(views, teams, elapsed), flush=True)
            await load
        print(summary(views, teams), flush=True)
        return 0
    finally:
        for process in processes:
            with contextlib.suppress(Exception):
                process.stop(timeout_s=10)
            process.kill()
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="how long the load runs")
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        return asyncio.run(run(args.seconds))
    return 130


if __name__ == "__main__":
    sys.exit(main())
