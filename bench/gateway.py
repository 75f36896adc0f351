"""Benchmark of ``fairshare gateway`` against calling the stand-in vLLM server directly and
against a plain pass-through proxy on the same HTTP stack, all measured in the same run.

Run with ``make bench`` (or ``python -m bench.gateway`` from the repository root).
Processes on loopback, each started as a user would (``python -m ...``):

- an allocator (``fairshare serve``, embedded mode) with one pool ``bench-gw`` of C = 100
  shared by three teams (0.5, 0.3, 0.2);
- two stand-in vLLM servers (``fairshare.sim.standin``) with room for every request at once (no
  queueing in them), so what is measured is the path, not the scheduler: one streams at
  50 tokens/s per request, the other answers at once (model ``standin-fast``);
- the gateway (``fairshare gateway``) in front of it, team from a trusted header;
- two plain pass-through proxies (bench/passthrough.py), one in front of each stand-in:
  aiohttp server and client as in the gateway, forwarding body and answer as they are, no
  allocator.

The load generator is this process: one aiohttp session, closed loops of workers, rounds
alternating between the two targets compared so that noise hits both alike; each figure is
the median over the rounds.

1. **Time to first token at 50 concurrent streams:** each worker sends a streaming chat
   completion (20 tokens at 50 tokens/s, so a stream lasts about 0.4 s and the machine is
   not saturated) and times the first SSE event; directly to the stand-in vs through the
   gateway. The workers start spread over one stream's length, as independent clients
   arrive (started together, streams of one length would keep arriving in bursts of 50).
   The requests spread over the three teams by their shares, at most 25, 15 and 10 in
   flight against reservations of 50, 30 and 20: every one is within its team's share, so
   every Acquire waits for the pool's durable write (the costliest case). Target: the
   gateway adds at most 2 ms at the median.
   Two more loops show where that time goes: the same streams through the pass-through
   proxy (the HTTP hop alone), and the allocator alone, as the gateway uses it: 50
   holders, spread the same way, each acquiring (timed), holding the grant one stream's
   length and releasing it, through the client library in this process.
2. **Throughput of short non-streaming requests at 32 in flight** (one token each, the
   stand-in answering at once): through the gateway vs through the pass-through proxy.
   Target: the gateway serves at least 50 % of the proxy's requests per second.

With ``--peer litellm`` it measures instead the gateway against LiteLLM's proxy and the
stand-in directly, side by side (bench/gateway_peer.py).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import shutil
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import yaml

from bench._common import (
    LoadResult,
    Samples,
    closed_loop,
    cpu_seconds,
    machine,
    machine_lines,
    met,
    ms,
    percentile,
    pool_yaml,
    workdir,
    write_section,
)
from fairshare.client import AllocatorClient
from fairshare.wire.polling import polling_environment
from harness.http import wait_http
from harness.net import free_port
from harness.process import ServerProcess
from harness.serve import Allocator, wait_serving
from harness.standin import Standin, wait_standin

SECTION = "## Gateway"
POOL = "bench-gw"
MODEL = "standin"
FAST_MODEL = "standin-fast"
FAST_TOKENS_PER_S = 100_000.0
TEAMS = {"team-a": 0.5, "team-b": 0.3, "team-c": 0.2}
TEAM_HEADER = "x-fairshare-team"
STREAMS = 32 + 18  # 50 concurrent streams
STREAM_TOKENS = 20
TOKENS_PER_S = 50.0
STREAM_S = STREAM_TOKENS / TOKENS_PER_S
"""How long one stream lasts; the streams' workers start spread over it."""
SHORT_IN_FLIGHT = 32
TTFT_TARGET_S = 0.002
THROUGHPUT_TARGET = 0.5
REQUEST_TIMEOUT_S = 30.0
HTTP_OK = 200
PEERS = ("litellm",)
"""Other proxies ``--peer`` measures the gateway against (bench/gateway_peer.py)."""


