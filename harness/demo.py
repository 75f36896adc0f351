"""``make demo``: an allocator, two stand-in vLLM servers, the gateway and three teams'
load, with each team's priorities and waits printed live.

``python -m harness.demo [--seconds N]`` from the repository root. Everything runs on
loopback in this machine's processes and is stopped at the end (or on Ctrl-C):

- an allocator (``fairshare serve``, embedded) with one pool ``demo`` of C = 8 shared by
  teams ``a`` (0.5, a reservation of 4), ``b`` (0.3, 2.4) and ``c`` (0.2, 1.6);
- two stand-in vLLM servers (``sim.standin``) of 4 running requests each (so 8 in all, the
  pool's C), scheduling by vLLM's (priority, arrival);
- the gateway (``fairshare gateway``) in front of both, the team taken from the
  ``x-fairshare-team`` header;
- the load, streaming chat completions of 1 to 3 s each (10 to 30 tokens at 10 tokens/s)
  through the gateway: team ``a`` floods (12 requests always in flight), ``b`` keeps 2 in
  flight and ``c`` 1, each within its reservation.

Every second it prints, per team, the requests in flight, how many of the requests that
ended in the last five seconds were within the team's share and how many borrowed, the
priorities the gateway put on them (``x-fairshare-priority``) and their median wait for a
first token. What to see: ``b`` and ``c`` stay within their share at priority 0 and wait
at most for one running request to end (vLLM, like the stand-in, never preempts a running
request to start a waiting one), while ``a``, above its share, borrows at worse
priorities and waits longest.
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


WINDOW_S = 5.0
"""The report counts the requests that ended within this many seconds."""


@dataclass(frozen=True)
class Ended:
    """One request that ended: when, how it was placed, and how long it waited."""

    at: float
    borrowing: bool
    priority: int | None
    waited: float | None


@dataclass
class TeamView:
    """What one team saw: requests in flight now, and those that ended lately."""

    in_flight: int = 0
    ended: deque[Ended] = field(default_factory=deque)
    errors: deque[float] = field(default_factory=deque)

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
            borrowing = reply.headers.get("x-fairshare-borrowing") == "true"
            waited = None
            async for line in reply.content:
                if waited is None and line.startswith(b"data:"):
                    waited = time.monotonic() - t0
            view.ended.append(
                Ended(
                    time.monotonic(),
                    borrowing,
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


def report(views: dict[str, TeamView], elapsed: float) -> str:
    lines = [f"--- {elapsed:5.1f} s (requests that ended in the last {WINDOW_S:g} s) " + "-" * 20]
    lines.append(
        f"{'team':<5} {'share':>5} {'in flight':>9} {'within':>6} {'borrow':>6} "
        f"{'wait p50':>9}  priorities"
    )
    horizon = time.monotonic() - WINDOW_S
    for team, view in views.items():
        view.forget_before(horizon)
        waits = [e.waited for e in view.ended if e.waited is not None]
        wait = f"{statistics.median(waits):7.2f} s" if waits else "        -"
        seen = Counter(e.priority for e in view.ended if e.priority is not None)
        priorities = " ".join(f"{p}×{n}" for p, n in sorted(seen.items())) or "-"
        borrowing = sum(1 for e in view.ended if e.borrowing)
        within = len(view.ended) - borrowing
        errors = f"  ({len(view.errors)} errors)" if view.errors else ""
        lines.append(
            f"{team:<5} {SHARES[team]:>5.1f} {view.in_flight:>9} {within:>6} "
            f"{borrowing:>6} {wait}  {priorities}{errors}"
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
    allocator = Allocator(work, config)
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
        [sys.executable, "-m", "cli", "gateway", "--config", str(gateway_config)],
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
            while time.monotonic() < until:
                await asyncio.sleep(1.0)
                print(report(views, time.monotonic() - start), flush=True)
            await load
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
