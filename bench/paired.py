"""Two versions of fairshare side by side, one request at a time: what a change does to
the latency the gateway adds.

``python -m bench.paired --base DIR`` runs two stacks on this machine, each an allocator
(embedded mode, the pool of ``bench.gateway``) and a ``fairshare gateway`` in front of one
shared stand-in vLLM server: one from this checkout (``new``), one from the checkout in
``DIR`` (``base``: another worktree of the repository, at the commit to compare with; its
processes run with ``DIR`` as their working directory, so ``python -m`` imports its
packages, with this checkout's virtualenv). Then, per round, ``--pairs`` cycles of three
non-streaming one-token requests: the stand-in directly, then one through each stack, the
two in one order and in the other every other cycle, so that each follows the other as
often (the second of two requests 10 ms apart through like stacks runs faster, most
likely because the code is still in the processor's caches). ``--rate`` requests a
second in all.

It prints, per round and over all rounds, each stack's median added latency over the
direct median, and the median of the paired differences (new less base, each cycle's two
requests). The spread of the paired median between two identical stacks (``--base`` this
checkout) is its resolution: about ±0.03 ms on a 2-core machine.

Not part of ``make test`` or ``make bench``; it writes nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

import aiohttp

from bench._common import Samples, machine, machine_lines, workdir
from bench.gateway import (
    FAST_MODEL,
    FAST_TOKENS_PER_S,
    REQUEST_TIMEOUT_S,
    Load,
    allocator_process,
    gateway_process,
    standin_process,
    stop_all,
)
from harness.http import wait_http
from harness.serve import wait_serving
from harness.standin import wait_standin

WARMUP = 50
"""Unrecorded requests through each path before the first round."""


def order(cycle: int) -> tuple[str, str, str]:
    """The paths of one cycle: direct first, the two stacks swapped every other cycle."""
    return ("direct", "base", "new") if cycle % 2 == 0 else ("direct", "new", "base")


async def compare(base: Path, rounds: int, pairs: int, rate: float) -> list[str]:
    """The lines of the comparison (see the module doc)."""
    work = workdir("fairshare-bench-paired-")
    (work / "base").mkdir()
    allocators = {"new": allocator_process(work), "base": allocator_process(work / "base")}
    allocators["base"].cwd = base
    standin = standin_process(work, FAST_MODEL, FAST_TOKENS_PER_S)
    upstream = f"http://{standin.address}"
    gateways = {
        name: gateway_process(folder, allocators[name].address, {FAST_MODEL: upstream})
        for name, folder in (("new", work), ("base", work / "base"))
    }
    gateways["base"].cwd = base
    processes = [*allocators.values(), standin, *gateways.values()]
    lines: list[str] = []
    try:
        for process in (*allocators.values(), standin):
            process.start()
        for allocator in allocators.values():
            await wait_serving(allocator.address, process=allocator)
        await wait_standin(upstream, process=standin)
        for gateway in gateways.values():
            gateway.start()
            await wait_http(f"http://{gateway.address}/readyz", process=gateway)
        bases = {"direct": upstream} | {n: f"http://{g.address}" for n, g in gateways.items()}
        connector = aiohttp.TCPConnector(limit=0)
        timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            load = Load(session)
            for url in bases.values():
                for _ in range(WARMUP):
                    await load.short(url, Samples())
            added: dict[str, list[float]] = {"base": [], "new": []}
            by_round: list[float] = []
            every: list[float] = []
            for number in range(rounds):
                samples = {name: Samples(on=True) for name in bases}
                start = time.perf_counter()
                sequence = [name for cycle in range(pairs) for name in order(cycle)]
                for i, name in enumerate(sequence):
                    delay = start + i / rate - time.perf_counter()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    await load.short(bases[name], samples[name])
                calls = {name: samples[name].get("call") for name in bases}
                direct = statistics.median(calls["direct"])
                for name, figures in added.items():
                    figures.append(statistics.median(calls[name]) - direct)
                paired = [n - b for b, n in zip(calls["base"], calls["new"], strict=True)]
                every += paired
                by_round.append(statistics.median(paired))
                lines.append(
                    f"round {number + 1}: base adds {added['base'][-1] * 1e3:.2f} ms, new adds "
                    f"{added['new'][-1] * 1e3:.2f} ms; new - base, paired: "
                    f"{by_round[-1] * 1e3:+.3f} ms"
                )
                print(lines[-1], flush=True)
        lines.append(
            f"over {rounds} rounds: base adds {statistics.median(added['base']) * 1e3:.2f} ms, "
            f"new adds {statistics.median(added['new']) * 1e3:.2f} ms (medians of the rounds); "
            f"new - base, median of the {len(every)} paired differences: "
            f"{statistics.median(every) * 1e3:+.3f} ms (rounds: "
            f"{', '.join(f'{d * 1e3:+.3f}' for d in by_round)})"
        )
    finally:
        stop_all(processes, work)
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", type=Path, required=True, help="checkout to compare with")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--pairs", type=int, default=300, help="cycles per round")
    parser.add_argument("--rate", type=float, default=100.0, help="requests per second")
    args = parser.parse_args(argv)
    if not (args.base / "fairshare").is_dir():
        parser.error(f"{args.base} is not a checkout of fairshare")
    if args.rounds < 1 or args.pairs < 1 or args.rate <= 0:
        parser.error("--rounds and --pairs must be at least 1, --rate above 0")
    info = machine()
    lines = asyncio.run(compare(args.base.resolve(), args.rounds, args.pairs, args.rate))
    print(lines[-1])
    print(machine_lines(info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