@dataclass
class Targets:
    """The URLs of the servers under test."""

    standin: str
    gateway: str
    passthrough: str
    """In front of the fast stand-in."""
    stream_passthrough: str
    """In front of the streaming stand-in."""
    allocator: str
    pids: dict[str, int]
    """The process of each part, for its CPU time: allocator, stand-in, gateway, proxy."""


def cpu_per_request(
    pids: dict[str, int], before: dict[str, float], own_before: float, ops: int
) -> dict[str, float]:
    """Milliseconds of CPU each process spent per request since ``before``."""
    spent = {name: cpu_seconds(pid) - before[name] for name, pid in pids.items()}
    spent["load generator"] = time.process_time() - own_before
    return {name: 1e3 * seconds / max(ops, 1) for name, seconds in spent.items()}


class Load:
    """The benchmark's requests, spread over the teams by their shares."""

    def __init__(self, session: aiohttp.ClientSession) -> None:
        self.session = session
        weights = [round(share * 10) for share in TEAMS.values()]
        self._teams = itertools.cycle(
            [team for team, w in zip(TEAMS, weights, strict=True) for _ in range(w)]
        )

    def _headers(self, bearer: str = "unused") -> dict[str, str]:
        return {TEAM_HEADER: next(self._teams), "Authorization": f"Bearer {bearer}"}

    async def stream(self, base: str, samples: Samples) -> None:
        """One streaming chat completion; records the time to its first SSE event."""
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": "say something short"}],
            "max_tokens": STREAM_TOKENS,
            "stream": True,
        }
        t0 = time.perf_counter()
        async with self.session.post(
            base + "/v1/chat/completions", json=body, headers=self._headers()
        ) as reply:
            if reply.status != HTTP_OK:
                raise RuntimeError(f"{base}: status {reply.status}: {await reply.text()}")
            first = True
            async for line in reply.content:
                if first and line.startswith(b"data:"):
                    samples.add("ttft", time.perf_counter() - t0)
                    first = False
            if first:
                raise RuntimeError(f"{base}: a stream without events")

    async def short(
        self, base: str, samples: Samples, bearer: str = "unused", model: str = FAST_MODEL
    ) -> None:
        """One non-streaming completion of one token (``bearer``: the key the server asks
        for, if any)."""
        body = {
            "model": model,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 1,
        }
        t0 = time.perf_counter()
        async with self.session.post(
            base + "/v1/chat/completions", json=body, headers=self._headers(bearer)
        ) as reply:
            data = await reply.read()
            if reply.status != HTTP_OK:
                raise RuntimeError(f"{base}: status {reply.status}: {data[:200]!r}")
        samples.add("call", time.perf_counter() - t0)

    async def held(self, client: AllocatorClient, samples: Samples) -> None:
        """One grant as a stream through the gateway holds one; times its Acquire."""
        t0 = time.perf_counter()
        grant = await client.acquire(POOL, next(self._teams), est_tokens=STREAM_TOKENS)
        samples.add("acquire", time.perf_counter() - t0)
        await asyncio.sleep(STREAM_S)
        await grant.release(float(STREAM_TOKENS))


async def short_loop(
    load: Load, base: str, pids: dict[str, int], args: argparse.Namespace, bearer: str = "unused"
) -> tuple[LoadResult, dict[str, float]]:
    """One closed loop of short requests at ``SHORT_IN_FLIGHT`` through ``base``: its result
    and the ms of CPU per request each process of ``pids`` (and this one) spent."""

    async def called(samples: Samples) -> None:
        await load.short(base, samples, bearer)

    before = {part: cpu_seconds(pid) for part, pid in pids.items()}
    own_before = time.process_time()
    result = await closed_loop(
        called,
        in_flight=SHORT_IN_FLIGHT,
        warmup_s=args.warmup,
        duration_s=args.duration,
        max_ops=100_000,
    )
    # Warm-up requests are in the CPU time but not in the count: divide by all.
    done = result.ops + round(result.rate * args.warmup)
    return result, cpu_per_request(pids, before, own_before, done)


