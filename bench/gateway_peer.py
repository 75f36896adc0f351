"""``fairshare gateway`` against LiteLLM's proxy, side by side in one run:
``python -m bench.gateway --peer litellm``.

Processes on loopback, each a child of this one:

- an allocator (``fairshare serve``, embedded mode) with bench/gateway.py's pool (C = 100,
  three teams 0.5, 0.3, 0.2; every request is within its team's share, so every Acquire
  waits for the pool's durable write);
- one stand-in vLLM server answering at once (model ``standin-fast``, room for every
  request at once), the upstream of every path;
- ``fairshare gateway`` in front of it, team from a trusted header;
- LiteLLM's proxy in front of it (bench/litellm_peer.py: the pinned version in its own
  virtualenv under build/, one uvicorn worker, a master key, no database, offline);
- a second LiteLLM proxy, the same but for fairshare's callback (docs/litellm.md), which
  asks the allocator for each request's priority (the team from the same header);
- a third LiteLLM proxy, the same but for a callback that does nothing at the same hooks
  (bench/litellm_noop.py): what LiteLLM costs a request for running any callback there;
- bench/passthrough.py in front of it: an aiohttp server that forwards each request to the
  stand-in with an aiohttp client and does nothing else, the HTTP hop every Python proxy
  makes (the gateway is built on the same two parts);
- the same hop once more, but sending first one gRPC message, on a stream it keeps open
  as the client library keeps its ``AcquireStream``, to a server that appends the
  message's bytes to a file and fdatasyncs it before answering (bench/echo.py ``--sync``):
  the floor of a gateway that decides every request durably over gRPC, with none of the
  deciding (no identity, no body, no pool, no signing, no log). It is measured one request
  at a time only: under load an allocator shares one write among many requests, which this
  floor does not.

Every request is bench/gateway.py's short one: a non-streaming chat completion of one token.
Seven paths: the stand-in directly, through the hop, through the hop with a durable message,
through the gateway, through LiteLLM, through LiteLLM with a callback that does nothing,
and through LiteLLM with fairshare's callback. What the callback adds is the difference of
its LiteLLM from the first, round by round. The do-nothing callback splits it: what LiteLLM
costs a request for running a callback at those hooks at all (the least any callback there
adds: the callback target's floor) and fairshare's work beyond it (its decision, its
release), each within the half millisecond or so by which two LiteLLM processes alike
differ. Each round measures every path, in an order that rotates from round to round: one
request at a time, the paths in turn request by request, then each path under load for a
stretch of its own; so other work on the machine hits them alike. Each figure is the
median over the rounds. Each LiteLLM proxy serves one model group: an earlier split gave
the callback's proxy a second group of the same model, which the callback did not decide,
and with a callback that did nothing there the first group's requests took about 3 ms
longer than the second's in both rounds of a run (and than LiteLLM alone's), which that
split counted as the callback's.

1. **Sequential added latency:** one request at a time, the paths in turn, started at a
   fixed pace of ``SEQUENTIAL_PER_S`` (well below what the paths serve one after another,
   so a request rarely waits for the one before it; the report counts those that did). A
   path's added latency in a round is its median latency minus the direct median of the
   same round. Target: the gateway's added latency is at most ``ADDED_LATENCY_TARGET`` of
   LiteLLM's. The hop with a durable message is that target's floor, reported beside it:
   what is left between the two is what the gateway may spend on everything else. Target
   of the callback: it adds less than ``CALLBACK_TARGET`` of LiteLLM's own added latency
   (round by round).
2. **Throughput at 32 in flight** (bench/gateway.py's closed loop of short requests), with
   the CPU each process spends per request. Target: the gateway serves at least
   ``THROUGHPUT_TARGET`` of the requests per second the stand-in serves directly. The hop
   alone is that target's floor: a proxy that makes the hop and nothing else cannot serve
   more than the hop does, so the report gives the hop's own fraction of direct beside the
   target, and the gateway's requests per second as a fraction of the hop's (what the
   gateway adds over the hop: its allocator calls, its checks, its log).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import time
from dataclasses import dataclass

import aiohttp

from bench import litellm_peer
from bench._common import (
    LoadResult,
    Samples,
    machine,
    machine_lines,
    met,
    ms,
    percentile,
    workdir,
    write_section,
)
from bench.echo import echo_server
from bench.gateway import (
    FAST_MODEL,
    FAST_TOKENS_PER_S,
    POOL,
    REQUEST_TIMEOUT_S,
    SHORT_IN_FLIGHT,
    TEAM_HEADER,
    TEAMS,
    Load,
    allocator_process,
    cpu_rows,
    gateway_process,
    median_rate,
    passthrough_process,
    pids_of,
    short_loop,
    standin_process,
    stop_all,
)
from harness.http import wait_http
from harness.process import ROOT
from harness.serve import wait_serving
from harness.standin import wait_standin

SECTION = "## The gateway against LiteLLM's proxy"
PATHS = ("direct", "hop", "floor", "gateway", "litellm", "litellm+noop", "litellm+fairshare")
LOADED = tuple(name for name in PATHS if name != "floor")
"""The paths measured at 32 in flight too (the floor is a floor one request at a time)."""
NOOP_CALLBACK = "bench.litellm_noop.handler"
"""The third proxy's callback: fairshare's hooks, each doing nothing."""
LABELS = {
    "direct": "stand-in directly",
    "hop": "pass-through hop (does nothing)",
    "floor": "hop + one durable gRPC message (does nothing else)",
    "gateway": "fairshare gateway",
    "litellm": "LiteLLM proxy",
    "litellm+noop": "LiteLLM proxy with a callback that does nothing (the same hooks)",
    "litellm+fairshare": "LiteLLM proxy with fairshare's callback",
}
SEQUENTIAL_PER_S = 10.0
"""The pace of the sequential requests, all paths together: one every 100 ms, where one
takes from a few ms (directly) to some tens of ms (LiteLLM's proxy on a busy machine)."""
SEQUENTIAL_RECORDED = 80
"""Sequential requests recorded per path and round (56 s at that pace, the paths in turn)."""
SEQUENTIAL_WARMUP = 5
"""Sequential requests of each path and round not recorded, before those."""
WARM_REQUESTS = 50
"""Requests through each path before the first round (LiteLLM loads code on its first)."""
ADDED_LATENCY_TARGET = 0.25
"""The gateway's sequential added latency over direct, as a fraction of LiteLLM's: at most."""
CALLBACK_TARGET = 0.25
"""What fairshare's callback adds to LiteLLM's proxy one request at a time, as a fraction
of LiteLLM's own added latency: less than that."""
THROUGHPUT_TARGET = 0.5
"""The gateway's requests per second at 32 in flight, as a fraction of direct's: at least."""


@dataclass
class PeerTargets:
    bases: dict[str, str]
    """The base URL of each path."""
    bearer: dict[str, str]
    """The key each path asks for (LiteLLM's master key; unused by the others)."""
    models: dict[str, str]
    """The model each path's requests name."""
    pids: dict[str, int]
    """The process of each part, for its CPU time."""


@dataclass
class PeerResults:
    sequential: dict[str, list[LoadResult]]
    loaded: dict[str, list[LoadResult]]
    cpu: dict[str, list[dict[str, float]]]
    """32 in flight: per path, per round, ms of CPU per request of each process."""


@dataclass(frozen=True)
class Versions:
    fairshare: str
    litellm: str


def order_of(round_no: int) -> list[str]:
    """The paths in the order of round ``round_no``: each round starts one further."""
    shift = round_no % len(PATHS)
    return [*PATHS[shift:], *PATHS[:shift]]


def p50(result: LoadResult) -> float:
    return percentile(result.samples.get("call"), 50)


def median_of(results: list[LoadResult], q: float) -> float:
    return statistics.median(percentile(r.samples.get("call"), q) for r in results)


def added_latency(res: PeerResults, name: str) -> float:
    """The median over the rounds of ``name``'s sequential median minus direct's."""
    pairs = zip(res.sequential[name], res.sequential["direct"], strict=True)
    return statistics.median(p50(path) - p50(direct) for path, direct in pairs)


def late(results: list[LoadResult]) -> int:
    """Sequential requests started after their time because the one before still ran."""
    return sum(len(r.samples.get("late")) for r in results)


async def interleaved(load: Load, targets: PeerTargets, round_no: int) -> dict[str, LoadResult]:
    """One round of the sequential measurement: one request at a time, the paths in turn
    (in ``order_of(round_no)``), one started every ``1 / SEQUENTIAL_PER_S`` s; each path's
    first ``SEQUENTIAL_WARMUP`` are not recorded. A request that starts after its time
    (the one before ran long) is counted as late on its own path. Each result's seconds
    are those of the recorded part of the round, all paths together.

    Taking the paths request by request, rather than each for a stretch of its own, puts
    any two paths' requests a fraction of a second apart, under the same state of the
    machine: in a separate trial, two LiteLLM processes alike, measured in stretches of
    100 requests one after the other, differed by up to 2 ms from round to round (and by
    4 once), and by 0.6 ms at most taken in turn. Not spread: each path follows the same
    other path in every round (the rotation keeps the cycle)."""
    order = order_of(round_no)
    samples = {name: Samples() for name in order}
    count = len(order) * (SEQUENTIAL_WARMUP + SEQUENTIAL_RECORDED)
    start = measured_from = time.perf_counter()
    for i in range(count):
        name = order[i % len(order)]
        if i == len(order) * SEQUENTIAL_WARMUP:
            measured_from = time.perf_counter()
            for recorded in samples.values():
                recorded.on = True
        delay = start + i / SEQUENTIAL_PER_S - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        else:
            samples[name].add("late", -delay)
        await load.short(
            targets.bases[name], samples[name], targets.bearer[name], targets.models[name]
        )
    elapsed = time.perf_counter() - measured_from
    return {
        name: LoadResult(len(recorded.get("call")), elapsed, recorded)
        for name, recorded in samples.items()
    }


async def measure(args: argparse.Namespace, targets: PeerTargets) -> PeerResults:
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        load = Load(session)
        for name in PATHS:
            for _ in range(WARM_REQUESTS):
                await load.short(
                    targets.bases[name], Samples(), targets.bearer[name], targets.models[name]
                )
        sequential: dict[str, list[LoadResult]] = {name: [] for name in PATHS}
        loaded: dict[str, list[LoadResult]] = {name: [] for name in LOADED}
        cpu: dict[str, list[dict[str, float]]] = {name: [] for name in LOADED}
        for round_no in range(args.rounds):
            for name, result in (await interleaved(load, targets, round_no)).items():
                sequential[name].append(result)
                print(
                    f"  round {round_no + 1} sequential {name:>17}: p50 {ms(p50(result))} ms",
                    flush=True,
                )
            for name in (name for name in order_of(round_no) if name in LOADED):
                result, spent = await short_loop(
                    load, targets.bases[name], targets.pids, args, targets.bearer[name]
                )
                loaded[name].append(result)
                cpu[name].append(spent)
                print(
                    f"  round {round_no + 1} {SHORT_IN_FLIGHT} in flight {name:>17}: "
                    f"{result.rate:7.0f} requests/s",
                    flush=True,
                )
        return PeerResults(sequential, loaded, cpu)


def paired(res: PeerResults, name: str, base: str) -> float:
    """The median over the rounds of ``name``'s sequential median minus ``base``'s in the
    same round (paired, as ``added_latency`` is with direct)."""
    pairs = zip(res.sequential[name], res.sequential[base], strict=True)
    return statistics.median(p50(path) - p50(other) for path, other in pairs)


def callback_added(res: PeerResults) -> float:
    """What fairshare's callback adds to LiteLLM's proxy one request at a time: the two
    proxies' difference in each round, the median over the rounds."""
    return paired(res, "litellm+fairshare", "litellm")


def callback_floor(res: PeerResults) -> float:
    """What a callback that does nothing at the same hooks adds to LiteLLM's proxy, round
    by round: the least any callback there adds."""
    return paired(res, "litellm+noop", "litellm")


def callback_work(res: PeerResults) -> float:
    """What fairshare's callback adds beyond a callback that does nothing, round by round:
    its decision and its release."""
    return paired(res, "litellm+fairshare", "litellm+noop")


def durable_call(res: PeerResults) -> float:
    """What one durable gRPC message adds to a request, one at a time: the floor's
    difference from the hop in each round, the median over the rounds (the least the
    callback can add)."""
    return paired(res, "floor", "hop")


def verdicts(res: PeerResults) -> tuple[str, bool, bool]:
    ours = added_latency(res, "gateway")
    theirs = added_latency(res, "litellm")
    latency_ratio = ours / theirs if theirs > 0 else float("inf")
    latency_ok = latency_ratio <= ADDED_LATENCY_TARGET
    direct = median_rate(res.loaded["direct"])
    gateway = median_rate(res.loaded["gateway"])
    litellm = median_rate(res.loaded["litellm"])
    hop = median_rate(res.loaded["hop"])
    rate_ratio = gateway / direct if direct > 0 else 0.0
    rate_ok = rate_ratio >= THROUGHPUT_TARGET
    hop_ratio = hop / direct if direct > 0 else 0.0
    added = callback_added(res)
    nothing = callback_floor(res)
    nothing_ratio = nothing / theirs if theirs > 0 else float("inf")
    callback_floor_text = (
        f"A callback that does nothing at the same hooks adds {ms(nothing)} ms, "
        f"{nothing_ratio:.1%} of LiteLLM's own: what LiteLLM costs a request for running a "
        "callback there at all, the target's floor; "
        + (
            "the target is below it; "
            if nothing_ratio >= CALLBACK_TARGET
            else f"the target leaves {ms(CALLBACK_TARGET * theirs - nothing)} ms above it, "
        )
        + f"where fairshare's work (its decision, its release) adds {ms(callback_work(res))} ms "
        f"(one durable gRPC message alone, the floor minus the hop, adds "
        f"{ms(durable_call(res))} ms)."
    )
    least = added_latency(res, "floor")
    least_ratio = least / theirs if theirs > 0 else float("inf")
    latency_floor = (
        f"The hop with one durable gRPC message and nothing else adds {ms(least)} ms, "
        f"{least_ratio:.2f} of LiteLLM's: "
        + (
            "the target is below that floor; "
            if least_ratio > ADDED_LATENCY_TARGET
            else f"the target leaves {ms(ADDED_LATENCY_TARGET * theirs - least)} ms above it "
            "for everything else a gateway does (identify, parse, decide, sign, log), "
        )
        + f"where the gateway spends {ms(ours - least)} ms."
    )
    floor = (
        f"The hop alone serves {hop:,.0f}/s, {hop_ratio:.0%} of direct: "
        + (
            "the target is below that floor (a proxy built on aiohttp's server and client, "
            "as the gateway is, cannot meet it here whatever else it does); "
            if hop_ratio < THROUGHPUT_TARGET
            else ""
        )
        + f"the gateway serves {gateway / hop if hop > 0 else 0.0:.0%} of the hop's."
    )
    text = (
        f"Targets: one request at a time, the gateway adds {ms(ours)} ms to the direct median "
        f"and LiteLLM's proxy {ms(theirs)} ms: the gateway's is {latency_ratio:.3f} of "
        f"LiteLLM's, target ≤ {ADDED_LATENCY_TARGET:.2f}: {met(latency_ok)}. "
        f"{latency_floor} At "
        f"{SHORT_IN_FLIGHT} in flight the gateway serves {gateway:,.0f} requests/s, "
        f"{rate_ratio:.0%} of the {direct:,.0f}/s served directly, target ≥ "
        f"{THROUGHPUT_TARGET:.0%}: {met(rate_ok)} (LiteLLM's proxy: {litellm:,.0f}/s, "
        f"{litellm / direct if direct > 0 else 0.0:.0%} of direct; the gateway serves "
        f"{gateway / litellm if litellm > 0 else 0.0:.1f}× LiteLLM's). {floor} "
        f"fairshare's callback adds {ms(added)} ms to LiteLLM's proxy one request at a "
        f"time, {added / theirs if theirs > 0 else float('inf'):.1%} of LiteLLM's own added "
        f"latency, target < {CALLBACK_TARGET:.0%}: {met(added < CALLBACK_TARGET * theirs)}. "
        f"{callback_floor_text} The callback's proxy serves "
        f"{median_rate(res.loaded['litellm+fairshare']):,.0f} requests/s at "
        f"{SHORT_IN_FLIGHT} in flight, the do-nothing one "
        f"{median_rate(res.loaded['litellm+noop']):,.0f}."
    )
    return text, latency_ok, rate_ok


def tables(res: PeerResults) -> str:
    direct = median_rate(res.loaded["direct"])
    lines = [
        f"| path | one at a time: p50 ms | p99 ms | added over direct, ms | "
        f"{SHORT_IN_FLIGHT} in flight: requests/s | × direct | p50 ms | p99 ms |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name in PATHS:
        seq = res.sequential[name]
        added = "—" if name == "direct" else ms(added_latency(res, name))
        loaded_cells = "— | — | — | —"
        if name in res.loaded:
            loaded, rate = res.loaded[name], median_rate(res.loaded[name])
            loaded_cells = (
                f"{rate:,.0f} | {rate / direct if direct > 0 else 0.0:.2f} | "
                f"{ms(median_of(loaded, 50))} | {ms(median_of(loaded, 99))}"
            )
        lines.append(
            f"| {LABELS[name]} | {ms(median_of(seq, 50))} | {ms(median_of(seq, 99))} | "
            f"{added} | {loaded_cells} |"
        )
    return "\n".join(lines)


def cpu_table(res: PeerResults) -> str:
    """CPU per request at 32 in flight of each process, on each path (medians of rounds)."""
    rows = [(name, LABELS[name]) for name in LOADED]
    return cpu_rows(res.cpu, rows, f"{SHORT_IN_FLIGHT} in flight: ms of CPU per request")


def section(
    res: PeerResults, info: dict[str, str], args: argparse.Namespace, versions: Versions
) -> str:
    text, _, _ = verdicts(res)
    shares = ", ".join(f"{share:g}" for share in TEAMS.values())
    return "\n".join(
        [
            SECTION,
            "",
            "`fairshare gateway` and LiteLLM's proxy in front of the same stand-in vLLM "
            "server, that server called directly, a pass-through hop that does nothing "
            "(the floor of any Python proxy) and the same hop sending one durable gRPC "
            "message on an open stream before it forwards (the floor of a gateway that "
            "decides each request durably over gRPC), LiteLLM's proxy with fairshare's "
            "callback, and LiteLLM's proxy with a callback that does nothing at the same "
            "hooks (the callback target's floor), measured side by side "
            "in one run "
            "(bench/gateway_peer.py). The rounds interleave the paths, in an order "
            "that rotates from round to round, so that other work on the machine hits them "
            "alike; every figure is the median over the rounds. Figures vary from run to run "
            "and from round to round with the machine's load (the load average below was "
            "taken at the start; the last table gives each round's own figures).",
            "",
            f"Command: `python -m bench.gateway --peer litellm --rounds {args.rounds} "
            f"--duration {args.duration:g} --warmup {args.warmup:g}` (the loops at "
            f"{SHORT_IN_FLIGHT} in flight: {args.duration:g} s each after {args.warmup:g} s "
            "of warm-up; LiteLLM's proxy answers them in waves a few seconds apart, so they "
            "need to be long).",
            "",
            f"Versions: fairshare {versions.fairshare}; litellm {versions.litellm} "
            "(`litellm[proxy]` with opentelemetry-sdk and prisma, which its proxy imports on "
            "every request; every version pinned in bench/litellm-requirements.txt, which "
            "says why; in a virtualenv of its own under build/).",
            "",
            machine_lines(info),
            "",
            "Workload: every request is a non-streaming chat completion of one token to "
            f"model `{FAST_MODEL}`, which the stand-in answers at once (room for every "
            "request at once, no queueing in it). One at a time: "
            f"{SEQUENTIAL_PER_S:g} requests/s, one in flight, the paths in turn request by "
            f"request, {SEQUENTIAL_RECORDED} recorded per path and round after "
            f"{SEQUENTIAL_WARMUP} unrecorded; "
            f"{sum(late(rs) for rs in res.sequential.values())} started late in all because "
            f"the one before was still running. Loaded: {SHORT_IN_FLIGHT} in flight, a closed "
            "loop. The gateway asks the allocator (embedded mode, one pool of C = 100 shared "
            f"by three teams {shares}, team from a trusted header) for every request, and "
            "every request is within its team's share, so each Acquire waits for the pool's "
            "durable write (an fdatasync). LiteLLM's proxy: one uvicorn worker (its default), "
            "a master key (it refuses to start without one), no database, warnings-only "
            "logging (no access log), offline (the tables it would fetch are read from the "
            "package, telemetry vetoed). The gateway runs with its defaults: its access log "
            "writes one line per request (to a file). The pass-through hop: bench/"
            "passthrough.py (an aiohttp server and client, as the gateway is built). The "
            "load generator, the allocator, the stand-in, the proxies and the durable echo "
            "behind the floor share the "
            "machine's cores; "
            f"{WARM_REQUESTS} requests went through each path before the first round.",
            "",
            tables(res),
            "",
            text,
            "",
            cpu_table(res),
            "",
            READING,
            "",
            rounds_table(res),
        ]
    )


def rounds_table(res: PeerResults) -> str:
    """Each round's own figures, in the order its paths ran."""
    lines = [
        "| round | order | gateway adds, ms | floor adds, ms | LiteLLM adds, ms | "
        "gateway ÷ LiteLLM | floor ÷ LiteLLM | "
        "the callback adds, ms | a do-nothing callback adds, ms | "
        f"{SHORT_IN_FLIGHT} in flight, requests/s: direct, hop, gateway, LiteLLM, "
        "LiteLLM with the do-nothing callback, LiteLLM with fairshare's | hop ÷ direct | "
        "gateway ÷ direct |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for i in range(len(res.sequential["direct"])):
        direct = p50(res.sequential["direct"][i])
        ours = p50(res.sequential["gateway"][i]) - direct
        least = p50(res.sequential["floor"][i]) - direct
        theirs = p50(res.sequential["litellm"][i]) - direct
        callback = p50(res.sequential["litellm+fairshare"][i]) - direct - theirs
        nothing = p50(res.sequential["litellm+noop"][i]) - direct - theirs
        rates = [res.loaded[name][i].rate for name in LOADED]
        lines.append(
            f"| {i + 1} | {', '.join(order_of(i))} | {ms(ours)} | {ms(least)} | {ms(theirs)} | "
            f"{ours / theirs if theirs > 0 else float('inf'):.2f} | "
            f"{least / theirs if theirs > 0 else float('inf'):.2f} | {ms(callback)} | "
            f"{ms(nothing)} | "
            f"{', '.join(f'{r:,.0f}' for r in rates)} | "
            f"{rates[1] / rates[0] if rates[0] > 0 else 0.0:.2f} | "
            f"{rates[2] / rates[0] if rates[0] > 0 else 0.0:.2f} |"
        )
    return "\n".join(lines)


READING = (
    "Reading the figures. One at a time, the gateway's added latency is an HTTP hop plus an "
    "Acquire that returns after the pool's durable write (its Release runs in the background: "
    "the answer does not wait for it); LiteLLM's is an HTTP hop through FastAPI and its router, "
    "its key check and its callbacks, with no write at all. At 32 in flight every process "
    "runs on the same cores, so requests per second through a path is about the cores' time "
    "divided by the CPU that one request costs in all the processes on it (the table above, "
    "from /proc): through the gateway that includes the allocator's Acquire and Release, "
    "batched with the others that wait. On each row, the columns of the processes off that "
    "path are what they spend idle, divided over that path's requests."
)


def git(*args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True, timeout=30
    ).stdout.strip()


def fairshare_commit() -> str:
    """The checkout's commit, marked when tracked files differ from it."""
    try:
        head = git("rev-parse", "--short=12", "HEAD")
        changed = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{head} (with uncommitted changes)" if changed else head


def callback_settings(allocator: str) -> dict[str, object]:
    """The settings of fairshare's callback in the second LiteLLM proxy: the benchmark's
    pool for its model, the team from the header the load sends, the gateway's holder
    deadline."""
    return {
        "allocator": {"endpoints": [allocator], "holder": "bench-litellm", "deadline_s": 0.75},
        "pools": {FAST_MODEL: POOL},
        "team": {"from": ["header"], "header": TEAM_HEADER},
    }


async def run(args: argparse.Namespace) -> PeerResults:
    work = workdir("fairshare-bench-gateway-peer-")
    allocator = allocator_process(work)
    fast = standin_process(work, FAST_MODEL, FAST_TOKENS_PER_S)
    upstream = f"http://{fast.address}"
    gateway = gateway_process(work, allocator.address, {FAST_MODEL: upstream})
    litellm = litellm_peer.LiteLLM(work, FAST_MODEL, upstream)
    callback = litellm_peer.LiteLLM(
        work,
        FAST_MODEL,
        upstream,
        fairshare=callback_settings(allocator.address),
        name="litellm-fairshare",
    )
    noop = litellm_peer.LiteLLM(
        work, FAST_MODEL, upstream, callback=NOOP_CALLBACK, name="litellm-noop"
    )
    hop = passthrough_process(work, upstream, "passthrough")
    echo = echo_server(work, sync=True, name="durable-echo")
    floor = passthrough_process(work, upstream, "floor", decide=echo.address)
    processes = (allocator, fast, gateway, litellm, callback, noop, hop, echo, floor)
    try:
        allocator.start()
        fast.start()
        await wait_serving(allocator.address, process=allocator)
        await wait_standin(upstream, process=fast)
        gateway.start()
        litellm.start()
        callback.start()
        noop.start()
        hop.start()
        echo.start()
        await wait_serving(echo.address, process=echo)
        floor.start()
        await wait_http(f"http://{gateway.address}/readyz", process=gateway)
        # The hops have no health path: each is up once it forwards a request.
        for forwarding in (hop, floor):
            await wait_http(
                f"http://{forwarding.address}/v1/chat/completions",
                process=forwarding,
                post_json={"model": FAST_MODEL, "messages": [], "max_tokens": 1},
                any_status=True,
            )
        for proxy in (litellm, callback, noop):
            await wait_http(proxy.health_url, process=proxy, timeout_s=litellm_peer.START_TIMEOUT_S)
        targets = PeerTargets(
            bases={
                "direct": upstream,
                "hop": f"http://{hop.address}",
                "floor": f"http://{floor.address}",
                "gateway": f"http://{gateway.address}",
                "litellm": litellm.url,
                "litellm+noop": noop.url,
                "litellm+fairshare": callback.url,
            },
            bearer={
                "direct": "unused",
                "hop": "unused",
                "floor": "unused",
                "gateway": "unused",
                "litellm": litellm.master_key,
                "litellm+noop": noop.master_key,
                "litellm+fairshare": callback.master_key,
            },
            models=dict.fromkeys(PATHS, FAST_MODEL),
            pids=pids_of(
                {
                    "allocator": allocator,
                    "stand-in": fast,
                    "hop": hop,
                    "gateway": gateway,
                    "litellm": litellm,
                    "litellm+noop": noop,
                    "litellm+fairshare": callback,
                }
            ),
        )
        return await measure(args, targets)
    finally:
        stop_all(processes, work)


def main(args: argparse.Namespace) -> int:
    """``python -m bench.gateway --peer litellm`` (bench/gateway.py parses the arguments)."""
    if args.peer != "litellm":
        raise ValueError(f"no such peer: {args.peer}")
    versions = Versions(fairshare=fairshare_commit(), litellm=litellm_peer.ensure_installed())
    info = machine()
    for key, value in info.items():
        print(f"{key}: {value}")
    print(f"fairshare: {versions.fairshare}\nlitellm: {versions.litellm}")
    res = asyncio.run(run(args))
    print()
    print(tables(res))
    print()
    text, _, _ = verdicts(res)
    print(text)
    print()
    print(cpu_table(res))
    if not args.no_write:
        write_section(SECTION, section(res, info, args, versions))
        print(f"\nwrote the {SECTION!r} section of docs/benchmarks.md")
    return 0