@dataclass
class Results:
    ttft: dict[str, list[LoadResult]]
    acquire: list[LoadResult]
    """The allocator alone: Acquire latency of 50 holders as the gateway's streams."""
    short: dict[str, list[LoadResult]]
    rounds: int
    duration_s: float
    cpu: dict[str, list[dict[str, float]]]
    """Short requests: per path, per round, ms of CPU per request of each process."""


def median_p(results: list[LoadResult], name: str, q: float) -> float:
    return statistics.median(percentile(r.samples.get(name), q) for r in results)


def median_rate(results: list[LoadResult]) -> float:
    return statistics.median(r.rate for r in results)


async def measure(args: argparse.Namespace, targets: Targets) -> Results:
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    async with (
        aiohttp.ClientSession(connector=connector, timeout=timeout) as session,
        AllocatorClient([targets.allocator], holder="bench-alone") as client,
    ):
        load = Load(session)
        ttft: dict[str, list[LoadResult]] = {"direct": [], "passthrough": [], "gateway": []}
        acquire: list[LoadResult] = []
        short: dict[str, list[LoadResult]] = {"passthrough": [], "gateway": []}
        cpu: dict[str, list[dict[str, float]]] = {"passthrough": [], "gateway": []}
        bases = {
            "direct": targets.standin,
            "gateway": targets.gateway,
            "passthrough": targets.passthrough,
        }
        stream_bases = {**bases, "passthrough": targets.stream_passthrough}
        for round_no in range(args.rounds):
            for name in ("direct", "passthrough", "gateway"):
                base = stream_bases[name]

                async def streamed(samples: Samples, base: str = base) -> None:
                    await load.stream(base, samples)

                result = await closed_loop(
                    streamed,
                    in_flight=STREAMS,
                    warmup_s=args.warmup,
                    duration_s=args.duration,
                    max_ops=10_000,
                    stagger_s=STREAM_S,
                )
                ttft[name].append(result)
                print(
                    f"  round {round_no + 1} streams {name:>11}: first token p50 "
                    f"{ms(percentile(result.samples.get('ttft'), 50))} ms",
                    flush=True,
                )

            async def holding(samples: Samples) -> None:
                await load.held(client, samples)

            result = await closed_loop(
                holding,
                in_flight=STREAMS,
                warmup_s=args.warmup,
                duration_s=args.duration,
                max_ops=10_000,
                stagger_s=STREAM_S,
            )
            acquire.append(result)
            print(
                f"  round {round_no + 1} streams  allocator: Acquire p50 "
                f"{ms(percentile(result.samples.get('acquire'), 50))} ms",
                flush=True,
            )
            for name in ("passthrough", "gateway"):
                result, spent = await short_loop(load, bases[name], targets.pids, args)
                cpu[name].append(spent)
                short[name].append(result)
                print(
                    f"  round {round_no + 1} short   {name:>11}: {result.rate:7.0f} requests/s",
                    flush=True,
                )
        return Results(ttft, acquire, short, args.rounds, args.duration, cpu)


def verdicts(res: Results) -> tuple[str, bool, bool]:
    direct = median_p(res.ttft["direct"], "ttft", 50)
    through = median_p(res.ttft["gateway"], "ttft", 50)
    added = through - direct
    ttft_ok = added <= TTFT_TARGET_S
    hop = median_p(res.ttft["passthrough"], "ttft", 50) - direct
    alone = median_p(res.acquire, "acquire", 50)
    proxy = median_rate(res.short["passthrough"])
    gateway = median_rate(res.short["gateway"])
    ratio = gateway / proxy if proxy > 0 else 0.0
    rate_ok = ratio >= THROUGHPUT_TARGET
    text = (
        f"Targets: at {STREAMS} concurrent streams the gateway adds {ms(added)} ms to the "
        f"median time to first token ({ms(through)} ms through it, {ms(direct)} ms directly), "
        f"target ≤ {ms(TTFT_TARGET_S)} ms: {met(ttft_ok)}. Of that, the HTTP hop alone "
        f"(the pass-through proxy) adds {ms(hop)} ms and an Acquire alone at the same pace "
        f"takes {ms(alone)} ms (within share: it waits for the durable write), "
        f"{ms(hop + alone)} ms together. Short non-streaming requests at "
        f"{SHORT_IN_FLIGHT} in flight: {gateway:,.0f}/s through the gateway, {proxy:,.0f}/s "
        f"through the pass-through proxy, {ratio:.0%}, target ≥ "
        f"{THROUGHPUT_TARGET:.0%}: {met(rate_ok)}."
    )
    return text, ttft_ok, rate_ok


def table(res: Results) -> str:
    lines = [
        "| path | load | requests/s | p50 ms | p99 ms |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for name, label in (
        ("direct", "stand-in directly"),
        ("passthrough", "pass-through proxy"),
        ("gateway", "through the gateway"),
    ):
        rs = res.ttft[name]
        lines.append(
            f"| {label} | {STREAMS} streams, first token | {median_rate(rs):,.0f} | "
            f"{ms(median_p(rs, 'ttft', 50))} | {ms(median_p(rs, 'ttft', 99))} |"
        )
    lines.append(
        f"| allocator alone (client library) | {STREAMS} holders as the streams, Acquire | "
        f"{median_rate(res.acquire):,.0f} | {ms(median_p(res.acquire, 'acquire', 50))} | "
        f"{ms(median_p(res.acquire, 'acquire', 99))} |"
    )
    for name, label in (
        ("passthrough", "pass-through proxy"),
        ("gateway", "through the gateway"),
    ):
        rs = res.short[name]
        lines.append(
            f"| {label} | {SHORT_IN_FLIGHT} in flight, 1-token answers | "
            f"{median_rate(rs):,.0f} | {ms(median_p(rs, 'call', 50))} | "
            f"{ms(median_p(rs, 'call', 99))} |"
        )
    return "\n".join(lines)


def section(res: Results, info: dict[str, str], args: argparse.Namespace) -> str:
    text, _, _ = verdicts(res)
    return "\n".join(
        [
            SECTION,
            "",
            f"Command: `python -m bench.gateway` (rounds {args.rounds}, {args.duration:g} s "
            f"per loop after {args.warmup:g} s of warm-up; medians over the rounds).",
            "",
            machine_lines(info),
            "",
            "Workload: one pool of C = 100 shared by three teams (0.5, 0.3, 0.2), requests "
            "spread over them by share; the stand-in vLLM servers run every request at once. "
            f"Streams: {STREAM_TOKENS} tokens at {TOKENS_PER_S:g} tokens/s, {STREAMS} in "
            f"flight. Short requests: one token, answered at once, {SHORT_IN_FLIGHT} in "
            "flight. The load generator, the allocator, the stand-ins, the gateway and the "
            "proxy share the machine's cores.",
            "",
            table(res),
            "",
            text,
            "",
            cpu_table(res),
            "",
            WHERE_THE_TIME_GOES,
        ]
    )


def cpu_table(res: Results) -> str:
    """CPU per short request of each process, on each path (medians over the rounds)."""
    rows = (("passthrough", "pass-through proxy"), ("gateway", "gateway"))
    return cpu_rows(res.cpu, rows, "short requests: ms of CPU per request")


def cpu_rows(
    cpu: dict[str, list[dict[str, float]]], rows: Sequence[tuple[str, str]], heading: str
) -> str:
    """A table of ``cpu`` (per path, per round, ms of CPU per request of each process): a
    row per (path, label) of ``rows``, a column per process, medians over the rounds."""
    parts = list(cpu[rows[-1][0]][0])
    lines = [
        f"| {heading} | " + " | ".join(parts) + " | all |",
        "| --- | " + " | ".join("---:" for _ in parts) + " | ---: |",
    ]
    for name, label in rows:
        rounds = cpu[name]
        medians = [statistics.median(r[part] for r in rounds) for part in parts]
        cells = " | ".join(f"{m:.2f}" for m in medians)
        lines.append(f"| {label} | {cells} | {sum(medians):.2f} |")
    return "\n".join(lines)


WHERE_THE_TIME_GOES = (
    "Where the time goes. First token: the pass-through proxy's row is the HTTP hop "
    "alone, and the allocator's row an Acquire alone, made at the same pace by 50 holders "
    "through the client library in a process that does nothing else. Every request of "
    "this workload is within its team's share, so its Acquire returns only after the "
    "pool's durable write (an fdatasync of the embedded store; design.md §10): hop and "
    "Acquire together are a floor no gateway can go under while within-share grants wait "
    "for their write, which the design keeps (a grant lost with a crashed owner could let "
    "its successor promise a reserved slot twice). The 2 ms target is below that floor on "
    "this machine. What the gateway adds over the floor is its Acquire waiting for the "
    "CPU: the gateway's event loop and the gRPC completions it waits for share the two "
    "cores with the other streams' chunks, the stand-in and the load generator. Short "
    "requests: every part runs on the same two cores, so requests per second through a "
    "path is about the cores' time divided by the CPU one request costs in all the "
    "processes on that path (the table above, from /proc). Through the gateway a request "
    "also costs the allocator an Acquire and a Release, each batched with the others that "
    "wait (AcquireMany, ReleaseMany), and the gateway its client calls on top of the HTTP "
    "work the proxy does."
)


# -- processes ------------------------------------------------------------------------------


def gateway_yaml(allocator: str, upstreams: dict[str, str], listen: str) -> str:
    """The gateway's config: each model of ``upstreams`` (model: base URL) in the pool."""
    doc = {
        "listen": listen,
        "metrics_listen": "",
        "allocator": {"endpoints": [allocator], "holder": "bench-gateway"},
        "auth": {"team_header": TEAM_HEADER},
        "models": [
            {"name": model, "pool": POOL, "upstreams": [url]} for model, url in upstreams.items()
        ],
        "cost": {"unit": "tokens"},
    }
    return yaml.safe_dump(doc, sort_keys=False)


def pids_of(processes: dict[str, ServerProcess]) -> dict[str, int]:
    """The process ids of started processes, by name."""
    pids = {}
    for name, process in processes.items():
        if process.proc is None:
            raise RuntimeError(f"{name} is not started")
        pids[name] = process.proc.pid
    return pids


def standin_process(work: Path, model: str, tokens_per_s: float) -> Standin:
    """A stand-in vLLM server serving ``model`` with room for every request at once."""
    return Standin(work, models=(model,), max_running=1000, tokens_per_s=tokens_per_s, name=model)


def passthrough_process(
    work: Path, upstream: str, name: str, decide: str | None = None
) -> ServerProcess:
    """A pass-through proxy (bench/passthrough.py) in front of ``upstream``; with
    ``decide``, calling the durable echo at that address before each forward."""
    address = f"127.0.0.1:{free_port()}"
    command = ["-m", "bench.passthrough", "--listen", address, "--upstream", upstream]
    if decide is not None:
        command += ["--decide", decide]
    # Its gRPC client polls as the gateway's does (fairshare.wire.polling).
    env = polling_environment(os.environ)
    log = work / f"{name}.log"
    return ServerProcess([sys.executable, *command], address=address, log=log, env=env)


def allocator_process(work: Path) -> Allocator:
    """The allocator (embedded mode) with the benchmark's one pool, its config in ``work``."""
    config = work / "pools.yaml"
    pool = {
        "name": POOL,
        "capacity": 100,
        "shares": TEAMS,
        "degraded_mode": "fail_open",
    }
    config.write_text(pool_yaml([pool]), encoding="utf-8")
    return Allocator(work, config)


def gateway_process(work: Path, allocator: str, upstreams: dict[str, str]) -> ServerProcess:
    """``fairshare gateway`` on a free loopback port, asking ``allocator`` for every request
    to a model of ``upstreams`` (model: base URL); its config and log in ``work``."""
    address = f"127.0.0.1:{free_port()}"
    config = work / "gateway.yaml"
    config.write_text(gateway_yaml(allocator, upstreams, address), encoding="utf-8")
    return ServerProcess(
        [sys.executable, "-m", "fairshare.cli", "gateway", "--config", str(config)],
        address=address,
        log=work / "gateway.log",
    )


def stop_all(processes: Sequence[ServerProcess], work: Path) -> None:
    """Stops (then kills) every process and removes ``work``."""
    for process in processes:
        with contextlib.suppress(Exception):
            process.stop(timeout_s=10)
        process.kill()
    shutil.rmtree(work, ignore_errors=True)


async def run(args: argparse.Namespace) -> Results:
    work = workdir("fairshare-bench-gateway-")
    allocator = allocator_process(work)
    standin = standin_process(work, MODEL, TOKENS_PER_S)
    fast = standin_process(work, FAST_MODEL, FAST_TOKENS_PER_S)
    standin_address, fast_address = standin.address, fast.address
    gateway = gateway_process(
        work,
        allocator.address,
        {MODEL: f"http://{standin_address}", FAST_MODEL: f"http://{fast_address}"},
    )
    gateway_address = gateway.address
    proxy = passthrough_process(work, f"http://{fast_address}", "passthrough")
    stream_proxy = passthrough_process(work, f"http://{standin_address}", "stream-passthrough")
    processes = (allocator, standin, fast, gateway, proxy, stream_proxy)
    try:
        allocator.start()
        standin.start()
        fast.start()
        await wait_serving(allocator.address, process=allocator)
        for server in (standin, fast):
            await wait_standin(server.url, process=server)
        gateway.start()
        proxy.start()
        stream_proxy.start()
        await wait_http(f"http://{gateway_address}/readyz", process=gateway)
        # A proxy has no health path: it is up once it forwards a request.
        for running, model in ((proxy, FAST_MODEL), (stream_proxy, MODEL)):
            await wait_http(
                f"http://{running.address}/v1/chat/completions",
                process=running,
                post_json={"model": model, "messages": [], "max_tokens": 1},
                any_status=True,
            )
        targets = Targets(
            standin=f"http://{standin_address}",
            gateway=f"http://{gateway_address}",
            passthrough=f"http://{proxy.address}",
            stream_passthrough=f"http://{stream_proxy.address}",
            allocator=allocator.address,
            pids=pids_of(
                {"allocator": allocator, "stand-in": fast, "gateway": gateway, "proxy": proxy}
            ),
        )
        return await measure(args, targets)
    finally:
        stop_all(processes, work)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every loop")
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per loop")
    parser.add_argument("--warmup", type=float, default=0.5, help="warm-up seconds per loop")
    parser.add_argument("--no-write", action="store_true", help="do not touch docs/")
    parser.add_argument(
        "--peer",
        choices=PEERS,
        help="instead, the gateway against this proxy and the stand-in directly "
        "(bench/gateway_peer.py; installs the proxy under build/peers/ on first use)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.peer is not None:
        from bench.gateway_peer import main as peer_main

        return peer_main(args)
    info = machine()
    for key, value in info.items():
        print(f"{key}: {value}")
    res = asyncio.run(run(args))
    print()
    print(table(res))
    print()
    text, _, _ = verdicts(res)
    print(text)
    if not args.no_write:
        write_section(SECTION, section(res, info, args))
        print(f"\nwrote the {SECTION!r} section of docs/benchmarks.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
